#!/usr/bin/env python3
"""The PyTorch side of scripts/bench/torch_pipeline (the driver runs it).

    torch_pipeline.py --family F [--steps N] [--warmup N] [--autocast]
                      [--init FILE] [--out FILE] [--split a,b,...] [--ranks 2]

examples/train_char_lm.lua's char-LM written in PyTorch and trained with
torch.distributed.pipelining on --ranks processes (torch.multiprocessing
spawn, gloo on the CPU, one thread each): the same model (token embedding
of the text's vocabulary, 6 pre-norm transformer blocks of dim 64 with 4
causal attention heads without biases, an MLP 64-256-64 with biases and
tanh GELU, RMSNorm eps 1e-5 with a gain, a final RMSNorm and a 64 x vocab
head with a bias; no position embedding), the same data (the GPL-3 text,
the example's seeded windows: 8 micro-batches of 4 x 64 characters a step),
the mean cross-entropy over each micro-batch (gradients averaged over the
micro-batches) and AdamW (lr 0.005, betas 0.9 / 0.999, eps 1e-8, weight
decay 0.01), float32, or with --autocast under torch.autocast("cpu",
dtype=torch.bfloat16) around each step.

Families (luapipe's name: PyTorch's schedule, stages split by blocks):
  gpipe            ScheduleGPipe                   1 stage a rank   3 | 3
  1f1b             Schedule1F1B                    1 stage a rank   3 | 3
  zb1p             ScheduleInterleavedZeroBubble   1 stage a rank   3 | 3 (ZB-H1)
  interleaved1f1b  ScheduleInterleaved1F1B         2 a rank, loop   1 2 2 1
  zbv              ScheduleZBVZeroBubble           2 a rank, V      2 1 2 1
  dualpipev        ScheduleDualPipeV               2 a rank, V      2 1 2 1
The embedding rides with the first stage, the final norm and the head with
the last; each rank gets 3 blocks, as luapipe's cost partition gives.
--split overrides the blocks per stage ("1,2,2,1").

--init FILE loads the initial weights from a safetensors file with
luapipe's parameter names (scripts/bench/torch_pipeline.lua writes it), so
that the first step's loss equals luapipe's. Prints (and writes to --out)
key=value lines: family, autocast, stages, params (the whole model's
parameter count), step_ms (median over the steps after --warmup of each
step's time, the mean over ranks of the time a rank spends in zero_grad +
schedule.step + optimizer.step: what luapipe's samples/s measures),
min_ms, cpu_ms (the same median of the CPU time of each rank's process,
all its threads, over those spans), first_loss (the mean loss of step 1's micro-batches), final_loss,
rss_mb_R (rank R's peak resident memory, ru_maxrss), rss_mb_max.
Needs PyTorch >= 2.6 (pip install torch into a venv of your own).
"""

import argparse
import json
import math
import os
import resource
import socket
import statistics
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

FAMILIES = {
    # name: (schedule class name, placement, default blocks per stage)
    "gpipe": ("ScheduleGPipe", "single", [3, 3]),
    "1f1b": ("Schedule1F1B", "single", [3, 3]),
    "zb1p": ("ScheduleInterleavedZeroBubble", "multi1", [3, 3]),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", "loop", [1, 2, 2, 1]),
    "zbv": ("ScheduleZBVZeroBubble", "v", [2, 1, 2, 1]),
    "dualpipev": ("ScheduleDualPipeV", "v", [2, 1, 2, 1]),
}


class RMSNorm(nn.Module):
    """x * weight / sqrt(mean(x^2) + eps), as luapipe's rmsnorm."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    """Causal multi-head self-attention, Q K V O projections without biases
    (weights [out, in], y = x W^T: luapipe's attention.wq ...)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        std = 1.0 / math.sqrt(dim)
        for n in ("wq", "wk", "wv", "wo"):
            setattr(self, n, nn.Parameter(torch.randn(dim, dim) * std))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(w):
            return F.linear(x, w).view(b, t, h, d // h).transpose(1, 2)

        o = F.scaled_dot_product_attention(split(self.wq), split(self.wk), split(self.wv),
                                           is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, t, d), self.wo)


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


class Block(nn.Module):
    """x + attn(rmsnorm(x)), then x + fc2(gelu(fc1(rmsnorm(x))))."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = MLP(dim, hidden)

    def forward(self, x):
        return self.mlp(x + self.attn(self.attn_norm(x)))


def make_layer(i, a, vocab):
    """Layer i (0-based) of the example's nn.sequential: embedding, blocks,
    rmsnorm, linear head."""
    if i == 0:
        return nn.Embedding(vocab, a.dim)
    if i <= a.blocks:
        return Block(a.dim, a.heads, 4 * a.dim)
    if i == a.blocks + 1:
        return RMSNorm(a.dim)
    return nn.Linear(a.dim, vocab)


class Stage(nn.Module):
    """Layers first..last of the model; parameter names are luapipe's
    ("layers.3.attn.wq") so a luapipe safetensors file loads as it is."""

    def __init__(self, first, last, a, vocab):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): make_layer(i, a, vocab) for i in range(first, last + 1)})

    def forward(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x


def stage_bounds(blocks_per_stage, nblocks):
    """Layer ranges (first, last) per stage: the embedding with the first
    stage, the final norm and head with the last."""
    if sum(blocks_per_stage) != nblocks or min(blocks_per_stage) < 0:
        raise SystemExit(f"torch_pipeline.py: --split {blocks_per_stage} does not give the "
                         f"{nblocks} blocks")
    bounds, at = [], 1
    for s, n in enumerate(blocks_per_stage):
        first = 0 if s == 0 else at
        last = at + n - 1
        if s == len(blocks_per_stage) - 1:
            last = nblocks + 2
        bounds.append((first, last))
        at += n
    return bounds


def load_text(path):
    with open(path, "rb") as f:
        text = f.read()
    chars = sorted(set(text))
    ids = {c: i for i, c in enumerate(chars)}
    return [ids[c] for c in text], len(chars)


MASK = 0x7FFFFFFFFFFFFFFF


def offset(seed, ntrain, T, step, mb, b):
    """The example's window offset (64-bit wrap-around as Lua's integers)."""
    x = seed
    for v in (step, mb, b):
        x = (x * 6364136223846793005 + v * 1442695040888963407 + 1) & MASK
        x ^= x >> 31
    return x % (ntrain - T - 1)


def step_batch(ids, a, step):
    """Step `step`'s inputs and targets, [M * batch, T] (micro-batch m is
    rows m * batch ...), as the example's data(step, mb) for mb = 0 .. M-1."""
    T, n = a.context, len(ids)
    x = torch.empty(a.microbatches * a.batch, T, dtype=torch.long)
    y = torch.empty_like(x)
    for m in range(a.microbatches):
        for b in range(a.batch):
            o = offset(a.seed, n, T, step, m, b)
            x[m * a.batch + b] = torch.tensor(ids[o:o + T])
            y[m * a.batch + b] = torch.tensor(ids[o + 1:o + T + 1])
    return x, y


def read_safetensors(path):
    """{name: float32 tensor} of a safetensors file (F32 only), read
    without the safetensors package."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit(f"torch_pipeline.py: {path}: tensor {name} is {e['dtype']}, not F32")
        lo, hi = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32).reshape(e["shape"])
    return out


def worker(rank, a, port, q):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    import torch.distributed.pipelining as pp

    cls_name, placement, split = FAMILIES[a.family]
    split = [int(s) for s in a.split.split(",")] if a.split else split
    P = a.ranks
    nstages = {"single": P, "multi1": P}.get(placement, 2 * P)
    if placement in ("single", "multi1") and len(split) != P or \
       placement in ("loop", "v") and len(split) != 2 * P:
        raise SystemExit(f"torch_pipeline.py: {a.family} needs {nstages} stages, --split gives "
                         f"{len(split)}")
    if placement in ("single", "multi1"):
        mine = [rank]
    elif placement == "loop":
        mine = [rank, rank + P]
    else:
        mine = [rank, 2 * P - 1 - rank]
    ids, vocab = load_text(a.text)
    bounds = stage_bounds(split, a.blocks)
    init = read_safetensors(a.init) if a.init else None
    torch.manual_seed(a.seed)
    modules, stages = [], []
    for s in mine:
        m = Stage(*bounds[s], a, vocab)
        if init is not None:
            sd = m.state_dict()
            missing = [k for k in sd if k not in init]
            if missing:
                raise SystemExit(f"torch_pipeline.py: {a.init} lacks {missing[0]}")
            m.load_state_dict({k: init[k] for k in sd})
        modules.append(m)
        stages.append(pp.PipelineStage(m, s, nstages, torch.device("cpu")))

    def loss_fn(out, tgt):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), tgt.reshape(-1))

    cls = getattr(pp, cls_name)
    sched = cls(stages[0] if placement == "single" else stages, a.microbatches, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    has_first, has_last = 0 in mine, nstages - 1 in mine
    times, cpu, losses_of = [], [], {}
    for k in range(1, a.steps + 1):
        x, y = step_batch(ids, a, k)
        losses = [] if has_last else None
        args = (x,) if has_first else ()
        kw = {"target": y, "losses": losses} if has_last else {}
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        if a.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sched.step(*args, **kw)
        else:
            sched.step(*args, **kw)
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        if has_last:
            losses_of[k] = float(torch.stack([v.detach().float() for v in losses]).mean())
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    mine_out = {"times": times, "cpu": cpu, "losses": losses_of, "rss_mb": rss_mb,
                "params": sum(p.numel() for p in params)}
    every = [None] * P
    dist.all_gather_object(every, mine_out)
    if rank == 0:
        per_step = [sum(r["times"][i] for r in every) / P for i in range(a.steps)]
        kept = per_step[a.warmup:] or per_step
        cpu_step = [sum(r["cpu"][i] for r in every) / P for i in range(a.steps)]
        cpu_kept = cpu_step[a.warmup:] or cpu_step
        losses = {}
        for r in every:
            losses.update(r["losses"])
        res = {"family": a.family, "schedule": cls_name, "autocast": int(a.autocast),
               "stages": "|".join(f"{f}-{l}" for f, l in bounds),
               "params": sum(r["params"] for r in every),
               "step_ms": f"{statistics.median(kept):.3f}", "min_ms": f"{min(kept):.3f}",
               "cpu_ms": f"{statistics.median(cpu_kept):.3f}",
               "first_loss": f"{losses[1]:.6f}", "final_loss": f"{losses[a.steps]:.6f}"}
        for r, e in enumerate(every):
            res[f"rss_mb_{r}"] = f"{e['rss_mb']:.1f}"
        res["rss_mb_max"] = f"{max(e['rss_mb'] for e in every):.1f}"
        q.put(res)
    dist.barrier()  # no rank tears gloo down while the other still sends
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description="The char-LM with torch.distributed.pipelining.")
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--autocast", action="store_true", help="CPU bf16 autocast around each step")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--split", help="blocks per stage, e.g. 1,2,2,1")
    ap.add_argument("--init", help="initial weights (safetensors, luapipe's names)")
    ap.add_argument("--out", help="also write the key=value lines here")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    try:
        mp.spawn(worker, args=(a, port, q), nprocs=a.ranks, join=True)
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        # a rank that fails in its teardown ("terminate called without an
        # active exception", seen about once in 50 runs) after rank 0 had
        # the figures: they stand
        if q.empty():
            raise
        print(f"torch_pipeline.py: note: after the run, {e}", file=sys.stderr)
    res = q.get()
    text = "".join(f"{k}={v}\n" for k, v in res.items())
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
