#include "untied/core/json.h"

#include <cstdio>
#include <cstdlib>

namespace untied {

std::string json_line(const Json& j) {
  // dump(0) puts each item on a line of its own, with ": " after keys. Its line breaks are all
  // structure (a string's newline is written as \n), so each one can go: after an opening
  // bracket or before a closing one it is dropped, elsewhere (after a comma) it becomes a space.
  const std::string multi = j.dump(0, ' ', false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(multi.size());
  for (size_t i = 0; i < multi.size(); ++i) {
    if (multi[i] != '\n') {
      out += multi[i];
      continue;
    }
    const char before = i > 0 ? multi[i - 1] : '\0', after = i + 1 < multi.size() ? multi[i + 1] : '\0';
    if (before != '{' && before != '[' && after != '}' && after != ']') out += ' ';
  }
  return out;
}

void print_json_rows(const std::vector<Json>& rows) {
  std::printf("[\n");
  for (size_t i = 0; i < rows.size(); ++i)
    std::printf("  %s%s\n", json_line(rows[i]).c_str(), i + 1 < rows.size() ? "," : "");
  std::printf("]\n");
}

double as_printed(const char* fmt, double v) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, fmt, v);
  if (n < 0 || n >= static_cast<int>(sizeof buf)) return v;  // a huge value (1e300 as %.2f): left as it is
  return std::strtod(buf, nullptr);  // "nan", "-nan" and "inf" read back as themselves
}

Json peak_bytes_by_tag(const MemoryStats& m) {
  Json j = Json::object();
  for (int t = 0; t < kNumTags; ++t) j[std::string(tag_name(static_cast<Tag>(t)))] = m.peak[t];
  return j;
}

}  // namespace untied
