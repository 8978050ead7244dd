// Config files (config_file.h).
#include "cli/config_file.h"

#include <sstream>

#include <nlohmann/json.hpp>

namespace untied::cli {
namespace {

// A JSON config, {"name": value, ...}, into flag arguments: a string as it is, a number as JSON
// writes it, a boolean as true or false (the text a command line would give). parse_config passes
// only text that starts with '{': an object, or a parse error.

Status read_json_config(const std::string& path, const std::string& text, std::vector<std::string>* out) {
  using Json = nlohmann::ordered_json;
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {  // a parse_error: says where, and what was expected
    return Status::invalid_argument(path + ": not valid JSON: " + e.what());
  }
  for (const auto& [name, value] : j.items()) {
    if (name == "config") return Status::invalid_argument(path + ": key \"config\": config files do not nest");
    std::string text_value;
    if (value.is_string()) text_value = value.get<std::string>();
    else if (value.is_boolean()) text_value = value.get<bool>() ? "true" : "false";
    else if (value.is_number()) text_value = value.dump();
    else
      return Status::invalid_argument(path + ": key \"" + name + "\": the value must be a string, number or boolean, not " +
                                      value.type_name());
    out->push_back("--" + name + "=" + text_value);
  }
  return Status::ok_status();
}

}  // namespace

Status parse_config(const std::string& path, const std::string& text, std::vector<std::string>* out) {
  if (auto first = text.find_first_not_of(" \t\r\n"); first != std::string::npos && text[first] == '{')
    return read_json_config(path, text, out);
  std::istringstream lines(text);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::istringstream is(line);
    std::string name, eq, value;
    if (!(is >> name)) continue;
    if (auto e = name.find('='); e != std::string::npos) {
      value = name.substr(e + 1);
      name.resize(e);
    } else {
      is >> eq;
      if (eq.starts_with("=")) eq = eq.substr(1);
      value = eq;
    }
    std::string rest;
    if (value.empty()) is >> value;
    if (is >> rest) return Status::invalid_argument(path + ":" + std::to_string(n) + ": expected `name = value`");
    if (name == "config") return Status::invalid_argument(path + ":" + std::to_string(n) + ": config files do not nest");
    out->push_back("--" + name + "=" + value);
  }
  return Status::ok_status();
}

}  // namespace untied::cli
