#!/usr/bin/env python3
"""Check a sharded Hugging Face folder as PyTorch users read it.

    check_hf_shards.py SAVED [ORIGINAL]

SAVED holds model.safetensors.index.json and the shards it names (what
luapipe's models.save writes for a model loaded from such a folder). Reads
the index as transformers does (weight_map: tensor -> file, metadata.
total_size), every shard with safetensors.torch.load_file, and checks that
each shard holds exactly the tensors the map gives it, that total_size is
the sum of the tensors' bytes, and, with ORIGINAL, that every saved tensor
is in the file that held it there. Needs torch and safetensors (not a
dependency of luapipe; its tests read the shards with luapipe's reader).
"""
import json
import os
import sys

from safetensors.torch import load_file


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n")[2].strip())
    d = sys.argv[1]
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    wm = idx["weight_map"]
    total, seen = 0, set()
    for f in sorted(set(wm.values())):
        for k, t in load_file(os.path.join(d, f)).items():
            if wm.get(k) != f:
                sys.exit(f"{d}/{f}: holds {k}, which the index puts in {wm.get(k)}")
            seen.add(k)
            total += t.numel() * t.element_size()
    if seen != set(wm):
        sys.exit(f"{d}: the index names tensors no shard holds: {sorted(set(wm) - seen)[:5]}")
    if idx.get("metadata", {}).get("total_size") != total:
        sys.exit(f"{d}: metadata.total_size {idx.get('metadata', {}).get('total_size')}, "
                 f"the tensors have {total} bytes")
    if len(sys.argv) == 3:
        orig = json.load(open(os.path.join(sys.argv[2], "model.safetensors.index.json")))["weight_map"]
        moved = [k for k, f in wm.items() if k in orig and orig[k] != f]
        if moved:
            sys.exit(f"{d}: {len(moved)} tensors in another shard than in {sys.argv[2]}, e.g. {moved[0]}")
    print(f"{d}: ok: {len(wm)} tensors in {len(set(wm.values()))} shards, total_size {total}")


if __name__ == "__main__":
    main()
