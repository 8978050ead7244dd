// Hugging Face tokenizer.json (hf_tokenizer.h).
//
// Over 800 lines as one file: loading and encoding share the private state of one tokenizer
// (the regexes, the pair table, the word cache), and each part is short: UTF-8 and NFC helpers,
// the regex wrapper, the added-token matcher, BPE, then the loader, in that order.
//
// Encoding works on raw bytes throughout: ByteLevel maps every byte to one character of its
// alphabet and BPE starts from one symbol per character, so the vocab is keyed by the bytes its
// tokens stand for and the mapping itself is never built for the text.
#include "untied/train/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "untied/core/file_io.h"
#include "untied/core/json.h"

namespace untied {
namespace {

// Objects as std::map: a 128K-entry vocab parses in n log n (ordered_json looks keys up linearly).
using JsonIn = nlohmann::json;

// The regexes of the families safe_cut() knows, as their tokenizer.json files write them.
// clang-format off
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
// ByteLevel's own regex (use_regex true).
constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// clang-format on

// ---------------------------------------------------------------------------------------------
// UTF-8

// The code point at p (n >= 1 bytes left): its length, or -k when the first k bytes are a
// maximal ill-formed subsequence (replaced by one U+FFFD).
int decode_utf8(const unsigned char* p, size_t n, uint32_t* cp) {
  const unsigned c = p[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n || p[k] < lo || p[k] > hi) return -k;
    lo = 0x80, hi = 0xBF;
    v = (v << 6) | (p[k] & 0x3F);
  }
  *cp = v;
  return len;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The offset of the first ill-formed byte of text, or text.size() when it is all valid UTF-8.
size_t first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {  // ASCII runs, 8 bytes at a time
      uint64_t w;
      while (i + 8 <= n && (std::memcpy(&w, p + i, 8), (w & 0x8080808080808080ull) == 0)) i += 8;
      while (i < n && p[i] < 0x80) ++i;
      continue;
    }
    uint32_t cp;
    const int len = decode_utf8(p + i, n - i, &cp);
    if (len < 0) return i;
    i += static_cast<size_t>(len);
  }
  return n;
}

// text with each maximal ill-formed subsequence replaced by U+FFFD; *replaced counts them.
std::string repair_utf8(std::string_view text, size_t first_bad, int64_t* replaced) {
  std::string out(text.substr(0, first_bad));
  out.reserve(text.size() + 16);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = first_bad; i < text.size();) {
    uint32_t cp;
    const int len = decode_utf8(p + i, text.size() - i, &cp);
    if (len > 0) {
      out.append(text.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      ++*replaced;
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

size_t utf8_length_at(std::string_view s, size_t i) {
  uint32_t cp;
  const int len = decode_utf8(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i, &cp);
  return len > 0 ? static_cast<size_t>(len) : 1;
}

// Unicode White_Space (Rust's char::is_whitespace, which lstrip and rstrip use).
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// A letter or number (Rust's char::is_alphanumeric, which single_word uses), or '_'.
bool is_word_char(uint32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

// The code point that ends s[0, end) (end > 0, valid UTF-8).
uint32_t last_code_point(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  uint32_t cp = 0;
  decode_utf8(reinterpret_cast<const unsigned char*>(s.data()) + b, end - b, &cp);
  return cp;
}

// ---------------------------------------------------------------------------------------------
// NFC

// Combining marks (and one composition, U+11935 U+11930) that utf8proc's tables hold and those
// of tokenizers' NFC do not (its normalization crate is at Unicode 9.0; these came in 10.0 to
// 15.0): tokenizers treats each as a plain starter, neither reordered nor composed, so NFC here
// leaves them and the text on either side is normalized on its own. A utf8proc newer than
// Unicode 15 would know marks this list lacks.
// clang-format off
constexpr std::array<std::pair<uint32_t, uint32_t>, 37> kNfcUnknownToTokenizers = {{
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
    {0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0xA82C, 0xA82C}, {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070},
    {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x1193D, 0x1193E},
    {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99},
    {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
}};
// clang-format on

bool nfc_unknown_to_tokenizers(uint32_t cp) {
  const auto it = std::upper_bound(kNfcUnknownToTokenizers.begin(), kNfcUnknownToTokenizers.end(), cp,
                                   [](uint32_t c, const std::pair<uint32_t, uint32_t>& r) { return c < r.first; });
  return it != kNfcUnknownToTokenizers.begin() && cp <= std::prev(it)->second;
}

// Per code point: 1 when a string of such characters may change under NFC (the character is not
// NFC itself, combines with what precedes it, or has a combining class). The NFC quick check
// answers yes for a string of the others, so it is left as it is without running utf8proc.
const std::vector<uint8_t>& nfc_unstable() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x110000, 0);
    for (int32_t cp = 0x300; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;
      const utf8proc_property_t* prop = utf8proc_get_property(cp);
      if (prop->combining_class != 0) t[static_cast<size_t>(cp)] = 1;
      if (prop->decomp_seqindex == UINT16_MAX || prop->decomp_type != 0) continue;  // no canonical decomposition
      std::string one;
      append_utf8(static_cast<uint32_t>(cp), &one);
      utf8proc_uint8_t* nfc = nullptr;
      const utf8proc_ssize_t len =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(one.data()), static_cast<utf8proc_ssize_t>(one.size()),
                       &nfc, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      const bool same =
          len == static_cast<utf8proc_ssize_t>(one.size()) && std::memcmp(nfc, one.data(), one.size()) == 0;
      std::free(nfc);
      if (!same) {
        t[static_cast<size_t>(cp)] = 1;
        continue;
      }
      // A primary composite: the last character of its decomposition combines with what
      // precedes it.
      utf8proc_int32_t parts[8];
      int last_boundclass;
      const utf8proc_ssize_t n = utf8proc_decompose_char(cp, parts, 8, UTF8PROC_DECOMPOSE, &last_boundclass);
      if (n >= 2 && n <= 8) t[static_cast<size_t>(parts[n - 1])] = 1;
    }
    for (int32_t cp = 0x1161; cp <= 0x1175; ++cp) t[static_cast<size_t>(cp)] = 1;  // Hangul vowels and
    for (int32_t cp = 0x11A8; cp <= 0x11C2; ++cp) t[static_cast<size_t>(cp)] = 1;  // trailing consonants
    for (const auto& [lo, hi] : kNfcUnknownToTokenizers)  // plain starters, as tokenizers sees them
      for (uint32_t cp = lo; cp <= hi; ++cp) t[cp] = 0;
    return t;
  }();
  return table;
}

bool is_nfc_quick(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::vector<uint8_t>& unstable = nfc_unstable();
  for (size_t i = 0; i < s.size();) {
    if (p[i] < 0xCC) {  // below U+0300 (1 byte, or a 2-byte lead C2..CB): nothing there composes
      ++i;
      continue;
    }
    uint32_t cp;
    const int len = decode_utf8(p + i, s.size() - i, &cp);
    if (len < 0 || unstable[cp]) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string utf8proc_nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  UNTIED_CHECK(len >= 0, "NFC of ", s.size(), " bytes failed: ", utf8proc_errmsg(len),
               " (the text was repaired to valid UTF-8)");
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(len));
  std::free(out);
  return r;
}

// NFC as tokenizers computes it: utf8proc's, with the marks it does not know left in place, and
// U+11A7 too (the Hangul T base, no trailing consonant: utf8proc 2.6 composes a syllable with it
// and loses it).
std::string nfc(std::string_view s) {
  std::string out;
  size_t from = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = p[i];
    const int len = p[i] < 0x80 ? 1 : decode_utf8(p + i, s.size() - i, &cp);
    const size_t n = len > 0 ? static_cast<size_t>(len) : 1;
    if (len > 1 && (cp == 0x11A7 || nfc_unknown_to_tokenizers(cp))) {
      if (i > from) out += utf8proc_nfc(s.substr(from, i - from));
      out.append(s.substr(i, n));
      from = i + n;
    }
    i += n;
  }
  if (from == 0) return utf8proc_nfc(s);
  if (from < s.size()) out += utf8proc_nfc(s.substr(from));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Regexes

// Oniguruma's \s, as the body of a character class: tab..CR, NEL and the separators (PCRE2's
// \s adds U+180E, which Oniguruma does not count).
constexpr std::string_view kSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";

// pattern with \s and \S rewritten to Oniguruma's set; an error message when it cannot be.
StatusOr<std::string> translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's') {
        out += in_class ? std::string(kSpaceClassBody) : "[" + std::string(kSpaceClassBody) + "]";
      } else if (d == 'S') {
        if (in_class) return Status::unsupported("\\S inside a character class");
        out += "[^" + std::string(kSpaceClassBody) + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ']' first
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
        const size_t end = p.find(":]", i + 2);
        if (end == std::string_view::npos) return Status::unsupported("an unterminated POSIX class");
        out += p.substr(i, end + 2 - i);
        i = end + 1;
        continue;
      }
      return Status::unsupported("a nested character class");
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> compile(std::string_view pattern, bool literal) {
    std::string translated(pattern);
    if (!literal) {
      StatusOr<std::string> t = translate_pattern(pattern);
      if (!t.ok()) return t.status();
      translated = t.value();
    }
    int err = 0;
    PCRE2_SIZE at = 0;
    const uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), flags, &err, &at, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return Status::invalid_argument(std::string(reinterpret_cast<const char*>(msg)) + " at offset " +
                                      std::to_string(at));
    }
    auto re = std::unique_ptr<Regex>(new Regex(code, std::string(pattern)));
    re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    if (re->jit_) {
      re->stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      re->context_ = pcre2_match_context_create(nullptr);
      if (re->stack_ != nullptr && re->context_ != nullptr) pcre2_jit_stack_assign(re->context_, nullptr, re->stack_);
    }
    return re;
  }
  ~Regex() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    if (stack_ != nullptr) pcre2_jit_stack_free(stack_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

  // Isolated: every match is a piece and so is the text between matches; empty pieces are
  // dropped. Matches are found as Oniguruma's iterator finds them: an empty match right after
  // the previous match is skipped by moving on one character. s is valid UTF-8.
  template <typename F>
  void split(std::string_view s, F&& on_piece) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    const size_t n = s.size();
    size_t prev = 0, from = 0, last_end = SIZE_MAX;
    while (from <= n) {
      const int rc = pcre2_match(code_, subject, n, from, PCRE2_NO_UTF_CHECK, data_, context_);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        UNTIED_CHECK(false, "the regex ", pattern_, " failed on a text of ", n,
                     " bytes: ", reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
      const size_t start = ov[0], end = ov[1];
      if (start == end && end == last_end) {
        if (from >= n) break;
        from += utf8_length_at(s, from);
        continue;
      }
      from = last_end = end;
      if (start > prev) on_piece(s.substr(prev, start - prev));
      if (end > start) on_piece(s.substr(start, end - start));
      prev = end;
    }
    if (prev < n) on_piece(s.substr(prev));
  }

 private:
  Regex(pcre2_code* code, std::string pattern)
      : code_(code), data_(pcre2_match_data_create_from_pattern(code, nullptr)), pattern_(std::move(pattern)) {}
  pcre2_code* code_;
  pcre2_match_data* data_;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
  std::string pattern_;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;  // matched as written (normalized tokens: as normalized)
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

// Finds added tokens in a text: at the leftmost place any token starts, the longest one there
// (the aho-corasick LeftmostLongest rule of tokenizers), then on after it.
class AddedMatcher {
 public:
  void add(const AddedToken& t) {
    if (t.content.empty()) return;
    const auto b = static_cast<unsigned char>(t.content[0]);
    auto& list = by_first_[b];
    list.push_back(t);
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    first_[b] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  bool any(bool (*pred)(const AddedToken&)) const {
    for (const auto& list : by_first_)
      for (const AddedToken& t : list)
        if (pred(t)) return true;
    return false;
  }

  // Calls on_text(piece) for the text between tokens and on_token(id) for each token, in order.
  // A special token is left in the text when !parse_special.
  template <typename T, typename K>
  void split(std::string_view s, bool parse_special, T&& on_text, K&& on_token) const {
    if (empty_) {
      if (!s.empty()) on_text(s);
      return;
    }
    size_t done = 0, pos = 0;
    const size_t n = s.size();
    while (pos < n) {
      size_t q = pos;
      while (q < n && !first_[static_cast<unsigned char>(s[q])]) ++q;
      if (q == n) break;
      const AddedToken* hit = nullptr;
      for (const AddedToken& t : by_first_[static_cast<unsigned char>(s[q])])
        if (s.compare(q, t.content.size(), t.content) == 0) {
          hit = &t;
          break;
        }
      if (hit == nullptr) {
        pos = q + 1;
        continue;
      }
      size_t start = q, stop = q + hit->content.size();
      pos = stop;
      if (hit->special && !parse_special) continue;
      if (hit->single_word) {
        const bool word_before = start > 0 && is_word_char(last_code_point(s, start));
        uint32_t after = 0;
        const bool word_after =
            stop < n && (decode_utf8(reinterpret_cast<const unsigned char*>(s.data()) + stop, n - stop, &after) > 0) &&
            is_word_char(after);
        if (word_before || word_after) continue;
      }
      if (hit->lstrip) {
        while (start > done && is_white_space(last_code_point(s, start))) {
          size_t b = start - 1;
          while (b > done && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
          start = b;
        }
      }
      if (hit->rstrip) {
        uint32_t cp = 0;
        int len = 0;
        while (stop < n &&
               (len = decode_utf8(reinterpret_cast<const unsigned char*>(s.data()) + stop, n - stop, &cp)) > 0 &&
               is_white_space(cp))
          stop += static_cast<size_t>(len);
        pos = stop;
      }
      if (start > done) on_text(s.substr(done, start - done));
      on_token(hit->id);
      done = stop;
    }
    if (done < n) on_text(s.substr(done));
  }

 private:
  std::array<std::vector<AddedToken>, 256> by_first_;
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

// ---------------------------------------------------------------------------------------------
// BPE

// (left id, right id) -> (rank, merged id): open addressing, a power-of-two table at most half
// full.
class PairTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
  }
  void put(int32_t a, int32_t b, int32_t rank, int32_t id) {  // a later merge of the same pair wins
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, rank, id};
        return;
      }
    }
  }
  // The slot of (a, b), or nullptr.
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t id = 0;
  };
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t key = pack(a, b);
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i];
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// GPT-2's map from bytes to the printable characters of ByteLevel's alphabet, as UTF-8.
std::array<std::string, 256> byte_alphabet() {
  std::array<std::string, 256> out;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    append_utf8(printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++), &out[b]);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string source;
  // Pipeline.
  bool nfc = false;
  std::vector<std::unique_ptr<Regex>> splits;  // Split pre-tokenizers, in order
  std::unique_ptr<Regex> byte_level_regex;     // ByteLevel use_regex
  AddedMatcher raw_added, normalized_added;
  std::vector<int32_t> prefix, suffix;  // the post-processor's single template around $A
  // Model.
  bool ignore_merges = false;
  StringMap vocab_by_bytes;            // the bytes a vocab token stands for -> id
  std::array<int32_t, 256> byte_id{};  // the one-byte tokens (-1: none; the byte is dropped)
  PairTable merges;
  int64_t merge_count = 0;
  // Ids.
  int64_t vocab_size = 0;
  int64_t added_count = 0;
  StringMap token_ids;                // vocab strings as written, and added tokens' contents
  std::vector<std::string> id_bytes;  // what decode() writes for each id
  std::vector<uint8_t> id_special;
  std::optional<int32_t> bos, eos;
  bool adds_bos = false;
  bool cut_ok = false;
  int64_t invalid_utf8 = 0;

  // Encoding state.
  struct Symbol {
    int32_t id, prev, next, alive;
  };
  struct Candidate {
    int32_t rank, pos, id;
    // std heaps put the largest first: the lowest rank, then the lowest position, is "largest".
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> cache_ids;
  static constexpr size_t kCacheWords = 1 << 18, kCacheMaxWordBytes = 128;

  void encode(std::string_view text, const HfEncodeOptions& o, std::vector<int32_t>* out);
  void encode_segment(std::string_view text, bool parse_special, std::vector<int32_t>* out);
  void pre_tokenize(std::string_view s, size_t step, std::vector<int32_t>* out);
  void bpe(std::string_view word, std::vector<int32_t>* out);
};

void HfTokenizer::Impl::encode(std::string_view text, const HfEncodeOptions& o, std::vector<int32_t>* out) {
  std::string repaired;
  if (const size_t bad = first_invalid_utf8(text); bad < text.size()) {
    repaired = repair_utf8(text, bad, &invalid_utf8);
    text = repaired;
  }
  if (o.add_special_tokens) out->insert(out->end(), prefix.begin(), prefix.end());
  raw_added.split(
      text, o.parse_special, [&](std::string_view piece) { encode_segment(piece, o.parse_special, out); },
      [&](int32_t id) { out->push_back(id); });
  if (o.add_special_tokens) out->insert(out->end(), suffix.begin(), suffix.end());
}

void HfTokenizer::Impl::encode_segment(std::string_view text, bool parse_special, std::vector<int32_t>* out) {
  std::string normalized;
  if (nfc && !is_nfc_quick(text)) {
    normalized = untied::nfc(text);
    text = normalized;
  }
  normalized_added.split(
      text, parse_special, [&](std::string_view piece) { pre_tokenize(piece, 0, out); },
      [&](int32_t id) { out->push_back(id); });
}

void HfTokenizer::Impl::pre_tokenize(std::string_view s, size_t step, std::vector<int32_t>* out) {
  if (step < splits.size()) {
    splits[step]->split(s, [&](std::string_view piece) { pre_tokenize(piece, step + 1, out); });
  } else if (byte_level_regex) {
    byte_level_regex->split(s, [&](std::string_view piece) { bpe(piece, out); });
  } else {
    bpe(s, out);
  }
}

void HfTokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>* out) {
  if (ignore_merges) {
    if (auto it = vocab_by_bytes.find(word); it != vocab_by_bytes.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    if (auto it = cache.find(word); it != cache.end()) {
      out->insert(out->end(), cache_ids.begin() + it->second.first,
                  cache_ids.begin() + it->second.first + it->second.second);
      return;
    }
  }
  symbols.clear();
  for (char c : word) {
    const int32_t id = byte_id[static_cast<unsigned char>(c)];
    if (id < 0) continue;  // not in the vocab, no fallback: dropped, as tokenizers does
    const auto k = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, k - 1, k + 1, 1});
  }
  const auto n = static_cast<int32_t>(symbols.size());
  if (n > 0) symbols.back().next = -1;
  // The merges by rank, then by position: a heap of candidates, stale ones skipped on the way
  // out (the procedure of tokenizers' Word::merge_all, without dropout).
  heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const PairTable::Slot* m = merges.find(symbols[i].id, symbols[i + 1].id))
      heap.push_back(Candidate{m->rank, i, m->id});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    const PairTable::Slot* now = merges.find(left.id, right.id);
    if (now == nullptr || now->id != top.id) continue;
    left.id = top.id;
    right.alive = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      if (const PairTable::Slot* m = merges.find(symbols[static_cast<size_t>(left.prev)].id, left.id)) {
        heap.push_back(Candidate{m->rank, left.prev, m->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const PairTable::Slot* m = merges.find(left.id, symbols[static_cast<size_t>(left.next)].id)) {
        heap.push_back(Candidate{m->rank, top.pos, m->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  const size_t first = out->size();
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<size_t>(i)].next)
    out->push_back(symbols[static_cast<size_t>(i)].id);
  if (cacheable) {
    if (cache.size() >= kCacheWords) {
      cache.clear();
      cache_ids.clear();
    }
    const auto at = static_cast<uint32_t>(cache_ids.size());
    cache_ids.insert(cache_ids.end(), out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
    cache.emplace(std::string(word), std::pair<uint32_t, uint32_t>{at, static_cast<uint32_t>(out->size() - first)});
  }
}

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

// Reads one tokenizer.json into an Impl, recording where each problem is.
class Loader {
 public:
  Loader(const JsonIn& j, std::string where, HfTokenizer::Impl* t) : j_(j), where_(std::move(where)), t_(t) {}

  Status run() {
    if (!j_.is_object()) return bad("", "the file must hold a JSON object");
    for (const char* key : {"truncation", "padding"})
      if (j_.contains(key) && !j_[key].is_null())
        return unsupported(key, "is set; untied tokenizes whole documents: set it to null");
    Status s = model();
    if (s.ok()) s = added_tokens();
    if (s.ok()) s = normalizer(j_.contains("normalizer") ? j_["normalizer"] : JsonIn(), "normalizer");
    if (s.ok()) s = pre_tokenizer();
    if (s.ok()) s = post_processor(j_.contains("post_processor") ? j_["post_processor"] : JsonIn(), "post_processor");
    if (s.ok()) s = decoder();
    return s;
  }

 private:
  Status bad(const std::string& key, const std::string& what) const {
    return Status::invalid_argument(where_ + (key.empty() ? "" : ": " + key) + ": " + what);
  }
  Status unsupported(const std::string& key, const std::string& what) const {
    return Status::unsupported(where_ + ": " + key + " " + what);
  }
  static std::string type_of(const JsonIn& v) {
    return v.is_object() && v.contains("type") && v["type"].is_string() ? v["type"].get<std::string>() : "";
  }
  // v[key] as a bool (fallback when absent or null); an error when it is something else.
  Status flag(const JsonIn& v, const char* key, const std::string& where, bool fallback, bool* out) const {
    *out = fallback;
    if (!v.contains(key) || v[key].is_null()) return Status::ok_status();
    if (!v[key].is_boolean()) return bad(where + "." + key, "must be true or false");
    *out = v[key].get<bool>();
    return Status::ok_status();
  }

  Status model() {
    if (!j_.contains("model") || !j_["model"].is_object()) return bad("model", "is missing (or not an object)");
    const JsonIn& m = j_["model"];
    std::string type = type_of(m);
    if (type.empty() && m.contains("vocab") && m.contains("merges")) type = "BPE";
    if (type != "BPE")
      return unsupported("model",
                         "type '" + type + "' is not supported: only byte-level BPE models (Llama 3, Qwen2/3, GPT-2)");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
      return unsupported("model.dropout", "is set: BPE dropout is random; set it to null");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) return bad(std::string("model.") + key, "must be a string or null");
      if (!m[key].get<std::string>().empty())
        return unsupported(std::string("model.") + key,
                           "'" + m[key].get<std::string>() + "' is not supported (null or \"\" only)");
    }
    if (Status s = flag(m, "ignore_merges", "model", false, &t_->ignore_merges); !s.ok()) return s;
    if (!m.contains("vocab")) return bad("model.vocab", "is missing");
    if (!m["vocab"].is_object()) return bad("model.vocab", "must be an object {token: id}");
    const std::array<std::string, 256> alphabet = byte_alphabet();
    std::unordered_map<std::string, int> char_byte;
    for (int b = 0; b < 256; ++b) char_byte[alphabet[b]] = b;
    std::vector<std::string> by_id;
    const int64_t limit = id_limit();
    for (const auto& [token, id_value] : m["vocab"].items()) {
      if (!id_value.is_number_integer() || id_value.get<int64_t>() < 0 || id_value.get<int64_t>() >= limit)
        return bad("model.vocab", "the id of '" + token + "' must be an integer in [0, " + std::to_string(limit) +
                                      "): ids number the vocabulary and the added tokens densely");
      const auto id = static_cast<int32_t>(id_value.get<int64_t>());
      if (static_cast<size_t>(id) >= by_id.size()) by_id.resize(static_cast<size_t>(id) + 1);
      if (!by_id[static_cast<size_t>(id)].empty())
        return bad("model.vocab", "id " + std::to_string(id) + " is given to both '" + by_id[static_cast<size_t>(id)] +
                                      "' and '" + token + "'");
      by_id[static_cast<size_t>(id)] = token;
      t_->token_ids.emplace(token, id);
    }
    if (t_->token_ids.empty()) return bad("model.vocab", "is empty");
    t_->vocab_size = static_cast<int64_t>(by_id.size());
    t_->id_bytes.assign(by_id.size(), "");
    t_->id_special.assign(by_id.size(), 0);
    t_->byte_id.fill(-1);
    for (size_t id = 0; id < by_id.size(); ++id) {
      const std::string& token = by_id[id];
      // The bytes the token stands for, when every character is in the byte alphabet.
      std::string bytes;
      bool mapped = !token.empty();
      for (size_t i = 0; i < token.size() && mapped;) {
        const size_t len = utf8_length_at(token, i);
        auto it = char_byte.find(token.substr(i, len));
        if (it == char_byte.end())
          mapped = false;
        else
          bytes += static_cast<char>(it->second);
        i += len;
      }
      t_->id_bytes[id] = mapped ? bytes : token;
      if (!mapped) continue;
      t_->vocab_by_bytes.emplace(bytes, static_cast<int32_t>(id));
      if (bytes.size() == 1) t_->byte_id[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
    }
    const bool full_alphabet = std::find(t_->byte_id.begin(), t_->byte_id.end(), -1) == t_->byte_id.end();
    // unk_token and byte_fallback act only on a byte the vocab lacks: with all 256 they change nothing.
    if (m.contains("unk_token") && !m["unk_token"].is_null() && !full_alphabet)
      return unsupported("model.unk_token", "is set and the vocab lacks some of the 256 byte tokens: not supported");
    bool byte_fallback = false;
    if (Status s = flag(m, "byte_fallback", "model", false, &byte_fallback); !s.ok()) return s;
    if (byte_fallback && !full_alphabet)
      return unsupported("model.byte_fallback",
                         "is true and the vocab lacks some of the 256 byte tokens: not supported");

    if (!m.contains("merges")) return bad("model.merges", "is missing");
    if (!m["merges"].is_array()) return bad("model.merges", "must be an array");
    const JsonIn& merges = m["merges"];
    t_->merges.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const JsonIn& e = merges[r];
      const std::string key = "model.merges[" + std::to_string(r) + "]";
      std::string a, b;
      if (e.is_string()) {
        const std::string line = e.get<std::string>();
        const size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
          return bad(key, "'" + line + "' is not two tokens separated by one space");
        a = line.substr(0, space), b = line.substr(space + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      } else {
        return bad(key, "must be a string \"a b\" or a pair [\"a\", \"b\"]");
      }
      const auto ia = t_->token_ids.find(a), ib = t_->token_ids.find(b), iab = t_->token_ids.find(a + b);
      for (const auto& [it, name] : {std::pair{ia, a}, {ib, b}, {iab, a + b}})
        if (it == t_->token_ids.end())
          return bad(key, "('" + a + "', '" + b + "') refers to '" + name + "', which is not in model.vocab");
      t_->merges.put(ia->second, ib->second, static_cast<int32_t>(r), iab->second);
    }
    t_->merge_count = static_cast<int64_t>(merges.size());
    return Status::ok_status();
  }

  Status added_tokens() {
    if (!j_.contains("added_tokens") || j_["added_tokens"].is_null()) return Status::ok_status();
    if (!j_["added_tokens"].is_array()) return bad("added_tokens", "must be an array");
    const JsonIn& list = j_["added_tokens"];
    for (size_t i = 0; i < list.size(); ++i) {
      const JsonIn& e = list[i];
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      if (!e.is_object()) return bad(key, "must be an object");
      if (!e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
          e["id"].get<int64_t>() >= id_limit())
        return bad(key + ".id", "must be an integer in [0, " + std::to_string(id_limit()) +
                                    "): ids number the vocabulary and the added tokens densely");
      if (!e.contains("content") || !e["content"].is_string() || e["content"].get<std::string>().empty())
        return bad(key + ".content", "must be a non-empty string");
      AddedToken t;
      t.id = static_cast<int32_t>(e["id"].get<int64_t>());
      t.content = e["content"].get<std::string>();
      if (first_invalid_utf8(t.content) != t.content.size()) return bad(key + ".content", "is not valid UTF-8");
      for (auto [name, dst] : {std::pair{"special", &t.special},
                               {"single_word", &t.single_word},
                               {"lstrip", &t.lstrip},
                               {"rstrip", &t.rstrip}})
        if (Status s = flag(e, name, key, false, dst); !s.ok()) return s;
      if (Status s = flag(e, "normalized", key, !t.special, &t.normalized); !s.ok()) return s;
      if (static_cast<size_t>(t.id) >= t_->id_bytes.size()) {
        t_->id_bytes.resize(static_cast<size_t>(t.id) + 1);
        t_->id_special.resize(static_cast<size_t>(t.id) + 1);
      }
      t_->id_bytes[static_cast<size_t>(t.id)] = decode_bytes(t.content);
      t_->id_special[static_cast<size_t>(t.id)] = t.special;
      t_->token_ids[t.content] = t.id;  // an added token is found before a vocab entry of the same text
      added_.push_back(t);
    }
    t_->vocab_size = static_cast<int64_t>(t_->id_bytes.size());
    t_->added_count = static_cast<int64_t>(list.size());
    return Status::ok_status();
  }

  // decode()'s bytes for a token string (ByteLevel decoder rule).
  std::string decode_bytes(const std::string& token) const {
    const std::array<std::string, 256> alphabet = byte_alphabet();
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const size_t len = utf8_length_at(token, i);
      const auto it = std::find(alphabet.begin(), alphabet.end(), token.substr(i, len));
      if (it == alphabet.end()) return token;
      bytes += static_cast<char>(it - alphabet.begin());
      i += len;
    }
    return bytes;
  }

  Status normalizer(const JsonIn& n, const std::string& key) {
    if (n.is_null()) return Status::ok_status();
    const std::string type = type_of(n);
    if (type == "NFC") {
      t_->nfc = true;
      return Status::ok_status();
    }
    if (type == "Sequence") {
      if (!n.contains("normalizers") || !n["normalizers"].is_array())
        return bad(key + ".normalizers", "must be an array");
      for (size_t i = 0; i < n["normalizers"].size(); ++i)
        if (Status s = normalizer(n["normalizers"][i], key + ".normalizers[" + std::to_string(i) + "]"); !s.ok())
          return s;
      return Status::ok_status();
    }
    return unsupported(key, "type '" + type + "' is not supported (null, NFC, or a Sequence of NFC)");
  }

  Status pre_tokenizer() {
    std::vector<std::pair<const JsonIn*, std::string>> steps;
    const JsonIn none;
    const JsonIn& p = j_.contains("pre_tokenizer") ? j_["pre_tokenizer"] : none;
    if (p.is_null())
      return unsupported("pre_tokenizer",
                         "is null: only byte-level BPE tokenizers (a ByteLevel pre-tokenizer) are supported");
    if (Status s = flatten(p, "pre_tokenizer", "pretokenizers", &steps); !s.ok()) return s;
    bool byte_level = false;
    bool cut_ok = true;
    for (const auto& [step, key] : steps) {
      const std::string type = type_of(*step);
      if (byte_level)
        return unsupported(key, "type '" + type + "' after ByteLevel is not supported: ByteLevel must come last");
      if (type == "Split") {
        const JsonIn& s = *step;
        if (!s.contains("pattern") || !s["pattern"].is_object())
          return bad(key + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
        const bool literal = s["pattern"].contains("String");
        const char* which = literal ? "String" : "Regex";
        if (!s["pattern"].contains(which) || !s["pattern"][which].is_string())
          return bad(key + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
        const std::string behavior =
            s.contains("behavior") && s["behavior"].is_string() ? s["behavior"].get<std::string>() : "";
        if (behavior != "Isolated")
          return unsupported(key + ".behavior", "'" + behavior + "' is not supported (Isolated only)");
        bool invert = false;
        if (Status st = flag(s, "invert", key, false, &invert); !st.ok()) return st;
        if (invert) return unsupported(key + ".invert", "true is not supported");
        const std::string pattern = s["pattern"][which].get<std::string>();
        StatusOr<std::unique_ptr<Regex>> re = Regex::compile(pattern, literal);
        if (!re.ok()) return unsupported(key + ".pattern", "'" + pattern + "': " + re.status().message());
        // GPT-2's regex is not cut-safe: its \s+(?!\S) splits a run of newlines by what follows it.
        cut_ok = cut_ok && !literal && (pattern == kLlama3Pattern || pattern == kQwen2Pattern);
        t_->splits.push_back(std::move(re).value());
      } else if (type == "ByteLevel") {
        bool prefix = false, use_regex = true;
        if (Status st = flag(*step, "add_prefix_space", key, false, &prefix); !st.ok()) return st;
        if (Status st = flag(*step, "use_regex", key, true, &use_regex); !st.ok()) return st;
        if (prefix) return unsupported(key + ".add_prefix_space", "true is not supported (Llama 3 and Qwen set false)");
        if (use_regex) {
          StatusOr<std::unique_ptr<Regex>> re = Regex::compile(kGpt2Pattern, false);
          UNTIED_CHECK(re.ok(), "the GPT-2 regex does not compile: ", re.status().message());
          t_->byte_level_regex = std::move(re).value();
          cut_ok = false;  // the GPT-2 regex (above)
        }
        byte_level = true;
      } else {
        return unsupported(key, "type '" + type + "' is not supported (Split and ByteLevel, or a Sequence of them)");
      }
    }
    if (!byte_level)
      return unsupported("pre_tokenizer", "has no ByteLevel step: only byte-level BPE tokenizers are supported");
    // A cut is after a '\n' or before a ' ': no added token may hold either, or look around it.
    const auto has_space_or_strip = [](const AddedToken& t) {
      return t.lstrip || t.rstrip || t.single_word || t.content.find_first_of(" \n") != std::string::npos;
    };
    bool added_ok = true;
    for (const AddedToken& t : added_) added_ok = added_ok && !has_space_or_strip(t);
    t_->cut_ok = cut_ok && added_ok;
    for (const AddedToken& t : added_) {
      if (!t.normalized || !t_->nfc) {
        t_->raw_added.add(t);
      } else {
        AddedToken n = t;
        n.content = nfc(t.content);
        t_->normalized_added.add(n);
      }
    }
    return Status::ok_status();
  }

  // A step or a Sequence of steps (nested Sequences too) into a flat list.
  Status flatten(const JsonIn& p, const std::string& key, const char* list_key,
                 std::vector<std::pair<const JsonIn*, std::string>>* out) const {
    if (!p.is_object()) return bad(key, "must be an object with a \"type\"");
    if (type_of(p) != "Sequence") {
      out->emplace_back(&p, key);
      return Status::ok_status();
    }
    if (!p.contains(list_key) || !p[list_key].is_array()) return bad(key + "." + list_key, "must be an array");
    for (size_t i = 0; i < p[list_key].size(); ++i)
      if (Status s = flatten(p[list_key][i], key + "." + list_key + "[" + std::to_string(i) + "]", list_key, out);
          !s.ok())
        return s;
    return Status::ok_status();
  }

  Status post_processor(const JsonIn& p, const std::string& key) {
    if (p.is_null()) return Status::ok_status();
    std::vector<std::pair<const JsonIn*, std::string>> steps;
    if (Status s = flatten(p, key, "processors", &steps); !s.ok()) return s;
    for (const auto& [step, k] : steps) {
      const std::string type = type_of(*step);
      if (type == "ByteLevel") continue;  // offsets only
      if (type != "TemplateProcessing")
        return unsupported(k,
                           "type '" + type + "' is not supported (null, ByteLevel, TemplateProcessing or a Sequence)");
      const JsonIn& tp = *step;
      if (!tp.contains("single") || !tp["single"].is_array()) return bad(k + ".single", "must be an array");
      const JsonIn none = JsonIn::object();
      const JsonIn& specials =
          tp.contains("special_tokens") && tp["special_tokens"].is_object() ? tp["special_tokens"] : none;
      std::vector<int32_t> before, after;
      bool seen_a = false;
      for (size_t i = 0; i < tp["single"].size(); ++i) {
        const JsonIn& item = tp["single"][i];
        const std::string ik = k + ".single[" + std::to_string(i) + "]";
        if (item.is_object() && item.contains("Sequence")) {
          const JsonIn& seq = item["Sequence"];
          if (!seq.is_object() || !seq.contains("id") || seq["id"] != "A" || seen_a)
            return bad(ik, "the single template holds one sequence, $A");
          seen_a = true;
        } else if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
                   item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string()) {
          const std::string name = item["SpecialToken"]["id"].get<std::string>();
          if (!specials.contains(name) || !specials[name].is_object() || !specials[name].contains("ids") ||
              !specials[name]["ids"].is_array())
            return bad(k + ".special_tokens", "has no ids for '" + name + "', which " + ik + " names");
          for (const JsonIn& id : specials[name]["ids"]) {
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= t_->vocab_size)
              return bad(k + ".special_tokens." + name,
                         "ids must be ids of this tokenizer (below " + std::to_string(t_->vocab_size) + ")");
            (seen_a ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
          }
        } else {
          return bad(ik, "must be {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}");
        }
      }
      if (!seen_a) return bad(k + ".single", "does not hold the sequence $A");
      t_->prefix.insert(t_->prefix.begin(), before.begin(), before.end());  // a later processor wraps an earlier one
      t_->suffix.insert(t_->suffix.end(), after.begin(), after.end());
    }
    return Status::ok_status();
  }

  Status decoder() {
    if (!j_.contains("decoder") || j_["decoder"].is_null()) return Status::ok_status();
    const std::string type = type_of(j_["decoder"]);
    if (type != "ByteLevel") return unsupported("decoder", "type '" + type + "' is not supported (null or ByteLevel)");
    return Status::ok_status();
  }

  // Ids are dense: below the vocabulary's entries plus the added tokens (a bound that keeps a
  // file with one huge id from allocating gigabytes).
  int64_t id_limit() const {
    int64_t n = 0;
    if (j_.contains("model") && j_["model"].is_object() && j_["model"].contains("vocab") &&
        j_["model"]["vocab"].is_object())
      n += static_cast<int64_t>(j_["model"]["vocab"].size());
    if (j_.contains("added_tokens") && j_["added_tokens"].is_array()) n += static_cast<int64_t>(j_["added_tokens"].size());
    return n;
  }

  const JsonIn& j_;
  std::string where_;
  HfTokenizer::Impl* t_;
  std::vector<AddedToken> added_;
};

// A tokenizer's file (tokenizer.json, tokenizer_config.json, config.json): a regular file of at
// most 1 GiB (Llama 3's tokenizer.json is 9 MB).
StatusOr<std::string> read_file(const std::string& path) {
  return read_regular_file(path, int64_t{1} << 30, "the tokenizer's file");
}

StatusOr<JsonIn> parse_json(const std::string& text, const std::string& where) {
  try {
    return JsonIn::parse(text);
  } catch (const JsonIn::exception& e) {
    return Status::invalid_argument(where + " is not valid JSON: " + e.what());
  }
}

// A token id from config.json (an int, the first of a list, or null).
Status config_id(const JsonIn& c, const char* key, const std::string& where, int64_t vocab,
                 std::optional<int32_t>* out) {
  if (!c.contains(key) || c[key].is_null()) return Status::ok_status();
  const JsonIn& v = c[key].is_array() && !c[key].empty() ? c[key][0] : c[key];
  if (!v.is_number_integer())
    return Status::invalid_argument(where + ": " + key + " must be an integer or a list of integers");
  if (v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
    return Status::invalid_argument(where + ": " + key + " " + std::to_string(v.get<int64_t>()) +
                                    " is not an id of the tokenizer (below " + std::to_string(vocab) + ")");
  *out = static_cast<int32_t>(v.get<int64_t>());
  return Status::ok_status();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

StatusOr<HfTokenizer> HfTokenizer::from_json(const std::string& json_text, const std::string& where) {
  StatusOr<JsonIn> j = parse_json(json_text, where);
  if (!j.ok())
    return Status::invalid_argument(j.status().message() + "; pass a tokenizer.json written by the tokenizers library");
  auto impl = std::make_unique<Impl>();
  impl->source = where;
  try {
    Loader loader(j.value(), where, impl.get());
    if (Status s = loader.run(); !s.ok()) return s;
  } catch (const JsonIn::exception& e) {  // a value of an unexpected type that no check above caught
    return Status::invalid_argument(where + ": " + e.what());
  }
  // Without side files: the template's first token is the BOS, added when it is the only one.
  if (!impl->prefix.empty()) impl->bos = impl->prefix[0];
  impl->adds_bos = impl->prefix.size() == 1;
  return HfTokenizer(std::move(impl));
}

StatusOr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    return Status::not_found("tokenizer " + path +
                             " does not exist: give a tokenizer.json or a model directory holding one");
  const bool dir = fs::is_directory(path, ec);
  const std::string file = dir ? (fs::path(path) / "tokenizer.json").string() : path;
  if (dir && !fs::exists(file, ec))
    return Status::not_found(path + " holds no tokenizer.json: give a Hugging Face model directory with its tokenizer");
  StatusOr<std::string> text = read_file(file);
  if (!text.ok()) return text.status();
  StatusOr<HfTokenizer> tok = from_json(text.value(), file);
  if (!tok.ok()) return tok.status();
  try {
    return with_side_files(std::move(tok).value(), file);
  } catch (const JsonIn::exception& e) {
    return Status::invalid_argument(file + " (or the config files beside it): " + e.what());
  }
}

StatusOr<HfTokenizer> HfTokenizer::with_side_files(HfTokenizer t, const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  Impl& impl = *t.impl_;
  const fs::path base = fs::path(file).parent_path();
  const std::optional<int32_t> template_bos = impl.bos;

  // tokenizer_config.json: bos_token, eos_token (a string or {"content": ...}), add_bos_token.
  std::optional<int32_t> config_bos, config_eos, tc_bos, tc_eos;
  bool add_bos_token = false;
  const std::string tc_path = (base / "tokenizer_config.json").string();
  if (fs::exists(tc_path, ec)) {
    StatusOr<std::string> tc_text = read_file(tc_path);
    if (!tc_text.ok()) return tc_text.status();
    StatusOr<JsonIn> tc = parse_json(tc_text.value(), tc_path);
    if (!tc.ok()) return tc.status();
    const JsonIn& c = tc.value();
    if (!c.is_object()) return Status::invalid_argument(tc_path + ": must hold a JSON object");
    for (auto [key, dst] : {std::pair{"bos_token", &tc_bos}, {"eos_token", &tc_eos}}) {
      if (!c.contains(key) || c[key].is_null()) continue;
      const JsonIn& v = c[key].is_object() && c[key].contains("content") ? c[key]["content"] : c[key];
      if (!v.is_string())
        return Status::invalid_argument(tc_path + ": " + key + " must be a string, {\"content\": ...} or null");
      const std::optional<int32_t> id = t.token_to_id(v.get<std::string>());
      if (!id)
        return Status::invalid_argument(tc_path + ": " + key + " '" + v.get<std::string>() + "' is not a token of " +
                                        file);
      *dst = id;
    }
    if (c.contains("add_bos_token") && !c["add_bos_token"].is_null()) {
      if (!c["add_bos_token"].is_boolean())
        return Status::invalid_argument(tc_path + ": add_bos_token must be true or false");
      add_bos_token = c["add_bos_token"].get<bool>();
    }
  }
  const std::string config_path = (base / "config.json").string();
  if (fs::exists(config_path, ec)) {
    StatusOr<std::string> c_text = read_file(config_path);
    if (!c_text.ok()) return c_text.status();
    StatusOr<JsonIn> c = parse_json(c_text.value(), config_path);
    if (!c.ok()) return c.status();
    if (!c.value().is_object()) return Status::invalid_argument(config_path + ": must hold a JSON object");
    if (Status s = config_id(c.value(), "bos_token_id", config_path, impl.vocab_size, &config_bos); !s.ok()) return s;
    if (Status s = config_id(c.value(), "eos_token_id", config_path, impl.vocab_size, &config_eos); !s.ok()) return s;
  }
  impl.bos = config_bos ? config_bos : tc_bos ? tc_bos : template_bos;
  impl.eos = config_eos ? config_eos : tc_eos;
  // The tokenizer adds BOS itself: its template is exactly [BOS] $A, or add_bos_token says so.
  impl.adds_bos = impl.bos && ((impl.prefix.size() == 1 && impl.prefix[0] == *impl.bos) || add_bos_token);
  return t;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, const HfEncodeOptions& options) {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->encode(text, options, &out);
  return out;
}

void HfTokenizer::encode_append(std::string_view text, const HfEncodeOptions& options, std::vector<int32_t>* out) {
  impl_->encode(text, options, out);
}

bool HfTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_special.size() && impl_->id_special[static_cast<size_t>(id)] != 0;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) continue;
    if (skip_special_tokens && impl_->id_special[static_cast<size_t>(id)]) continue;
    out += impl_->id_bytes[static_cast<size_t>(id)];
  }
  return out;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->token_ids.find(token);
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> HfTokenizer::eos_id() const { return impl_->eos; }
bool HfTokenizer::adds_bos() const { return impl_->adds_bos; }
const std::string& HfTokenizer::source() const { return impl_->source; }
int64_t HfTokenizer::invalid_utf8_replaced() const { return impl_->invalid_utf8; }

std::string HfTokenizer::describe() const {
  const Impl& t = *impl_;
  std::string pre;
  for (size_t i = 0; i < t.splits.size(); ++i) pre += "Split+";
  pre += t.byte_level_regex ? "ByteLevel(regex)" : "ByteLevel";
  std::string s = "BPE, " + std::to_string(t.vocab_size) + " ids (" + std::to_string(t.added_count) + " added), " +
                  std::to_string(t.merge_count) + " merges, " + (t.nfc ? "NFC" : "no normalizer") + ", " + pre;
  if (t.ignore_merges) s += ", ignore_merges";
  const bool jit = std::all_of(t.splits.begin(), t.splits.end(), [](const auto& r) { return r->jit(); }) &&
                   (!t.byte_level_regex || t.byte_level_regex->jit());
  if (!jit) s += ", regex without JIT";
  return s;
}

size_t HfTokenizer::safe_cut(std::string_view text) const {
  if (!impl_->cut_ok || text.size() < 2) return 0;
  const auto alpha = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  constexpr size_t kWindow = 1 << 20;
  const size_t lo = text.size() > kWindow ? text.size() - kWindow : 1;
  for (size_t q = text.size() - 1; q >= lo; --q) {
    const auto c = static_cast<unsigned char>(text[q]), p = static_cast<unsigned char>(text[q - 1]);
    if (p == '\n' && c > 0x20 && c < 0x7F) return q;
    if (c == ' ' && q + 1 < text.size() && alpha(p) && alpha(static_cast<unsigned char>(text[q + 1]))) return q;
  }
  return 0;
}

}  // namespace untied
