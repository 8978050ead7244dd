#!/usr/bin/env python3
"""Writes small Hugging Face tokenizers with the `tokenizers` library itself, and the ids it gives
on a multilingual sample, for tests/train_data/hf_tokenizer_test.cc and the `untied prepare` tests.

Three tokenizer.json files, each with the exact pipeline of a real family, a byte-level BPE trained
here on a deterministic multilingual corpus (English, German, French, Russian, Chinese, Japanese,
Korean, Arabic, Hindi, code, numbers, emoji with ZWJ sequences and skin tones, tabs, runs of spaces
and newlines, NFD input):

  llama3_style  no normalizer; Split(Llama 3's regex, Isolated) then ByteLevel(use_regex=False);
                BPE with ignore_merges=True; specials <|begin_of_text|>, <|end_of_text|> and
                reserved ones after the vocab; post-processor Sequence[ByteLevel, TemplateProcessing
                adding <|begin_of_text|>]; merges written as "a b" strings.
  qwen_style    NFC; Split(Qwen2's regex: single digits, Isolated) then ByteLevel(use_regex=False);
                BPE (ignore_merges=False, continuing_subword_prefix and end_of_word_suffix "" as
                Qwen2 writes them); specials <|endoftext|>, <|im_start|>, <|im_end|> and the
                non-special added tokens <think>, </think> (and Café, normalized, matched in the
                NFC text); ByteLevel post-processor (no BOS); merges as ["a", "b"] pairs.
  gpt2_style    ByteLevel(use_regex=True) alone (the GPT-2 regex inside ByteLevel), <|endoftext|>, and
                added tokens with lstrip, rstrip and single_word.

Beside each: config.json and tokenizer_config.json with the bos/eos fields the real models have,
sample.txt and docs.jsonl (one document holds a special token literally), and expected.json: the
ids of `tokenizers` for the sample and for short edge cases (with and without the post-processor's
special tokens, with special tokens in text parsed and not), and what `untied prepare` must write
for docs.jsonl and sample.txt (tokens and document starts). A tokenizer is saved, reloaded from its
edited JSON and checked to give the same ids before anything is written.

And whitespace_probe: Split(r"\s") with merges that join "a", X, "b" into one token, for X among
U+180E, U+0085, U+00A0, U+3000, U+200B and U+001C: one id where Oniguruma's \s (the regex engine
of `tokenizers`) does not match X, several where it splits there.

usage: python3 reference/make_tokenizer_fixtures.py [OUTDIR]   (needs `tokenizers`; tests do not)
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = sys.argv[1] if len(sys.argv) > 1 else "reference/fixtures/tokenizers"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

SENTENCES = [
    # English, with contractions in every case
    "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine, but we've seen otherwise.",
    "DON'T PANIC. YOU'RE NOT ALONE, AND IT'S GOING TO BE OK.", "She'd said he'd come; they're late.",
    "Training long-context transformers needs context parallelism across many GPUs.",
    "Numbers like 3.14159, 2,718,281 and 1e-9 appear in papers from 1999 to 2024.",
    # German, French (with accents, precomposed)
    "Die Größe der Straße ist übermäßig, sagte der Bürgermeister in München.",
    "Übung macht den Meister; Äpfel und Öl kosten 3,50 €.",
    "À bientôt ! L'été dernier, ça s'est très bien passé à Besançon.",
    "Où est la bibliothèque ? C'est à côté de l'église, près du théâtre.",
    # Russian
    "Привет, мир! Сегодня хорошая погода, и мы идём гулять.", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    # Chinese, Japanese, Korean
    "你好，世界！今天天气很好，我们去公园散步吧。", "机器学习需要大量的数据和计算资源。",
    "東京は日本の首都です。ひらがなとカタカナと漢字を使います。", "吾輩は猫である。名前はまだ無い。",
    "안녕하세요, 세계! 오늘은 날씨가 좋습니다.", "한국어 형태소 분석은 어렵지만 재미있습니다.",
    # Arabic, Hindi
    "مرحبا بالعالم! اليوم هو يوم جميل.", "اللغة العربية تكتب من اليمين إلى اليسار.",
    "नमस्ते दुनिया! आज मौसम बहुत अच्छा है।", "हिन्दी देवनागरी लिपि में लिखी जाती है।",
    # emoji: skin tones, ZWJ families, flags, variation selectors
    "Great job 👍🏽👍🏿 ❤️ 🎉🎉🎉", "Family: 👨‍👩‍👧‍👦 and 👩🏾‍💻 at work 🏳️‍🌈 🇩🇪 🇫🇷 🇯🇵",
    "😀😃😄😁 😂🤣 🙂🙃 🥲 🤖", "Weather ☀️ 🌧️ ⛈️ ❄️ and 🐈‍⬛",
]
CODE = [
    "def square(x):\n\treturn x ** 2  # the square\n",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}\n",
    "if (a != b && c >= d) { return -1; }  // done\n",
    "SELECT name, COUNT(*) FROM users WHERE age > 21 GROUP BY name;\n",
    "<div class=\"main\">\n  <p>Hello &amp; welcome</p>\n</div>\n",
    "x = {'key': [1, 2, 3], \"other\": None}\n",
]
NFD = ["Cafe\u0301 de\u0301ja\u0300 vu", "A\u030angstro\u0308m", "\u1100\u1161\u11a8\u1102\u1161", "e\u0323\u0302 Vie\u0323\u0302t Nam"]


def pseudo_words(rng):
    """Made-up words in each script (syllables drawn at random), so that BPE has a few thousand
    merges to learn: Latin with accents, Cyrillic, Greek, Chinese, kana, Hangul, Arabic, Devanagari."""
    latin = ["ka", "ro", "ten", "mi", "sch", "ung", "ver", "str", "é", "ü", "ç", "ou", "ai", "th", "ing", "qu", "ß",
             "ph", "ion", "er", "an", "el", "ß", "ö", "à", "gn", "ll", "ti", "na", "be"]
    cyr = ["при", "ст", "ов", "ка", "ени", "ль", "щ", "ый", "ть", "за", "ро", "ми", "ж", "ё", "ну"]
    greek = ["κα", "λη", "μέ", "ρα", "πο", "λύ", "θε", "ός", "νι", "κή"]
    han = [chr(0x4E00 + (i * 7919) % 0x5000) for i in range(400)]
    kana = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
    hangul = [chr(0xAC00 + (i * 104729) % 11172) for i in range(300)]
    arabic = [chr(c) for c in range(0x0627, 0x064B)]
    deva = [c + m for c in [chr(x) for x in range(0x0915, 0x0939)] for m in ["", "ा", "ि", "ी", "ु", "े", "ो", "्"]]
    words = []
    for syl, lo, hi, n in [(latin, 1, 4, 900), (cyr, 1, 4, 500), (greek, 1, 3, 200), (han, 1, 3, 700),
                           (kana, 2, 5, 400), (hangul, 1, 3, 400), (arabic, 2, 6, 300), (deva, 1, 3, 300)]:
        for _ in range(n):
            w = "".join(rng.choice(syl) for _ in range(rng.randint(lo, hi)))
            words.append(w.capitalize() if rng.random() < 0.2 else w)
    return words


def corpus():
    rng = random.Random(1234)
    words = pseudo_words(rng)
    lines = []
    for i in range(12000):
        k = rng.randint(1, 3)
        parts = [rng.choice(SENTENCES) for _ in range(k)]
        # Zipf-like: low indices often, the whole list sometimes.
        parts.append(" ".join(words[min(int(rng.paretovariate(0.7)) - 1, len(words) - 1)]
                              for _ in range(rng.randint(2, 12))))
        rng.shuffle(parts)
        if rng.random() < 0.2:
            parts.append(rng.choice(CODE))
        if rng.random() < 0.15:
            parts.append(rng.choice(NFD))
        if rng.random() < 0.3:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        sep = rng.choice([" ", " ", " ", "  ", "\n", "\n\n", "\t", "   ", "\r\n"])
        line = sep.join(parts)
        if rng.random() < 0.1:
            line += " " * rng.randint(2, 12) + "\n" * rng.randint(1, 4)
        lines.append(line)
    return lines


# The sample the ids are compared on: every case the pre-tokenizers and BPE distinguish.
SAMPLE_DOCS = [
    "Hello world! The quick brown fox jumps over the lazy dog. I'm here; DON'T go, YOU'RE late, it'S fine.",
    "Numbers: 1234567890 3.14159 1,000,000 ²³ Ⅻ ٣٤٥ 0x1F and 007.\n  Tabs\tand\t\ttabs, then spaces:          end.",
    "Größe, Straße, Übermäßig. À bientôt, ça va? L'été.\r\nПривет, мир! Съешь же ещё этих булок.",
    "你好，世界！机器学习需要数据。東京は日本の首都です。カタカナ ひらがな。안녕하세요 세계!",
    "مرحبا بالعالم. नमस्ते दुनिया।",
    "Emoji 👍🏽👍🏿 👨‍👩‍👧‍👦 👩🏾‍💻 🏳️‍🌈 🇩🇪🇫🇷 ❤️ 🐈‍⬛ 🤖🤖🤖",
    "NFD: Cafe\u0301 de\u0301ja\u0300 vu, A\u030angstro\u0308m, \u1100\u1161\u11a8, e\u0323\u0302 and a\u0307\u0323.",
    "def square(x):\n\treturn x ** 2  # comment\n    if a != b:\n        pass\n",
    "Whitespace:" + " " * 40 + "x\n\n\n\n   \n  \t \n" + "\t" * 5 + "y" + " " * 7 + "\n" + " " * 2000 + "z",
    "Unicode spaces: a\u00a0b c\u3000d e\u2028f g\u0085h i\u180ej k\u200bl m\ufeffn \u2003o",
    "Specials in text: <|endoftext|> and <|begin_of_text|>, <|end_of_text|>, <|im_start|>user<|im_end|>, <think>x</think>,"
    " broken <|endoftext| and <|im_end",
    "Long runs: " + "=" * 300 + " " + "ab" * 200 + " " + "!?" * 50,
    "Mixed: café☕ 東京tokyo123abc ABC'S 'll 's'S'T x'RE can't won't",
]


def sample_text():
    # Documents separated by blank lines, with a blank-looking line (spaces only) and CRLF.
    return "\n\n".join(SAMPLE_DOCS) + "\n \n\r\n" + "last document\n"


CASES = ["", " ", "  ", "\n", " \n ", "\n\n\n", "hello", " hello", "HELLO World", "DON'T", "don't", "'S'", "it'S",
         "12345", "  12345", "a\u0301", "\u1100\u1161", "🇩🇪🇫🇷", "👨‍👩‍👧‍👦", "\t\t x", "x  ", "x \n\n  y",
         " " * 17, "a" + " " * 33 + "b", "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>",
         "<|begin_of_text|>hi", " <|end_of_text|> ", "<|im_start|>user\nhi<|im_end|>\n", "<think>\nok\n</think>",
         "<|endoftext", "日本語のテキスト", "Ünïcödé", "\u180e", "\u0085\u0085", "x\u3000\u3000y",
         "a\u180e\u180e!b", "!\u180e!", "x\u180e\u180e\u180e", "1\u180e 2", "a \u180e\u180e b", "\u0085x \u0085\u0085y",
         "Cafe\u0301 Café café", "a <mask> b", "a \t\u3000<mask>", "<mask>", "<r>   x", "x <r>\n\ny", "x[word]y",
         "x [word] y", "[word]", "é[word]", "[word]_", "1[word]",
         # marks newer than tokenizers' NFC tables (Unicode 9): left as they are, not reordered
         "q\u0301\u0d3b x\u0c3c\u0316 \U00011935\U00011930 e\u0301\u1df6", "\uac00\u11a7 \u1100\u1161\u11a7 e\u0301"]

JSONL_DOCS = [
    {"text": "The first document: hello world, it's short.", "id": 1},
    {"text": "Второй документ: 你好 👍🏽 \t tabs   and spaces\n\nnew paragraph."},
    {"text": "A document with a literal <|endoftext|> in it, and <|end_of_text|> and <|begin_of_text|> too."},
    {"text": "NFD input: Cafe\u0301, A\u030a, \u1100\u1161.\r\nCRLF line."},
    {"text": ""},
    {"meta": {"a": 1}, "text": "<think>non-special added token</think> 12345678 ok"},
]


# Words of the sample that become single vocab entries of the Llama 3 style tokenizer.
IGNORE_MERGES_WORDS = [" jumps", " Übermäßig", "机器学习", " bientôt", "Привет", " tokyo", " comment"]


def byte_to_char():
    """GPT-2's map from bytes to printable characters (ByteLevel's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def build(kind):
    if kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        vocab = 4000
    elif kind == "qwen":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        vocab = 3500
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        vocab = 1500
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    tok.train_from_iterator(corpus(), trainer)
    if kind == "llama3":
        # Llama 3's vocab holds words its merges do not build in one piece (it was not trained with
        # these merges), which is what ignore_merges is for; a few such words, added to the vocab.
        j = json.loads(tok.to_str())
        vocab = j["model"]["vocab"]
        b2c = byte_to_char()
        for w in IGNORE_MERGES_WORDS:
            vocab.setdefault("".join(b2c[b] for b in w.encode("utf-8")), len(vocab))
        tok = Tokenizer.from_str(json.dumps(j))
    n = tok.get_vocab_size()
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|reserved_special_token_2|>", "<|eot_id|>"]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    elif kind == "qwen":
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
        tok.add_tokens([AddedToken("<think>", special=False, normalized=False),
                        AddedToken("</think>", special=False, normalized=False),
                        # Not in Qwen: a token matched in the NFC text ("Cafe\u0301" finds it).
                        AddedToken("Café", special=False, normalized=True)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:  # and the added-token options Llama and Qwen leave false
        tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False),
                                AddedToken("<mask>", special=True, normalized=False, lstrip=True),
                                AddedToken("<r>", special=True, normalized=False, rstrip=True)])
        tok.add_tokens([AddedToken("[word]", special=False, normalized=False, single_word=True)])
    assert tok.get_vocab_size() > n
    return tok


def whitespace_probe():
    """A tokenizer whose ids show where a regex's \\s splits: Split(\\s, Isolated), and merges that
    join "a", X, "b" into one token for several X. One token: X is not \\s for Oniguruma."""
    b2c = byte_to_char()
    vocab = {b2c[b]: b for b in range(256)}
    merges = []
    for x in ["\u180e", "\u0085", "\u00a0", "\u3000", "\u200b", "\x1c"]:
        chars = [b2c[b] for b in ("a" + x + "b").encode("utf-8")]
        left = chars[0]
        for c in chars[1:]:
            merges.append([left, c])
            vocab.setdefault(left + c, len(vocab))
            left = left + c
    j = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": "\\s"}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
         "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                             "use_regex": True},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                   "vocab": vocab, "merges": merges}}
    return json.dumps(j, ensure_ascii=False, indent=1)


def edit_json(kind, j):
    m = j["model"]
    if kind == "llama3":
        assert m["ignore_merges"] is True
        m["merges"] = [" ".join(p) if isinstance(p, list) else p for p in m["merges"]]  # the older format
    else:
        m["merges"] = [p.split(" ") if isinstance(p, str) else p for p in m["merges"]]  # the newer format
    if kind == "qwen":
        m["continuing_subword_prefix"] = ""
        m["end_of_word_suffix"] = ""
    return j


def side_files(kind, tok):
    tid = tok.token_to_id
    if kind == "llama3":  # Llama 3.1 Instruct lists three end ids in config.json
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": tid("<|begin_of_text|>"),
                  "eos_token_id": [tid("<|end_of_text|>"), tid("<|eot_id|>")], "vocab_size": tok.get_vocab_size()}
        tconf = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": True,
                 "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast"}
    elif kind == "qwen":  # Qwen3 base: config.json names <|endoftext|> for both; the tokenizer adds no BOS
        config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "bos_token_id": tid("<|endoftext|>"),
                  "eos_token_id": tid("<|endoftext|>"), "vocab_size": tok.get_vocab_size() + 64}
        tconf = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None,
                 "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True},
                 "pad_token": "<|endoftext|>", "errors": "replace", "split_special_tokens": False,
                 "tokenizer_class": "Qwen2Tokenizer"}
    else:  # GPT-2: one token begins and ends everything
        config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "bos_token_id": tid("<|endoftext|>"),
                  "eos_token_id": tid("<|endoftext|>")}
        tconf = None
    return config, tconf


def ids_of(tok, text, add_special, parse_special):
    tok.encode_special_tokens = not parse_special
    try:
        return tok.encode(text, add_special_tokens=add_special).ids
    finally:
        tok.encode_special_tokens = False


def is_blank(b):
    return all(c in b" \t\r\f\v\n" for c in b)


def split_documents(text, mode):
    """tokenizer.h's split_documents, on bytes."""
    if mode == "file":
        return [] if is_blank(text) else [text]
    docs, begin, end, pos = [], None, 0, 0
    while pos < len(text):
        eol = text.find(b"\n", pos)
        if eol < 0:
            eol = len(text)
        content_end = eol - 1 if eol > pos and text[eol - 1:eol] == b"\r" else eol
        line = text[pos:content_end]
        if mode == "lines":
            if not is_blank(line):
                docs.append(line)
        elif is_blank(line):
            if begin is not None:
                docs.append(text[begin:end])
            begin = None
        else:
            if begin is None:
                begin = pos
            end = content_end
        pos = eol + 1
    if begin is not None:
        docs.append(text[begin:end])
    return docs


def prepared(tok, texts, bos, eos, parse_special):
    """What `untied prepare` writes: per document [BOS] ids [EOS], documents of no token dropped."""
    tokens, starts = [], []
    for t in texts:
        if t == "":
            continue
        ids = ([bos] if bos is not None else []) + ids_of(tok, t, False, parse_special) + \
              ([eos] if eos is not None else [])
        if ids:
            starts.append(len(tokens))
            tokens += ids
    return {"tokens": tokens, "doc_starts": starts}


def first_id(v):
    return v[0] if isinstance(v, list) else v


def write_expected(kind, tok, path, config):
    sample = sample_text()
    bos = first_id(config["bos_token_id"])
    eos = first_id(config["eos_token_id"])
    adds_bos = tok.encode("x", add_special_tokens=True).ids[:1] == [bos]
    prep_bos = bos if adds_bos else None

    def entry(text):
        return {"ids": ids_of(tok, text, False, True), "ids_add_special": ids_of(tok, text, True, True),
                "ids_special_as_text": ids_of(tok, text, False, False)}

    exp = {"tokenizer": "tokenizer.json", "vocab_size": tok.get_vocab_size(), "bos_id": bos, "eos_id": eos,
           "adds_bos": adds_bos, "sample": dict(file="sample.txt", **entry(sample)),
           "cases": [dict(text=c, **entry(c)) for c in CASES]}
    if kind == "llama3":  # what ignore_merges changes: the same JSON with it false
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = False
        plain = Tokenizer.from_str(json.dumps(j))
        exp["sample"]["ids_without_ignore_merges"] = plain.encode(sample, add_special_tokens=False).ids
        diff = exp["sample"]["ids_without_ignore_merges"] != exp["sample"]["ids"]
        print(f"  ignore_merges changes the sample's ids: {diff}")
        assert diff, "the sample does not exercise ignore_merges"
    texts = [d.get("text") for d in JSONL_DOCS]
    raw = sample.encode("utf-8")
    exp["prepare"] = {
        "jsonl": dict(file="docs.jsonl", field="text", **prepared(tok, texts, prep_bos, eos, False)),
        "jsonl_parse_special": dict(file="docs.jsonl", field="text", **prepared(tok, texts, prep_bos, eos, True)),
        "jsonl_no_bos_no_eos": dict(file="docs.jsonl", field="text", **prepared(tok, texts, None, None, False)),
        "text_blank_lines": dict(file="sample.txt", split="blank-lines", **prepared(
            tok, [d.decode("utf-8") for d in split_documents(raw, "blank-lines")], prep_bos, eos, False)),
        "text_lines": dict(file="sample.txt", split="lines", **prepared(
            tok, [d.decode("utf-8") for d in split_documents(raw, "lines")], prep_bos, eos, False)),
    }
    with open(path, "w", encoding="utf-8") as f:
        f.write(dump(exp) + "\n")


def dump(v, indent=0):
    """JSON with one key per line and every list of ids on one line: small and diffable."""
    pad = " " * (indent + 1)
    if isinstance(v, dict):
        items = [pad + json.dumps(k) + ": " + dump(x, indent + 1) for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(v, list) and not all(isinstance(x, int) for x in v):
        return "[\n" + ",\n".join(pad + dump(x, indent + 1) for x in v) + "\n" + " " * indent + "]"
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def main():
    for kind, name in [("llama3", "llama3_style"), ("qwen", "qwen_style"), ("gpt2", "gpt2_style")]:
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok = build(kind)
        j = edit_json(kind, json.loads(tok.to_str()))
        text = json.dumps(j, ensure_ascii=False, indent=1)
        edited = Tokenizer.from_str(text)
        sample = sample_text()
        for t in [sample] + CASES:  # the edited file is the same tokenizer
            for add in (False, True):
                assert edited.encode(t, add_special_tokens=add).ids == tok.encode(t, add_special_tokens=add).ids
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        config, tconf = side_files(kind, edited)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        if tconf is not None:
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(tconf, f, indent=2)
        with open(os.path.join(d, "sample.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(sample)
        with open(os.path.join(d, "docs.jsonl"), "w", encoding="utf-8", newline="") as f:
            for doc in JSONL_DOCS:
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
        write_expected(kind, edited, os.path.join(d, "expected.json"), config)
        print(f"{name}: vocab {edited.get_vocab_size()}, {len(j['model']['merges'])} merges, "
              f"sample {len(edited.encode(sample).ids)} ids; wrote {d}")
    d = os.path.join(OUT, "whitespace_probe")
    os.makedirs(d, exist_ok=True)
    text = whitespace_probe()
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    probe = Tokenizer.from_str(text)
    cases = ["a\u180eb", "a\u0085b", "a\u00a0b", "a\u3000b", "a\u200bb", "a\x1cb", "a b", "a\u2028b"]
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        f.write(dump({"cases": [{"text": c, "ids": probe.encode(c).ids} for c in cases]}) + "\n")
    print(f"whitespace_probe: {[len(probe.encode(c).ids) for c in cases]} ids; wrote {d}")


if __name__ == "__main__":
    main()
