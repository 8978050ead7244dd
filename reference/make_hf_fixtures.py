#!/usr/bin/env python3
"""Writes tiny random Hugging Face model directories with transformers itself, for
tests/train/hf_weights_test.cc and tests/train/evaluator_test.cc:
  hf_llama_tiny  Llama 3: GQA, untied embeddings, rope_scaling llama3 (its three wavelength bands
                 all within the sequence: theta 100, head_dim 8, original_max_position_embeddings
                 64), float32, saved as sharded safetensors (model.safetensors.index.json);
  hf_qwen3_tiny  Qwen3: QK-norm, tied embeddings (no lm_head.weight in the file), GQA, bfloat16
                 tensors in one model.safetensors, the config as transformers 5 writes it.
Each has expected.json with a token sequence and transformers' own loss on it (labels = the
tokens, shifted inside transformers) and logits.npy, transformers' float32 logits (S, V) for it;
hf_qwen3_tiny also grads/NAME.npy, the gradient of that loss for every parameter.

usage: python3 reference/make_hf_fixtures.py   (needs torch and transformers; tests do not)
"""
import json
import os

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

OUT = "reference/fixtures/hf_llama_tiny"
QWEN = "reference/fixtures/hf_qwen3_tiny"


def write_logits(model, tokens, out):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0].float().numpy()
    np.save(f"{out}/logits.npy", logits.astype(np.float32))


def qwen3():
    torch.manual_seed(12)
    cfg = Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=512, tie_word_embeddings=True, rope_theta=1000.0,
                      use_sliding_window=False, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            elif "norm" in name:  # non-trivial norm weights, the q/k norms' included
                p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16)
    os.makedirs(QWEN, exist_ok=True)
    model.save_pretrained(QWEN, safe_serialization=True)
    # The reference is the model in float32 from the bfloat16 weights it saved (untied reads
    # them as float32 too).
    model = Qwen3ForCausalLM.from_pretrained(QWEN, dtype=torch.float32).eval()
    tokens = torch.randint(0, 80, (1, 60), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item()}, open(f"{QWEN}/expected.json", "w"), indent=1)
    write_logits(model, tokens, QWEN)
    # Every parameter's gradient of that loss: the tied embedding's is the sum of its two uses.
    model.zero_grad()
    model(input_ids=tokens, labels=tokens).loss.backward()
    os.makedirs(f"{QWEN}/grads", exist_ok=True)
    for name, p in model.named_parameters():
        np.save(f"{QWEN}/grads/{name}.npy", p.grad.float().numpy().astype(np.float32))
    print(f"qwen3 loss {out.loss.item():.10f}; wrote {QWEN}")


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
    write_logits(model, tokens, OUT)
    print(f"llama loss {out.loss.item():.10f}; wrote {OUT}")
    qwen3()


if __name__ == "__main__":
    main()
