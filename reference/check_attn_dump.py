#!/usr/bin/env python3
"""Checks an `untied attn --dump DIR` against an independent NumPy (float64) implementation of the
attention block: projections, Hugging Face rotate_half RoPE at global positions (restarting at
each document start when meta.json has doc_lens), causal softmax attention within each document
and sliding window (meta.json: doc_lens, window), standard GQA, output projection, and the
hand-written backward.

usage: python3 reference/check_attn_dump.py DIR [--rtol 1e-4]
Exits non-zero when any of y, dx, dwq, dwk, dwv, dwo differs by more than rtol * max|reference|.
"""
import json
import sys

import numpy as np


def rope_tables(positions, dim, theta):
    inv = theta ** (-np.arange(0, dim // 2, dtype=np.float64) * 2.0 / dim)
    ang = positions.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def documents(seq, doc_lens):
    """Each position's document index and its position within the document."""
    lens = doc_lens if doc_lens else [seq]
    doc = np.repeat(np.arange(len(lens)), lens)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return doc, np.arange(seq) - starts[doc]


def rope(x, cos, sin, inverse=False):  # x (S, heads, D)
    h = x.shape[-1] // 2
    s = -sin if inverse else sin
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], s[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def main():
    d = sys.argv[1]
    rtol = float(sys.argv[sys.argv.index("--rtol") + 1]) if "--rtol" in sys.argv else 1e-4
    meta = json.load(open(f"{d}/meta.json"))
    ld = lambda n: np.load(f"{d}/{n}.npy").astype(np.float64)
    x, dy, wq, wk, wv, wo = (ld(n) for n in ("x", "dy", "wq", "wk", "wv", "wo"))
    S, H, G, D = meta["seq"], meta["heads"], meta["kv_heads"], meta["head_dim"]
    g = H // G
    doc, pos = documents(S, meta.get("doc_lens", []))
    window = meta.get("window", 0)
    cos, sin = rope_tables(pos, D, meta["rope_theta"])
    q = rope((x @ wq.T).reshape(S, H, D), cos, sin)
    k = rope((x @ wk.T).reshape(S, G, D), cos, sin)
    v = (x @ wv.T).reshape(S, G, D)
    kh, vh = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # query head h uses KV head h // g
    scale = 1.0 / np.sqrt(D)
    s = np.einsum("ihd,jhd->hij", q, kh) * scale
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    visible = (j <= i) & (doc[:, None] == doc[None, :])
    if window > 0:
        visible &= i - j < window
    s = np.where(visible[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", p, vh)
    y = out.reshape(S, H * D) @ wo.T
    # backward
    dwo = dy.T @ out.reshape(S, H * D)
    dout = (dy @ wo).reshape(S, H, D)
    dp = np.einsum("ihd,jhd->hij", dout, vh)
    dvh = np.einsum("hij,ihd->jhd", p, dout)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = np.einsum("hij,jhd->ihd", ds, kh) * scale
    dkh = np.einsum("hij,ihd->jhd", ds, q) * scale
    dk = dkh.reshape(S, G, g, D).sum(2)
    dv = dvh.reshape(S, G, g, D).sum(2)
    dq = rope(dq, cos, sin, inverse=True).reshape(S, H * D)
    dk = rope(dk, cos, sin, inverse=True).reshape(S, G * D)
    dv = dv.reshape(S, G * D)
    dx = dq @ wq + dk @ wk + dv @ wv
    ref = {"y": y, "dx": dx, "dwq": dq.T @ x, "dwk": dk.T @ x, "dwv": dv.T @ x, "dwo": dwo}
    ok = True
    for name, r in ref.items():
        got = ld(name)
        err = np.abs(got - r).max()
        tol = rtol * np.abs(r).max()
        print(f"{name:4s} max|err| {err:.3e}  max|ref| {np.abs(r).max():.3e}  tol {tol:.3e}  {'ok' if err <= tol else 'FAIL'}")
        ok &= bool(err <= tol)
    print(f"{meta['strategy']} on {meta['ranks']} ranks, {meta['dtype']}: {'matches' if ok else 'DOES NOT match'} the NumPy reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
