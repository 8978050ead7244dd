#!/usr/bin/env python3
"""The round trip through transformers, end to end: import a Hugging Face model directory into
untied, train it 10 steps, write it back with --save-hf, then load that with transformers itself
and compare its loss and logits with untied's evaluation of the same directory.

  1. writes the fixture's token sequence (FIXTURE/expected.json) as an untied token file;
  2. untied train --hf-model FIXTURE --data tokens ... --steps 10 --save-hf OUT [--save-hf-dtype D];
  3. untied eval --hf-model OUT --dump-logits (untied's loss and logits of the trained model);
  4. transformers: AutoModelForCausalLM.from_pretrained(OUT) in float32, its loss and logits.

usage: python3 reference/check_hf_roundtrip.py UNTIED FIXTURE [f32|bf16] [RANKS] [STRATEGY]
       (needs torch and transformers; the tests do not)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def write_tokens(path, tokens, vocab):
    with open(path, "wb") as f:  # token_file.h, version 1, 16-bit tokens
        f.write(b"UNTIEDTK" + struct.pack("<IIQQ", 1, 2, len(tokens), vocab))
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def main():
    untied, fixture = sys.argv[1], sys.argv[2]
    dtype = sys.argv[3] if len(sys.argv) > 3 else "f32"
    ranks = sys.argv[4] if len(sys.argv) > 4 else "2"
    strategy = sys.argv[5] if len(sys.argv) > 5 else "upipe"
    tokens = json.load(open(f"{fixture}/expected.json"))["tokens"]
    vocab = json.load(open(f"{fixture}/config.json"))["vocab_size"]
    seq = str(len(tokens))
    with tempfile.TemporaryDirectory() as d:
        tok, out, logits = f"{d}/t.tok", f"{d}/out", f"{d}/logits.npy"
        write_tokens(tok, tokens, vocab)
        launch = ["mpirun", "--oversubscribe", "-np", ranks, untied]
        subprocess.run(launch + ["train", "--hf-model", fixture, "--data", "tokens", "--data-path", tok, "--seq", seq,
                                 "--steps", "10", "--batch", "1", "--warmup", "0", "--lr", "0.003", "--strategy",
                                 strategy, "--no-progress", "--save-hf", out, "--save-hf-dtype", dtype], check=True,
                       stdout=subprocess.DEVNULL)
        ev = json.loads(subprocess.run(launch + ["eval", "--hf-model", out, "--data", "tokens", "--data-path", tok,
                                                 "--seq", seq, "--strategy", strategy, "--json", "--dump-logits",
                                                 logits], check=True, capture_output=True, text=True).stdout)
        ours = np.load(logits)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        with torch.no_grad():
            res = model(input_ids=torch.tensor([tokens]), labels=torch.tensor([tokens]))
        theirs = res.logits[0].numpy()
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"{os.path.basename(fixture)} ({dtype}, {ranks} ranks, {strategy}), after 10 steps: "
              f"untied loss {ev['loss']:.7f}, transformers loss {res.loss.item():.7f} "
              f"(relative difference {abs(ev['loss'] - res.loss.item()) / res.loss.item():.2e}); "
              f"logits max |diff| / max |logit| {err:.2e}")


if __name__ == "__main__":
    main()
