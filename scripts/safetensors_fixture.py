#!/usr/bin/env python3
"""Writes tests/data/safetensors/reference.safetensors with the reference
safetensors library (safetensors.numpy, ml_dtypes for BF16 and F8_E4M3),
so the tests read a file luapipe did not write. Run once; the tests need
none of this (the file is committed):

  python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install safetensors numpy ml_dtypes
  /tmp/stvenv/bin/python scripts/safetensors_fixture.py

Each stored tensor X of a dtype other than F32 has a companion
"X.expected" (F32) holding numpy's float32 value of it; the FP8 weights'
companions hold q * s per 128 x 128 (or `block`) block, computed in
float32 as DeepSeek's weight_dequant does. "bf16.source" (F32) and
"bf16.rounded" (BF16, ml_dtypes' round to nearest even) check the writer.
"""
import os
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

rng = np.random.default_rng(20261206)
t = {}

t["f32"] = np.array([[1.5, -0.0, 3e-41], [np.inf, -2.25, 1e30]], dtype=np.float32)

f16 = np.array([1.0, -2.0, 65504.0, 2.0**-24, np.inf, 1 / 3], dtype=np.float16)
t["f16"] = f16
t["f16.expected"] = f16.astype(np.float32)

bf = rng.standard_normal((2, 4)).astype(np.float32).astype(ml_dtypes.bfloat16)
t["bf16"] = bf
t["bf16.expected"] = bf.astype(np.float32)

# exact halfway cases (ties to even, both ways), just above and below
# half, a NaN, the largest float (rounds to inf), plus random values
ties = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF80C000,
                 0x7F7FFFFF, 0x7FC00000, 0x00018000], dtype=np.uint32).view(np.float32)
src = np.concatenate([ties, rng.standard_normal(56).astype(np.float32) * 100])
t["bf16.source"] = src
t["bf16.rounded"] = src.astype(ml_dtypes.bfloat16)


def block_scaled(name, rows, cols, block, scale_name):
    q = np.clip(rng.standard_normal((rows, cols)) * 64, -440, 440).astype(np.float32)
    q = q.astype(ml_dtypes.float8_e4m3fn)
    br, bc = -(-rows // block), -(-cols // block)
    s = (rng.random((br, bc)) * 0.01 + 0.001).astype(np.float32)
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:rows, :cols]
    t[name] = q
    t[scale_name] = s
    t[name + ".expected"] = q.astype(np.float32) * full


# DeepSeek's converted names (.scale), blocks of 128 with partial edges;
# Hugging Face's (_scale_inv) with blocks of 4
block_scaled("layers.0.attn.wq.weight", 129, 131, 128, "layers.0.attn.wq.scale")
block_scaled("model.layers.0.self_attn.q_proj.weight", 6, 10, 4,
             "model.layers.0.self_attn.q_proj.weight_scale_inv")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data",
                   "safetensors", "reference.safetensors")
save_file(t, out, metadata={"format": "pt", "made_by": "scripts/safetensors_fixture.py"})
print("wrote", os.path.normpath(out), os.path.getsize(out), "bytes", file=sys.stderr)
