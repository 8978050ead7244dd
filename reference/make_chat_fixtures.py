#!/usr/bin/env python3
"""Writes reference/fixtures/chat/: real chat templates and what transformers renders with them.

  make_chat_fixtures.py [--trl PATH] [--out DIR]

The templates are the ones the models ship in tokenizer_config.json, as huggingface/trl keeps
them byte for byte in trl/chat_templates/ (to recognise a model by its template):

  llama3_1.jinja  meta-llama/Llama-3.1-8B-Instruct (and 3.3-70B-Instruct)
  llama3_2.jinja  meta-llama/Llama-3.2-1B-Instruct / 3B-Instruct (strftime_now for the date)
  qwen2_5.jinja   Qwen/Qwen2.5-*-Instruct
  qwen3.jinja     Qwen/Qwen3-* (reasoning in <think>, enable_thinking)

They are read from a trl checkout (--trl: a work tree or a bare git directory; git show of the
pinned commit) or, without one, from the .jinja files already in --out. Either way each must
have the SHA-256 pinned below, so the fixture cannot drift from the real templates.

cases.json: for each conversation, the template, the special tokens the model's tokenizer sets,
messages, add_generation_prompt, the extra keyword arguments (enable_thinking, tools, ...) and
the text tokenizer.apply_chat_template(messages, tokenize=False, ...) returns, from a real
PreTrainedTokenizerFast carrying those special tokens and the template. strftime_now reads a
clock pinned to `now` (noon UTC, so the date is the same in any time zone within 11 hours); the
C++ test passes the same `now`. A case whose render raises carries "error" (the message) instead
of "text".

Run with the reference venv: $(bash /work/shared/tools/torch-venv.sh) reference/make_chat_fixtures.py
"""
import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys

TRL_COMMIT = "f2cd57710ae345ea6428ae95363267fcf38a3dc8"
TEMPLATES = {
    "llama3_1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "llama3_2": "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4",
    "qwen2_5": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
}
# The special tokens of each model's tokenizer_config.json (null ones left out).
LLAMA_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
QWEN_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
TOKENS = {"llama3_1": LLAMA_TOKENS, "llama3_2": LLAMA_TOKENS, "qwen2_5": QWEN_TOKENS, "qwen3": QWEN_TOKENS}
NOW = 1721995200  # 2024-07-26 12:00:00 UTC

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current temperature at a place.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City, country"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"],
        },
    },
}


def tool_call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def cases():
    sys_user_asst = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4."},
    ]
    multi_turn = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the GPU cross the road? To reduce the latency."},
        {"role": "user", "content": "Another one."},
    ]
    whitespace = [
        {"role": "system", "content": "  Be terse.\n\n"},
        {"role": "user", "content": "\n  Line one\nline two  \n\n"},
        {"role": "assistant", "content": "  ok\tdone \n"},
    ]
    unicode = [
        {"role": "user", "content": "Traduis « bonjour » en 日本語 🙂, s'il te plaît — \"vite\"."},
        {"role": "assistant", "content": "こんにちは (konnichiwa) ✨ — «\u00a0voilà\u00a0»"},
    ]
    empty = [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
    ]
    tools_chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", {"location": "Paris, France"})]},
        {"role": "tool", "content": "{\"temperature\": 22.5, \"unit\": \"celsius\"}"},
        {"role": "assistant", "content": "It is 22.5 °C in Paris."},
    ]
    out = []

    def add(name, template, messages, add_generation_prompt=False, **extra):
        out.append({"name": name, "template": template + ".jinja", "messages": messages,
                    "add_generation_prompt": add_generation_prompt, "extra": extra})

    for t in ("llama3_1", "llama3_2"):
        add(f"{t}_system_user_assistant", t, sys_user_asst)
        add(f"{t}_multi_turn_generation_prompt", t, multi_turn, True)
        add(f"{t}_whitespace", t, whitespace)
        add(f"{t}_unicode", t, unicode, True)
        add(f"{t}_empty_content", t, empty)
        add(f"{t}_tools", t, tools_chat, False, tools=[WEATHER_TOOL])
    add("llama3_1_date_string", "llama3_1", sys_user_asst, True, date_string="01 Jan 2025")
    add("llama3_2_tools_in_system", "llama3_2", tools_chat, True, tools=[WEATHER_TOOL], tools_in_user_message=False)
    add("llama3_2_two_tool_calls_raise", "llama3_2",
        [{"role": "user", "content": "Both?"},
         {"role": "assistant", "tool_calls": [tool_call("a", {}), tool_call("b", {})]}])

    add("qwen2_5_default_system", "qwen2_5", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    add("qwen2_5_multi_turn_generation_prompt", "qwen2_5", [sys_user_asst[0]] + multi_turn, True)
    add("qwen2_5_whitespace", "qwen2_5", whitespace)
    add("qwen2_5_unicode", "qwen2_5", unicode)
    add("qwen2_5_tools", "qwen2_5", tools_chat, True, tools=[WEATHER_TOOL])

    think_turns = [
        {"role": "system", "content": "You are Qwen."},
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "content": "<think>\n17 * 3 = 51.\n</think>\n\n17 * 3 = 51."},
        {"role": "user", "content": "And 51 / 3?"},
        {"role": "assistant", "content": "<think>\nBack to 17.\n</think>\n\nIt is 17."},
    ]
    add("qwen3_think_in_content", "qwen3", think_turns)
    add("qwen3_think_in_content_generation_prompt", "qwen3", think_turns[:4], True)
    add("qwen3_reasoning_content", "qwen3",
        [{"role": "user", "content": "Capital of France?"},
         {"role": "assistant", "reasoning_content": "\nThe user asks a geography question.\n", "content": "\nParis."}])
    add("qwen3_no_think_block", "qwen3", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    add("qwen3_enable_thinking_false", "qwen3", multi_turn, True, enable_thinking=False)
    add("qwen3_enable_thinking_true", "qwen3", multi_turn, True, enable_thinking=True)
    add("qwen3_whitespace", "qwen3", whitespace)
    add("qwen3_unicode_empty", "qwen3", unicode + empty[1:])
    add("qwen3_tools", "qwen3",
        [{"role": "system", "content": "Use tools."}] + tools_chat[:3] +
        [{"role": "tool", "content": "{\"humidity\": 40}"},
         {"role": "assistant", "content": "<think>Both answers are in.</think>22.5 °C, 40% humidity."}],
        False, tools=[WEATHER_TOOL])
    return out


def read_templates(trl, out_dir):
    texts = {}
    for name, digest in TEMPLATES.items():
        if trl:
            git_dir = trl if os.path.exists(os.path.join(trl, "HEAD")) and not os.path.exists(os.path.join(trl, ".git")) \
                else os.path.join(trl, ".git")
            text = subprocess.run(["git", "--git-dir", git_dir, "show", f"{TRL_COMMIT}:trl/chat_templates/{name}.jinja"],
                                  check=True, capture_output=True).stdout
        else:
            with open(os.path.join(out_dir, name + ".jinja"), "rb") as f:
                text = f.read()
        got = hashlib.sha256(text).hexdigest()
        if got != digest:
            sys.exit(f"{name}.jinja has SHA-256 {got}, not the pinned {digest}: not the model's template")
        texts[name] = text.decode("utf-8")
    return texts


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl", help="a huggingface/trl checkout or bare git directory holding commit " + TRL_COMMIT)
    ap.add_argument("--out", default=os.path.join(here, "fixtures", "chat"))
    args = ap.parse_args()

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import chat_template_utils

    class Clock:  # what strftime_now() reads
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.fromtimestamp(NOW, tz)

    chat_template_utils.datetime = Clock

    os.makedirs(args.out, exist_ok=True)
    texts = read_templates(args.trl, args.out)
    for name, text in texts.items():
        with open(os.path.join(args.out, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(text)

    def tokenizer(name):
        # A byte-level vocabulary: enough for a tokenizer object; rendering never tokenizes.
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=texts[name], **TOKENS[name])

    rows = []
    for case in cases():
        name = case["template"][:-len(".jinja")]
        tok = tokenizer(name)
        row = dict(case)
        row["tokens"] = TOKENS[name]
        row["now"] = NOW
        try:
            row["text"] = tok.apply_chat_template(case["messages"], tokenize=False,
                                                  add_generation_prompt=case["add_generation_prompt"], **case["extra"])
        except Exception as e:  # the template's raise_exception
            row["error"] = str(e)
        rows.append(row)
    doc = {"generator": "reference/make_chat_fixtures.py",
           "templates": f"huggingface/trl@{TRL_COMMIT}:trl/chat_templates/",
           "transformers": __import__("transformers").__version__,
           "jinja2": __import__("jinja2").__version__,
           "cases": rows}
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(rows)} cases and {len(texts)} templates to {args.out}")


if __name__ == "__main__":
    main()
