// The values a chat template computes with, and the Python behaviour Jinja2 gives them.
//
// A Value is undefined, JSON data, an object (a namespace() or a for-loop's `loop`) or a callable
// (a macro, a filter-like global, a bound string/dict method). JSON data is held by reference
// into a shared, immutable document, so `messages[3].content` costs no copy; values computed by
// the template own a fresh document. Objects are shared by reference, as in Python: the namespace
// a loop body assigns to is the one the template reads after the loop.
//
// Everything here follows CPython, because transformers renders templates with Jinja2 on Python:
// py_str is str(), py_repr is repr(), to_json is json.dumps, truthy is bool(), equals is ==.
// Strings are UTF-8; lengths, indices and slices count code points, as Python's str does.
//
// Errors are thrown as TemplateError (a message, with the template line where the renderer knows
// it); chat_template.cc turns them into a Status. Nothing here is thread-unsafe: values are
// shared between threads only when a caller shares them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "untied/core/json.h"

namespace untied::jinja {

// A render or parse failure: what went wrong, in the words of the template's author.
struct TemplateError {
  std::string message;
  int line = 0;  // 0: not yet known; the statement that catches it fills it in
  bool raised = false;  // thrown by raise_exception() in the template
};

[[noreturn]] void fail(std::string message, int line = 0);

struct Object;
struct Callable;

struct Value {
  enum class Kind { kUndefined, kData, kObject, kCallable };
  Kind kind = Kind::kUndefined;
  std::shared_ptr<const Json> owner;  // kData: keeps `json` alive
  const Json* json = nullptr;         // kData
  std::shared_ptr<Object> object;     // kObject
  std::shared_ptr<Callable> callable; // kCallable
  std::string hint;                   // kUndefined: why ("'x' is undefined"), for errors

  static Value undefined(std::string why);
  static Value data(Json j);
  static Value ref(const std::shared_ptr<const Json>& owner, const Json* node);
  static Value of_object(std::shared_ptr<Object> o);
  static Value of_callable(std::shared_ptr<Callable> c);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_data() const { return kind == Kind::kData; }
  const Json& j() const { return *json; }
  bool is_string() const { return is_data() && json->is_string(); }
  bool is_array() const { return is_data() && json->is_array(); }
  bool is_dict() const { return is_data() && json->is_object(); }
  bool is_none() const { return is_data() && json->is_null(); }
  bool is_bool() const { return is_data() && json->is_boolean(); }
  bool is_int() const { return is_data() && (json->is_number_integer() || json->is_number_unsigned()); }
  bool is_float() const { return is_data() && json->is_number_float(); }
  // Python's numbers, bool included (True + 1 == 2).
  bool is_number() const { return is_data() && (json->is_number() || json->is_boolean()); }
  const std::string& str() const { return json->get_ref<const std::string&>(); }
  // Element i of an array / value of a dict, sharing this value's document.
  Value child(const Json& node) const { return ref(owner, &node); }
};

// namespace() and loop: named attributes in insertion order.
struct Object {
  std::string type_name;  // "namespace", "LoopContext"
  bool assignable = false;  // {% set ns.x = ... %} allowed (namespace only)
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument called `name` at position `pos` or by keyword; nullptr when not given.
  const Value* get(size_t pos, std::string_view name) const;
  // Refuses a keyword argument outside `known` and more than max_positional positional ones.
  void check(std::string_view fn, size_t max_positional, std::initializer_list<std::string_view> known) const;
};

struct Callable {
  std::string name;
  std::function<Value(const Args&)> fn;
};

// Python's type name of v, for messages: "str", "int", "list", "dict", "NoneType", "Undefined".
std::string type_name(const Value& v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// a < b for numbers, strings and lists (lexicographic); other pairs throw like Python.
bool less(const Value& a, const Value& b);

// str(v), repr(v). An undefined value prints as "" (Jinja's default Undefined).
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;  // < 0: None (one line)
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;
  bool sort_keys = false;
};
// json.dumps(v, ...) exactly as Python writes it (", " and ": ", floats as repr, NaN/Infinity).
std::string to_json(const Value& v, const JsonDumpOptions& o);

// The plain JSON of v (a data value's copy; a namespace as an object); throws for undefined and
// callables. Used where a computed value must be stored (list literals, dict()).
Json to_plain_json(const Value& v);

// UTF-8 <-> code points. Bytes that are not UTF-8 map to U+DC80..U+DCFF and back (Python's
// surrogateescape), so any byte string round-trips.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
// Python's str.isspace() for one code point.
bool py_isspace(char32_t c);

}  // namespace untied::jinja
