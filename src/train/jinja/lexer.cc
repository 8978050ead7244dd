// The lexer: Jinja2's tokenizer (jinja2/lexer.py) with trim_blocks and lstrip_blocks on.
//
//   source:  \r\n and \r become \n; one trailing \n is dropped (keep_trailing_newline=False)
//   text:    up to the next "{{", "{%" or "{#"
//            "{%-" / "{{-" / "{#-" strip all whitespace before the tag;
//            otherwise, for "{%" and "{#" (not "{%+"), spaces and tabs between the line start and
//            the tag are dropped (lstrip_blocks)
//   tags:    "-%}" "-}}" "-#}" strip all whitespace after the tag; "%}" and "#}" eat one
//            newline right after them (trim_blocks); "+%}" keeps it; "}}" keeps everything
//   inside:  names, strings, integers, floats, operators; an end marker inside open brackets
//            is an operator ("{{ {'a': {'b': 1}} }}")
#include <algorithm>
#include <cctype>
#include <cstring>

#include "train/jinja/syntax.h"
#include "train/jinja/value.h"

namespace untied::jinja {
namespace {

// The code point at s[pos] and its length in bytes (a stray byte counts as one).
char32_t code_point_at(const std::string& s, size_t pos, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[pos]);
  size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
  if (pos + n > s.size()) n = 1;
  const std::u32string cp = utf8_decode(std::string_view(s).substr(pos, n));
  *len = cp.size() == 1 ? n : 1;
  return cp.empty() ? c : cp[0];
}

bool space_at(const std::string& s, size_t pos, size_t* len) {
  return pos < s.size() && py_isspace(code_point_at(s, pos, len));
}

size_t skip_space(const std::string& s, size_t pos) {
  size_t len = 0;
  while (space_at(s, pos, &len)) pos += len;
  return pos;
}

std::string rstrip_space(const std::string& text) {
  std::u32string cps = utf8_decode(text);
  while (!cps.empty() && py_isspace(cps.back())) cps.pop_back();
  return utf8_encode(cps);
}

bool all_space(const std::string& text) {
  if (text.empty()) return false;
  for (char32_t c : utf8_decode(text))
    if (!py_isspace(c)) return false;
  return true;
}

bool starts_with(const std::string& s, size_t pos, const char* lit) {
  return s.compare(pos, std::strlen(lit), lit) == 0;
}

// A Python string literal's body, escapes decoded ("unicode-escape").
std::string decode_string(const std::string& body, int line) {
  std::u32string in = utf8_decode(body), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out += in[i];
      continue;
    }
    const char32_t e = in[++i];
    auto hex = [&](size_t digits) {
      if (i + digits >= in.size()) fail("truncated \\x/\\u escape in a string", line);
      char32_t v = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char32_t h = in[i + k];
        int d = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
        if (d < 0) fail("bad \\x/\\u escape in a string", line);
        v = v * 16 + static_cast<char32_t>(d);
      }
      i += digits;
      return v;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += 0x07; break;
      case 'b': out += 0x08; break;
      case 'f': out += 0x0C; break;
      case 'v': out += 0x0B; break;
      case '\n': break;  // line continuation
      case 'x': out += hex(2); break;
      case 'u': out += hex(4); break;
      case 'U': out += hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k)
            v = v * 8 + (in[++i] - '0');
          out += v;
        } else {
          out += '\\';  // Python keeps unknown escapes as they are
          out += e;
        }
    }
  }
  return utf8_encode(out);
}

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {}

  std::vector<Token> run() {
    while (pos_ < s_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_text(s_.substr(pos_));
        advance_to(s_.size());
        break;
      }
      const char kind = s_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < s_.size() && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
      const bool raw = kind == '%' && is_raw_begin(after);
      std::string text = s_.substr(pos_, tag - pos_);
      text = strip_before_tag(std::move(text), sign, kind != '{');
      emit_text(text);
      advance_to(tag);
      if (raw) lex_raw(after);
      else if (kind == '#') lex_comment(after);
      else lex_tag(kind, after);
    }
    out_.push_back({Tok::kEof, "", line_});
    return std::move(out_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos && p + 1 < s_.size(); p = s_.find('{', p + 1)) {
      const char c = s_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
    }
    return std::string::npos;
  }

  // The text before a tag, after the tag's whitespace control.
  std::string strip_before_tag(std::string text, char sign, bool block_or_comment) const {
    if (sign == '-') return rstrip_space(text);
    if (sign == '+' || !block_or_comment) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_space(text.substr(l_pos))) text.resize(l_pos);
    return text;
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) out_.push_back({Tok::kData, text, line_});
  }

  // Moves to `to`, counting lines; line_starting_ tells whether the consumed span ended a line.
  void advance_to(size_t to) {
    line_ += static_cast<int>(std::count(s_.begin() + static_cast<long>(pos_), s_.begin() + static_cast<long>(to), '\n'));
    if (to > pos_) line_starting_ = s_[to - 1] == '\n';
    pos_ = to;
  }

  // After "{%" and its sign: "raw" then "%}" or "-%}".
  bool is_raw_begin(size_t p) const {
    p = skip_space(s_, p);
    if (!starts_with(s_, p, "raw")) return false;
    p = skip_space(s_, p + 3);
    return starts_with(s_, p, "%}") || starts_with(s_, p, "-%}");
  }

  void lex_raw(size_t p) {
    const int open_line = line_;
    p = skip_space(s_, p);
    p = skip_space(s_, p + 3);
    if (s_[p] == '-') p = skip_space(s_, p + 3);
    else p += 2;
    advance_to(p);
    // The body runs to "{%[-+]? endraw [-+]?%}".
    for (size_t q = s_.find("{%", pos_); q != std::string::npos; q = s_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = 0;
      if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) sign = s_[r++];
      r = skip_space(s_, r);
      if (!starts_with(s_, r, "endraw")) continue;
      r = skip_space(s_, r + 6);
      size_t end;
      if (starts_with(s_, r, "+%}")) end = r + 3;
      else if (starts_with(s_, r, "-%}")) end = skip_space(s_, r + 3);
      else if (starts_with(s_, r, "%}")) end = r + 2 + (r + 2 < s_.size() && s_[r + 2] == '\n' ? 1 : 0);
      else continue;
      emit_text(strip_before_tag(s_.substr(pos_, q - pos_), sign, true));
      advance_to(end);
      return;
    }
    fail("unclosed '{% raw %}': add '{% endraw %}'", open_line);
  }

  void lex_comment(size_t p) {
    for (; p + 1 < s_.size(); ++p) {
      if (starts_with(s_, p, "+#}")) { advance_to(p + 3); return; }
      if (starts_with(s_, p, "-#}")) { advance_to(skip_space(s_, p + 3)); return; }
      if (starts_with(s_, p, "#}")) {
        advance_to(p + 2 + (p + 2 < s_.size() && s_[p + 2] == '\n' ? 1 : 0));
        return;
      }
    }
    fail("unclosed comment: '{#' has no '#}'", line_);
  }

  // "{{ ... }}" or "{% ... %}": tokens up to the end marker.
  void lex_tag(char kind, size_t p) {
    const bool block = kind == '%';
    const int open_line = line_;
    out_.push_back({block ? Tok::kBlockBegin : Tok::kVariableBegin, "", line_});
    advance_to(p);
    std::vector<char> brackets;
    while (true) {
      size_t q = skip_space(s_, pos_);
      advance_to(q);
      if (pos_ >= s_.size())
        fail(std::string("unclosed tag: '") + (block ? "{%" : "{{") + "' has no '" + (block ? "%}" : "}}") + "'",
             open_line);
      if (brackets.empty()) {
        const char* close = block ? "%}" : "}}";
        if (s_[pos_] == '-' && starts_with(s_, pos_ + 1, close)) {
          out_.push_back({block ? Tok::kBlockEnd : Tok::kVariableEnd, "", line_});
          advance_to(skip_space(s_, pos_ + 3));
          return;
        }
        if (block && starts_with(s_, pos_, "+%}")) {
          out_.push_back({Tok::kBlockEnd, "", line_});
          advance_to(pos_ + 3);
          return;
        }
        if (starts_with(s_, pos_, close)) {
          out_.push_back({block ? Tok::kBlockEnd : Tok::kVariableEnd, "", line_});
          size_t end = pos_ + 2;
          if (block && end < s_.size() && s_[end] == '\n') ++end;  // trim_blocks
          advance_to(end);
          return;
        }
      }
      lex_token(brackets);
    }
  }

  void lex_token(std::vector<char>& brackets) {
    const char c = s_[pos_];
    const auto digit = [&](size_t p) { return p < s_.size() && s_[p] >= '0' && s_[p] <= '9'; };
    // The digits of a number with "_" separators: \d+(_\d+)*
    const auto digits = [&](size_t p) {
      size_t q = p;
      while (digit(q) || (s_[q] == '_' && q > p && digit(q + 1))) ++q;
      return q;
    };
    if (digit(pos_)) {
      size_t q = digits(pos_);
      bool is_float = false;
      const bool after_dot = pos_ > 0 && s_[pos_ - 1] == '.';
      if (!after_dot) {
        size_t r = q;
        if (r < s_.size() && s_[r] == '.' && digit(r + 1)) {
          r = digits(r + 1);
          is_float = true;
        }
        if (r < s_.size() && (s_[r] == 'e' || s_[r] == 'E')) {
          size_t t = r + 1;
          if (t < s_.size() && (s_[t] == '+' || s_[t] == '-')) ++t;
          if (digit(t)) {
            r = digits(t);
            is_float = true;
          }
        }
        if (is_float) q = r;
      }
      std::string text;
      for (size_t k = pos_; k < q; ++k)
        if (s_[k] != '_') text += s_[k];
      out_.push_back({is_float ? Tok::kFloat : Tok::kInt, text, line_});
      advance_to(q);
      return;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = pos_;
      while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
      out_.push_back({Tok::kName, s_.substr(pos_, q - pos_), line_});
      advance_to(q);
      return;
    }
    if (c == '\'' || c == '"') {
      size_t q = pos_ + 1;
      while (q < s_.size() && s_[q] != c) q += s_[q] == '\\' ? 2 : 1;
      if (q >= s_.size()) fail(std::string("unterminated string: add the closing ") + c, line_);
      out_.push_back({Tok::kString, decode_string(s_.substr(pos_ + 1, q - pos_ - 1), line_), line_});
      advance_to(q + 1);
      return;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                       "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      if (!starts_with(s_, pos_, op)) continue;
      const char o = op[0];
      if (op[1] == 0 && (o == '(' || o == '[' || o == '{')) brackets.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      if (op[1] == 0 && (o == ')' || o == ']' || o == '}')) {
        if (brackets.empty() || brackets.back() != o) fail(std::string("unexpected '") + o + "'", line_);
        brackets.pop_back();
      }
      out_.push_back({Tok::kOp, op, line_});
      advance_to(pos_ + std::strlen(op));
      return;
    }
    size_t len = 1;
    const char32_t cp = code_point_at(s_, pos_, &len);
    fail("unexpected character '" + utf8_encode(std::u32string(1, cp)) + "'", line_);
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

std::string normalize_newlines(const std::string& raw) {
  std::string s;
  s.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      s += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      s += raw[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace untied::jinja
