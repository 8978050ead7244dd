// Flags through CLI11 (args.h): the declarations become a CLI::App for each parse; CLI11 reads the
// command line and the config file, and each value is checked as it is read.
#include "cli/args.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli/config_file.h"
#include "untied/core/allocator.h"
#include "untied/core/file_io.h"

namespace untied::cli {
namespace {

// A config file (config_file.h: `name = value` lines or a JSON object) as CLI11's items, one per
// flag; what cannot be read is refused with config_file's message (the file and line).
class ConfigReader : public CLI::Config {
 public:
  explicit ConfigReader(std::string path) : path_(std::move(path)) {}
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return ""; }
  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    std::stringstream text;
    text << in.rdbuf();
    std::vector<std::string> args;
    if (Status s = parse_config(path_, text.str(), &args); !s.ok()) throw CLI::ConfigError(s.message());
    std::vector<CLI::ConfigItem> items;
    for (const std::string& a : args) {  // "--name=value"
      const size_t eq = a.find('=');
      CLI::ConfigItem item;
      item.name = a.substr(2, eq - 2);
      item.inputs = {a.substr(eq + 1)};
      items.push_back(std::move(item));
    }
    return items;
  }

 private:
  std::string path_;
};

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

// The flag a CLI11 error message starts with ("--seq: 1 required TEXT missing"), or "".
std::string flag_of(const std::string& message) {
  const size_t colon = message.find(':');
  return message.rfind("--", 0) == 0 && colon != std::string::npos ? message.substr(0, colon) : "";
}

}  // namespace

StatusOr<int64_t> parse_int(const std::string& s) {
  // Integers accept K/M suffixes as powers of two (1K = 1024), as sequence lengths are written.
  if (s.empty()) return Status::invalid_argument("empty value where an integer was expected");
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE) return Status::invalid_argument("'" + s + "' is too large for a 64-bit integer");
  if (errno != 0 || end == s.c_str()) return Status::invalid_argument("'" + s + "' is not an integer");
  std::string rest(end);
  int64_t mult = 1;
  if (rest == "K" || rest == "k") mult = 1024;
  else if (rest == "M" || rest == "m") mult = 1024 * 1024;
  else if (!rest.empty()) return Status::invalid_argument("'" + s + "' is not an integer (suffixes: K, M)");
  int64_t out = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(v), mult, &out))
    return Status::invalid_argument("'" + s + "' is too large for a 64-bit integer");
  return out;
}

StatusOr<std::vector<int64_t>> parse_int_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto v = parse_int(item);
    if (!v.ok()) return v.status();
    out.push_back(v.value());
  }
  if (out.empty()) return Status::invalid_argument("empty list where integers were expected");
  return out;
}

void FlagSet::add(const std::string& name, FlagKind kind, const std::string& default_value, const std::string& help) {
  UNTIED_ASSERT(kind != FlagKind::kNumber && kind != FlagKind::kChoice, "flag --", name,
                ": numbers and choices are declared with add_number and add_choice");
  flags_[name] = Flag{kind, default_value, default_value, help};
  order_.push_back(name);
}

void FlagSet::add_int(const std::string& name, const std::string& default_value, const std::string& help,
                      IntRange range) {
  add(name, FlagKind::kInt, default_value, help);
  flags_[name].range = range;
}

void FlagSet::add_number(const std::string& name, const std::string& default_value, const std::string& help,
                         NumberBound bound) {
  flags_[name] = Flag{FlagKind::kNumber, default_value, default_value, help, false, {}, bound};
  order_.push_back(name);
}

void FlagSet::add_choice(const std::string& name, std::vector<std::string> names, const std::string& default_value,
                         const std::string& help) {
  flags_[name] = Flag{FlagKind::kChoice, default_value, default_value, help, false, {}, {}, std::move(names)};
  order_.push_back(name);
}

void FlagSet::add_checked(const std::string& name, const std::string& default_value, const std::string& help,
                          std::function<Status(const std::string&)> check) {
  add(name, FlagKind::kString, default_value, help);
  flags_[name].check = std::move(check);
}

std::string FlagSet::refusal(const std::string& name, const Flag& f, const std::string& value) {
  switch (f.kind) {
    case FlagKind::kBool:
      if (value != "true" && value != "false" && value != "1" && value != "0")
        return "expects true or false, got '" + value + "'";
      return "";
    case FlagKind::kInt: {
      auto v = parse_int(value);
      if (!v.ok()) return v.status().message();
      if (v.value() < f.range.min || v.value() > f.range.max) {
        const std::string lo = std::to_string(f.range.min), hi = std::to_string(f.range.max);
        if (f.range.max == std::numeric_limits<int64_t>::max()) return "must be >= " + lo + ", not " + value;
        return "must be in [" + lo + ", " + hi + "], not " + value;
      }
      return "";
    }
    case FlagKind::kBytes: {
      auto v = parse_bytes(value);
      return v.ok() ? "" : v.status().message();
    }
    case FlagKind::kNumber: {
      double v = 0;
      const bool number = CLI::detail::lexical_cast(value, v) && v == v;
      if (!number || (f.bound.strict ? !(v > f.bound.min) : !(v >= f.bound.min)))
        return "'" + value + "' is not " + f.bound.what;
      return "";
    }
    case FlagKind::kIntList: {
      auto v = parse_int_list(value);
      return v.ok() ? "" : v.status().message();
    }
    case FlagKind::kChoice:
      for (const std::string& c : f.choices)
        if (value == c) return "";
      return "'" + value + "': use " + join_names(f.choices);
    case FlagKind::kString:
      if (f.check) {
        Status s = f.check(value);
        return s.ok() ? "" : s.message();
      }
      return "";
    case FlagKind::kConfig: return "";
  }
  return "";
}

Status FlagSet::parse(const std::vector<std::string>& args) {
  CLI::App app{summary_, command_};
  app.set_help_flag();  // (--help is ours: wants_help)
  app.allow_extras(false);
  app.allow_config_extras(CLI::config_extras_mode::error);
  bool help = false;
  app.add_flag("--help,-h", help);
  // Each flag's text as CLI11 reads it; checked below (and a number's, by CLI11's conversion).
  std::map<std::string, std::string> text;
  std::map<std::string, CLI::Option*> options;
  std::string config_path;
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    std::string& t = text[name];
    if (f.kind == FlagKind::kConfig) {
      for (const std::string& a : args)  // (its path names the file in the reader's messages)
        if (a.rfind("--" + name + "=", 0) == 0) config_path = a.substr(name.size() + 3);
      for (size_t i = 0; i + 1 < args.size(); ++i)
        if (args[i] == "--" + name) config_path = args[i + 1];
      options[name] = app.set_config("--" + name, "", f.help, false);
      app.config_formatter(std::make_shared<ConfigReader>(config_path));
      continue;
    }
    if (f.kind == FlagKind::kBool) {
      // --name, --name=VALUE and --no-name, into one text; the last one given wins.
      CLI::Option* on = app.add_flag("--" + name + "{true}", t, f.help)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      CLI::Option* off = app.add_flag("--no-" + name + "{false}", t, "")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      on->excludes(off);
      options[name] = on;
      options["no-" + name] = off;
      continue;
    }
    options[name] = app.add_option("--" + name, t, f.help)
                        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                        ->check(CLI::Validator(
                            [&f, name](std::string& v) { return refusal(name, f, v); }, "", name));
  }
  // The config file must be a regular file of bounded size before CLI11 reads it (a FIFO would
  // block its open, /dev/zero would never end).
  if (!config_path.empty())
    if (auto text = read_regular_file(config_path, int64_t{16} << 20, "--config"); !text.ok()) return text.status();
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // (CLI11's vector form: in reverse order)
  try {
    app.parse(reversed);
  } catch (const CLI::ExtrasError&) {
    std::string first;
    for (const std::string& r : app.remaining())
      if (first.empty() || (r.rfind("--", 0) == 0 && first.rfind("--", 0) != 0)) first = r;
    if (first.rfind("--", 0) == 0) {
      const std::string flag = first.substr(0, first.find('='));
      return Status::invalid_argument("unknown flag " + flag + " for '" + command_ + "'; see `" + command_ +
                                      " --help` for the flags it takes");
    }
    return Status::invalid_argument("unexpected argument '" + first + "' for '" + command_ +
                                    "': flags start with --; see `" + command_ + " --help`");
  } catch (const CLI::ConfigError& e) {
    const std::string m = e.what();
    if (const std::string key = "INI was not able to parse "; m.rfind(key, 0) == 0)
      return Status::invalid_argument("unknown flag --" + m.substr(key.size()) + " for '" + command_ +
                                      "' in --config " + config_path + "; see `" + command_ + " --help`");
    return Status::invalid_argument(m);
  } catch (const CLI::FileError& e) {
    return Status::not_found("--config " + config_path + ": cannot open the file");
  } catch (const CLI::ArgumentMismatch& e) {
    const std::string flag = flag_of(e.what());
    return Status::invalid_argument(flag.empty() ? std::string(e.what()) : flag + " needs a value");
  } catch (const CLI::ParseError& e) {  // a value a check refused: "--seq: 'abc' is not an integer"
    std::string m = e.what();
    if (const std::string flag = flag_of(m); !flag.empty() && flags_.count(flag.substr(2)) &&
                                             flags_.at(flag.substr(2)).kind == FlagKind::kInt &&
                                             m.find("must be ") != std::string::npos)
      m = flag + " " + m.substr(flag.size() + 2);  // "--ranks must be in [1, 1024], not 0"
    return Status::invalid_argument(m);
  }
  help_ = help;
  for (const std::string& name : order_) {
    Flag& f = flags_.at(name);
    if (f.kind == FlagKind::kConfig) {
      f.value = config_path;
      f.set = !config_path.empty();
      continue;
    }
    const bool given = options.at(name)->count() > 0 || (f.kind == FlagKind::kBool && options.at("no-" + name)->count() > 0);
    if (!given) continue;
    // A bool's value (its flags bypass the checks) and one CLI11 left unchecked: its default.
    if (std::string why = refusal(name, f, text[name]); !why.empty())
      return Status::invalid_argument("--" + name + ": " + why);
    f.value = text[name];
    f.set = true;
  }
  return Status::ok_status();
}

std::optional<int> parse_command_line(FlagSet& flags, const std::vector<std::string>& args, bool root) {
  if (Status s = flags.parse(args); !s.ok()) return refuse(flags, s, root);
  if (!flags.wants_help()) return std::nullopt;
  if (root) std::printf("%s", flags.usage().c_str());
  return 0;
}

int refuse(const FlagSet& flags, const Status& why, bool root) {
  if (root) std::fprintf(stderr, "%s: %s\n", flags.command().c_str(), why.message().c_str());
  return 2;
}

std::string FlagSet::usage() const {
  std::string out = "usage: " + command_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind == FlagKind::kChoice) left += " " + [&] {
      std::string c;
      for (const std::string& n : f.choices) c += (c.empty() ? "" : "|") + n;
      return c;
    }();
    else if (f.kind != FlagKind::kBool) left += " VALUE";
    if (left.size() < 24) left.resize(24, ' ');
    else left += "  ";
    out += left + f.help;
    if (!f.default_value.empty()) out += " (default: " + f.default_value + ")";
    out += "\n";
  }
  out += "  --help                show this help\n";
  return out;
}

const FlagSet::Flag& FlagSet::find(const std::string& name) const {
  auto it = flags_.find(name);
  UNTIED_ASSERT(it != flags_.end(), "flag --", name, " was never declared");
  return it->second;
}

bool FlagSet::get_bool(const std::string& name) const {
  const std::string& v = find(name).value;
  return v == "true" || v == "1";
}
int64_t FlagSet::get_int(const std::string& name) const { return parse_int(find(name).value).value(); }
int64_t FlagSet::get_bytes(const std::string& name) const {
  const std::string& v = find(name).value;
  return v.empty() ? 0 : parse_bytes(v).value();
}
double FlagSet::get_number(const std::string& name) const {
  const Flag& f = find(name);
  double v = 0;
  UNTIED_ASSERT(CLI::detail::lexical_cast(f.value, v), "flag --", name, ": '", f.value, "' is not a number");
  return v;
}
const std::string& FlagSet::get_string(const std::string& name) const { return find(name).value; }
std::vector<int64_t> FlagSet::get_int_list(const std::string& name) const {
  return parse_int_list(find(name).value).value();
}
size_t FlagSet::get_choice(const std::string& name) const {
  const Flag& f = find(name);
  for (size_t i = 0; i < f.choices.size(); ++i)
    if (f.choices[i] == f.value) return i;
  UNTIED_ASSERT(false, "flag --", name, ": '", f.value, "' is not one of its choices");
  return 0;
}
bool FlagSet::was_set(const std::string& name) const { return find(name).set; }

}  // namespace untied::cli
