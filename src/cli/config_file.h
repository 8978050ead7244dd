// Config files (`untied train --config F`, and any command with a kConfig flag): the same names as
// the flags, as `name = value` lines (# starts a comment) or one JSON object {"name": value, ...} of
// strings, numbers and booleans, turned into flag arguments ("--name=value"); FlagSet::parse
// (args.h) hands them to CLI11 as the file's values, which the command line overrides.
#pragma once

#include <string>
#include <vector>

#include "untied/core/status.h"

namespace untied::cli {

// text (the file's contents; `path` names it in messages): a JSON object when its first non-blank
// character is '{', else `name = value` lines. Appends the arguments to *out; invalid_argument
// naming path:line (or the JSON key) for what cannot be read, including a nested `config`.
Status parse_config(const std::string& path, const std::string& text, std::vector<std::string>* out);

}  // namespace untied::cli
