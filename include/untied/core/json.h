// JSON output (the metrics lines, `--json`, the --dump meta.json), through
// nlohmann::ordered_json so that keys come out in the order they are set. Numbers stay numbers
// (integers as integers); a non-finite double (a NaN loss, an infinite ratio) is written as
// null, nlohmann's rule, since JSON has no NaN or infinity; strings are escaped, and bytes that
// are not UTF-8 are replaced by U+FFFD instead of failing the dump.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "untied/core/allocator.h"

namespace untied {

using Json = nlohmann::ordered_json;

// j on one line with ": " after each key and ", " between items, `{"seq": 4096, "ms": 1.5}`:
// the spacing these lines have always had, which line-based readers match (`"loss": `).
std::string json_line(const Json& j);

// Prints rows on stdout as one JSON array, one object per line: "[\n  {...},\n  {...}\n]\n".
void print_json_rows(const std::vector<Json>& rows);

// v rounded to what printf's `fmt` prints ("%.3f": 3 decimals), so that a timing has the
// digits it had when these outputs were printf'd; NaN and infinities stay so (and print null).
double as_printed(const char* fmt, double v);

// {"parameters": bytes, "gradients": bytes, ...}: the peak of every tag, in tag order.
Json peak_bytes_by_tag(const MemoryStats& m);

}  // namespace untied
