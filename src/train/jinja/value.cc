#include "train/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace untied::jinja {

void fail(std::string message, int line) { throw TemplateError{std::move(message), line, false}; }

Value Value::undefined(std::string why) {
  Value v;
  v.hint = std::move(why);
  return v;
}

Value Value::data(Json j) {
  Value v;
  v.kind = Kind::kData;
  auto owner = std::make_shared<const Json>(std::move(j));
  v.json = owner.get();
  v.owner = std::move(owner);
  return v;
}

Value Value::ref(const std::shared_ptr<const Json>& owner, const Json* node) {
  Value v;
  v.kind = Kind::kData;
  v.owner = owner;
  v.json = node;
  return v;
}

Value Value::of_object(std::shared_ptr<Object> o) {
  Value v;
  v.kind = Kind::kObject;
  v.object = std::move(o);
  return v;
}

Value Value::of_callable(std::shared_ptr<Callable> c) {
  Value v;
  v.kind = Kind::kCallable;
  v.callable = std::move(c);
  return v;
}

const Value* Object::find(std::string_view name) const {
  for (const auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

void Object::set(const std::string& name, Value v) {
  for (auto& [k, old] : attrs)
    if (k == name) {
      old = std::move(v);
      return;
    }
  attrs.emplace_back(name, std::move(v));
}

const Value* Args::get(size_t pos, std::string_view name) const {
  if (pos < positional.size()) return &positional[pos];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

void Args::check(std::string_view fn, size_t max_positional, std::initializer_list<std::string_view> known) const {
  if (positional.size() > max_positional)
    fail(std::string(fn) + "() takes at most " + std::to_string(max_positional) + " positional argument(s), got " +
         std::to_string(positional.size()));
  for (const auto& [k, v] : keyword)
    if (std::find(known.begin(), known.end(), k) == known.end())
      fail(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kObject: return v.object->type_name;
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kData: break;
  }
  const Json& j = v.j();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_float()) return "float";
  if (j.is_number()) return "int";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kObject:
    case Value::Kind::kCallable: return true;
    case Value::Kind::kData: break;
  }
  const Json& j = v.j();
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_float()) return j.get<double>() != 0.0;
  if (j.is_number_unsigned()) return j.get<uint64_t>() != 0;
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  if (j.is_array() || j.is_object()) return !j.empty();
  return true;
}

namespace {

// Python's numeric value of a number or bool, as a double and (when exact) an integer.
struct Num {
  bool is_float;
  double f;
  int64_t i;
};

Num num_of(const Json& j) {
  if (j.is_boolean()) return {false, j.get<bool>() ? 1.0 : 0.0, j.get<bool>() ? 1 : 0};
  if (j.is_number_float()) return {true, j.get<double>(), 0};
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    return {false, static_cast<double>(u), static_cast<int64_t>(u)};
  }
  const int64_t i = j.get<int64_t>();
  return {false, static_cast<double>(i), i};
}

bool json_num(const Json& j) { return j.is_number() || j.is_boolean(); }

bool json_equals(const Json& a, const Json& b) {
  if (json_num(a) && json_num(b)) {
    const Num x = num_of(a), y = num_of(b);
    if (!x.is_float && !y.is_float) return x.i == y.i;
    return x.f == y.f;
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equals(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto jt = b.find(it.key());
      if (jt == b.end() || !json_equals(it.value(), *jt)) return false;
    }
    return true;
  }
  return a == b;
}

int json_compare(const Json& a, const Json& b, const Value& va, const Value& vb) {
  if (json_num(a) && json_num(b)) {
    const Num x = num_of(a), y = num_of(b);
    if (!x.is_float && !y.is_float) return x.i < y.i ? -1 : (x.i > y.i ? 1 : 0);
    return x.f < y.f ? -1 : (x.f > y.f ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (json_equals(a[i], b[i])) continue;
      return json_compare(a[i], b[i], va, vb);
    }
    return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '" + type_name(va) + "' and '" + type_name(vb) + "'");
}

void append_utf8(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // surrogateescape: the original byte
    out += static_cast<char>(c - 0xDC00);
  } else if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool py_isprintable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c >= 0x80 && c < 0xA0) return false;
  if (c == 0xAD) return false;
  if (c >= 0xDC80 && c <= 0xDCFF) return false;
  if (c == 0x2028 || c == 0x2029) return false;
  return !py_isspace(c) || c == ' ';
}

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (py_isprintable(c)) {
      append_utf8(out, c);
    } else {
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

std::string repr_json(const Json& j) {
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_float()) return py_float_repr(j.get<double>());
  if (j.is_number_unsigned()) return std::to_string(j.get<uint64_t>());
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_string()) return repr_string(j.get_ref<const std::string&>());
  std::string out;
  if (j.is_array()) {
    out = "[";
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      out += repr_json(j[i]);
    }
    return out + "]";
  }
  out = "{";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out += ", ";
    first = false;
    out += repr_string(it.key()) + ": " + repr_json(it.value());
  }
  return out + "}";
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out += '"';
}

void dump_json(std::string& out, const Json& j, const JsonDumpOptions& o, int level) {
  if (j.is_null()) { out += "null"; return; }
  if (j.is_boolean()) { out += j.get<bool>() ? "true" : "false"; return; }
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (std::isnan(d)) out += "NaN";
    else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
    else out += py_float_repr(d);
    return;
  }
  if (j.is_number_unsigned()) { out += std::to_string(j.get<uint64_t>()); return; }
  if (j.is_number_integer()) { out += std::to_string(j.get<int64_t>()); return; }
  if (j.is_string()) { json_string(out, j.get_ref<const std::string&>(), o.ensure_ascii); return; }
  const bool is_array = j.is_array();
  if (j.empty()) { out += is_array ? "[]" : "{}"; return; }
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  const std::string nl = o.indent >= 0 ? "\n" + std::string(static_cast<size_t>(o.indent) * (level + 1), ' ') : "";
  const std::string nl_end = o.indent >= 0 ? "\n" + std::string(static_cast<size_t>(o.indent) * level, ' ') : "";
  out += is_array ? '[' : '{';
  out += nl;
  if (is_array) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += item_sep + nl;
      dump_json(out, j[i], o, level + 1);
    }
  } else {
    std::vector<std::pair<const std::string*, const Json*>> items;
    for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(&it.key(), &it.value());
    if (o.sort_keys)
      std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep + nl;
      json_string(out, *items[i].first, o.ensure_ascii);
      out += key_sep;
      dump_json(out, *items[i].second, o, level + 1);
    }
  }
  out += nl_end;
  out += is_array ? ']' : '}';
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  if (a.is_data() && b.is_data()) return json_equals(a.j(), b.j());
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.kind == Value::Kind::kObject && b.kind == Value::Kind::kObject) return a.object == b.object;
  if (a.kind == Value::Kind::kCallable && b.kind == Value::Kind::kCallable) return a.callable == b.callable;
  return false;
}

bool less(const Value& a, const Value& b) {
  if (!a.is_data() || !b.is_data())
    fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
  return json_compare(a.j(), b.j(), a, b) < 0;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that read back as d, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp >= -5 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    // Python switches to exponent notation below 1e-4.
    if (exp >= -4) return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + out + ebuf;
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kCallable: return "<function " + v.callable->name + ">";
    case Value::Kind::kObject: {
      std::string out = "<" + v.object->type_name + " {";
      bool first = true;
      for (const auto& [k, a] : v.object->attrs) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + py_repr(a);
      }
      return out + "}>";
    }
    case Value::Kind::kData: break;
  }
  if (v.j().is_string()) return v.str();
  return repr_json(v.j());
}

std::string py_repr(const Value& v) {
  if (v.is_data()) return repr_json(v.j());
  return py_str(v);
}

std::string to_json(const Value& v, const JsonDumpOptions& o) {
  if (!v.is_data()) {
    if (v.kind == Value::Kind::kObject) return to_json(Value::data(to_plain_json(v)), o);
    fail("Object of type " + type_name(v) + " is not JSON serializable" +
         (v.is_undefined() && !v.hint.empty() ? " (" + v.hint + ")" : ""));
  }
  std::string out;
  dump_json(out, v.j(), o, 0);
  return out;
}

Json to_plain_json(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kData: return v.j();
    case Value::Kind::kObject: {
      Json o = Json::object();
      for (const auto& [k, a] : v.object->attrs) o[k] = to_plain_json(a);
      return o;
    }
    case Value::Kind::kUndefined:
      fail(v.hint.empty() ? "an undefined value cannot be stored" : v.hint);
    case Value::Kind::kCallable: break;
  }
  fail("a function (" + v.callable->name + ") cannot be stored in a list or dict");
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = 0;
    char32_t cp = 0;
    if (c < 0x80) { out += c; ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    bool ok = n > 0;
    for (int k = 1; ok && k <= n; ++k) {
      if (i + k >= s.size()) { ok = false; break; }
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (cc & 0x3F);
    }
    if (ok) {
      static const char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
      if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) ok = false;
    }
    if (ok) {
      out += cp;
      i += static_cast<size_t>(n) + 1;
    } else {
      out += static_cast<char32_t>(0xDC00 + c);
      ++i;
    }
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  switch (c) {
    case ' ': case '\t': case '\n': case '\r': case 0x0B: case 0x0C:
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace untied::jinja
