// Over 800 lines for one reason: it is the table of Jinja2's filters, tests and Python methods the
// subset supports, each a few lines that follow CPython; split up, the table would be scattered.
#include "train/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>

namespace untied::jinja {
namespace {

Value str_value(std::string s) { return Value::data(Json(std::move(s))); }
Value bool_value(bool b) { return Value::data(Json(b)); }

Value list_value(const std::vector<Value>& items) {
  Json a = Json::array();
  for (const Value& v : items) a.push_back(to_plain_json(v));
  return Value::data(std::move(a));
}

int64_t as_int(const Value& v, const char* what) {
  if (v.is_bool()) return v.j().get<bool>() ? 1 : 0;
  if (v.is_int()) return v.j().is_number_unsigned() ? static_cast<int64_t>(v.j().get<uint64_t>()) : v.j().get<int64_t>();
  fail(std::string(what) + " must be an integer, not '" + type_name(v) + "'");
}

double as_double(const Value& v, const char* what) {
  if (v.is_number()) return v.is_bool() ? (v.j().get<bool>() ? 1.0 : 0.0) : v.j().get<double>();
  fail(std::string(what) + " must be a number, not '" + type_name(v) + "'");
}

const std::string& as_string(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " must be a string, not '" + type_name(v) + "'");
  return v.str();
}

bool arg_bool(const Args& a, size_t pos, const char* name, bool def) {
  const Value* v = a.get(pos, name);
  return v ? truthy(*v) : def;
}

std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

std::string ascii_upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string ascii_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = prev_cased ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string ascii_capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = ascii_upper(out.substr(0, 1))[0];
  return out;
}

// str.strip / lstrip / rstrip with Python's rules: chars=None strips whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string cps = utf8_decode(s);
  std::u32string set;
  const bool by_set = chars && !chars->is_none() && !chars->is_undefined();
  if (by_set) set = utf8_decode(as_string(*chars, "strip() argument"));
  auto strip_it = [&](char32_t c) { return by_set ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(std::u32string_view(cps).substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const Value* sep_v, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  const bool by_space = !sep_v || sep_v->is_none();
  if (by_space) {
    std::u32string cps = utf8_decode(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (true) {
      while (i < cps.size() && py_isspace(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && py_isspace(cps[e - 1])) --e;
        std::u32string rest = cps.substr(i, e - i);
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(utf8_encode(rest));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_isspace(cps[j])) ++j;
      std::u32string word = cps.substr(i, j - i);
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(utf8_encode(word));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
    return parts;
  }
  const std::string& sep = as_string(*sep_v, "split() separator");
  if (sep.empty()) fail("empty separator");
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t p = s.find(sep, start);
      if (p == std::string::npos) break;
      parts.push_back(s.substr(start, p - start));
      start = p + sep.size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string::npos) break;
    parts.push_back(s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
  }
  parts.push_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts repl between code points
    const std::u32string cps = utf8_decode(s);
    int64_t n = 0;
    for (char32_t c : cps) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      out += utf8_encode(std::u32string(1, c));
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + repl;
    start = p + old.size();
    ++n;
  }
  return out + s.substr(start);
}

Value make_method(const std::string& name, std::function<Value(const Args&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->fn = std::move(fn);
  return Value::of_callable(std::move(c));
}

bool string_prefix_test(const std::string& s, const Value& arg, bool suffix) {
  auto test = [&](const Value& p) {
    const std::string& x = as_string(p, suffix ? "endswith() argument" : "startswith() argument");
    if (x.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
  };
  if (arg.is_array()) {
    for (const Json& e : arg.j())
      if (test(arg.child(e))) return true;
    return false;
  }
  return test(arg);
}

std::optional<Value> string_method(const Value& self, const std::string& name) {
  static const char* const kNames[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                       "upper", "lower", "title", "capitalize", "replace", "join", "find",
                                       "count"};
  if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; }) == std::end(kNames))
    return std::nullopt;
  return make_method("str." + name, [self, name](const Args& a) -> Value {
    const std::string& s = self.str();
    if (name == "startswith" || name == "endswith") {
      a.check(name, 1, {});
      if (a.positional.empty()) fail(name + "() takes at least 1 argument");
      return bool_value(string_prefix_test(s, a.positional[0], name == "endswith"));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      a.check(name, 1, {});
      return str_value(py_strip(s, a.get(0, ""), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      a.check(name, 2, {"sep", "maxsplit"});
      const Value* m = a.get(1, "maxsplit");
      std::vector<Value> parts;
      for (std::string& p : py_split(s, a.get(0, "sep"), m ? as_int(*m, "maxsplit") : -1, name == "rsplit"))
        parts.push_back(str_value(std::move(p)));
      return list_value(parts);
    }
    if (name == "upper") return str_value(ascii_upper(s));
    if (name == "lower") return str_value(ascii_lower(s));
    if (name == "title") return str_value(ascii_title(s));
    if (name == "capitalize") return str_value(ascii_capitalize(s));
    if (name == "replace") {
      a.check(name, 3, {});
      if (a.positional.size() < 2) fail("replace() takes at least 2 arguments");
      const int64_t count = a.positional.size() > 2 ? as_int(a.positional[2], "replace() count") : -1;
      return str_value(py_replace(s, as_string(a.positional[0], "replace() argument"),
                                  as_string(a.positional[1], "replace() argument"), count));
    }
    if (name == "join") {
      a.check(name, 1, {});
      if (a.positional.empty()) fail("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.positional[0])) {
        if (!v.is_string()) fail("sequence item: expected str instance, " + type_name(v) + " found");
        if (!first) out += s;
        first = false;
        out += v.str();
      }
      return str_value(out);
    }
    a.check(name, 1, {});
    if (a.positional.empty()) fail(name + "() takes at least 1 argument");
    const std::string& sub = as_string(a.positional[0], (name + "() argument").c_str());
    if (name == "find") {
      const size_t p = s.find(sub);
      return Value::data(Json(p == std::string::npos ? int64_t{-1}
                                                     : static_cast<int64_t>(utf8_decode(s.substr(0, p)).size())));
    }
    int64_t n = 0;
    if (sub.empty()) n = static_cast<int64_t>(utf8_decode(s).size()) + 1;
    else
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::data(Json(n));
  });
}

std::vector<Value> dict_items(const Value& d) {
  std::vector<Value> out;
  for (auto it = d.j().begin(); it != d.j().end(); ++it) {
    Json pair = Json::array({it.key(), it.value()});
    out.push_back(Value::data(std::move(pair)));
  }
  return out;
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return std::nullopt;
  return make_method("dict." + name, [self, name](const Args& a) -> Value {
    if (name == "get") {
      a.check(name, 2, {});
      if (a.positional.empty()) fail("get() takes at least 1 argument");
      if (a.positional[0].is_string()) {
        auto it = self.j().find(a.positional[0].str());
        if (it != self.j().end()) return self.child(*it);
      }
      return a.positional.size() > 1 ? a.positional[1] : Value::data(Json(nullptr));
    }
    a.check(name, 0, {});
    if (name == "items") return list_value(dict_items(self));
    Json out = Json::array();
    for (auto it = self.j().begin(); it != self.j().end(); ++it) out.push_back(name == "keys" ? Json(it.key()) : it.value());
    return Value::data(std::move(out));
  });
}

std::string kind_of(const Value& v) { return "'" + type_name(v) + " object'"; }

// The attribute `name` of v taken as a filter/sort key: a dotted path, digits index lists.
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value::data(Json(std::stoll(part)))) : get_item(cur, str_value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort key for sort/min/max/unique/dictsort: strings fold case unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return str_value(ascii_lower(v.str()));
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

size_t py_len(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return utf8_decode(v.str()).size();
  if (v.is_array() || v.is_dict()) return v.j().size();
  fail("object of type '" + type_name(v) + "' has no len()");
}

// The test name and its extra arguments from args[first...] (select, reject, selectattr, ...).
bool run_test_from(const Args& a, size_t first, const Value& item) {
  if (a.positional.size() <= first) return truthy(item);
  const std::string& name = as_string(a.positional[first], "a test name");
  if (!is_known_test(name)) fail("unknown test '" + name + "'");
  Args rest;
  rest.positional.assign(a.positional.begin() + static_cast<long>(first) + 1, a.positional.end());
  rest.keyword = a.keyword;
  return apply_test(name, item, rest);
}

Value filter_select(const Value& v, const Args& a, bool keep, bool by_attr) {
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    Value subject = item;
    if (by_attr) {
      if (a.positional.empty()) fail("selectattr/rejectattr need an attribute name");
      subject = attribute_path(item, as_string(a.positional[0], "the attribute name"));
    }
    if (run_test_from(a, by_attr ? 1 : 0, subject) == keep) out.push_back(item);
  }
  return list_value(out);
}

using FilterFn = Value (*)(const Value&, const Args&);

Value f_abs(const Value& v, const Args& a) {
  a.check("abs", 0, {});
  if (v.is_float()) return Value::data(Json(std::fabs(v.j().get<double>())));
  const int64_t i = as_int(v, "abs() argument");
  return Value::data(Json(i < 0 ? -i : i));
}
Value f_capitalize(const Value& v, const Args&) { return str_value(ascii_capitalize(py_str(v))); }
Value f_length(const Value& v, const Args&) { return Value::data(Json(static_cast<int64_t>(py_len(v)))); }
Value f_default(const Value& v, const Args& a) {
  a.check("default", 2, {"default_value", "boolean"});
  const Value* d = a.get(0, "default_value");
  const bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return d ? *d : str_value("");
  return v;
}
Value f_dictsort(const Value& v, const Args& a) {
  a.check("dictsort", 3, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) fail("dictsort expects a dict, not '" + type_name(v) + "'");
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = a.get(1, "by");
  const size_t pos = by && by->is_string() && by->str() == "value" ? 1 : 0;
  std::vector<Value> items = dict_items(v);
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return less(sort_key(x.child(x.j()[pos]), cs), sort_key(y.child(y.j()[pos]), cs));
  });
  if (arg_bool(a, 2, "reverse", false)) std::reverse(items.begin(), items.end());
  return list_value(items);
}
Value f_escape(const Value& v, const Args&) { return str_value(html_escape(py_str(v))); }
Value f_first(const Value& v, const Args&) {
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("first() of an empty sequence") : items.front();
}
Value f_last(const Value& v, const Args&) {
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("last() of an empty sequence") : items.back();
}
Value f_float(const Value& v, const Args& a) {
  a.check("float", 1, {"default"});
  if (v.is_number()) return Value::data(Json(as_double(v, "float")));
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string t = py_strip(v.str(), nullptr, true, true);
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value::data(Json(d));
    } catch (const std::exception&) {
    }
  }
  const Value* d = a.get(0, "default");
  return d ? *d : Value::data(Json(0.0));
}
Value f_int(const Value& v, const Args& a) {
  a.check("int", 2, {"default", "base"});
  if (v.is_bool() || v.is_int()) return Value::data(Json(as_int(v, "int")));
  if (v.is_float()) return Value::data(Json(static_cast<int64_t>(std::trunc(v.j().get<double>()))));
  if (v.is_string()) {
    const std::string t = py_strip(v.str(), nullptr, true, true);
    const Value* b = a.get(1, "base");
    try {
      size_t used = 0;
      const int64_t i = std::stoll(t, &used, b ? static_cast<int>(as_int(*b, "base")) : 10);
      if (used == t.size()) return Value::data(Json(i));
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value::data(Json(static_cast<int64_t>(std::trunc(d))));
    } catch (const std::exception&) {
    }
  }
  const Value* d = a.get(0, "default");
  return d ? *d : Value::data(Json(int64_t{0}));
}
Value f_format(const Value& v, const Args& a) {
  a.check("format", 64, {});
  return str_value(percent_format(py_str(v), list_value(a.positional)));
}
Value f_indent(const Value& v, const Args& a) {
  a.check("indent", 3, {"width", "first", "blank"});
  const Value* w = a.get(0, "width");
  const std::string pad = w && w->is_string() ? w->str() : std::string(w ? static_cast<size_t>(as_int(*w, "width")) : 4, ' ');
  const bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  std::string s = py_str(v) + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) rv += "\n";
    rv += i == 0 || (!blank && lines[i].empty()) ? lines[i] : pad + lines[i];
  }
  return str_value(first ? pad + rv : rv);
}
Value f_items(const Value& v, const Args&) {
  if (v.is_undefined()) return list_value({});
  if (!v.is_dict()) fail("items() expects a dict, not '" + type_name(v) + "'");
  return list_value(dict_items(v));
}
Value f_join(const Value& v, const Args& a) {
  a.check("join", 2, {"d", "attribute"});
  const Value* sep = a.get(0, "d");
  const Value* attr = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first && sep) out += py_str(*sep);
    first = false;
    out += py_str(attr ? attribute_path(item, py_str(*attr)) : item);
  }
  return str_value(out);
}
Value f_list(const Value& v, const Args&) { return list_value(iterate(v)); }
Value f_lower(const Value& v, const Args&) { return str_value(ascii_lower(py_str(v))); }
Value f_upper(const Value& v, const Args&) { return str_value(ascii_upper(py_str(v))); }
Value f_title(const Value& v, const Args&) { return str_value(ascii_title(py_str(v))); }
Value f_map(const Value& v, const Args& a) {
  std::vector<Value> out;
  const Value* attr = nullptr;
  for (const auto& [k, x] : a.keyword)
    if (k == "attribute") attr = &x;
  for (const Value& item : iterate(v)) {
    if (attr) {
      Value r = attribute_path(item, py_str(*attr));
      if (r.is_undefined())
        for (const auto& [k, x] : a.keyword)
          if (k == "default") r = x;
      out.push_back(r);
      continue;
    }
    if (a.positional.empty()) fail("map() needs a filter name or attribute=");
    const std::string& name = as_string(a.positional[0], "a filter name");
    if (!is_known_filter(name)) fail("unknown filter '" + name + "'");
    Args rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    out.push_back(apply_filter(name, item, rest));
  }
  return list_value(out);
}
Value min_max(const Value& v, const Args& a, bool want_max) {
  a.check(want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = a.get(1, "attribute");
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("no min/max of an empty sequence");
  auto key = [&](const Value& x) { return sort_key(attr ? attribute_path(x, py_str(*attr)) : x, cs); };
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i)
    if (want_max ? less(key(best), key(items[i])) : less(key(items[i]), key(best))) best = items[i];
  return best;
}
Value f_max(const Value& v, const Args& a) { return min_max(v, a, true); }
Value f_min(const Value& v, const Args& a) { return min_max(v, a, false); }
Value f_select(const Value& v, const Args& a) { return filter_select(v, a, true, false); }
Value f_reject(const Value& v, const Args& a) { return filter_select(v, a, false, false); }
Value f_selectattr(const Value& v, const Args& a) { return filter_select(v, a, true, true); }
Value f_rejectattr(const Value& v, const Args& a) { return filter_select(v, a, false, true); }
Value f_replace(const Value& v, const Args& a) {
  a.check("replace", 3, {"old", "new", "count"});
  const Value* o = a.get(0, "old");
  const Value* n = a.get(1, "new");
  const Value* c = a.get(2, "count");
  if (!o || !n) fail("replace() needs old and new");
  return str_value(py_replace(py_str(v), py_str(*o), py_str(*n), c && !c->is_none() ? as_int(*c, "count") : -1));
}
Value f_reverse(const Value& v, const Args&) {
  if (v.is_string()) {
    std::u32string cps = utf8_decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return str_value(utf8_encode(cps));
  }
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return list_value(items);
}
Value f_round(const Value& v, const Args& a) {
  a.check("round", 2, {"precision", "method"});
  const Value* p = a.get(0, "precision");
  const Value* m = a.get(1, "method");
  const int64_t prec = p ? as_int(*p, "precision") : 0;
  const std::string method = m ? py_str(*m) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("round() method must be 'common', 'ceil' or 'floor'");
  if (method == "common" && (v.is_int() || v.is_bool()) && prec >= 0) return Value::data(Json(as_int(v, "round")));
  const double scale = std::pow(10.0, static_cast<double>(prec));
  const double x = as_double(v, "round() argument") * scale;
  const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::data(Json(r / scale));
}
Value f_safe(const Value& v, const Args&) { return v; }
Value f_sort(const Value& v, const Args& a) {
  a.check("sort", 3, {"reverse", "case_sensitive", "attribute"});
  const bool rev = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attr = a.get(2, "attribute");
  std::vector<Value> items = iterate(v);
  auto key = [&](const Value& x) { return sort_key(attr ? attribute_path(x, py_str(*attr)) : x, cs); };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return rev ? less(key(y), key(x)) : less(key(x), key(y)); });
  return list_value(items);
}
Value f_string(const Value& v, const Args&) { return str_value(py_str(v)); }
Value f_sum(const Value& v, const Args& a) {
  a.check("sum", 2, {"attribute", "start"});
  const Value* attr = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  bool is_float = start && start->is_float();
  double f = start ? as_double(*start, "start") : 0.0;
  int64_t i = start && !is_float ? as_int(*start, "start") : 0;
  for (const Value& item : iterate(v)) {
    const Value x = attr ? attribute_path(item, py_str(*attr)) : item;
    if (x.is_float() && !is_float) {
      is_float = true;
      f = static_cast<double>(i);
    }
    if (is_float) f += as_double(x, "sum() item");
    else i += as_int(x, "sum() item");
  }
  return is_float ? Value::data(Json(f)) : Value::data(Json(i));
}
// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(const Value& v, const Args& a) {
  a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  if (const Value* ind = a.get(1, "indent"); ind && !ind->is_none()) {
    const int64_t n = as_int(*ind, "tojson indent");
    o.indent = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(n, 64)));
  }
  if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_array() || sep->j().size() != 2 || !sep->j()[0].is_string() || !sep->j()[1].is_string())
      fail("tojson separators must be a pair of strings");
    o.item_separator = sep->j()[0].get<std::string>();
    o.key_separator = sep->j()[1].get<std::string>();
    if (o.item_separator.empty() || o.key_separator.empty())
      fail("unsupported: empty tojson separators");
  }
  o.sort_keys = arg_bool(a, 3, "sort_keys", false);
  return str_value(to_json(v, o));
}
Value f_trim(const Value& v, const Args& a) {
  a.check("trim", 1, {"chars"});
  return str_value(py_strip(py_str(v), a.get(0, "chars"), true, true));
}
Value f_unique(const Value& v, const Args& a) {
  a.check("unique", 2, {"case_sensitive", "attribute"});
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = a.get(1, "attribute");
  std::vector<Value> out, keys;
  for (const Value& item : iterate(v)) {
    const Value k = sort_key(attr ? attribute_path(item, py_str(*attr)) : item, cs);
    if (std::none_of(keys.begin(), keys.end(), [&](const Value& x) { return equals(x, k); })) {
      keys.push_back(k);
      out.push_back(item);
    }
  }
  return list_value(out);
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> kFilters = {
      {"abs", f_abs},         {"capitalize", f_capitalize}, {"count", f_length},   {"d", f_default},
      {"default", f_default}, {"dictsort", f_dictsort},     {"e", f_escape},       {"escape", f_escape},
      {"first", f_first},     {"float", f_float},           {"format", f_format},  {"indent", f_indent},
      {"int", f_int},         {"items", f_items},           {"join", f_join},      {"last", f_last},
      {"length", f_length},   {"list", f_list},             {"lower", f_lower},    {"map", f_map},
      {"max", f_max},         {"min", f_min},               {"reject", f_reject},  {"rejectattr", f_rejectattr},
      {"replace", f_replace}, {"reverse", f_reverse},       {"round", f_round},    {"safe", f_safe},
      {"select", f_select},   {"selectattr", f_selectattr}, {"sort", f_sort},      {"string", f_string},
      {"sum", f_sum},         {"title", f_title},           {"tojson", f_tojson},  {"trim", f_trim},
      {"unique", f_unique},   {"upper", f_upper},
  };
  return kFilters;
}

bool has_cased(const std::string& s, bool want_lower) {
  bool any = false;
  for (char c : s) {
    if (!is_alpha(c)) continue;
    if ((c >= 'a' && c <= 'z') != want_lower) return false;
    any = true;
  }
  return any;
}

const Value& test_arg(const Args& a, const std::string& name) {
  if (a.positional.empty()) fail("the test '" + name + "' needs an argument");
  return a.positional[0];
}

bool same_as(const Value& a, const Value& b) {
  if (a.is_data() && b.is_data()) {
    const Json &x = a.j(), &y = b.j();
    if (x.is_null() || x.is_boolean() || y.is_null() || y.is_boolean()) return x.type() == y.type() && x == y;
    return a.json == b.json;
  }
  return equals(a, b);
}

}  // namespace

bool is_known_filter(std::string_view name) { return filters().find(name) != filters().end(); }

std::string known_filters_hint() {
  std::string s = "known filters:";
  for (const auto& [k, f] : filters()) s += " " + k;
  return s;
}

static const char* const kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "float", "ge", ">=", "gt", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "<", "mapping",
    "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper"};

bool is_known_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

std::string known_tests_hint() {
  std::string s = "known tests:";
  for (const char* t : kTests) s += std::string(" ") + t;
  return s;
}

Value apply_filter(const std::string& name, const Value& v, const Args& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("unknown filter '" + name + "'");
  return it->second(v, args);
}

bool apply_test(const std::string& n, const Value& v, const Args& a) {
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.is_bool();
  if (n == "false") return v.is_bool() && !v.j().get<bool>();
  if (n == "true") return v.is_bool() && v.j().get<bool>();
  if (n == "integer") return v.is_int();
  if (n == "float") return v.is_float();
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "iterable")
    return v.is_undefined() || v.is_string() || v.is_array() || v.is_dict() ||
           (v.kind == Value::Kind::kObject && v.object->type_name == "LoopContext");
  if (n == "sequence") return v.is_undefined() || v.is_string() || v.is_array() || v.is_dict();
  if (n == "callable") return v.kind == Value::Kind::kCallable;
  if (n == "escaped") return false;
  if (n == "lower") return v.is_string() && has_cased(v.str(), true);
  if (n == "upper") return v.is_string() && has_cased(v.str(), false);
  if (n == "odd" || n == "even") {
    const int64_t i = as_int(v, "the value of an odd/even test");
    return ((i % 2) != 0) == (n == "odd");
  }
  if (n == "divisibleby") {
    const int64_t d = as_int(test_arg(a, n), "divisibleby's argument");
    if (d == 0) fail("divisibleby 0");
    return as_int(v, "the value of divisibleby") % d == 0;
  }
  if (n == "sameas") return same_as(v, test_arg(a, n));
  if (n == "in") return contains(test_arg(a, n), v);
  if (n == "eq" || n == "equalto" || n == "==") return equals(v, test_arg(a, n));
  if (n == "ne" || n == "!=") return !equals(v, test_arg(a, n));
  if (n == "lt" || n == "<") return less(v, test_arg(a, n));
  if (n == "le" || n == "<=") return !less(test_arg(a, n), v);
  if (n == "gt" || n == ">") return less(test_arg(a, n), v);
  if (n == "ge" || n == ">=") return !less(v, test_arg(a, n));
  fail("unknown test '" + n + "'");
}

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::kUndefined: fail(obj.hint.empty() ? "'" + name + "' of an undefined value" : obj.hint);
    case Value::Kind::kObject: {
      if (const Value* v = obj.object->find(name)) return *v;
      return Value::undefined("'" + obj.object->type_name + "' object has no attribute '" + name + "'");
    }
    case Value::Kind::kCallable: return Value::undefined("'function' object has no attribute '" + name + "'");
    case Value::Kind::kData: break;
  }
  if (obj.is_dict()) {
    if (auto m = dict_method(obj, name)) return *m;
    auto it = obj.j().find(name);
    if (it != obj.j().end()) return obj.child(*it);
  } else if (obj.is_string()) {
    if (auto m = string_method(obj, name)) return *m;
  }
  return Value::undefined(kind_of(obj) + " has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail(obj.hint.empty() ? "subscript of an undefined value" : obj.hint);
  if (obj.is_dict() && key.is_string()) {
    auto it = obj.j().find(key.str());
    if (it != obj.j().end()) return obj.child(*it);
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = as_int(key, "an index");
    if (obj.is_array()) {
      const int64_t n = static_cast<int64_t>(obj.j().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.child(obj.j()[static_cast<size_t>(i)]);
    } else {
      const std::u32string cps = utf8_decode(obj.str());
      const int64_t n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return str_value(utf8_encode(std::u32string(1, cps[static_cast<size_t>(i)])));
    }
    return Value::undefined(kind_of(obj) + " has no element " + py_repr(key));
  }
  if (key.is_string()) return get_attribute(obj, key.str());
  return Value::undefined(kind_of(obj) + " has no element " + py_repr(key));
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) fail(obj.hint.empty() ? "slice of an undefined value" : obj.hint);
  if (!obj.is_array() && !obj.is_string()) fail("'" + type_name(obj) + "' object is not subscriptable");
  const std::u32string cps = obj.is_string() ? utf8_decode(obj.str()) : std::u32string();
  const int64_t n = obj.is_string() ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(obj.j().size());
  auto given = [](const Value* v) { return v && !v->is_none() && !v->is_undefined(); };
  const int64_t st = given(step) ? as_int(*step, "a slice step") : 1;
  if (st == 0) fail("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value* v, int64_t def) {
    if (!given(v)) return def;
    int64_t i = as_int(*v, "a slice index");
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t b = adjust(start, st < 0 ? n - 1 : 0);
  const int64_t e = adjust(stop, st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(i);
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : idx) out += cps[static_cast<size_t>(i)];
    return str_value(utf8_encode(out));
  }
  Json out = Json::array();
  for (int64_t i : idx) out.push_back(obj.j()[static_cast<size_t>(i)]);
  return Value::data(std::move(out));
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Json& e : container.j())
      if (equals(container.child(e), item)) return true;
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.j().contains(item.str());
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  if (v.is_array()) {
    out.reserve(v.j().size());
    for (const Json& e : v.j()) out.push_back(v.child(e));
    return out;
  }
  if (v.is_dict()) {
    for (auto it = v.j().begin(); it != v.j().end(); ++it) out.push_back(str_value(it.key()));
    return out;
  }
  if (v.is_string()) {
    for (char32_t c : utf8_decode(v.str())) out.push_back(str_value(utf8_encode(std::u32string(1, c))));
    return out;
  }
  fail("'" + type_name(v) + "' object is not iterable");
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> values = args.is_array() ? iterate(args) : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (i + 1 >= fmt.size()) fail("incomplete format: a '%' ends the string");
    const char c = fmt[++i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= values.size()) fail("not enough arguments for format string");
    const Value& v = values[next++];
    char buf[64];
    switch (c) {
      case 's': out += py_str(v); break;
      case 'r': out += py_repr(v); break;
      case 'd':
      case 'i': out += std::to_string(v.is_float() ? static_cast<int64_t>(std::trunc(v.j().get<double>()))
                                                   : as_int(v, "%d format")); break;
      case 'f':
        std::snprintf(buf, sizeof buf, "%f", as_double(v, "%f format"));
        out += buf;
        break;
      default: fail(std::string("unsupported: format conversion '%") + c + "' (supported: %s %r %d %i %f %%)");
    }
  }
  if (next < values.size() && args.is_array()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace untied::jinja
