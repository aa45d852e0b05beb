#!/usr/bin/env python3
"""Make the DeepSeek-V3 reference fixtures under tests/data/v3 (issue 23, section 4).

    make_v3_fixtures.py MODEL_PY [--out DIR] [--case NAME ...]

MODEL_PY is DeepSeek's inference/model.py (github.com/deepseek-ai/DeepSeek-V3,
MIT); it is read from where the user keeps it and never copied into this
repository. Needs PyTorch, safetensors and numpy (a venv of your own; nothing
the build or the tests need). The tests only read the files written here.

For each case it builds model.Transformer from a tiny config with a fixed seed
and random weights, rounds the weights to what the checkpoint stores (F32,
BF16, or FP8 E4M3 with 128 x 128 block scales), then in float32 on the CPU:
the logits of every position, the mean cross-entropy over every position, the
autograd gradient of every trained parameter, and five torch.optim.AdamW steps
on the same batch (the five losses and the parameters after). It refuses a
seed where a router decision is within MARGIN of a tie and tries the next one.
The case v3_sparse (many experts, few tokens) wants experts that get no
token in some AdamW step after getting some before: torch gives them grad
None and AdamW leaves them alone (no decay, no moment update, no step).
Same inputs, same torch: the same bytes (one thread, fixed seeds).
"""

import argparse
import hashlib
import importlib.util
import json
import math
import os
import sys
import types

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

MARGIN = 1e-4           # smallest allowed gap between a kept and a dropped router score
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 5
BLOCK = 128             # FP8 block size (quantization_config.weight_block_size)
FP8_MAX = 448.0

# ---------------------------------------------------------------------------
# model.py, imported from the user's path

def load_model_py(path):
    """Import DeepSeek's model.py from PATH as module 'ds_model'. Its kernel
    module (Triton FP8 kernels) is replaced by a stub that fails if called:
    every weight here is float32, so model.linear takes the plain F.linear
    path and never reaches it."""
    if not os.path.isfile(path):
        sys.exit(f"make_v3_fixtures: {path}: no such file (give the path of DeepSeek-V3's inference/model.py)")

    def unavailable(*_a, **_k):
        raise RuntimeError("kernel stub: FP8/Triton kernels are not used by the fixtures")

    kernel = types.ModuleType("kernel")
    kernel.act_quant = kernel.weight_dequant = kernel.fp8_gemm = unavailable
    sys.modules["kernel"] = kernel
    spec = importlib.util.spec_from_file_location("ds_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.attn_impl = "naive"     # k/v caches of full keys and values: differentiable as written
    mod.gemm_impl = "bf16"      # unused: no weight has element_size 1
    mod.world_size, mod.rank = 1, 0
    return mod


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

# ---------------------------------------------------------------------------
# The three cases

# Only the keys that define the architecture; model.py's ModelArgs defaults
# fill nothing here, so a reader needs no default of its own.
V3_F32 = dict(
    vocab_size=128, dim=64, inter_dim=96, moe_inter_dim=16,
    n_layers=3, n_dense_layers=1, n_heads=4,
    n_routed_experts=8, n_shared_experts=1, n_activated_experts=3,
    n_expert_groups=4, n_limited_groups=2, score_func="sigmoid", route_scale=2.5,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_seq_len=16, original_seq_len=4096, rope_theta=10000.0, rope_factor=40.0,
    beta_fast=32, beta_slow=1, mscale=1.0,
)

V2LITE_BF16 = dict(
    vocab_size=128, dim=64, inter_dim=96, moe_inter_dim=16,
    n_layers=2, n_dense_layers=1, n_heads=4,
    n_routed_experts=8, n_shared_experts=2, n_activated_experts=2,
    n_expert_groups=1, n_limited_groups=1, score_func="softmax", route_scale=1.0,
    q_lora_rank=0, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    max_seq_len=8192, original_seq_len=4096, rope_theta=10000.0, rope_factor=40.0,
    beta_fast=32, beta_slow=1, mscale=0.707, dtype="bf16",
)

HF_FP8 = dict(
    vocab_size=96, dim=160, inter_dim=144, moe_inter_dim=16,
    n_layers=2, n_dense_layers=1, n_heads=2,
    n_routed_experts=8, n_shared_experts=1, n_activated_experts=2,
    n_expert_groups=4, n_limited_groups=2, score_func="sigmoid", route_scale=2.5,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
    max_seq_len=8192, original_seq_len=4096, rope_theta=10000.0, rope_factor=40.0,
    beta_fast=32, beta_slow=1, mscale=1.0,
)

# Many experts, few tokens: in every AdamW step most experts get no token,
# and some that had tokens in an earlier step get none (AdamW skips them
# with their moments set). A larger lr moves the routing between steps.
V3_SPARSE = dict(
    vocab_size=64, dim=32, inter_dim=48, moe_inter_dim=8,
    n_layers=3, n_dense_layers=1, n_heads=2,
    n_routed_experts=32, n_shared_experts=1, n_activated_experts=2,
    n_expert_groups=4, n_limited_groups=2, score_func="sigmoid", route_scale=2.5,
    q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    max_seq_len=16, original_seq_len=4096, rope_theta=10000.0, rope_factor=40.0,
    beta_fast=32, beta_slow=1, mscale=1.0,
)

CASES = {
    "v3_f32": dict(args=V3_F32, layout="deepseek", store="f32", bias=True,
                   batch=2, seqlen=8, seed=1000),
    "v2lite_bf16": dict(args=V2LITE_BF16, layout="deepseek", store="bf16", bias=False,
                        batch=2, seqlen=8, seed=2000),
    "hf_fp8": dict(args=HF_FP8, layout="hf", store="fp8", bias=True,
                   batch=2, seqlen=10, seed=3000, mtp=1, shards=2),
    "v3_sparse": dict(args=V3_SPARSE, layout="deepseek", store="f32", bias=True,
                      batch=2, seqlen=4, seed=4000, sparse=True, adamw=dict(lr=1e-2)),
}

# ---------------------------------------------------------------------------
# Names: model.py's (DeepSeek's converted form) <-> Hugging Face's.
# The reverse of inference/convert.py's renaming (mp = 1).

DS_TO_HF_LEAF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "wq": "q_proj", "wq_a": "q_a_proj", "q_norm": "q_a_layernorm", "wq_b": "q_b_proj",
    "wkv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "wkv_b": "kv_b_proj",
    "wo": "o_proj", "gate": "gate", "w1": "gate_proj", "w2": "down_proj", "w3": "up_proj",
}
HF_TO_DS_LEAF = {v: k for k, v in DS_TO_HF_LEAF.items()}


def ds_to_hf(name):
    """model.py name -> Hugging Face name ('layers.1.ffn.gate.bias' ->
    'model.layers.1.mlp.gate.e_score_correction_bias'; 'scale' -> 'weight_scale_inv')."""
    top = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
           "head.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    assert parts[0] == "layers", name
    out = ["model", "layers", parts[1]]
    for p in parts[2:-1]:
        out.append({"attn": "self_attn", "ffn": "mlp"}.get(p, DS_TO_HF_LEAF.get(p, p)))
    leaf = parts[-1]
    if leaf == "scale":
        leaf = "weight_scale_inv"
    elif leaf == "bias" and parts[-2] == "gate":
        leaf = "e_score_correction_bias"
    out.append(leaf)
    return ".".join(out)


def hf_to_ds(name):
    """Hugging Face name -> model.py name (None for a name model.py has no
    place for)."""
    top = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
           "lm_head.weight": "head.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    out = ["layers", parts[2]]
    for p in parts[3:-1]:
        out.append({"self_attn": "attn", "mlp": "ffn"}.get(p, HF_TO_DS_LEAF.get(p, p)))
    leaf = {"weight_scale_inv": "scale", "e_score_correction_bias": "bias"}.get(parts[-1], parts[-1])
    out.append(leaf)
    return ".".join(out)


def hf_config(a, mtp):
    """Hugging Face config.json (DeepseekV3 keys) for ModelArgs dict A."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": a["vocab_size"],
        "hidden_size": a["dim"],
        "intermediate_size": a["inter_dim"],
        "moe_intermediate_size": a["moe_inter_dim"],
        "num_hidden_layers": a["n_layers"],
        "num_nextn_predict_layers": mtp,
        "num_attention_heads": a["n_heads"],
        "num_key_value_heads": a["n_heads"],
        "n_shared_experts": a["n_shared_experts"],
        "n_routed_experts": a["n_routed_experts"],
        "num_experts_per_tok": a["n_activated_experts"],
        "routed_scaling_factor": a["route_scale"],
        "n_group": a["n_expert_groups"],
        "topk_group": a["n_limited_groups"],
        "topk_method": "noaux_tc",
        "scoring_func": a["score_func"],
        "norm_topk_prob": a["score_func"] == "sigmoid",
        "first_k_dense_replace": a["n_dense_layers"],
        "moe_layer_freq": 1,
        "q_lora_rank": a["q_lora_rank"] or None,
        "kv_lora_rank": a["kv_lora_rank"],
        "qk_nope_head_dim": a["qk_nope_head_dim"],
        "qk_rope_head_dim": a["qk_rope_head_dim"],
        "v_head_dim": a["v_head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": a["max_seq_len"],
        "rms_norm_eps": 1e-06,
        "rope_theta": a["rope_theta"],
        "rope_scaling": {
            "type": "yarn",
            "factor": a["rope_factor"],
            "original_max_position_embeddings": a["original_seq_len"],
            "beta_fast": a["beta_fast"],
            "beta_slow": a["beta_slow"],
            "mscale": a["mscale"],
            "mscale_all_dim": a["mscale"],
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }


def model_args_from_hf(c):
    """ModelArgs dict from a Hugging Face config (the mapping the README gives)."""
    rs = c.get("rope_scaling") or {}
    yarn = rs.get("type", rs.get("rope_type")) == "yarn"
    a = dict(
        vocab_size=c["vocab_size"], dim=c["hidden_size"], inter_dim=c["intermediate_size"],
        moe_inter_dim=c["moe_intermediate_size"], n_layers=c["num_hidden_layers"],
        n_dense_layers=c["first_k_dense_replace"], n_heads=c["num_attention_heads"],
        n_routed_experts=c["n_routed_experts"], n_shared_experts=c["n_shared_experts"],
        n_activated_experts=c["num_experts_per_tok"], n_expert_groups=c["n_group"],
        n_limited_groups=c["topk_group"], score_func=c["scoring_func"],
        route_scale=c["routed_scaling_factor"], q_lora_rank=c["q_lora_rank"] or 0,
        kv_lora_rank=c["kv_lora_rank"], qk_nope_head_dim=c["qk_nope_head_dim"],
        qk_rope_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
        rope_theta=c["rope_theta"],
    )
    if yarn:
        a.update(max_seq_len=c["max_position_embeddings"],
                 original_seq_len=rs["original_max_position_embeddings"],
                 rope_factor=rs["factor"], beta_fast=rs["beta_fast"], beta_slow=rs["beta_slow"],
                 mscale=rs["mscale_all_dim"])
    else:
        a.update(max_seq_len=c["max_position_embeddings"],
                 original_seq_len=c["max_position_embeddings"])
    return a

# ---------------------------------------------------------------------------
# Building the model

def build_model(mod, args_dict, batch, with_bias):
    """model.Transformer for ARGS_DICT with every parameter float32 (weights
    uninitialised) and, where WITH_BIAS, a router correction bias on every MoE
    gate (model.py makes one only at dim 7168)."""
    a = {k: v for k, v in args_dict.items() if k != "dtype"}
    args = mod.ModelArgs(max_batch_size=batch, **a)
    model = mod.Transformer(args).float()   # Linear.dtype (bf16) -> float32: plain F.linear
    if with_bias:
        for layer in model.layers:
            if isinstance(layer.ffn, mod.MoE):
                layer.ffn.gate.bias = torch.nn.Parameter(
                    torch.zeros(args.n_routed_experts), requires_grad=False)
    return args, model


def init_weights(named, gen):
    """Fill parameters in place from generator GEN, in the given order:
    embedding N(0,1); norm weights 1 + N(0,0.1); router correction bias
    N(0,0.05); every matrix N(0, 1/fan_in) (router included: router logits
    of spread about 1, so routing is well separated)."""
    with torch.no_grad():
        for name, p in named:
            leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
            if name.endswith("embed.weight") or name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif p.dim() == 1 and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif leaf == "bias":
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


def fp8_quantize(w):
    """Block-scaled FP8 E4M3 of float32 matrix W: (q [O,I] float8_e4m3fn,
    s [ceil(O/128), ceil(I/128)] float32), w ~ q * s blockwise; partial
    blocks at the ends keep their own scale."""
    O, I = w.shape
    bo, bi = -(-O // BLOCK), -(-I // BLOCK)
    pad = torch.zeros(bo * BLOCK, bi * BLOCK)
    pad[:O, :I] = w
    blocks = pad.view(bo, BLOCK, bi, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    q = q.view(bo * BLOCK, bi * BLOCK)[:O, :I].contiguous().to(torch.float8_e4m3fn)
    return q, s.contiguous()


def fp8_dequantize(q, s):
    """float32 q * s with s expanded over 128 x 128 blocks."""
    O, I = q.shape
    full = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:O, :I]
    return q.float() * full


def fp8_stored(name, p):
    """Is model.py parameter NAME stored as FP8 in the HF checkpoint? As in
    DeepSeek-V3's: the linear layers of attention, MLPs and experts; not the
    router, norms, embeddings, heads or the MTP layer's eh_proj (BF16 there)."""
    return (name.startswith("layers.") and p.dim() == 2 and ".gate." not in name
            and not any(k in name for k in ("embed_tokens", "eh_proj", "shared_head")))


def stored_tensors(named, store):
    """{model.py name: tensor as stored} for STORE ('f32', 'bf16', 'fp8';
    fp8 adds NAME-with-'scale' entries; its non-FP8 tensors are BF16, the
    correction bias F32) and {name: float32 value the reference uses}."""
    files, values = {}, {}
    for name, p in named:
        p = p.detach()
        if store == "f32" or (store == "fp8" and name.endswith("gate.bias")):
            files[name] = p.clone().contiguous()
            values[name] = p.clone()
        elif store == "bf16" or not fp8_stored(name, p):
            files[name] = p.to(torch.bfloat16).contiguous()
            values[name] = files[name].float()
        else:
            q, s = fp8_quantize(p)
            files[name] = q
            files[name[:-len("weight")] + "scale"] = s
            values[name] = fp8_dequantize(q, s)
    return files, values

# ---------------------------------------------------------------------------
# Forward over every position, losses, routing margins

def reset_caches(model):
    """Fresh zero k/v caches (attn_impl 'naive' writes keys and values into
    them), so that no graph of an earlier forward is reached."""
    for layer in model.layers:
        at = layer.attn
        at.k_cache = torch.zeros_like(at.k_cache)
        at.v_cache = torch.zeros_like(at.v_cache)


def forward_all(model, tokens):
    """Logits [B, T, V] of every position: Transformer.forward's own steps
    (embed, the layers with freqs_cis and the causal mask, norm, head) without
    its last-position slice and without inference_mode."""
    reset_caches(model)
    seqlen = tokens.size(1)
    h = model.embed(tokens)
    freqs_cis = model.freqs_cis[0:seqlen]
    mask = torch.full((seqlen, seqlen), float("-inf")).triu_(1) if seqlen > 1 else None
    for layer in model.layers:
        h = layer(h, 0, freqs_cis, mask)
    return model.head(model.norm(h))


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def route_margin(gate, x):
    """Smallest gap, over the tokens of X, between the last kept and the
    first dropped group score (with groups) and between the k-th and
    (k+1)-th expert selection score among the kept groups: the ties that
    would let float noise decide the routing."""
    with torch.no_grad():
        s = F.linear(x, gate.weight)
        s = s.softmax(dim=-1, dtype=torch.float32) if gate.score_func == "softmax" else s.sigmoid()
        if gate.bias is not None:
            s = s + gate.bias
        n = x.size(0)
        margin = math.inf
        if gate.n_groups > 1:
            g = s.view(n, gate.n_groups, -1)
            gs = g.amax(dim=-1) if gate.bias is None else g.topk(2, dim=-1)[0].sum(dim=-1)
            srt = gs.sort(dim=-1, descending=True)[0]
            if gate.topk_groups < gate.n_groups:
                margin = min(margin, (srt[:, gate.topk_groups - 1] - srt[:, gate.topk_groups]).min().item())
            keep = gs.topk(gate.topk_groups, dim=-1)[1]
            drop = torch.ones(n, gate.n_groups, dtype=torch.bool).scatter_(1, keep, False)
            s = g.masked_fill(drop.unsqueeze(-1), float("-inf")).flatten(1)
        srt = s.sort(dim=-1, descending=True)[0]
        if gate.topk < s.size(1):
            nxt = srt[:, gate.topk]
            gap = srt[:, gate.topk - 1] - nxt
            gap = gap[torch.isfinite(nxt)]
            if gap.numel():
                margin = min(margin, gap.min().item())
        return margin


def plain_topk(gate, x, use_bias, use_groups):
    """Sorted expert choice of GATE for X with its correction bias and its
    group limit each left out on request: counts how many tokens each
    changes, to show the fixtures exercise them."""
    with torch.no_grad():
        s = F.linear(x, gate.weight)
        s = s.softmax(dim=-1, dtype=torch.float32) if gate.score_func == "softmax" else s.sigmoid()
        if use_bias and gate.bias is not None:
            s = s + gate.bias
        if use_groups and gate.n_groups > 1:
            g = s.view(x.size(0), gate.n_groups, -1)
            gs = g.amax(dim=-1) if gate.bias is None else g.topk(2, dim=-1)[0].sum(dim=-1)
            keep = gs.topk(gate.topk_groups, dim=-1)[1]
            drop = torch.ones(x.size(0), gate.n_groups, dtype=torch.bool).scatter_(1, keep, False)
            s = g.masked_fill(drop.unsqueeze(-1), float("-inf")).flatten(1)
        return s.topk(gate.topk, dim=-1)[1].sort(dim=-1)[0]


class MarginWatch:
    """Records route_margin of every MoE gate call while active, and the
    fewest tokens any routed expert got in one call (an expert with none has
    no gradient, which torch.optim.AdamW skips, decay included: the seeds
    chosen avoid that ambiguity)."""

    def __init__(self, model, mod):
        self.margin = math.inf
        self.min_tokens = math.inf
        self.counts = []        # per gate call (step-major, layer-minor): tokens per expert
        self.handles = [layer.ffn.gate.register_forward_hook(self.hook)
                        for layer in model.layers if isinstance(layer.ffn, mod.MoE)]

        self.calls = 0
        self.changed = {"bias": 0, "groups": 0}

    def hook(self, gate, inputs, out):
        x = inputs[0].detach()
        self.margin = min(self.margin, route_margin(gate, x))
        counts = torch.bincount(out[1].flatten(), minlength=gate.weight.size(0))
        self.min_tokens = min(self.min_tokens, counts.min().item())
        self.counts.append(counts.tolist())
        if self.calls < len(self.handles):   # the first forward: what bias and groups decide
            chosen = out[1].sort(dim=-1)[0]
            for what in ("bias", "groups"):
                if (what == "bias" and gate.bias is None) or (what == "groups" and gate.n_groups == 1):
                    continue
                alt = plain_topk(gate, x, use_bias=(what != "bias"), use_groups=(what != "groups"))
                self.changed[what] += (alt != chosen).any(dim=-1).sum().item()
        self.calls += 1

    def close(self):
        for h in self.handles:
            h.remove()

# ---------------------------------------------------------------------------
# One case

def run_case(mod, name, case, seed):
    """Build, run and train case CASE with SEED. Returns a dict of results,
    or a string saying why the seed does not do (a routing margin below
    MARGIN, an expert without tokens)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    args, model = build_model(mod, case["args"], case["batch"], case["bias"])
    named = list(model.named_parameters())
    init_weights(named, gen)
    mtp_named = []
    if case.get("mtp"):
        mtp_named = make_mtp(mod, args, gen)
    files, values = stored_tensors(named, case["store"])
    mtp_files, _ = stored_tensors(mtp_named, case["store"])
    with torch.no_grad():
        for n, p in named:
            p.copy_(values[n])

    seq = torch.randint(0, args.vocab_size, (case["batch"], case["seqlen"] + 1), generator=gen)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    # model.py's own forward (last position, inference_mode) against ours
    with torch.no_grad():
        last = model(tokens)
    watch = MarginWatch(model, mod)
    trained = [(n, p) for n, p in named if p.requires_grad]
    adamw = dict(ADAMW, **case.get("adamw", {}))
    init = {n: p.detach().clone() for n, p in trained}
    opt = torch.optim.AdamW([p for _, p in trained], foreach=False, **adamw)
    losses, grads = [], {}
    for step in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        logits = forward_all(model, tokens)
        if watch.min_tokens == 0 and not case.get("sparse"):
            watch.close()
            return f"an expert gets no token at AdamW step {step + 1}"
        loss = loss_of(logits, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            ref_logits, ref_loss = logits.detach().clone(), loss.detach().clone()
            # (an expert without tokens: grad None, written as zeros)
            grads = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                     for n, p in trained}
            dlast = (ref_logits[:, -1] - last).abs().max().item()
            if dlast > 1e-5 * ref_logits.abs().max().item():
                sys.exit(f"make_v3_fixtures: {name}: full-sequence forward disagrees with "
                         f"Transformer.forward at the last position by {dlast:g}")
        opt.step()
    watch.close()
    if watch.margin < MARGIN:
        return f"a router decision within {watch.margin:.3g} of a tie"
    after = {n: p.detach().clone() for n, p in trained}
    sparse = {}
    if case.get("sparse"):
        # (layer, expert, step) with no token after tokens in an earlier step
        nmoe = len(watch.handles)
        per = [watch.counts[k * nmoe:(k + 1) * nmoe] for k in range(ADAMW_STEPS)]
        resumed = skipped = idle = 0
        for li in range(nmoe):
            for x in range(len(per[0][li])):
                used = [per[k][li][x] > 0 for k in range(ADAMW_STEPS)]
                skipped += sum(1 for k in range(ADAMW_STEPS) if not used[k] and any(used[:k]))
                resumed += sum(1 for k in range(ADAMW_STEPS)
                               if used[k] and any(not u for u in used[:k]) and any(used[:k]))
                idle += sum(1 for u in used if not u)
        if skipped == 0:
            return "no expert loses its tokens after having some"
        # the same five steps with every missing gradient taken as zero (what
        # an optimizer that ignored grad None would do): how far that lands
        with torch.no_grad():
            for n, p in trained:
                p.copy_(init[n])
        opt0 = torch.optim.AdamW([p for _, p in trained], foreach=False, **adamw)
        for step in range(ADAMW_STEPS):
            opt0.zero_grad(set_to_none=True)
            loss_of(forward_all(model, tokens), targets).backward()
            for _, p in trained:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            opt0.step()
        zero_grad_off = max(((p.detach() - after[n]).norm() / after[n].norm()).item()
                            for n, p in trained)
        sparse = dict(expert_steps_without_tokens=idle, skipped_after_tokens=skipped,
                      resumed_after_skip=resumed, zero_grad_instead_rel_l2=f"{zero_grad_off:.6g}",
                      tokens_per_step=json.dumps(per))
    else:
        missing = [n for n, p in trained if n not in grads or grads[n] is None]
        assert not missing, missing
    return dict(sparse=sparse, adamw=adamw,args=args, files=files, mtp_files=mtp_files, tokens=tokens, targets=targets,
                logits=ref_logits, loss=ref_loss, grads=grads, losses=losses, after=after,
                margin=watch.margin, changed=watch.changed, untrained=[n for n, p in named if not p.requires_grad])


def make_mtp(mod, args, gen):
    """Tensors of one multi-token-prediction layer (index n_layers), as the
    HF checkpoint of DeepSeek-V3 has them (a full MoE decoder block plus
    embed_tokens, enorm, hnorm, eh_proj, shared_head.{norm,head}); model.py
    does not use them. Returned as (model.py-style name, tensor) pairs."""
    i = args.n_layers
    block = mod.Block(i, args).float()
    block.ffn.gate.bias = torch.nn.Parameter(torch.zeros(args.n_routed_experts), requires_grad=False)
    named = [(f"layers.{i}.{n}", p) for n, p in block.named_parameters()]
    named += [(f"layers.{i}.embed_tokens.weight", torch.empty(args.vocab_size, args.dim)),
              (f"layers.{i}.enorm.weight", torch.empty(args.dim)),
              (f"layers.{i}.hnorm.weight", torch.empty(args.dim)),
              (f"layers.{i}.eh_proj.weight", torch.empty(args.dim, 2 * args.dim)),
              (f"layers.{i}.shared_head.norm.weight", torch.empty(args.dim)),
              (f"layers.{i}.shared_head.head.weight", torch.empty(args.vocab_size, args.dim))]
    init_weights(named, gen)
    return [(n, p.detach()) for n, p in named]

# ---------------------------------------------------------------------------
# Writing

def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def layer_index(hf_name):
    """N of 'model.layers.N. ...', else None."""
    parts = hf_name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else None


def write_case(out, name, case, r, seed, meta):
    d = os.path.join(out, name)
    ck = os.path.join(d, "checkpoint")
    os.makedirs(ck, exist_ok=True)
    for old in os.listdir(ck):
        os.remove(os.path.join(ck, old))
    if case["layout"] == "deepseek":
        cfg = dict(case["args"])
        write_json(os.path.join(ck, "config.json"), cfg)
        save_file(r["files"], os.path.join(ck, "model0-mp1.safetensors"))
        rename = lambda n: n
    else:
        write_json(os.path.join(ck, "config.json"), hf_config(case["args"], case["mtp"]))
        tensors = {ds_to_hf(n): t for n, t in r["files"].items()}
        for n, t in r["mtp_files"].items():
            tensors[ds_to_hf(n)] = t
        split = write_hf_shards(ck, tensors, case["shards"], case["args"]["n_layers"])
        meta = dict(meta, shard_split=split)
        rename = ds_to_hf
    with open(os.path.join(d, "tokens.json"), "w") as f:
        f.write('{"tokens": %s,\n "targets": %s}\n' % (json.dumps(r["tokens"].tolist()),
                                                       json.dumps(r["targets"].tolist())))
    ref = {"logits": r["logits"].contiguous(), "loss": r["loss"].reshape(1),
           "adamw_losses": torch.tensor(r["losses"], dtype=torch.float32)}
    for n, g in r["grads"].items():
        ref["grad." + rename(n)] = g.contiguous()
    for n, p in r["after"].items():
        ref["adamw." + rename(n)] = p.contiguous()
    md = dict(meta)
    md.update(case=name, seed=str(seed), route_margin=f"{r['margin']:.6g}",
              tokens_routed_otherwise_without=json.dumps(r["changed"], sort_keys=True),
              loss=f"{r['loss'].item():.9g}", untrained=",".join(rename(n) for n in r["untrained"]))
    if r["sparse"]:
        md.update(r["sparse"], adamw=json.dumps(r["adamw"]))
    # one metadata key: safetensors keeps metadata in a hash map, whose order
    # would change the bytes from run to run
    save_file(ref, os.path.join(d, "ref.safetensors"),
              metadata={"fixture": json.dumps(md, sort_keys=True)})
    return md


def write_hf_shards(ck, tensors, nshards, n_layers):
    """model-00001-of-00002.safetensors and model-00002-of-00002.safetensors
    plus model.safetensors.index.json. The model's own tensors (sorted by
    name) are cut near half their bytes, between one FP8 weight (first file)
    and its weight_scale_inv (second file), so that a layer and even one
    weight span both files; the MTP layer's tensors go to the second file."""
    assert nshards == 2
    names = sorted(tensors)
    mtp = [n for n in names if (layer_index(n) or 0) >= n_layers]
    main = [n for n in names if n not in mtp]
    size = lambda n: tensors[n].numel() * tensors[n].element_size()
    total = sum(size(n) for n in names)
    half, acc, cut = sum(size(n) for n in main) / 2, 0, None
    for i, n in enumerate(main):
        acc += size(n)
        if (acc >= half and n.endswith(".weight") and i + 1 < len(main)
                and main[i + 1] == n + "_scale_inv"):
            cut = i + 1
            break
    assert cut is not None
    shards = [main[:cut], main[cut:] + mtp]
    weight_map = {}
    for k, part in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{nshards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(ck, fn), metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fn
    write_json(os.path.join(ck, "model.safetensors.index.json"),
               {"metadata": {"total_size": total},
                "weight_map": {n: weight_map[n] for n in names}})
    return main[cut - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_py", help="path of DeepSeek-V3's inference/model.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "data", "v3"))
    ap.add_argument("--case", action="append", choices=sorted(CASES),
                    help="only this case (repeatable; default all)")
    ap.add_argument("--tries", type=int, default=50, help="seeds tried per case")
    opt = ap.parse_args()

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    mod = load_model_py(opt.model_py)
    meta = {"torch": torch.__version__, "model_py_sha256": file_sha256(opt.model_py),
            "adamw": json.dumps({k: v for k, v in ADAMW.items()}), "adamw_steps": str(ADAMW_STEPS)}
    out = os.path.normpath(opt.out)
    for name in opt.case or list(CASES):
        case = CASES[name]
        for seed in range(case["seed"], case["seed"] + opt.tries):
            r = run_case(mod, name, case, seed)
            if not isinstance(r, str):
                break
            print(f"{name}: seed {seed}: {r}, next seed")
        else:
            sys.exit(f"make_v3_fixtures: {name}: no seed in {opt.tries} tries keeps routing margins over "
                     f"{MARGIN:g} with every expert used")
        md = write_case(out, name, case, r, seed, meta)
        print(f"{name}: seed {seed}, loss {md['loss']}, route margin {md['route_margin']}, "
              f"tokens routed otherwise without {md['tokens_routed_otherwise_without']}, "
              f"adamw losses {' '.join(f'{x:.6f}' for x in r['losses'])}")


if __name__ == "__main__":
    main()
