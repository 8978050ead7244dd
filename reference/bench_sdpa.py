#!/usr/bin/env python3
"""untied's CPU flash attention beside PyTorch's scaled_dot_product_attention, same shapes.

Runs `untied bench kernels --json` and times torch.nn.functional.scaled_dot_product_attention
(forward, then backward of the same call) at the same sequence lengths, heads, KV heads
(enable_gqa), head dimension, causal mask, storage type and thread count, in this one process
after the other, and prints both side by side. FLOPs are counted as bench kernels counts them
(forward 4 S^2 D H, halved when causal; backward 2.5x the forward).

Optional: needs torch 2.5 or later (pip install torch); not a test dependency.

usage: python3 reference/bench_sdpa.py [--untied build/untied] [--seqs 1K,2K,4K] [--dtypes f32,bf16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from untied_binary import default_untied


def parse_len(s):
    s = s.strip().upper()
    mult = 1024 if s.endswith("K") else 1
    return int(s[:-1] if s.endswith("K") else s) * mult


def fwd_flops(S, H, D, causal):
    f = 4.0 * S * S * D * H
    return f / 2 if causal else f


def time_torch(torch, S, H, G, D, dtype, causal, warmup, repeat):
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, S, D, generator=gen, dtype=torch.float32).to(dtype).requires_grad_()
    k = torch.randn(1, G, S, D, generator=gen, dtype=torch.float32).to(dtype).requires_grad_()
    v = torch.randn(1, G, S, D, generator=gen, dtype=torch.float32).to(dtype).requires_grad_()
    dout = torch.randn(1, H, S, D, generator=gen, dtype=torch.float32).to(dtype)
    tf, tb = [], []
    for it in range(warmup + repeat):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=(G != H))
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        if it >= warmup:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
    backend = type(out.grad_fn).__name__
    return statistics.median(tf) * 1e3, statistics.median(tb) * 1e3, backend


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--untied", default=default_untied())
    p.add_argument("--seqs", default="1K,2K,4K")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("bench_sdpa.py needs torch (pip install torch): it is the peer being compared")
    torch.set_num_threads(a.threads)
    seqs = [parse_len(s) for s in a.seqs.split(",")]
    causal = not a.no_causal
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    banner = subprocess.run([a.untied, "bench", "kernels", "--seqs", "2", "--repeat", "1", "--warmup", "0",
                             "--threads", str(a.threads)], capture_output=True, text=True).stdout.splitlines()
    kernels = banner[0].split("|")[3].strip() if banner and banner[0].count("|") >= 4 else "?"
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{a.threads} threads; untied: {a.untied}, {kernels}")
    for dt in a.dtypes.split(","):
        cmd = [a.untied, "bench", "kernels", "--seqs", ",".join(str(s) for s in seqs), "--heads", str(a.heads),
               "--kv-heads", str(a.kv_heads), "--head-dim", str(a.head_dim), "--dtype", dt,
               "--threads", str(a.threads), "--repeat", str(a.repeat), "--json"]
        if not causal:
            cmd.append("--no-causal")
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        ours = {(r["op"], r["seq"]): r for r in json.loads(res.stdout)}
        for S in seqs:
            tf, tb, backend = time_torch(torch, S, a.heads, a.kv_heads, a.head_dim, torch_dtype[dt], causal, 1,
                                         a.repeat)
            ff = fwd_flops(S, a.heads, a.head_dim, causal)
            for op, fl, tt in (("fwd", ff, tf), ("bwd", 2.5 * ff, tb), ("fwd+bwd", 3.5 * ff, tf + tb)):
                u = ours[("attn_" + op.replace("+", "_"), S)]
                rows.append({"dtype": dt, "seq": S, "op": op, "untied_ms": u["ms"], "untied_gflops": fl / (u["ms"] * 1e6),
                             "torch_ms": tt, "torch_gflops": fl / (tt * 1e6), "speed_ratio": tt / u["ms"],
                             "torch_kernel": backend})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"H={a.heads} G={a.kv_heads} D={a.head_dim} {'causal' if causal else 'full'}; "
          "ratio = torch time / untied time (above 1: untied faster)")
    print(f"{'dtype':5} {'seq':>6} {'op':8} {'untied ms':>10} {'GFLOP/s':>8} {'torch ms':>10} {'GFLOP/s':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['dtype']:5} {r['seq']:6d} {r['op']:8} {r['untied_ms']:10.1f} {r['untied_gflops']:8.1f} "
              f"{r['torch_ms']:10.1f} {r['torch_gflops']:8.1f} {r['speed_ratio']:6.2f}")
    print("torch kernel: " + rows[0]["torch_kernel"] if rows else "")


if __name__ == "__main__":
    main()
