#!/usr/bin/env python3
"""The UPipe attention block in PyTorch on gloo, beside `untied attn`, same shapes.

The peer runs the same algorithm as untied's UPipe block, written the way a PyTorch user would:
per stage of U query heads (and their U/group KV heads), project x to q, k, v, apply RoPE,
all-to-all sequence -> heads, scaled_dot_product_attention (causal, GQA), all-to-all heads ->
sequence; then the output projection. Each stage runs under torch.utils.checkpoint, so the
backward recomputes its projections and attention, as UPipe does. Both sides compute y, dx and
every weight gradient.

It then runs `mpirun -np R untied attn` with the same S, heads, U, dtype and threads, and prints
forward, backward and peak memory per rank side by side: the peer's peak resident memory
(ru_maxrss) and untied's, both as the whole process and above the process after its inputs and
weights exist (the peer's baseline is measured; untied's is its parameters + gradients tags).

Optional: needs torch 2.5 or later; not a test dependency.

usage: python3 reference/bench_upipe_peer.py [--seq 4096] [--ranks 2] [--upipe-heads 8] [--dtype f32]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from untied_binary import default_untied

PRESETS = {"llama3-8b": dict(E=4096, H=32, G=8, D=128), "qwen3-32b": dict(E=5120, H=64, G=8, D=128)}


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peer_rank(rank, a, init_file, out_path):
    import torch
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=a.ranks)
    P = a.ranks
    p = PRESETS[a.heads_like]
    E, H, G, D = p["E"], p["H"], p["G"], p["D"]
    S, U = a.seq, a.upipe_heads
    group = H // G
    assert S % P == 0 and H % U == 0 and U % (P * group) == 0, "U must be a multiple of ranks x (H/G)"
    L, Ukv = S // P, U // group
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    gen = torch.Generator().manual_seed(1 + rank)
    x = (torch.randn(L, E, generator=gen) * 0.5).to(dt).requires_grad_()
    dy = torch.randn(L, E, generator=gen).to(dt)
    wgen = torch.Generator().manual_seed(7)
    def weight(rows):
        return (torch.randn(rows, E, generator=wgen) / E**0.5).to(dt).requires_grad_()
    wq, wk, wv = weight(H * D), weight(G * D), weight(G * D)
    wo = (torch.randn(E, H * D, generator=wgen) / (H * D) ** 0.5).to(dt).requires_grad_()
    pos = torch.arange(rank * L, (rank + 1) * L, dtype=torch.float64)
    inv = 500000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().to(dt)[:, None, :], ang.sin().to(dt)[:, None, :]

    def rope(t):  # (L, h, D), rotate-half pairs
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)

    class A2A(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            out = torch.empty_like(inp)
            dist.all_to_all_single(out, inp.contiguous())
            return out

        @staticmethod
        def backward(ctx, g):
            out = torch.empty_like(g)
            dist.all_to_all_single(out, g.contiguous())
            return out

    def seq_to_heads(t, h):  # (L, h, D) -> (1, h/P, S, D)
        t = A2A.apply(t.view(L, P, h // P, D).permute(1, 0, 2, 3).contiguous())  # (P src, L, h/P, D)
        return t.reshape(S, h // P, D).permute(1, 0, 2).unsqueeze(0)

    def heads_to_seq(o, h):  # (1, h/P, S, D) -> (L, h*D)
        o = o.squeeze(0).permute(1, 0, 2).reshape(P, L, h // P, D).contiguous()  # to rank = seq chunk
        o = A2A.apply(o)  # (P src = head chunk, L, h/P, D)
        return o.permute(1, 0, 2, 3).reshape(L, h * D)

    def stage(x, wq_s, wk_s, wv_s):
        q = rope((x @ wq_s.T).view(L, U, D))
        k = rope((x @ wk_s.T).view(L, Ukv, D))
        v = (x @ wv_s.T).view(L, Ukv, D)
        o = torch.nn.functional.scaled_dot_product_attention(
            seq_to_heads(q, U), seq_to_heads(k, Ukv), seq_to_heads(v, Ukv), is_causal=True, enable_gqa=group > 1)
        return heads_to_seq(o, U)

    def block():
        outs = []
        for s in range(H // U):
            outs.append(checkpoint(stage, x, wq[s * U * D:(s + 1) * U * D], wk[s * Ukv * D:(s + 1) * Ukv * D],
                                   wv[s * Ukv * D:(s + 1) * Ukv * D], use_reentrant=False))
        return torch.cat(outs, dim=1) @ wo.T

    base = rss_mib()
    fwd, bwd = [], []
    for it in range(a.warmup + a.repeat):
        for t in (x, wq, wk, wv, wo):
            t.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        y = block()
        dist.barrier()
        t1 = time.perf_counter()
        y.backward(dy)
        dist.barrier()
        t2 = time.perf_counter()
        del y
        if it >= a.warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res = dict(rank=rank, fwd_ms=statistics.median(fwd), bwd_ms=statistics.median(bwd), peak_rss_mib=peak,
               base_rss_mib=base, torch=torch.__version__)
    with open(out_path + f".{rank}", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def run_untied(a):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    timer = shutil.which("time") or "/usr/bin/time"
    with tempfile.TemporaryDirectory() as d:
        # Each rank under GNU time, which writes its peak RSS (KiB) to rss.<rank>.
        wrap = f'exec {timer} -f "%M" -o {d}/rss.$OMPI_COMM_WORLD_RANK "$@"'
        cmd = ["mpirun", "-np", str(a.ranks), "--oversubscribe", "--bind-to", "none", "sh", "-c", wrap, "sh",
               a.untied, "attn", "--heads-like", a.heads_like, "--seq", str(a.seq), "--upipe-heads",
               str(a.upipe_heads), "--dtype", a.dtype, "--threads", str(a.threads), "--warmup", str(a.warmup),
               "--json"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            sys.exit("untied attn failed:\n" + res.stdout + res.stderr)
        j = json.loads([l for l in res.stdout.splitlines() if l.startswith("{")][-1])
        rss = []
        for r in range(a.ranks):
            with open(os.path.join(d, f"rss.{r}")) as f:
                rss.append(int(f.read().split()[-1]) / 1024)
    return j, max(rss)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--untied", default=default_untied())
    p.add_argument("--heads-like", default="llama3-8b", choices=sorted(PRESETS))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--upipe-heads", type=int, default=8)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="per rank")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    try:
        import torch  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("bench_upipe_peer.py needs torch (pip install torch): it is the peer being compared")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res")
        mp.spawn(peer_rank, args=(a, os.path.join(d, "init"), out), nprocs=a.ranks, join=True)
        peer = [json.load(open(out + f".{r}")) for r in range(a.ranks)]
    ours, our_rss = run_untied(a)
    pf, pb = max(r["fwd_ms"] for r in peer), max(r["bwd_ms"] for r in peer)
    prss = max(r["peak_rss_mib"] for r in peer)
    pbase = max(r["base_rss_mib"] for r in peer)
    tags = ours["peak_bytes_by_tag"]
    our_work = (ours["peak_bytes"] - tags["parameters"]) / 2**20
    print(f"UPipe block, {a.heads_like} heads, S={a.seq}, U={a.upipe_heads}, {a.ranks} ranks x {a.threads} threads, "
          f"{a.dtype}; torch {peer[0]['torch']} on gloo vs untied ({ours['device']}); max over ranks")
    print(f"{'':22} {'untied':>12} {'torch':>12} {'torch/untied':>13}")
    rows = [("forward ms", ours["fwd_ms"], pf), ("backward ms", ours["bwd_ms"], pb),
            ("fwd+bwd ms", ours["fwd_ms"] + ours["bwd_ms"], pf + pb),
            ("peak RSS MiB", our_rss, prss),
            ("peak above inputs MiB", our_work, prss - pbase)]
    for name, u, t in rows:
        print(f"{name:22} {u:12.1f} {t:12.1f} {t / u:13.2f}")
    print("(above inputs: untied's allocator peak less its parameters; the peer's peak RSS less its RSS once x and "
          "the weights exist; both include the weight gradients and the block's activations)")


if __name__ == "__main__":
    main()
