// Command-line flags for the `untied` subcommands.
//
// A subcommand declares its flags (name, value kind, default, help) in a FlagSet, then parses
// argv. Accepted forms: `--name value`, `--name=value`, and bare `--name` for booleans
// (`--no-name` sets a boolean false). Unknown flags, missing values and values of the wrong
// kind produce a non-ok Status whose message names the flag and says what is accepted.
// `--help` is handled by the caller through wants_help().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "untied/core/status.h"

namespace untied::cli {

enum class FlagKind { kBool, kInt, kBytes, kString, kIntList };

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void add(const std::string& name, FlagKind kind, const std::string& default_value, const std::string& help);
  // Parses args (without the program and subcommand names).
  Status parse(const std::vector<std::string>& args);
  bool wants_help() const { return help_; }
  std::string usage() const;

  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  int64_t get_bytes(const std::string& name) const;  // 0 when empty
  const std::string& get_string(const std::string& name) const;
  std::vector<int64_t> get_int_list(const std::string& name) const;
  bool was_set(const std::string& name) const;

 private:
  struct Flag {
    FlagKind kind;
    std::string value;
    std::string default_value;
    std::string help;
    bool set = false;
  };
  Status assign(const std::string& name, Flag& f, const std::string& value);
  const Flag& find(const std::string& name) const;

  std::string command_, summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  bool help_ = false;
};

StatusOr<int64_t> parse_int(const std::string& s);
StatusOr<std::vector<int64_t>> parse_int_list(const std::string& s);  // "1024,2K,4096"

}  // namespace untied::cli
