#!/usr/bin/env python3
"""Writes tiny random mixture-of-experts model directories with transformers itself (5.x), for the
MoE support (not read by a test yet):
  hf_qwen3moe_tiny  Qwen3-MoE (Qwen3MoeForCausalLM): 3 layers, QK-norm, GQA (4 heads, 2 kv heads,
                 head_dim 8), hidden 32, vocab 72, tied embeddings (no lm_head.weight in the file);
                 8 experts, top-2, norm_topk_prob true, moe_intermediate_size 16; decoder_sparse_step
                 1 and mlp_only_layers [1], so layers 0 and 2 are MoE and layer 1 a dense SwiGLU MLP
                 of intermediate_size 40; router_aux_loss_coef 0.01. Its config.json names the expert
                 count `num_experts`, as Qwen's checkpoints on the Hub do (transformers 5 writes
                 `num_local_experts`, its attribute_map's target; the script renames the key and checks
                 that from_pretrained reads the same config and loss from it).
  hf_qwen3moe_untied_tiny  Qwen3-MoE: 2 layers, untied embeddings (lm_head.weight in the file),
                 4 experts, top-2, norm_topk_prob FALSE (the expert outputs are weighted by the raw
                 top-k softmax probabilities, which do not sum to 1); decoder_sparse_step 2, so only
                 layer 1 is MoE ((layer + 1) % decoder_sparse_step == 0) and layer 0 is dense
                 (intermediate_size 40); router_aux_loss_coef 0.02; its config.json as transformers 5
                 writes it (`num_local_experts`).
  hf_mixtral_tiny  Mixtral (MixtralForCausalLM): 2 layers, both MoE (Mixtral has no dense layers),
                 4 experts (num_local_experts), top-2, the top-2 weights always renormalised to sum
                 to 1, intermediate_size 24 (per expert), GQA (4 heads, 2 kv heads, head_dim 8),
                 hidden 32, vocab 66, untied embeddings, sliding_window null, no QK-norm,
                 router_aux_loss_coef 0.02.
All are float32, 2-D weights and experts drawn normal(0, 0.3), norm weights uniform(0.5, 1.5),
router weights normal(0, 0.3) (router logits of std about 1.7, far from uniform routing; with std 1
the probabilities are so peaked that the k-th and (k+1)-th largest are both near 0 and closer than
1e-3 for almost every seed). The seeds are chosen so that no top-k choice is near a tie
(min_topk_margin >= 1e-3, below) and every expert gets tokens in every MoE layer, so that every
expert's gradient is non-zero.

On disk (model.safetensors; what save_pretrained writes in transformers 5.25 is already this layout,
the names real checkpoints on the Hub use, one tensor per expert; the script asserts it, rewrites the
file in this layout if a transformers version wrote something else, and asserts that from_pretrained
on the directory gives the same loss bit for bit as the model it saved). E experts, H hidden, F the
expert's intermediate size, all (out, in) like nn.Linear:
  Qwen3-MoE MoE layer L:  model.layers.L.mlp.gate.weight                     (E, H)  the router
                          model.layers.L.mlp.experts.J.gate_proj.weight      (F, H)
                          model.layers.L.mlp.experts.J.up_proj.weight        (F, H)
                          model.layers.L.mlp.experts.J.down_proj.weight      (H, F)
  Qwen3-MoE dense layer L: model.layers.L.mlp.{gate_proj,up_proj}.weight (intermediate_size, H),
                          model.layers.L.mlp.down_proj.weight (H, intermediate_size)
  Mixtral layer L:        model.layers.L.block_sparse_moe.gate.weight        (E, H)  the router
                          model.layers.L.block_sparse_moe.experts.J.w1.weight (F, H) gate
                          model.layers.L.block_sparse_moe.experts.J.w3.weight (F, H) up
                          model.layers.L.block_sparse_moe.experts.J.w2.weight (H, F) down
  (in memory transformers 5 fuses each layer's experts: mlp.experts.gate_up_proj (E, 2F, H), gate
  rows [0, F) and up rows [F, 2F), and mlp.experts.down_proj (E, H, F); Mixtral's block_sparse_moe
  is `mlp` in memory. conversion_mapping.py converts on load and save.)
The rest is as in the dense models (self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm for Qwen3-MoE,
input_layernorm, post_attention_layernorm, model.norm, model.embed_tokens, lm_head).

The MoE block (transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock), for each token's
post-attention-normed x: router_logits = x @ gate.T; p = softmax(router_logits) in float32; the
top_k experts by p (torch.topk); their weights p_top, divided by their sum when norm_topk_prob
(always for Mixtral); out = sum over the chosen J of w_J * down_J(silu(gate_J x) * up_J x).
The loss with output_router_logits=True and labels = the tokens is
  loss = ce_loss + router_aux_loss_coef * aux_loss,
ce_loss the mean next-token cross-entropy over the 47 shifted positions, and aux_loss
transformers' load_balancing_loss_func (Switch Transformer eq. 4-6) POOLED over the MoE layers:
with N = S * (number of MoE layers) rows (every MoE layer's tokens), p the softmax of each row's
router logits, f_e = (number of (row, top-k slot) choices of expert e) / N (so sum_e f_e = top_k)
and P_e = (sum over rows of p_e) / N,
  aux_loss = E * sum_e f_e * P_e
(top_k, not 1, for perfectly uniform routing; f_e is not differentiated, the gradient flows
through P_e). It is not the mean of per-layer losses; expected.json has that too
(aux_loss_layers_averaged) to tell the two apart.

Each directory holds what save_pretrained writes (config.json, model.safetensors,
generation_config.json) and
  expected.json  tokens (48, all real: no attention mask), loss (the total above), ce_loss,
                 aux_loss (before the coefficient), aux_loss_layers_averaged, router_aux_loss_coef,
                 logits_first_row (position 0, first 8), num_experts, top_k, norm_topk_prob,
                 moe_layers (the MoE layers' indices), expert_load (for each MoE layer, in the order
                 of moe_layers, the number of tokens that chose each expert: E counts summing to
                 S * top_k), min_topk_margin (the smallest p_(k) - p_(k+1), k-th minus (k+1)-th
                 largest router probability, over all tokens and MoE layers);
  logits.npy     transformers' float32 logits (S, V);
  router_logits/layer_L.npy  transformers' router logits (S, E) float32 of each MoE layer L;
  grads/NAME.npy the float32 gradient of the TOTAL loss (ce + coef * aux) for every parameter under
                 its on-disk (Hub) name above, each expert's separately (the fused gradients split);
                 experts' gradients include only the tokens routed to them; the routers' include the
                 aux term. The tied embedding's is the sum of its two uses (no lm_head.weight.npy).
The script checks, besides: a forward and loss written by hand from the on-disk tensors (router
softmax in float32, top-k, renormalisation, SwiGLU experts; the pooled load-balancing loss) against
transformers' logits (1e-4), router logits, aux loss and every gradient; ce + coef * aux == loss;
the expert loop ("eager") against transformers' default experts implementation.

usage: python3 reference/make_moe_fixtures.py [qwen3moe] [qwen3moe_untied] [mixtral]   (all three
when none is named; needs torch, transformers 5 and safetensors; tests do not)
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from make_hf_fixtures import rms_norm, rotate  # the same hand-written RMSNorm and RoPE

QWEN3MOE = "reference/fixtures/hf_qwen3moe_tiny"
QWEN3MOE_UNTIED = "reference/fixtures/hf_qwen3moe_untied_tiny"
MIXTRAL = "reference/fixtures/hf_mixtral_tiny"
ROUTER_STD = 0.3
SEQ = 48
MIN_MARGIN = 1e-3


def draw_weights(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):  # the routers
                p.normal_(0, ROUTER_STD)
            elif p.dim() >= 2:  # linear weights, embeddings and the fused experts (E, 2F, H), (E, H, F)
                p.normal_(0, 0.3)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                raise AssertionError(f"unexpected parameter {name}")


def hub_tensors(model, mixtral, grads=False):
    """The model's parameters (or their gradients) under the Hub names, each expert's separately."""
    out = {}
    for name, p in model.named_parameters():
        t = (p.grad if grads else p).detach()
        hub = name.replace(".mlp.", ".block_sparse_moe.") if mixtral else name
        if name.endswith(".experts.gate_up_proj"):
            f = t.shape[1] // 2
            pre = hub[: -len("gate_up_proj")]
            for j in range(t.shape[0]):
                out[pre + (f"{j}.w1.weight" if mixtral else f"{j}.gate_proj.weight")] = t[j, :f].contiguous()
                out[pre + (f"{j}.w3.weight" if mixtral else f"{j}.up_proj.weight")] = t[j, f:].contiguous()
        elif name.endswith(".experts.down_proj"):
            pre = hub[: -len("down_proj")]
            for j in range(t.shape[0]):
                out[pre + (f"{j}.w2.weight" if mixtral else f"{j}.down_proj.weight")] = t[j].contiguous()
        else:
            out[hub] = t.contiguous()
    return out


def ensure_hub_layout(model, out, mixtral):
    """Asserts model.safetensors holds exactly the Hub-named tensors; rewrites it so if not."""
    want = hub_tensors(model, mixtral)
    disk = load_file(f"{out}/model.safetensors")
    same = set(disk) == set(want) and all(torch.equal(disk[k], want[k]) for k in want)
    if not same:
        print(f"  save_pretrained wrote {sorted(set(disk) - set(want))[:4]}...; rewriting in the Hub layout")
        save_file(want, f"{out}/model.safetensors", metadata={"format": "pt"})
    else:
        print(f"  save_pretrained wrote the Hub layout itself ({len(disk)} tensors)")
    return same


# ---- the forward and loss by hand, from the on-disk tensors ----

def swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def hand_forward(w, cfg, tokens, moe_layers, mixtral):
    """Logits (S, V) and the router logits (S, E) of each MoE layer, from the Hub-named tensors w."""
    h_n, kv_n, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    e_n, k = cfg.num_experts if not mixtral else cfg.num_local_experts, cfg.num_experts_per_tok
    norm_topk = True if mixtral else cfg.norm_topk_prob
    theta = cfg.rope_parameters["rope_theta"]
    s = tokens.shape[0]
    pos = torch.arange(s)
    causal = torch.arange(s)[None, :] <= torch.arange(s)[:, None]
    x = w["model.embed_tokens.weight"][tokens]
    routers = []
    for li in range(cfg.num_hidden_layers):
        pre = f"model.layers.{li}."
        y = rms_norm(x, w[pre + "input_layernorm.weight"], eps)
        q = (y @ w[pre + "self_attn.q_proj.weight"].T).view(s, h_n, hd)
        kk = (y @ w[pre + "self_attn.k_proj.weight"].T).view(s, kv_n, hd)
        v = (y @ w[pre + "self_attn.v_proj.weight"].T).view(s, kv_n, hd)
        if not mixtral:  # Qwen3's QK-norm, per head, before RoPE
            q = rms_norm(q, w[pre + "self_attn.q_norm.weight"], eps)
            kk = rms_norm(kk, w[pre + "self_attn.k_norm.weight"], eps)
        q, kk, v = q.transpose(0, 1), kk.transpose(0, 1), v.transpose(0, 1)
        q, kk = rotate(q, pos, theta), rotate(kk, pos, theta)
        kk, v = kk.repeat_interleave(h_n // kv_n, 0), v.repeat_interleave(h_n // kv_n, 0)
        sc = ((q @ kk.transpose(1, 2)) / hd ** 0.5).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + (sc @ v).transpose(0, 1).reshape(s, h_n * hd) @ w[pre + "self_attn.o_proj.weight"].T
        y = rms_norm(x, w[pre + "post_attention_layernorm.weight"], eps)
        if li in moe_layers:
            m = pre + ("block_sparse_moe." if mixtral else "mlp.")
            logits = y @ w[m + "gate.weight"].T  # (S, E)
            routers.append(logits)
            p = torch.softmax(logits.float(), -1)
            top_p, top_i = torch.topk(p, k, -1)
            if norm_topk:
                top_p = top_p / top_p.sum(-1, keepdim=True)
            mix = torch.zeros(s, e_n).scatter(1, top_i, top_p)  # each token's weight per expert, 0 if unchosen
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            outs = torch.stack([swiglu(y, *(w[f"{m}experts.{j}.{n}.weight"] for n in names)) for j in range(e_n)])
            x = x + torch.einsum("se,esh->sh", mix, outs)
        else:
            x = x + swiglu(y, w[pre + "mlp.gate_proj.weight"], w[pre + "mlp.up_proj.weight"],
                           w[pre + "mlp.down_proj.weight"])
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    return rms_norm(x, w["model.norm.weight"], eps) @ head.T, routers


def hand_aux(routers, e_n, k):
    """transformers' load-balancing loss: the MoE layers' rows pooled, then E * sum_e f_e * P_e."""
    logits = torch.cat(routers, 0)  # (N, E), N = S * MoE layers
    p = torch.softmax(logits.float(), -1)
    chosen = torch.topk(p, k, -1).indices
    f = F.one_hot(chosen, e_n).float().sum((0, 1)) / logits.shape[0]  # choices per expert / N
    return e_n * (f * p.mean(0)).sum()


def margins(routers, k):
    p = torch.softmax(torch.cat(routers, 0).float(), -1).sort(-1, descending=True).values
    return (p[:, k - 1] - p[:, k]).min().item()


def build(cls, cfg, seed):
    model = cls(cfg).float().eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    draw_weights(model, seed)
    return model


def check_routing(model, tokens, cfg, moe_layers, mixtral):
    """The margin and the per-layer expert loads of the model on the tokens (asserted usable)."""
    with torch.no_grad():
        out = model(input_ids=tokens, output_router_logits=True)
    routers = list(out.router_logits)
    assert len(routers) == len(moe_layers)
    e_n, k = (cfg.num_local_experts if mixtral else cfg.num_experts), cfg.num_experts_per_tok
    load = [torch.bincount(torch.topk(r.softmax(-1), k, -1).indices.flatten(), minlength=e_n).tolist()
            for r in routers]
    return margins(routers, k), load


def make(out, cls, cfg, seed, token_seed, moe_layers, mixtral, hub_config_key=False):
    e_n, k = (cfg.num_local_experts if mixtral else cfg.num_experts), cfg.num_experts_per_tok
    norm_topk = True if mixtral else cfg.norm_topk_prob
    coef = cfg.router_aux_loss_coef
    model = build(cls, cfg, seed)
    got_moe = [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]
    assert got_moe == moe_layers, (got_moe, moe_layers)
    if not mixtral:  # the dense layers use intermediate_size, the experts moe_intermediate_size
        for i, layer in enumerate(model.model.layers):
            if i not in moe_layers:
                assert layer.mlp.gate_proj.weight.shape == (cfg.intermediate_size, cfg.hidden_size)
            else:
                assert layer.mlp.experts.down_proj.shape == (e_n, cfg.hidden_size, cfg.moe_intermediate_size)
    tokens = torch.randint(0, cfg.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(token_seed))
    margin, load = check_routing(model, tokens, cfg, moe_layers, mixtral)
    print(f"{out}: min top-{k} margin {margin:.3e}, expert load {load}")
    assert margin >= MIN_MARGIN, f"seed {seed}: a top-k choice is within {margin:.2e} of a tie"
    assert all(c > 0 for layer in load for c in layer), f"seed {seed}: an expert gets no token"
    with torch.no_grad():
        before = model(input_ids=tokens, labels=tokens, output_router_logits=True).loss

    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    native = ensure_hub_layout(model, out, mixtral)
    if hub_config_key:  # Qwen's Hub configs say num_experts; transformers 5 writes num_local_experts
        c = json.load(open(f"{out}/config.json"))
        assert "num_local_experts" in c and "num_experts" not in c
        c["num_experts"] = c.pop("num_local_experts")
        with open(f"{out}/config.json", "w") as f:
            f.write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    model = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                experts_implementation="eager").eval()
    assert (model.config.num_local_experts if mixtral else model.config.num_experts) == e_n
    assert model.config.router_aux_loss_coef == coef
    with torch.no_grad():
        res = model(input_ids=tokens, labels=tokens, output_router_logits=True)
        ce = model(input_ids=tokens, labels=tokens, output_router_logits=False).loss
    assert torch.equal(res.loss, before), "from_pretrained of the directory gives another loss"
    loss, aux, logits = res.loss, res.aux_loss, res.logits[0]
    assert torch.equal(ce + coef * aux, loss)
    assert abs(F.cross_entropy(logits[:-1], tokens[0, 1:]).item() - ce.item()) < 1e-6
    routers = [r.detach() for r in res.router_logits]

    # The default experts implementation (grouped_mm where it can run) against the expert loop.
    default = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        d = (default(input_ids=tokens).logits[0] - logits).abs().max().item()
    print(f"  experts implementation {default.config._experts_implementation!r} vs 'eager': max |dlogits| {d:.2e}")
    assert d < 1e-4

    # By hand, from the tensors on disk.
    w = {n: t.clone().requires_grad_(True) for n, t in load_file(f"{out}/model.safetensors").items()}
    h_logits, h_routers = hand_forward(w, model.config, tokens[0], moe_layers, mixtral)
    h_ce = F.cross_entropy(h_logits[:-1], tokens[0, 1:])
    h_aux = hand_aux(h_routers, e_n, k)
    err = (h_logits - logits).abs().max().item()
    rerr = max((a - b).abs().max().item() for a, b in zip(h_routers, routers))
    per_layer = sum(hand_aux([r], e_n, k) for r in routers).item() / len(routers)
    print(f"  by hand: max |dlogits| {err:.2e}, |drouter| {rerr:.2e}; aux {aux.item():.8f} (by hand "
          f"{h_aux.item():.8f}; per-layer mean {per_layer:.8f})")
    assert err < 1e-4 and rerr < 1e-4
    assert abs(h_aux.item() - aux.item()) < 1e-6 and abs(hand_aux(routers, e_n, k).item() - aux.item()) < 1e-6
    if len(routers) > 1:
        assert abs(per_layer - aux.item()) > 1e-4, "pooled and per-layer aux agree: the fixture cannot tell them apart"

    # Gradients of the total loss, under the Hub names, against the hand-written loss's.
    model.zero_grad()
    model(input_ids=tokens, labels=tokens, output_router_logits=True).loss.backward()
    grads = hub_tensors(model, mixtral, grads=True)
    (h_ce + coef * h_aux).backward()
    assert set(grads) == set(w), set(grads) ^ set(w)
    gerr = max(((grads[n] - w[n].grad).abs().max() / (w[n].grad.abs().max() + 1e-6)).item() for n in w)
    print(f"  gradients: {len(grads)} tensors, max relative |dgrad| vs by hand {gerr:.2e}")
    assert gerr < 1e-4
    for n, g in grads.items():
        assert g.abs().max() > 0, f"zero gradient for {n}"

    os.makedirs(f"{out}/grads", exist_ok=True)
    for n, g in grads.items():
        np.save(f"{out}/grads/{n}.npy", g.float().numpy().astype(np.float32))
    os.makedirs(f"{out}/router_logits", exist_ok=True)
    for li, r in zip(moe_layers, routers):
        np.save(f"{out}/router_logits/layer_{li}.npy", r.float().numpy().astype(np.float32))
    np.save(f"{out}/logits.npy", logits.float().numpy().astype(np.float32))
    json.dump({"tokens": tokens[0].tolist(), "loss": loss.item(), "ce_loss": ce.item(), "aux_loss": aux.item(),
               "aux_loss_layers_averaged": per_layer, "router_aux_loss_coef": coef,
               "logits_first_row": logits[0, :8].tolist(), "num_experts": e_n, "top_k": k,
               "norm_topk_prob": norm_topk, "moe_layers": moe_layers, "expert_load": load,
               "min_topk_margin": margin},
              open(f"{out}/expected.json", "w"), indent=1)
    print(f"  loss {loss.item():.10f} = ce {ce.item():.10f} + {coef} * aux {aux.item():.10f}; "
          f"{'native' if native else 'rewritten'} Hub layout; wrote {out}")


def qwen3moe():
    cfg = Qwen3MoeConfig(vocab_size=72, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[1], router_aux_loss_coef=0.01,
                         use_sliding_window=False, dtype="float32")
    make(QWEN3MOE, Qwen3MoeForCausalLM, cfg, seed=SEEDS["qwen3moe"], token_seed=21, moe_layers=[0, 2],
         mixtral=False, hub_config_key=True)


def qwen3moe_untied():
    cfg = Qwen3MoeConfig(vocab_size=70, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=False,
                         decoder_sparse_step=2, mlp_only_layers=[], router_aux_loss_coef=0.02,
                         use_sliding_window=False, dtype="float32")
    make(QWEN3MOE_UNTIED, Qwen3MoeForCausalLM, cfg, seed=SEEDS["qwen3moe_untied"], token_seed=22, moe_layers=[1],
         mixtral=False)


def mixtral():
    cfg = MixtralConfig(vocab_size=66, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                        max_position_embeddings=256, tie_word_embeddings=False, sliding_window=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                        num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02, dtype="float32")
    make(MIXTRAL, MixtralForCausalLM, cfg, seed=SEEDS["mixtral"], token_seed=23, moe_layers=[0, 1], mixtral=True)


SEEDS = {"qwen3moe": 67, "qwen3moe_untied": 73, "mixtral": 80}  # chosen for min_topk_margin >= 1e-3, every expert used


def main():
    fns = {"qwen3moe": qwen3moe, "qwen3moe_untied": qwen3moe_untied, "mixtral": mixtral}
    for name in sys.argv[1:] or list(fns):
        fns[name]()


if __name__ == "__main__":
    main()
