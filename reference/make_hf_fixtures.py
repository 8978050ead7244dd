#!/usr/bin/env python3
"""Writes tiny random Hugging Face model directories with transformers itself, for
tests/train/hf_weights_test.cc and tests/train/evaluator_test.cc:
  hf_llama_tiny  Llama 3: GQA, untied embeddings, rope_scaling llama3 (its three wavelength bands
                 all within the sequence: theta 100, head_dim 8, original_max_position_embeddings
                 64), float32, saved as sharded safetensors (model.safetensors.index.json);
  hf_qwen3_tiny  Qwen3: QK-norm, tied embeddings (no lm_head.weight in the file), GQA, bfloat16
                 tensors in one model.safetensors, the config as transformers 5 writes it;
  hf_mistral_tiny  Mistral: sliding-window attention with the window (12) shorter than the
                 sequence (48), GQA, untied embeddings, float32 tensors in one model.safetensors.
                 Transformers' Mistral masks with create_sliding_window_causal_mask, i.e.
                 masking_utils.sliding_window_causal_mask_function: the query at position i sees
                 the keys j with i - sliding_window < j <= i, `sliding_window` keys including
                 itself (fewer near the start). The script checks this: the mask transformers
                 builds, and its logits (eager and sdpa) against attention masked by hand, where
                 windows one key longer or shorter give other logits.
  hf_qwen2_tiny  Qwen2: biases on the q, k and v projections (Qwen2Attention builds q_proj, k_proj
                 and v_proj with bias=True whatever the config says, o_proj without), drawn
                 normal(0, 0.5) so that they matter; GQA, untied embeddings, use_sliding_window
                 false (full causal attention in every layer), float32 tensors in one
                 model.safetensors. The script checks transformers' logits against the forward
                 written out by hand with the biases added.
Each has expected.json with a token sequence and transformers' own loss on it (labels = the
tokens, shifted inside transformers) and logits.npy, transformers' float32 logits (S, V) for it;
hf_qwen3_tiny, hf_mistral_tiny and hf_qwen2_tiny also grads/NAME.npy, the gradient of that loss for
every parameter (hf_qwen2_tiny's biases included: ...self_attn.q_proj.bias.npy and so on).
hf_mistral_tiny's expected.json also has sliding_window, keys_seen_per_query and loss_without_window
(the same model and tokens with sliding_window None, full causal attention); hf_qwen2_tiny's has
loss_without_biases (the same model and tokens with the q/k/v biases zeroed).

usage: python3 reference/make_hf_fixtures.py [llama] [qwen3] [mistral] [qwen2]   (all four when
none is named; needs torch and transformers; tests do not)
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.masking_utils import create_sliding_window_causal_mask

OUT = "reference/fixtures/hf_llama_tiny"
QWEN = "reference/fixtures/hf_qwen3_tiny"
MISTRAL = "reference/fixtures/hf_mistral_tiny"
QWEN2 = "reference/fixtures/hf_qwen2_tiny"


def write_logits(model, tokens, out):
    with torch.no_grad():
        logits = model(input_ids=tokens).logits[0].float().numpy()
    np.save(f"{out}/logits.npy", logits.astype(np.float32))


def qwen3():
    torch.manual_seed(12)
    cfg = Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=512, tie_word_embeddings=True, rope_theta=1000.0,
                      use_sliding_window=False, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            elif "norm" in name:  # non-trivial norm weights, the q/k norms' included
                p.uniform_(0.5, 1.5)
    model = model.to(torch.bfloat16)
    os.makedirs(QWEN, exist_ok=True)
    model.save_pretrained(QWEN, safe_serialization=True)
    # The reference is the model in float32 from the bfloat16 weights it saved (untied reads
    # them as float32 too).
    model = Qwen3ForCausalLM.from_pretrained(QWEN, dtype=torch.float32).eval()
    tokens = torch.randint(0, 80, (1, 60), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item()}, open(f"{QWEN}/expected.json", "w"), indent=1)
    write_logits(model, tokens, QWEN)
    # Every parameter's gradient of that loss: the tied embedding's is the sum of its two uses.
    model.zero_grad()
    model(input_ids=tokens, labels=tokens).loss.backward()
    os.makedirs(f"{QWEN}/grads", exist_ok=True)
    for name, p in model.named_parameters():
        np.save(f"{QWEN}/grads/{name}.npy", p.grad.float().numpy().astype(np.float32))
    print(f"qwen3 loss {out.loss.item():.10f}; wrote {QWEN}")


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, pos, theta):  # rotate_half RoPE, the halves of each head paired, as in transformers
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def hand_logits(model, tokens, keys_seen):
    """The Mistral (or Qwen2) forward written out, its attention masked by hand: the query at i sees
    the keys j with i - keys_seen < j <= i. The q/k/v projections' biases are added where the
    model has them (Qwen2)."""
    cfg, m = model.config, model.model
    h_n, kv_n, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    s = tokens.shape[1]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    allowed = (j <= i) & (j > i - keys_seen)
    pos = torch.arange(s)
    x = m.embed_tokens.weight[tokens[0]]
    for layer in m.layers:
        a = layer.self_attn
        y = rms_norm(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        proj = [(y @ f.weight.T + (f.bias if f.bias is not None else 0)) for f in (a.q_proj, a.k_proj, a.v_proj)]
        q = proj[0].view(s, h_n, hd).transpose(0, 1)
        k = proj[1].view(s, kv_n, hd).transpose(0, 1)
        v = proj[2].view(s, kv_n, hd).transpose(0, 1)
        q, k = rotate(q, pos, cfg.rope_parameters["rope_theta"]), rotate(k, pos, cfg.rope_parameters["rope_theta"])
        k, v = k.repeat_interleave(h_n // kv_n, 0), v.repeat_interleave(h_n // kv_n, 0)
        sc = (q @ k.transpose(1, 2)) / hd ** 0.5
        sc = sc.masked_fill(~allowed, float("-inf")).softmax(-1)
        x = x + (sc @ v).transpose(0, 1).reshape(s, h_n * hd) @ a.o_proj.weight.T
        y = rms_norm(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        mlp = layer.mlp
        x = x + (torch.nn.functional.silu(y @ mlp.gate_proj.weight.T) * (y @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T
    return rms_norm(x, m.norm.weight, cfg.rms_norm_eps) @ model.lm_head.weight.T


def check_window(model, tokens, window):
    """Asserts that transformers' Mistral sees `window` keys per query, itself included."""
    s = tokens.shape[1]
    # The mask transformers builds (eager: an additive float mask, 0 where a key is seen).
    model.config._attn_implementation = "eager"
    embeds = model.model.embed_tokens(tokens)
    mask = create_sliding_window_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                                             cache=None, position_ids=torch.arange(s)[None])
    seen = (mask[0, 0] == 0) if mask.dtype != torch.bool else mask[0, 0]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    assert torch.equal(seen, (j <= i) & (j > i - window)), "transformers' mask is not i - window < j <= i"
    assert seen.sum(-1).tolist() == [min(q + 1, window) for q in range(s)]
    # Its logits, eager and sdpa, against attention masked by hand.
    with torch.no_grad():
        ref = {w: hand_logits(model, tokens, w) for w in (window - 1, window, window + 1)}
        for impl in ("eager", "sdpa"):
            model.config._attn_implementation = impl
            got = model(input_ids=tokens).logits[0]
            err = (got - ref[window]).abs().max().item()
            off = min((got - ref[w]).abs().max().item() for w in (window - 1, window + 1))
            print(f"mistral {impl}: max |logits - hand-masked, {window} keys| {err:.2e}; "
                  f"{window}+-1 keys: {off:.2e}")
            assert err < 1e-4 and off > 1e-2
    model.config._attn_implementation = "eager"


def mistral():
    torch.manual_seed(13)
    window, vocab = 12, 72
    cfg = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                        max_position_embeddings=256, tie_word_embeddings=False, sliding_window=window,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, dtype="float32")
    model = MistralForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    os.makedirs(MISTRAL, exist_ok=True)
    model.save_pretrained(MISTRAL, safe_serialization=True)
    model = MistralForCausalLM.from_pretrained(MISTRAL, dtype=torch.float32, attn_implementation="eager").eval()
    assert model.config.sliding_window == window
    tokens = torch.randint(0, vocab, (1, 48), generator=torch.Generator().manual_seed(7))
    check_window(model, tokens, window)
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
        # The fixture is meaningful only if the window changes the result.
        model.config.sliding_window = None
        full = model(input_ids=tokens, labels=tokens).loss.item()
        model.config.sliding_window = window
    assert abs(full - out.loss.item()) > 1e-3
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item(),
               "logits_first_row": out.logits[0, 0, :8].tolist(), "sliding_window": window,
               "keys_seen_per_query": "sliding_window including itself: keys j with i - sliding_window < j <= i",
               "loss_without_window": full},
              open(f"{MISTRAL}/expected.json", "w"), indent=1)
    write_logits(model, tokens, MISTRAL)
    model.zero_grad()
    model(input_ids=tokens, labels=tokens).loss.backward()
    os.makedirs(f"{MISTRAL}/grads", exist_ok=True)
    for name, p in model.named_parameters():
        np.save(f"{MISTRAL}/grads/{name}.npy", p.grad.float().numpy().astype(np.float32))
    print(f"mistral loss {out.loss.item():.10f} (window {window}), {full:.10f} without the window; wrote {MISTRAL}")


def qwen2():
    torch.manual_seed(14)
    vocab = 76
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                      max_position_embeddings=256, tie_word_embeddings=False, use_sliding_window=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, dtype="float32")
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):  # q/k/v biases, large enough to change the result
                p.normal_(0, 0.5)
            else:
                raise AssertionError(f"unexpected parameter {name}")
    biases = sorted(n for n, _ in model.named_parameters() if n.endswith(".bias"))
    assert biases == sorted(f"model.layers.{i}.self_attn.{x}_proj.bias" for i in range(2) for x in "qkv"), biases
    os.makedirs(QWEN2, exist_ok=True)
    model.save_pretrained(QWEN2, safe_serialization=True)
    model = Qwen2ForCausalLM.from_pretrained(QWEN2, dtype=torch.float32, attn_implementation="eager").eval()
    assert all(t == "full_attention" for t in model.config.layer_types)
    tokens = torch.randint(0, vocab, (1, 48), generator=torch.Generator().manual_seed(9))
    s = tokens.shape[1]
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
        err = (out.logits[0] - hand_logits(model, tokens, s)).abs().max().item()
        print(f"qwen2: max |logits - by hand with the biases| {err:.2e}")
        assert err < 1e-4
        # The fixture is meaningful only if the biases change the result.
        saved = {n: p.clone() for n, p in model.named_parameters() if n.endswith(".bias")}
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.zero_()
        no_bias = model(input_ids=tokens, labels=tokens).loss.item()
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.copy_(saved[n])
        assert torch.equal(model(input_ids=tokens).logits, out.logits)
    assert abs(no_bias - out.loss.item()) > 1e-3
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item(),
               "logits_first_row": out.logits[0, 0, :8].tolist(), "loss_without_biases": no_bias},
              open(f"{QWEN2}/expected.json", "w"), indent=1)
    write_logits(model, tokens, QWEN2)
    model.zero_grad()
    model(input_ids=tokens, labels=tokens).loss.backward()
    os.makedirs(f"{QWEN2}/grads", exist_ok=True)
    for name, p in model.named_parameters():
        np.save(f"{QWEN2}/grads/{name}.npy", p.grad.float().numpy().astype(np.float32))
    print(f"qwen2 loss {out.loss.item():.10f}, {no_bias:.10f} without the biases; wrote {QWEN2}")


def llama():
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                      rope_theta=100.0, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init, so that attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, max_shard_size="20KB", safe_serialization=True)
    tokens = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(input_ids=tokens, labels=tokens)
    json.dump({"tokens": tokens[0].tolist(), "loss": out.loss.item(),
               "logits_first_row": out.logits[0, 0, :8].tolist()}, open(f"{OUT}/expected.json", "w"), indent=1)
    write_logits(model, tokens, OUT)
    print(f"llama loss {out.loss.item():.10f}; wrote {OUT}")


def main():
    which = sys.argv[1:] or ["llama", "qwen3", "mistral", "qwen2"]
    for name in which:
        {"llama": llama, "qwen3": qwen3, "mistral": mistral, "qwen2": qwen2}[name]()


if __name__ == "__main__":
    main()
