#!/usr/bin/env python3
"""Check the DeepSeek-V3 fixtures under tests/data/v3 against DeepSeek's model.py.

    check_v3_fixtures.py MODEL_PY [--data DIR] [--case NAME ...]

A sanity check of the files make_v3_fixtures.py wrote (needs PyTorch and
safetensors, like the generator; the tests do not run it). For each case it
reads the checkpoint folder back from disk as a loader would (DeepSeek's or
Hugging Face's config keys and names, shards through the index, BF16 and FP8
block-scaled tensors dequantised), loads it into model.Transformer, and
re-runs model.py's own Transformer.forward (the last position), the forward
of every position, the loss, the gradients and the five
AdamW steps on tokens.json, comparing each with ref.safetensors under the
issue's tolerances. It also checks that every reference name is a checkpoint
name. Exit 0 when every case passes, 1 otherwise.
"""

import argparse
import json
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_v3_fixtures as mk  # noqa: E402


def read_checkpoint(ck):
    """(layout, ModelArgs dict, {model.py name: float32 tensor}, [unused names],
    {name as stored: None}) of checkpoint folder CK."""
    with open(os.path.join(ck, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(ck, "model.safetensors.index.json")
    if os.path.exists(index):
        layout = "hf"
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
        args = mk.model_args_from_hf(cfg)
    else:
        layout = "deepseek"
        files = ["model0-mp1.safetensors"]
        args = {k: v for k, v in cfg.items() if k != "dtype"}
    raw = {}
    for fn in files:
        with safe_open(os.path.join(ck, fn), framework="pt") as f:
            for k in f.keys():
                raw[k] = f.get_tensor(k)
    if layout == "hf":
        assert set(raw) == set(wmap), "index weight_map and shard contents differ"
        for k, fn in wmap.items():
            with safe_open(os.path.join(ck, fn), framework="pt") as f:
                assert k in f.keys(), f"{k} not in {fn} as the index says"
    stored_names = set(raw)
    rename = mk.hf_to_ds if layout == "hf" else (lambda n: n)
    unused, ds = [], {}
    for k, t in raw.items():
        n = rename(k)
        if n is None or (layout == "hf" and (mk.layer_index(k) or 0) >= args["n_layers"]):
            unused.append(k)
            continue
        ds[n] = t
    weights = {}
    for n, t in ds.items():
        if n.endswith(".scale"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            weights[n] = mk.fp8_dequantize(t, ds[n[:-len("weight")] + "scale"])
        else:
            weights[n] = t.float()
    return layout, args, weights, sorted(unused), stored_names


def rel_l2(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_case(mod, d):
    ck = os.path.join(d, "checkpoint")
    layout, args_d, weights, unused, stored = read_checkpoint(ck)
    with open(os.path.join(d, "tokens.json")) as f:
        tj = json.load(f)
    tokens, targets = torch.tensor(tj["tokens"]), torch.tensor(tj["targets"])
    has_bias = any(n.endswith("gate.bias") for n in weights)
    args, model = mk.build_model(mod, args_d, tokens.size(0), has_bias)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    named = list(model.named_parameters())
    trained = [(n, p) for n, p in named if p.requires_grad]
    to_file = mk.ds_to_hf if layout == "hf" else (lambda n: n)

    with safe_open(os.path.join(d, "ref.safetensors"), framework="pt") as f:
        ref = {k: f.get_tensor(k) for k in f.keys()}
        fixture = json.loads(f.metadata()["fixture"])
    adamw = json.loads(fixture["adamw"])   # the case's settings (v3_sparse: lr 1e-2)
    adamw["betas"] = tuple(adamw["betas"])
    for k in ref:
        if k.startswith(("grad.", "adamw.")):
            name = k.split(".", 1)[1]
            assert name in stored, f"{k}: {name} is not a checkpoint name"
    assert {k[5:] for k in ref if k.startswith("grad.")} == {to_file(n) for n, _ in trained}

    # model.py's own Transformer.forward (last position, inference_mode)
    with torch.no_grad():
        last = model(tokens)
    res = {"last_position": ((last - ref["logits"][:, -1]).abs().max()
                             / ref["logits"].abs().max()).item()}
    opt = torch.optim.AdamW([p for _, p in trained], foreach=False, **adamw)
    losses = []
    for step in range(mk.ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        logits = mk.forward_all(model, tokens)
        loss = mk.loss_of(logits, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            res["logits"] = ((logits.detach() - ref["logits"]).abs().max()
                             / ref["logits"].abs().max()).item()
            res["loss"] = abs(loss.item() - ref["loss"].item()) / abs(ref["loss"].item())
            # (grad None: an expert without tokens, stored as zeros)
            res["grad"] = max(rel_l2(p.grad if p.grad is not None else torch.zeros_like(p),
                                     ref["grad." + to_file(n)]) for n, p in trained)
        opt.step()
    res["adamw_losses"] = (torch.tensor(losses) - ref["adamw_losses"]).abs().max().item()
    res["adamw_params"] = max(rel_l2(p.detach(), ref["adamw." + to_file(n)]) for n, p in trained)
    limits = {"last_position": 1e-5, "logits": 1e-4, "loss": 1e-5, "grad": 1e-3, "adamw_losses": 1e-4, "adamw_params": 1e-3}
    ok = all(res[k] <= limits[k] for k in limits)
    return ok, layout, res, unused


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_py", help="path of DeepSeek-V3's inference/model.py")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", "tests", "data", "v3"))
    ap.add_argument("--case", action="append")
    opt = ap.parse_args()
    torch.set_num_threads(1)
    mod = mk.load_model_py(opt.model_py)
    data = os.path.normpath(opt.data)
    cases = opt.case or sorted(c for c in os.listdir(data)
                               if os.path.isdir(os.path.join(data, c, "checkpoint")))
    bad = 0
    for c in cases:
        ok, layout, res, unused = check_case(mod, os.path.join(data, c))
        figs = ", ".join(f"{k} {v:.3g}" for k, v in res.items())
        print(f"{c} ({layout}): {'ok' if ok else 'FAILED'}: {figs}"
              + (f"; {len(unused)} tensors not used (MTP)" if unused else ""))
        bad += not ok
    print(f"{len(cases) - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
