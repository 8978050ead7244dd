// A Hugging Face `tokenizer.json` (the format of the `tokenizers` library) loaded and run in C++:
// the byte-level BPE tokenizers of Llama 3 and Qwen2 / Qwen3 (and GPT-2), giving the ids that
// `tokenizers` gives for the same text.
//
// What is read (anything else is refused when loading, with a message naming the file and key):
//   normalizer      null, NFC (Qwen2/3), or a Sequence of those. NFC is utf8proc's, except for
//                   the combining marks that tokenizers' tables (Unicode 9) lack: tokenizers
//                   leaves those in place, and so does this.
//   pre_tokenizer   a ByteLevel pre-tokenizer, last, after any number of Split pre-tokenizers,
//                   alone or in a Sequence. Split: pattern {"Regex": ...} or {"String": ...},
//                   behavior Isolated, invert false (Llama 3 and Qwen split with their regex this
//                   way). ByteLevel: add_prefix_space false; use_regex true splits with the GPT-2
//                   regex first; trim_offsets only moves offsets, so it is ignored.
//                   Regexes run on PCRE2 (UTF, Unicode properties, JIT where the CPU has it); `\s`
//                   and `\S` are rewritten to Oniguruma's set (tab..CR, U+0085 and \p{Z}), the
//                   regex engine of `tokenizers`. \p{L} and \p{N} follow PCRE2's Unicode tables
//                   (Debian 12: Unicode 14), so characters assigned later (new scripts, CJK
//                   Extension H/I) may be split differently from `tokenizers`.
//   model           BPE: vocab, merges as "a b" strings or ["a", "b"] pairs, ignore_merges (Llama
//                   3: a pre-token that is itself in the vocab is one token), byte_fallback false,
//                   unk_token null, dropout null, continuing_subword_prefix and end_of_word_suffix
//                   null or "". A merge naming a token that is not in the vocab is refused.
//   added_tokens    matched in the text before anything else (the longest at the leftmost place),
//                   each becoming its id; the text between them is normalized, pre-tokenized and
//                   run through BPE. Tokens with normalized true are matched in the normalized
//                   text; single_word, lstrip and rstrip are honoured (Llama and Qwen set all four
//                   false).
//   post_processor  null, ByteLevel (changes no id), TemplateProcessing (its `single` template:
//                   Llama 3 puts <|begin_of_text|> first), or a Sequence of those.
//   decoder         null or ByteLevel: decode() maps each token's characters back to bytes.
//   truncation and padding must be null (whole documents are tokenized).
//
// Text is UTF-8. Bytes that are not (a file is not always clean) are replaced by U+FFFD, one per
// maximal ill-formed subsequence, as Python's bytes.decode("utf-8", errors="replace") does, and
// counted (invalid_utf8_replaced()).
//
// Special tokens in text: encode() parses them by default, as `tokenizers`' encode(text) does
// (the text "<|endoftext|>" becomes that token's id). With parse_special false they are plain
// text (`tokenizers`' encode_special_tokens = True); added tokens that are not special (Qwen3's
// <think>) are matched either way.
//
// BOS and EOS, as the model directory says. load() reads, beside tokenizer.json, config.json and
// tokenizer_config.json when they are there:
//   bos_id()   config.json bos_token_id (an int, or the first of a list), else tokenizer_config's
//              bos_token (a string or {"content": ...}), else the first token the post-processor
//              puts before the text; none when all are absent or null.
//   eos_id()   config.json eos_token_id (an int, or the first of a list), else tokenizer_config's
//              eos_token; none when both are absent or null.
//   adds_bos() true when the tokenizer itself begins every encoding with bos_id(): its
//              post-processor's single template is exactly [BOS] $A..., or tokenizer_config has
//              add_bos_token true. Llama 3: true; Qwen: false (Qwen's config.json names a
//              bos_token_id that its tokenizer never adds).
//
// Thread safety: load() and the const accessors are safe from any thread; encode() is not (it
// keeps a cache of words already split and the regex engine's match state): use one HfTokenizer
// per thread. encode() returns no Status: a loaded tokenizer encodes any text; only a regex
// that exceeds PCRE2's match limits (none of these families' does) throws untied::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/status.h"

namespace untied {

struct HfEncodeOptions {
  // Add what the post-processor adds around one sequence (Llama 3: <|begin_of_text|> first).
  bool add_special_tokens = true;
  // Special tokens written in the text become their ids (tokenizers' default); false: they are
  // tokenized as the text they are.
  bool parse_special = true;
};

class HfTokenizer {
 public:
  // path: a tokenizer.json file, or a directory holding one (a Hugging Face model directory).
  // config.json and tokenizer_config.json next to it are read for BOS/EOS when present.
  // Errors: not_found (no such file or directory, or a directory without tokenizer.json);
  // invalid_argument (not JSON, a missing or mistyped key, a merge naming an unknown token, ...);
  // unsupported (a normalizer, pre-tokenizer, model, post-processor or decoder type, or a
  // setting, that this file does not implement, named in the message).
  static StatusOr<HfTokenizer> load(const std::string& path);
  // The contents of a tokenizer.json; `where` names it in messages. No BOS/EOS side files.
  static StatusOr<HfTokenizer> from_json(const std::string& json_text, const std::string& where);

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;
  ~HfTokenizer();

  // The ids of text, as tokenizers' Tokenizer.encode(text, add_special_tokens).ids.
  std::vector<int32_t> encode(std::string_view text, const HfEncodeOptions& options = {});
  // The same, appended to *out (no reallocation of a caller's reused buffer).
  void encode_append(std::string_view text, const HfEncodeOptions& options, std::vector<int32_t>* out);

  // The bytes of ids, as tokenizers' decode with the ByteLevel decoder (each token's characters
  // mapped back to their bytes; a token with characters outside the byte alphabet is its own
  // UTF-8). Special added tokens are dropped when skip_special_tokens; ids outside the vocab are
  // dropped. No UTF-8 repair: the bytes are returned as they are, so that
  // decode(encode(text, {.add_special_tokens = false})) == text for any valid UTF-8 text that
  // the normalizer leaves as it is.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Ids are in [0, vocab_size()): the largest id of the vocab or of an added token, plus one.
  int64_t vocab_size() const;
  // The id of a token (an added token's content, or a vocab entry as written in the file, in the
  // byte-level alphabet: " hello" is "Ġhello"); none when there is no such token.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // An added token marked special (<|eot_id|>, <|im_end|>; not Qwen3's <think>).
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  bool adds_bos() const;
  // The tokenizer.json read ("where" for from_json).
  const std::string& source() const;
  // One line: "BPE, 128256 ids (256 added), no normalizer, Split+ByteLevel, ignore_merges".
  std::string describe() const;

  // For streaming one very long document in pieces: the largest q in (0, text.size()) such that
  // encode(text[0, q)) followed by encode(text[q, end)) (no special tokens added) is exactly
  // encode(text), or 0 when this tokenizer cannot promise one in the last 1 MiB of text. q is
  // after a newline that a non-space ASCII byte follows, or before a space between ASCII
  // letters: places where no pre-token of the Llama 3 or Qwen2 regex can run across and NFC
  // changes nothing. Any other regex (GPT-2's too: its \s+(?!\S) splits a run of newlines by what
  // follows it), or an added token that holds a space or a newline or has lstrip, rstrip or
  // single_word, gives 0 (keep the document whole).
  size_t safe_cut(std::string_view text) const;

  // Ill-formed UTF-8 sequences replaced by U+FFFD by encode() so far.
  int64_t invalid_utf8_replaced() const;

  struct Impl;  // the loaded state (hf_tokenizer.cc)

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  static StatusOr<HfTokenizer> with_side_files(HfTokenizer t, const std::string& file);
  std::unique_ptr<Impl> impl_;
};

}  // namespace untied
