// Command-line flags for the `untied` subcommands, parsed by CLI11.
//
// A subcommand declares its flags once in a FlagSet: name, kind, default, help, and for some kinds
// what a value may be (an integer's range, a number's lower bound, a choice's names). parse() hands
// the declarations to CLI11, which reads the command line and, where the command declares a
// `config` flag, a config file by the same declarations (`name = value` lines, # comments, or one
// JSON object {"name": value}; the command line wins). Every value is checked as it is read: an
// integer against its range before any cast, a number by CLI11's conversion, a choice against its
// names. Accepted forms: `--name value`, `--name=value`, bare `--name` for booleans and `--no-name`
// to set one false. Unknown flags, missing values and values of the wrong kind give a non-ok Status
// whose message names the flag and says what is accepted. `--help` is read by wants_help().
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "untied/core/status.h"

namespace untied::cli {

enum class FlagKind {
  kBool,     // true or false; --name, --no-name, --name=false
  kInt,      // a 64-bit integer with an optional K or M suffix (powers of two: 1K = 1024), in a range
  kBytes,    // a byte count: 4096, 512K, 8G, 1.5G, 2T (binary), empty = none (0)
  kNumber,   // a real number, at least a lower bound (empty = not given, where the default is empty)
  kString,   // any text
  kIntList,  // integers as kInt, comma-separated: 1024,2K,4096
  kChoice,   // one of a fixed set of names
  kConfig,   // a config file of the command's own flags (read at parse)
};

// An integer flag's accepted values, checked before anything casts it.
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min(), max = std::numeric_limits<int64_t>::max();
};

// A number flag's lower bound: value > min (strict) or value >= min; `what` names the values
// accepted in a refusal ("'fast' is not a positive number").
struct NumberBound {
  double min = -std::numeric_limits<double>::infinity();
  bool strict = false;
  std::string what = "a number";
};
inline NumberBound positive_number() { return {.min = 0, .strict = true, .what = "a positive number"}; }
inline NumberBound non_negative_number() { return {.min = 0, .strict = false, .what = "a number >= 0"}; }

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  // kBool, kBytes, kString, kIntList, kConfig; kInt over all of int64.
  void add(const std::string& name, FlagKind kind, const std::string& default_value, const std::string& help);
  // kInt within `range` (a value outside it is refused: "--ranks must be in [1, 1024]").
  void add_int(const std::string& name, const std::string& default_value, const std::string& help, IntRange range);
  // kNumber: a value CLI11 reads as a double, within `bound` ("--lr: '0' is not a positive number").
  void add_number(const std::string& name, const std::string& default_value, const std::string& help,
                  NumberBound bound = {});
  // kChoice: one of `names` ("--recompute: 'some': use full, selective or auto").
  void add_choice(const std::string& name, std::vector<std::string> names, const std::string& default_value,
                  const std::string& help);
  // kString whose value `check` accepts (a command's own parser: its message is the refusal's).
  void add_checked(const std::string& name, const std::string& default_value, const std::string& help,
                   std::function<Status(const std::string&)> check);

  // Parses args (without the program and subcommand names), and the config file a kConfig flag
  // names.
  Status parse(const std::vector<std::string>& args);
  bool wants_help() const { return help_; }
  std::string usage() const;
  const std::string& command() const { return command_; }  // "untied train"

  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  int64_t get_bytes(const std::string& name) const;  // 0 when empty
  double get_number(const std::string& name) const;  // REQUIRES: a value (given, or a default)
  const std::string& get_string(const std::string& name) const;  // any kind: the text given
  std::vector<int64_t> get_int_list(const std::string& name) const;
  // kChoice: the index of the chosen name in the declaration's `names`.
  size_t get_choice(const std::string& name) const;
  // A kChoice's value mapped through `values` (one per declared name, in order).
  template <typename T>
  T get_choice(const std::string& name, const std::vector<T>& values) const {
    return values.at(get_choice(name));
  }
  bool was_set(const std::string& name) const;

 private:
  struct Flag {
    FlagKind kind;
    std::string value;
    std::string default_value;
    std::string help;
    bool set = false;
    IntRange range{};
    NumberBound bound{};
    std::vector<std::string> choices{};
    std::function<Status(const std::string&)> check{};
  };
  // "" when `value` is one `f` accepts; otherwise what is wrong with it.
  static std::string refusal(const std::string& name, const Flag& f, const std::string& value);
  const Flag& find(const std::string& name) const;

  std::string command_, summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  bool help_ = false;
};

// The start every subcommand shares: its flags parsed (with the config file a kConfig flag names),
// --help answered on stdout, a bad command line refused ("untied train: <why>" on stderr), printed
// by the root rank only (every rank returns alike). The exit status to end with (0 after --help, 2
// after a refusal), or nothing when the command goes on.
std::optional<int> parse_command_line(FlagSet& flags, const std::vector<std::string>& args, bool root);
// "<command>: <why>" on stderr by the root rank; returns 2 (bad usage).
int refuse(const FlagSet& flags, const Status& why, bool root = true);

StatusOr<int64_t> parse_int(const std::string& s);
StatusOr<std::vector<int64_t>> parse_int_list(const std::string& s);  // "1024,2K,4096"

}  // namespace untied::cli
