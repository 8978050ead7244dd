#!/usr/bin/env python3
"""The GPU peer, on the GPU machine's own PyTorch (install nothing): what untied's CUDA attention
and training step are compared with in scripts/gpu-check (phase "peer").

  attention  torch.nn.functional.scaled_dot_product_attention with its cuDNN backend and its flash
             backend, forward and backward, at the shapes of `untied bench kernels --device cuda`
             (bf16, causal, D 128, 32 query heads, 8 KV heads with enable_gqa): TFLOP/s counted as
             untied counts them (forward 4 S^2 D H, halved when causal; backward 2.5x the forward);
  step       one training step of transformers' LlamaForCausalLM built from Llama3-8B's config with
             its layers cut (--layers), bf16, SDPA attention, activation checkpointing, AdamW:
             tokens/s, model TFLOP/s (6N + 6 L d S per token, causal; recompute not counted; N
             without the input embedding), peak allocated and reserved memory, at each S that fits.

Prints one JSON object per line (kind, backend, seq, fwd/bwd TFLOP/s; or the step's figures), and
a line saying what could not run (a backend PyTorch does not have, transformers absent, out of
memory). --dry-run runs the same code on the CPU at tiny shapes (math backend), to check the script.

usage: python3 reference/gpu_peer.py [--seqs 8K,32K,128K] [--step-seqs 64K,128K] [--layers 4] [--dry-run]
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def parse_len(s):
    s = s.strip().upper()
    return int(s[:-1]) * 1024 if s.endswith("K") else int(s)


def timed(fn, device, repeat):
    fn()  # warm-up (and the backend's plan)
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def attention(args, device, dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"math": SDPBackend.MATH} if args.dry_run else {
        "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    H, G, D = args.heads, args.kv_heads, args.head_dim
    for seq in [parse_len(s) for s in args.seqs.split(",")]:
        flops_fwd = 4.0 * seq * seq * D * H / 2  # causal
        for name, backend in backends.items():
            try:
                q = torch.randn(1, H, seq, D, device=device, dtype=dtype, requires_grad=True)
                k = torch.randn(1, G, seq, D, device=device, dtype=dtype, requires_grad=True)
                v = torch.randn(1, G, seq, D, device=device, dtype=dtype, requires_grad=True)
                with sdpa_kernel([backend]):
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                                device, args.repeat)
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    dout = torch.randn_like(out)
                    bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), device, args.repeat)
                print(json.dumps({"kind": "attention", "backend": name, "seq": seq, "heads": H, "kv_heads": G,
                                  "head_dim": D, "fwd_ms": round(fwd * 1e3, 3), "bwd_ms": round(bwd * 1e3, 3),
                                  "fwd_tflops": round(flops_fwd / fwd / 1e12, 2),
                                  "bwd_tflops": round(2.5 * flops_fwd / bwd / 1e12, 2)}), flush=True)
            except Exception as e:  # a backend this build lacks, or out of memory
                print(json.dumps({"kind": "attention", "backend": name, "seq": seq, "error": str(e)[:300]}), flush=True)
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()


def step(args, device, dtype):
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(json.dumps({"kind": "step", "error": f"transformers is not installed here: {e}"}), flush=True)
        return
    if args.dry_run:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1 << 20)
    else:  # Llama3-8B's shapes, the layers cut
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                          num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                          max_position_embeddings=1 << 22, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)
    model.gradient_checkpointing_enable()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    n_all = sum(p.numel() for p in model.parameters())
    n = n_all - cfg.vocab_size * cfg.hidden_size  # without the input embedding
    L, d = cfg.num_hidden_layers, cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    for seq in [parse_len(s) for s in args.step_seqs.split(",")]:
        try:
            ids = torch.randint(0, cfg.vocab_size, (1, seq), device=device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()

            def one():
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            t = timed(one, device, args.step_repeat)
            flops = (6.0 * n + 6.0 * L * d * seq) * seq
            rec = {"kind": "step", "seq": seq, "layers": L, "parameters": n_all, "step_s": round(t, 3),
                   "tokens_per_s": round(seq / t, 1), "model_tflops": round(flops / t / 1e12, 1)}
            if device == "cuda":
                rec["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                rec["reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
            print(json.dumps(rec), flush=True)
        except torch.OutOfMemoryError as e:
            print(json.dumps({"kind": "step", "seq": seq, "error": "out of memory: " + str(e)[:200]}), flush=True)
            break
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="8K,32K,128K")
    p.add_argument("--step-seqs", default="64K,128K,256K")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--step-repeat", type=int, default=2)
    p.add_argument("--only", choices=["attention", "step"], default=None)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    if args.dry_run:
        args.seqs, args.step_seqs, args.repeat, args.step_repeat = "256,512", "256", 1, 1
        device, dtype = "cpu", torch.float32
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_peer: no CUDA device visible to PyTorch (use --dry-run to check the script on a CPU)")
        device, dtype = "cuda", torch.bfloat16
        print(json.dumps({"kind": "env", "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                          "gpu": torch.cuda.get_device_name()}), flush=True)
    if args.only in (None, "attention"):
        attention(args, device, dtype)
    if args.only in (None, "step"):
        step(args, device, dtype)


if __name__ == "__main__":
    main()
