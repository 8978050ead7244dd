// Jinja2's filters and tests, and Python's attribute and item access, for the template subset.
//
// Filters (Jinja2's, and transformers' tojson): abs, capitalize, count, d, default, dictsort,
// e, escape, first, float, format, indent, int, items, join, last, length, list, lower, map,
// max, min, reject, rejectattr, replace, reverse, round, safe, select, selectattr, sort,
// string, sum, title, tojson, trim, unique, upper.
// Tests: boolean, callable, defined, divisibleby, eq/equalto/==, escaped, even, false, float,
// ge/>=, gt/>, in, integer, iterable, le/<=, lower, lt/<, mapping, ne/!=, none, number, odd,
// sameas, sequence, string, true, undefined, upper.
// Methods: str.startswith/endswith/strip/lstrip/rstrip/split/rsplit/upper/lower/replace/title/
// capitalize/join/find/count/format-free; dict.items/keys/values/get.
// upper/lower/title/capitalize change ASCII letters only.
//
// Each function throws TemplateError with Python's wording for a misuse.
#pragma once

#include <string>
#include <string_view>

#include "train/jinja/value.h"

namespace untied::jinja {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
// "known filters: abs, ..." for the parser's message.
std::string known_filters_hint();
std::string known_tests_hint();

Value apply_filter(const std::string& name, const Value& v, const Args& args);
bool apply_test(const std::string& name, const Value& v, const Args& args);

// obj.name: a method of a str or dict first, then the dict's key (Jinja's getattr).
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: the item first, then a method named key (Jinja's getitem).
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step], Python's rules; null parts are omitted ones.
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// `item in container`.
bool contains(const Value& container, const Value& item);
// The items a for loop or a filter walks: a list's elements, a dict's keys, a string's
// characters; an undefined value has none. Throws for anything else.
std::vector<Value> iterate(const Value& v);
// Python's `a % b` with a str on the left: %s %r %d %i %f %% conversions.
std::string percent_format(const std::string& fmt, const Value& args);

}  // namespace untied::jinja
