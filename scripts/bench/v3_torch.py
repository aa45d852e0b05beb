#!/usr/bin/env python3
"""The DeepSeek-V3 benchmark's PyTorch side (scripts/bench/v3 runs it).

    v3_torch.py MODEL_PY [--steps N] [--threads T] [--autocast]

MODEL_PY is DeepSeek's inference/model.py (github.com/deepseek-ai/DeepSeek-V3,
MIT), read from where the user keeps it, never copied into this repository;
it is imported the way scripts/make_v3_fixtures.py does (float32, world size
1, attn_impl "naive", the Triton kernel module stubbed out). Needs PyTorch (a
venv of your own: python3 -m venv v && v/bin/pip install torch numpy
safetensors). The config is scripts/bench/v3.lua's: dim 256, 4 layers (the
first dense), 16 routed experts top 4 + 1 shared, no query LoRA, vocab 3072;
a step is the logits of every position for 4 x 256 tokens, the mean
cross-entropy, autograd backward and one torch.optim.AdamW step, eager, in
float32 on T threads (default 1); with --autocast the forward and the loss
run under torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's mixed
precision on the CPU: bf16 GEMMs, float32 weights and optimizer). Prints
"params N step_ms X min_ms Y" (median and best of N steps after one
warm-up step).
"""

import argparse
import math
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_v3_fixtures as fx  # noqa: E402  (scripts/make_v3_fixtures.py)

ARGS = dict(vocab_size=3072, dim=256, inter_dim=1024, moe_inter_dim=128, n_layers=4,
            n_dense_layers=1, n_heads=8, n_routed_experts=16, n_shared_experts=1,
            n_activated_experts=4, n_expert_groups=1, n_limited_groups=1, score_func="softmax",
            route_scale=1.0, q_lora_rank=0, kv_lora_rank=128, qk_nope_head_dim=32,
            qk_rope_head_dim=16, v_head_dim=32, max_seq_len=256)
B, T = 4, 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_py")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--autocast", action="store_true",
                    help='torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    # under autocast, RMSNorm's bf16 input and float32 weight take the
    # unfused path; PyTorch warns about it at every call
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
    mod = fx.load_model_py(a.model_py)
    _, model = fx.build_model(mod, ARGS, B, False)
    gen = torch.Generator().manual_seed(0)
    fx.init_weights(list(model.named_parameters()), gen)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tok = torch.randint(0, ARGS["vocab_size"], (B, T), generator=gen)
    tgt = torch.randint(0, ARGS["vocab_size"], (B, T), generator=gen)
    times = []
    for k in range(a.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = fx.loss_of(fx.forward_all(model, tok), tgt)
        loss.backward()
        opt.step()
        if k > 0:
            times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    n = sum(p.numel() for p in params)
    print(f"params {n} step_ms {times[(len(times) - 1) // 2]:.1f} min_ms {times[0]:.1f}")


if __name__ == "__main__":
    main()
