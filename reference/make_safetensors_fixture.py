#!/usr/bin/env python3
"""Writes reference/fixtures/safetensors/small.safetensors with the `safetensors` library itself,
for tests/core/safetensors_test.cc: tensor "f32" (2, 3) F32, "bf16" (4,) BF16, "f16" (5,) F16, each
holding 0.5 * arange(n) - 1, with metadata {"format": "pt"}.

usage: python3 reference/make_safetensors_fixture.py   (needs torch and safetensors; tests do not)
"""
import torch
from safetensors.torch import save_file

def values(n, dtype):
    return (0.5 * torch.arange(n, dtype=torch.float32) - 1).to(dtype)

save_file({"f32": values(6, torch.float32).reshape(2, 3), "bf16": values(4, torch.bfloat16),
           "f16": values(5, torch.float16)}, "reference/fixtures/safetensors/small.safetensors",
          metadata={"format": "pt"})
print("wrote reference/fixtures/safetensors/small.safetensors")
