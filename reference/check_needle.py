#!/usr/bin/env python3
"""The needle's key log-likelihood against transformers: untied eval --needle on a Hugging Face
model directory (reference/fixtures/sft/llama: a tiny Llama with a Llama-3-style tokenizer) dumps
its sequences; transformers (fp32) scores the same tokens; the summed log-likelihood of each
sequence's key tokens, and whether each key token is the argmax, must agree (1e-5 relative).

usage: python3 reference/check_needle.py UNTIED   (needs torch and transformers; tests do not)
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sft", "llama")


def main():
    untied = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "needle.json")
        out = subprocess.run([untied, "eval", "--hf-model", MODEL, "--needle", "--needle-lengths", "256,512",
                              "--needle-depths", "0,50,100", "--needle-trials", "1", "--json", "--needle-dump", dump,
                              "--ranks", "2"], capture_output=True, text=True, check=True).stdout
        table = json.loads(out)
        seqs = json.load(open(dump))
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    worst = 0.0
    for cell, s in zip(table["cells"], seqs):
        ids = torch.tensor([s["tokens"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
        b, e = s["answer_begin"], s["answer_end"]
        ll = sum(logp[p - 1, s["tokens"][p]].item() for p in range(b, e))
        right = sum(int(logp[p - 1].argmax().item() == s["tokens"][p]) for p in range(b, e))
        rel = abs(ll - cell["loglik"]) / abs(ll)
        worst = max(worst, rel)
        assert rel < 1e-5, (cell, ll, rel)
        assert right == round(cell["accuracy"] * cell["key_tokens"]), (cell, right)
        print(f"length {cell['length']:4}, depth {cell['depth']:3}%: key {s['key']} ({e - b} tokens), "
              f"log-likelihood untied {cell['loglik']:.6f}, transformers {ll:.6f}")
    print(f"{len(seqs)} haystacks: the key tokens' log-likelihood equals transformers' within {worst:.1e} relative")


if __name__ == "__main__":
    main()
