#!/usr/bin/env python3
"""Writes the PyTorch (float64) reference of three small decoders (Llama 3 style, Qwen3 style with QK-norm, and packed documents) for tests/model/torch_fixture_test.cc:
the weights, tokens and labels it used, its loss and the gradient of every parameter.

The model is written here independently of untied, from the Hugging Face Llama definitions:
embedding; per block RMSNorm -> attention (rotate_half RoPE at positions 0..S-1, restarting at
each document with doc_lens, causal within each document, GQA with query head h reading KV head
h // (H/G)) -> residual -> RMSNorm -> SwiGLU MLP -> residual;
final RMSNorm; LM head; mean cross-entropy over labels != -100.

usage: python3 reference/make_decoder_fixtures.py OUTDIR   (writes OUTDIR/<config name>/)
Needs PyTorch (any CPU build) and NumPy. The fixtures are committed; tests do not run this.
"""
import json
import os
import sys

import numpy as np
import torch

CFGS = {
    # Llama 3 style.
    "decoder_small": dict(vocab=37, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, ffn=48,
                          rope_theta=10000.0, norm_eps=1e-5, seq=48, seed=5, qk_norm=False),
    # Qwen3 style: RMSNorm over each head of q and k (weights q_norm, k_norm) before RoPE.
    "decoder_qknorm": dict(vocab=41, hidden=32, layers=2, heads=8, kv_heads=2, head_dim=8, ffn=40,
                           rope_theta=1000000.0, norm_eps=1e-6, seq=48, seed=6, qk_norm=True),
    # Packed documents, as Hugging Face packing with position_ids: positions restart at each
    # document, attention stays inside it (block-diagonal causal), no label crosses a document.
    # A one-token document, one longer than a quarter of the sequence.
    "decoder_packed": dict(vocab=37, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, ffn=48,
                           rope_theta=10000.0, norm_eps=1e-5, seq=48, seed=7, qk_norm=False,
                           doc_lens=[5, 7, 12, 1, 23]),
}


def documents(c):
    """Each position's document and its position inside it (one document without doc_lens)."""
    lens = c.get("doc_lens") or [c["seq"]]
    doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    starts = torch.cumsum(torch.tensor([0] + lens[:-1]), 0)
    return doc, torch.arange(c["seq"]) - starts[doc]


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def rope(x, cos, sin):  # x (S, heads, D); cos, sin (S, D)
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def forward(p, tokens, labels, c):
    S, H, G, D = c["seq"], c["heads"], c["kv_heads"], c["head_dim"]
    doc, pos = documents(c)
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool)) & (doc[:, None] == doc[None, :])
    h = p["embed"][tokens]
    for l in range(c["layers"]):
        w = lambda n: p[f"layers.{l}.{n}"]
        a = rms_norm(h, w("attn_norm"), c["norm_eps"])
        q = (a @ w("wq").T).view(S, H, D)
        k = (a @ w("wk").T).view(S, G, D)
        if c["qk_norm"]:
            q = rms_norm(q, w("q_norm"), c["norm_eps"])
            k = rms_norm(k, w("k_norm"), c["norm_eps"])
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        v = (a @ w("wv").T).view(S, G, D)
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        s = torch.einsum("ihd,jhd->hij", q, k) / D ** 0.5
        s = s.masked_fill(~mask, float("-inf"))
        o = torch.einsum("hij,jhd->ihd", s.softmax(-1), v).reshape(S, H * D)
        h = h + o @ w("wo").T
        b = rms_norm(h, w("mlp_norm"), c["norm_eps"])
        h = h + (torch.nn.functional.silu(b @ w("w_gate").T) * (b @ w("w_up").T)) @ w("w_down").T
    logits = rms_norm(h, p["final_norm"], c["norm_eps"]) @ p["lm_head"].T
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="mean")


def main():
    for name, c in CFGS.items():
        write(os.path.join(sys.argv[1], name), c)


def write(out, c):
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(c["seed"])
    E, HD, GD, F, V = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["ffn"], c["vocab"]
    shapes = {"embed": (V, E)}
    for l in range(c["layers"]):
        pre = f"layers.{l}."
        shapes.update({pre + "attn_norm": (E,), pre + "wq": (HD, E), pre + "wk": (GD, E), pre + "wv": (GD, E),
                       pre + "wo": (E, HD), **({pre + "q_norm": (c["head_dim"],), pre + "k_norm": (c["head_dim"],)}
                                              if c["qk_norm"] else {}), pre + "mlp_norm": (E,), pre + "w_gate": (F, E), pre + "w_up": (F, E),
                       pre + "w_down": (E, F)})
    shapes.update({"final_norm": (E,), "lm_head": (V, E)})
    p = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            t = 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        # Round to float32 so that untied, which stores fp32 weights, starts from the same values.
        p[name] = t.float().double().requires_grad_(True)
    tokens = torch.randint(0, V, (c["seq"],), generator=g)
    labels = torch.cat([tokens[1:], torch.tensor([-100])])
    labels[c["seq"] // 3] = -100
    for end in torch.cumsum(torch.tensor(c.get("doc_lens") or [c["seq"]]), 0)[:-1]:
        labels[end - 1] = -100  # the next token starts another document
    loss = forward(p, tokens, labels, c)
    loss.backward()
    for name, t in p.items():
        np.save(f"{out}/{name}.npy", t.detach().numpy().astype(np.float32))
        np.save(f"{out}/grad.{name}.npy", t.grad.numpy().astype(np.float32))
    np.save(f"{out}/tokens.npy", tokens.numpy().astype(np.float32))
    np.save(f"{out}/labels.npy", labels.numpy().astype(np.float32))
    json.dump(dict(c, loss=loss.item(), torch=torch.__version__), open(f"{out}/config.json", "w"), indent=1)
    print(f"loss {loss.item():.12f}; wrote {len(p)} parameters and their gradients to {out}")


if __name__ == "__main__":
    main()
