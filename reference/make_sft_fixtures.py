#!/usr/bin/env python3
"""Writes reference/fixtures/sft/: what transformers and TRL make of supervised fine-tuning data,
for checking untied's prompt/completion and chat samples (ids, loss masks, masked loss).

  llama/   LlamaForCausalLM, random fp32 weights (hidden 32, 2 layers, 4 heads, 2 KV heads,
           intermediate 64, tied embeddings, vocab 3750) with the tokenizer of
           fixtures/tokenizers/llama3_style (BOS <|begin_of_text|> 3742 added by its
           post-processor, eos_token <|end_of_text|> 3743, config eos_token_id [3743, 3749]) and
           chat_template.jinja = Llama 3.1 instruct's template.
  qwen3/   Qwen3ForCausalLM, the same sizes, vocab 2777, with the tokenizer of
           fixtures/tokenizers/qwen_style (no BOS, eos_token <|endoftext|> 2707, <|im_start|> and
           <|im_end|> special, <think> and </think> added but not special) and
           chat_template.jinja = Qwen3's template.
  Each saved by save_pretrained(safe_serialization=True): config.json, generation_config.json,
  model.safetensors; then tokenizer.json and tokenizer_config.json copied from the tokenizer
  fixture (qwen_style's eos_token object written as its string, which transformers 5 requires).

  samples_pc.jsonl    {"prompt": str, "completion": str} per line
  samples_chat.jsonl  {"messages": [{"role", "content"}, ...]} per line

  expected.json, for each model and each sample:
    prompt/completion: input_ids and completion_mask as TRL's SFTTrainer prepares a
      non-conversational prompt-completion dataset with completion_only_loss=True (read back from
      trainer.train_dataset: TRL turns its completion_mask into labels, -100 where the mask is 0).
      TRL appends the tokenizer's eos_token *as text* to the completion (unless the completion
      already ends with it), tokenizes prompt and prompt+completion+eos separately with the
      tokenizer's own call (add_special_tokens=True: Llama's BOS is there), and the mask starts
      where the two token lists first differ (so a seam merge moves the start back).
    messages: tokenizer.apply_chat_template(messages, tokenize=True) ids (a BatchEncoding in
      transformers 5: ["input_ids"]), and the mask by this rule: for each assistant turn i,
      start = len(apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=True))
      (a prefix of the full ids, asserted); mask 1 from start through the first special added
      token (tokenizer.json added_tokens with "special": true), then 1 on the non-special tokens
      that follow, up to the next special token (Qwen's "\\n" after <|im_end|>).
      For single-turn conversations (optional system, one user, then the assistant) also TRL's
      conversational prompt-completion ids and mask (prompt = messages[:-1],
      completion = [messages[-1]]), and whether they equal the rule's.
    loss: transformers' mean cross-entropy with labels = input_ids where the mask is 1, else
      -100 (each sample its own forward, fp32; transformers shifts the labels, so a mask bit on
      token t counts the prediction of token t from position t-1 and a bit on token 0 counts
      nothing): per sample the mean, the count of counted tokens and their sum (mean * count),
      and per file sum / count over all its samples.

The templates are read from the installed TRL package (trl/chat_templates/, byte for byte the
models' own), pinned by SHA-256 (the same files as fixtures/chat/). Neither template reads the
clock: Llama 3.1's uses date_string, "26 Jul 2024" when not given (no strftime_now); Qwen3's
has no date.

usage: python3 reference/make_sft_fixtures.py [OUTDIR]
       (needs torch, transformers, trl, datasets and accelerate; the tests do not)
"""
import copy
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile

import datasets
import tokenizers
import torch
import transformers
import trl
from datasets import Dataset
from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from trl import SFTConfig, SFTTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZERS = os.path.join(HERE, "fixtures", "tokenizers")
TEMPLATES = {
    "llama3_1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
}

PC_SAMPLES = [
    # English; the completion starts with a space.
    {"prompt": "The capital of France is", "completion": " Paris."},
    # German.
    {"prompt": "Übersetze ins Deutsche: good morning\nAntwort:", "completion": " Guten Morgen, schöne Grüße!"},
    # Chinese; the completion starts without a space.
    {"prompt": "问题：一加一等于几？\n答案：", "completion": "二。一加一等于二。"},
    # Code.
    {"prompt": "def add(a, b):\n", "completion": "    \"\"\"Sum of a and b.\"\"\"\n    return a + b\n"},
    # No space between prompt and completion.
    {"prompt": "Q: 2+2=?\nA:", "completion": "4"},
    # Empty prompt: with Qwen's tokenizer (no BOS) the first token is a target.
    {"prompt": "", "completion": "Once upon a time there was a tokenizer."},
    # Prompt of a newline only.
    {"prompt": "\n", "completion": "Hello world"},
    # The prompt ends mid-word: "beauti" + "ful" is one pre-token in the joined text.
    {"prompt": "The weather today is beauti", "completion": "ful and sunny."},
    # The prompt ends with a space that joins the completion's first word (" the", one token).
    {"prompt": "Fill the gap: ___ sun is hot.\nAnswer: ", "completion": "the"},
]

CHAT_SAMPLES = [
    # Single turn.
    {"messages": [{"role": "user", "content": "What is the capital of France?"},
                  {"role": "assistant", "content": "The capital of France is Paris."}]},
    # System, single turn.
    {"messages": [{"role": "system", "content": "You are a concise assistant."},
                  {"role": "user", "content": "Name a prime number."},
                  {"role": "assistant", "content": "Seven."}]},
    # Multi-turn.
    {"messages": [{"role": "user", "content": "Hi!"},
                  {"role": "assistant", "content": "Hello! How can I help?"},
                  {"role": "user", "content": "Count to three."},
                  {"role": "assistant", "content": "One, two, three."}]},
    # Unicode, single turn.
    {"messages": [{"role": "user", "content": "Wie sagt man „Grüße“ auf Chinesisch? 🙂"},
                  {"role": "assistant", "content": "Man sagt 问候 (wènhòu). Schöne Grüße! 👋"}]},
    # Newlines (code), system, single turn.
    {"messages": [{"role": "system", "content": "You write Python.\nKeep it short."},
                  {"role": "user", "content": "Write a function that squares x.\n\nOnly code."},
                  {"role": "assistant", "content": "def square(x):\n    return x * x\n"}]},
    # System, multi-turn.
    {"messages": [{"role": "system", "content": "Answer in German."},
                  {"role": "user", "content": "Good morning"},
                  {"role": "assistant", "content": "Guten Morgen"},
                  {"role": "user", "content": "Good night"},
                  {"role": "assistant", "content": "Gute Nacht"}]},
    # Leading and trailing whitespace in the contents (Llama 3.1's template trims them).
    {"messages": [{"role": "user", "content": "  spaces around  \n"},
                  {"role": "assistant", "content": "\n  trimmed or not  "}]},
    # Reasoning inside the assistant content (Qwen3's template splits it out and re-renders it).
    {"messages": [{"role": "user", "content": "Is 9 prime?"},
                  {"role": "assistant", "content": "<think>\n9 = 3 * 3.\n</think>\n\nNo, 9 = 3 × 3."}]},
]


def read_template(name):
    path = os.path.join(os.path.dirname(trl.__file__), "chat_templates", f"{name}.jinja")
    text = open(path, "rb").read()
    got = hashlib.sha256(text).hexdigest()
    if got != TEMPLATES[name]:
        sys.exit(f"{path}: sha256 {got}, expected {TEMPLATES[name]}")
    return text


def init_weights(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
            elif "norm" in name:  # non-trivial norm weights, the q/k norms' included
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)


def make_model_dir(out, kind):
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                  tie_word_embeddings=True)
    if kind == "llama":
        src = os.path.join(TOKENIZERS, "llama3_style")
        cfg = LlamaConfig(vocab_size=3750, rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=3742,
                          eos_token_id=[3743, 3749], **common)
        model, template = LlamaForCausalLM(cfg), read_template("llama3_1")
    else:
        src = os.path.join(TOKENIZERS, "qwen_style")
        cfg = Qwen3Config(vocab_size=2777, rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=2707,
                          eos_token_id=2707, use_sliding_window=False, **common)
        model, template = Qwen3ForCausalLM(cfg), read_template("qwen3")
    src_cfg = json.load(open(os.path.join(src, "config.json")))
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.vocab_size) == (
        src_cfg["bos_token_id"], src_cfg["eos_token_id"], src_cfg["vocab_size"])
    init_weights(model, 1234 if kind == "llama" else 4321)
    model = model.float().eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(os.path.join(src, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    # tokenizer_config.json as the fixture has it, except that a special token written as a bare
    # {"content": ...} object (qwen_style's eos_token) becomes its string: transformers 5 refuses
    # the object without "__type": "AddedToken".
    tc = json.load(open(os.path.join(src, "tokenizer_config.json")))
    for key, value in tc.items():
        if key.endswith("_token") and isinstance(value, dict):
            tc[key] = value["content"]
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(out, "chat_template.jinja"), "wb") as f:
        f.write(template)


def special_ids(model_dir):
    tj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    return {t["id"] for t in tj["added_tokens"] if t["special"]}


def chat_ids(tok, messages, **kw):
    out = tok.apply_chat_template(messages, tokenize=True, **kw)
    if isinstance(out, (dict, transformers.BatchEncoding)):
        out = out["input_ids"]
    return list(out)


def rule_mask(tok, messages, ids, specials):
    mask = [0] * len(ids)
    starts = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = chat_ids(tok, messages[:i], add_generation_prompt=True)
        assert ids[:len(prefix)] == prefix, (messages, i)
        j = len(prefix)
        starts.append(j)
        while j < len(ids) and ids[j] not in specials:
            mask[j] = 1
            j += 1
        if j < len(ids):  # the turn's end token
            mask[j] = 1
            j += 1
        while j < len(ids) and ids[j] not in specials:
            mask[j] = 1
            j += 1
    return mask, starts


def trl_prepare(model, tok, rows, tmp):
    """SFTTrainer's own preparation of rows; returns (input_ids, completion_mask) per row."""
    args = SFTConfig(output_dir=tmp, completion_only_loss=True, packing=False, max_length=None,
                     report_to="none", use_cpu=True, dataset_num_proc=None, padding_free=False,
                     save_strategy="no", logging_strategy="no", seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tok)
    ds = trainer.train_dataset
    out = []
    for row in ds:
        ids, labels = list(row["input_ids"]), list(row["labels"])
        assert len(ids) == len(labels)
        assert all(l == -100 or l == t for t, l in zip(ids, labels))
        out.append((ids, [0 if l == -100 else 1 for l in labels]))
    return out, sorted(ds.column_names)


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def masked_loss(model, ids, mask):
    x = torch.tensor([ids])
    labels = torch.tensor([[t if m else -100 for t, m in zip(ids, mask)]])
    count = sum(mask[1:])
    with torch.no_grad():
        out = model(input_ids=x, labels=labels)
        # Own check in float64 from the fp32 logits.
        logp = torch.log_softmax(out.logits[0, :-1].double(), dim=-1)
        tgt = torch.tensor(ids[1:])
        keep = torch.tensor(mask[1:], dtype=torch.bool)
        own = -logp[torch.arange(len(ids) - 1), tgt][keep].sum().item()
    mean = out.loss.item()
    assert abs(mean * count - own) <= 1e-4 * max(1.0, abs(own)), (mean * count, own)
    return {"loss_mean": mean, "loss_sum": mean * count, "loss_count": count}


def file_loss(samples):
    s = sum(x["loss_sum"] for x in samples)
    n = sum(x["loss_count"] for x in samples)
    return {"mean": s / n, "sum": s, "count": n}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures", "sft")
    torch.set_num_threads(1)
    logging.getLogger("trl").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "samples_pc.jsonl"), "w", encoding="utf-8") as f:
        for s in PC_SAMPLES:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    with open(os.path.join(out, "samples_chat.jsonl"), "w", encoding="utf-8") as f:
        for s in CHAT_SAMPLES:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")

    probe = AutoTokenizer.from_pretrained(os.path.join(TOKENIZERS, "llama3_style"))
    probe.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    returned = type(probe.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True)).__name__

    expected = {
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__, "datasets": datasets.__version__,
                     "tokenizers": tokenizers.__version__},
        "apply_chat_template_returns": returned,
        "loss_shift": "transformers shifts labels: mask bit t counts the prediction of token t "
                      "from position t-1; a bit on token 0 counts nothing",
        "models": {},
    }
    summary = []
    for kind in ("llama", "qwen3"):
        mdir = os.path.join(out, kind)
        make_model_dir(mdir, kind)
        tok = AutoTokenizer.from_pretrained(mdir)
        assert tok.chat_template == open(os.path.join(mdir, "chat_template.jinja")).read()
        specials = special_ids(mdir)
        model = (LlamaForCausalLM if kind == "llama" else Qwen3ForCausalLM).from_pretrained(
            mdir, dtype=torch.float32).eval()
        entry = {"special_ids": sorted(specials), "eos_token": tok.eos_token,
                 "eos_token_id": tok.eos_token_id, "bos_token": tok.bos_token,
                 "bos_token_id": tok.bos_token_id}

        # Prompt/completion through SFTTrainer.
        with tempfile.TemporaryDirectory() as tmp:
            trl_rows, columns = trl_prepare(copy.deepcopy(model), tok, PC_SAMPLES, tmp)
        pc = []
        for i, (s, (ids, mask)) in enumerate(zip(PC_SAMPLES, trl_rows)):
            # The same by hand, to state what TRL did.
            eos = tok.eos_token
            completion = s["completion"] if s["completion"].endswith(eos) else s["completion"] + eos
            prompt_ids = tok(s["prompt"])["input_ids"]
            full = tok(s["prompt"] + completion)["input_ids"]
            start = common_prefix(prompt_ids, full)
            assert ids == full, (kind, i, ids, full)
            assert mask == [0] * start + [1] * (len(full) - start), (kind, i)
            rec = {"input_ids": ids, "completion_mask": mask, "prompt_ids": prompt_ids,
                   "completion_start": start, "seam_merged": start < len(prompt_ids)}
            rec.update(masked_loss(model, ids, mask))
            pc.append(rec)
        entry["prompt_completion"] = {
            "trl_columns": columns,
            "eos_appended": f"the text {tok.eos_token!r} appended to the completion string "
                            "(unless it already ends with it), then tokenized with prompt+completion",
            "add_special_tokens": True,
            "samples": pc, "loss": file_loss(pc)}

        # Conversations: transformers' ids, the rule's mask, TRL's on single-turn ones.
        single = [i for i, s in enumerate(CHAT_SAMPLES)
                  if s["messages"][-1]["role"] == "assistant"
                  and [m["role"] for m in s["messages"]].count("assistant") == 1
                  and [m["role"] for m in s["messages"]].count("user") == 1]
        with tempfile.TemporaryDirectory() as tmp:
            trl_single, conv_columns = trl_prepare(
                copy.deepcopy(model), tok,
                [{"prompt": CHAT_SAMPLES[i]["messages"][:-1],
                  "completion": [CHAT_SAMPLES[i]["messages"][-1]]} for i in single], tmp)
        chat = []
        agree = True
        for i, s in enumerate(CHAT_SAMPLES):
            msgs = s["messages"]
            ids = chat_ids(tok, msgs)
            text = tok.apply_chat_template(msgs, tokenize=False)
            mask, starts = rule_mask(tok, msgs, ids, specials)
            rec = {"text": text, "input_ids": ids, "mask": mask, "assistant_starts": starts,
                   "trl": None}
            if i in single:
                t_ids, t_mask = trl_single[single.index(i)]
                same = t_ids == ids and t_mask == mask
                agree = agree and same
                rec["trl"] = {"input_ids": t_ids, "completion_mask": t_mask, "agrees": same}
            rec.update(masked_loss(model, ids, mask))
            chat.append(rec)
        entry["messages"] = {"single_turn": single, "trl_columns": conv_columns,
                             "samples": chat, "loss": file_loss(chat)}
        expected["models"][kind] = entry
        seams = [i for i, r in enumerate(pc) if r["seam_merged"]]
        summary.append(f"{kind}: {len(pc)} prompt/completion samples (seam merged in {seams}), "
                       f"{len(chat)} conversations, TRL and the rule agree on the "
                       f"{len(single)} single-turn ones: {agree}; loss pc "
                       f"{entry['prompt_completion']['loss']['mean']:.6f}, chat "
                       f"{entry['messages']['loss']['mean']:.6f}")

    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
