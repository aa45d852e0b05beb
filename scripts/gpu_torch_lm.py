#!/usr/bin/env python3
"""gpu_torch_lm.py — the char-LM of bench_gpu_lm in PyTorch eager float32 on
cuda:0, for the step-time comparison in scripts/gpu-check.sh: embedding,
pre-norm transformer blocks (RMSNorm, causal attention with bias-free
q/k/v/o, residual; RMSNorm, fc1 4*dim with bias, tanh GELU, fc2 with bias,
residual), RMSNorm, biased head; cross-entropy; AdamW lr 5e-3, weight decay
0.01; the same text windows. Prints key=value lines: torch_step_ms (median
from step 5 on, synchronised each step like luapipe's) and final_loss.
--attention manual (softmax of masked scores, as luapipe computes it) or
sdpa (torch.nn.functional.scaled_dot_product_attention). TF32 stays off."""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    for k, v in [("steps", 50), ("blocks", 4), ("dim", 256), ("heads", 8),
                 ("context", 128), ("batch", 16)]:
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_torch_lm: no device")
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    data = open(a.text, "rb").read()
    chars = sorted(set(data))
    ids = {c: i for i, c in enumerate(chars)}
    V, D, H, T, B = len(chars), a.dim, a.heads, a.context, a.batch
    dev = torch.device("cuda:0")

    class RMSNorm(torch.nn.Module):
        def __init__(s, d):
            super().__init__()
            s.w = torch.nn.Parameter(torch.ones(d))

        def forward(s, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * s.w

    class Block(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.n1, s.n2 = RMSNorm(D), RMSNorm(D)
            s.q, s.k, s.v, s.o = (torch.nn.Linear(D, D, bias=False) for _ in range(4))
            s.fc1, s.fc2 = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(s, x):
            h = s.n1(x)
            q, k, v = (f(h).view(B, T, H, D // H).transpose(1, 2) for f in (s.q, s.k, s.v))
            if a.attention == "sdpa":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                sc = q @ k.transpose(-1, -2) / (D // H) ** 0.5
                mask = torch.ones(T, T, device=x.device, dtype=torch.bool).triu(1)
                o = sc.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + s.o(o.transpose(1, 2).reshape(B, T, D))
            return x + s.fc2(F.gelu(s.fc1(s.n2(x)), approximate="tanh"))

    model = torch.nn.Sequential(torch.nn.Embedding(V, D), *[Block() for _ in range(a.blocks)],
                                RMSNorm(D), torch.nn.Linear(D, V)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.01)

    def offset(step, b):
        x = 1
        for v in (step, 0, b):
            x = (x * 6364136223846793005 + v * 1442695040888963407 + 1) & 0x7FFFFFFFFFFFFFFF
            x ^= x >> 31
        return x % (len(data) - T - 1)

    times, loss = [], None
    for s in range(a.steps):
        xs, ys = [], []
        for b in range(B):
            o = offset(s, b)
            xs += [ids[c] for c in data[o:o + T]]
            ys += [ids[c] for c in data[o + 1:o + T + 1]]
        t0 = time.perf_counter()
        x = torch.tensor(xs, device=dev).view(B, T)
        y = torch.tensor(ys, device=dev)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).view(B * T, V), y)
        loss.backward()
        opt.step()
        lv = loss.item()  # reads back like luapipe does
        torch.cuda.synchronize()
        if s >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
    print(f"torch_attention={a.attention}")
    print(f"torch_step_ms={statistics.median(times):.3f}")
    print(f"final_loss={lv:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
