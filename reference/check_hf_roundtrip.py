#!/usr/bin/env python3
"""Loads a model directory that `untied train --save-hf DIR` wrote with transformers itself and
prints its loss on the token sequence of reference/fixtures/hf_llama_tiny/expected.json, to set
against untied's loss on the same tokens (`untied train --hf-model DIR --data tokens` with those
tokens, step 1 before its update).

usage: python3 reference/check_hf_roundtrip.py DIR   (needs torch and transformers)
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

tokens = torch.tensor([json.load(open("reference/fixtures/hf_llama_tiny/expected.json"))["tokens"]])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
with torch.no_grad():
    print(f"transformers loss {model(input_ids=tokens, labels=tokens).loss.item():.7f}")
