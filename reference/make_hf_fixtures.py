#!/usr/bin/env python3
"""Writes a tiny random Hugging Face Llama 3 model directory with transformers itself, for
tests/train/hf_weights_test.cc: GQA, untied embeddings, rope_scaling llama3 (its three wavelength
bands all within the sequence: theta 100, head_dim 8, original_max_position_embeddings 64),
float32, saved as sharded safetensors (model.safetensors.index.json). expected.json holds a token
sequence and transformers' own loss on it (labels = the tokens, shifted inside transformers).

usage: python3 reference/make_hf_fixtures.py   (needs torch and transformers; tests do not)
"""
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

OUT = "reference/fixtures/hf_llama_tiny"


def main():
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                      rope_theta=100.0, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so that attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, max_shard_size="20KB", safe_serialization=True)
    tokens = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item(),
               "logits_first_row": out.logits[0, 0, :8].tolist()}, open(f"{OUT}/expected.json", "w"), indent=1)
    print(f"loss {out.loss.item():.10f}; wrote {OUT}")


if __name__ == "__main__":
    main()
