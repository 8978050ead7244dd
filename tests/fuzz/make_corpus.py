#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/NAME/): small valid inputs of each
format, from the fixtures or written here with the formats' own layouts.
usage: python3 tests/fuzz/make_corpus.py   (from the repository root; standard library only)"""
import json
import os
import shutil
import struct

OUT = "tests/fuzz/corpus"
FIX = "reference/fixtures"


def put(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def token_file(tokens, vocab, width, starts=None):  # include/untied/train/token_file.h
    version = 1 if starts is None else 2
    b = b"UNTIEDTK" + struct.pack("<IIQQ", version, width, len(tokens), vocab)
    b += b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in tokens)
    if starts is not None:
        b += struct.pack("<Q", len(starts)) + b"".join(struct.pack("<Q", s) for s in starts)
    return b


def checkpoint(params):  # src/train/checkpoint.cc: rank file, FNV-1a 64 checksum at the end
    ident = "batch=1 model tiny V=16 E=4"
    b = b"UNTIEDCK" + struct.pack("<IIIq", 1, 1, 0, 1) + struct.pack("<Q", len(ident)) + ident.encode()
    b += struct.pack("<Q", len(params))
    for name, n in params:
        b += struct.pack("<Q", len(name)) + name.encode() + struct.pack("<q", n)
        b += b"".join(struct.pack("<f", 0.5 * i) for i in range(3 * n))
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return b + struct.pack("<Q", h)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    put("safetensors", "small.safetensors", open(f"{FIX}/safetensors/small.safetensors", "rb").read())
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                         "__metadata__": {"format": "pt"}}).encode()
    put("safetensors", "bf16.safetensors", struct.pack("<Q", len(header)) + header + bytes(range(12)))
    put("token_file", "v1.tok", token_file([1, 2, 3, 4, 5, 6, 7], 10, 2))
    put("token_file", "v2.tok", token_file([9, 1, 2, 9, 3, 4, 5, 9, 6], 10, 2, [0, 3, 7]))
    put("token_file", "wide.tok", token_file([70000, 1, 65537], 70001, 4, [0, 1]))
    put("checkpoint", "rank.bin", checkpoint([("embed", 4), ("final_norm", 2)]))
    for m in ("hf_llama_tiny", "hf_qwen3_tiny", "hf_mistral_tiny", "hf_qwen2_tiny", "hf_qwen3moe_tiny", "hf_mixtral_tiny"):
        put("hf_config", f"{m}.json", open(f"{FIX}/{m}/config.json").read())
    put("tokenizer_json", "whitespace_probe.json", open(f"{FIX}/tokenizers/whitespace_probe/tokenizer.json").read())
    tiny = {"version": "1.0", "added_tokens": [{"id": 6, "content": "<|endoftext|>", "special": True,
                                               "single_word": False, "lstrip": False, "rstrip": False,
                                               "normalized": False}],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġa": 4, "Ġab": 5},
                      "merges": [["a", "b"], ["Ġ", "a"], ["Ġa", "b"]], "ignore_merges": False,
                      "byte_fallback": False, "unk_token": None}}
    put("tokenizer_json", "tiny.json", json.dumps(tiny))
    put("config_file", "lines.conf", "# a comment\nseq = 4096\nlr=0.001\nprogress = false  # trailing\n")
    put("config_file", "object.json", json.dumps({"seq": 8192, "lr": "3e-4", "progress": True}))
    for s in ("llama3_style", "qwen_style"):
        put("encode", f"{s}.txt", open(f"{FIX}/tokenizers/{s}/sample.txt", "rb").read())
    for i, line in enumerate([["--seq", "4096", "--flag"], ["--seq=8K", "--mem-budget", "2G", "--no-flag"],
                              ["--name", "x y", "--mem-budget=512M"], ["--help"], ["--bogus", "1"],
                              ["--seq=999999919999998m"]]):  # found by the fuzzer: K/M overflowed int64
        put("flags", f"line{i}", "\0".join(line))


if __name__ == "__main__":
    main()
