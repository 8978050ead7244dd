#!/usr/bin/env python3
"""A complete Hugging Face directory out, checked with transformers itself: for the Llama-3-style
and the Qwen3 model directories of reference/fixtures/sft (tokenizer.json, tokenizer_config.json,
generation_config.json and chat_template.jinja beside the weights), untied fine-tunes 4 steps with
--save-hf and checkpoints every 2 steps, and exports step 2; then each written directory must

  - load with AutoTokenizer and give the source tokenizer's ids for a sample text and the source's
    apply_chat_template ids for a conversation;
  - load with AutoModelForCausalLM in the dtype its config.json names, and generate greedily.

usage: python3 reference/check_hf_export.py UNTIED   (needs torch and transformers; tests do not)
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sft")
TEXT = "The quick brown fox jumps over the lazy dog. Die Größe der Straße: 3,50 €. 你好，世界！"
CHAT = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Germany?"}]


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    untied = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        for model in ("llama", "qwen3"):
            src = os.path.join(FIXTURES, model)
            data = os.path.join(d, f"{model}.tok")
            run(untied, "prepare", "--tokenizer", src, "--format", "messages", "--output", data, "--no-progress",
                os.path.join(FIXTURES, "samples_chat.jsonl"))
            out, ck, exp = (os.path.join(d, f"{model}_{x}") for x in ("out", "ck", "exp"))
            run(untied, "train", "--hf-model", src, "--data", "tokens", "--data-path", data, "--seq", "256",
                "--steps", "4", "--batch", "2", "--lr", "1e-3", "--ranks", "2", "--no-progress", "--checkpoint-dir", ck,
                "--save-every", "2", "--save-hf", out)
            said = run(untied, "export", "--checkpoint-dir", ck, "--out", exp, "--step", "2").strip()
            source_tok = AutoTokenizer.from_pretrained(src)
            want_ids = source_tok(TEXT)["input_ids"]
            want_chat = list(source_tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"])
            for name, path in (("--save-hf", out), ("export --step 2", exp)):
                files = sorted(os.listdir(path))
                tok = AutoTokenizer.from_pretrained(path)
                ids = tok(TEXT)["input_ids"]
                chat = list(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)["input_ids"])
                assert ids == want_ids, (model, name, ids[:10], want_ids[:10])
                assert chat == want_chat, (model, name)
                config = json.load(open(os.path.join(path, "config.json")))
                m = AutoModelForCausalLM.from_pretrained(path)
                prompt = torch.tensor([want_chat])
                gen = m.generate(prompt, max_new_tokens=8, do_sample=False,
                                 pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
                new = gen[0, prompt.shape[1]:].tolist()
                print(f"{model}, {name}: {', '.join(files)}; AutoTokenizer gives the source's ids "
                      f"({len(ids)} tokens of text, {len(chat)} of chat template); AutoModelForCausalLM "
                      f"({config.get('torch_dtype') or config.get('dtype')}, {m.dtype}) generated {len(new)} tokens: "
                      f"{tok.decode(new)!r}")
            print(f"  export said: {said}")


if __name__ == "__main__":
    main()
