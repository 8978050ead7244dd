// Config files (`untied train --config F`): the same names as the flags, as `name = value` lines
// (# starts a comment) or one JSON object {"name": value, ...} of strings, numbers and booleans,
// turned into flag arguments ("--name=value") that the command line then overrides.
#pragma once

#include <string>
#include <vector>

#include "untied/core/status.h"

namespace untied::cli {

// text (the file's contents; `path` names it in messages): a JSON object when its first non-blank
// character is '{', else `name = value` lines. Appends the arguments to *out; invalid_argument
// naming path:line (or the JSON key) for what cannot be read, including a nested `config`.
Status parse_config(const std::string& path, const std::string& text, std::vector<std::string>* out);
// parse_config of the file at path; not_found when it cannot be opened.
Status read_config(const std::string& path, std::vector<std::string>* out);

}  // namespace untied::cli
