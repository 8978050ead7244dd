#include "cli/args.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "untied/core/allocator.h"

namespace untied::cli {

StatusOr<int64_t> parse_int(const std::string& s) {
  // Integers accept K/M suffixes as powers of two (1K = 1024), as sequence lengths are written.
  if (s.empty()) return Status::invalid_argument("empty value where an integer was expected");
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str())
    return Status::invalid_argument("'" + s + "' is not an integer");
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

void FlagSet::add(const std::string& name, FlagKind kind, const std::string& default_value,
                  const std::string& help) {
  flags_[name] = Flag{kind, default_value, default_value, help, false};
  order_.push_back(name);
}

Status FlagSet::assign(const std::string& name, Flag& f, const std::string& value) {
  Status s;
  switch (f.kind) {
    case FlagKind::kBool:
      if (value != "true" && value != "false" && value != "1" && value != "0")
        s = Status::invalid_argument("expects true or false, got '" + value + "'");
      break;
    case FlagKind::kInt: {
      auto v = parse_int(value);
      if (!v.ok()) s = v.status();
      break;
    }
    case FlagKind::kBytes: {
      auto v = parse_bytes(value);
      if (!v.ok()) s = v.status();
      break;
    }
    case FlagKind::kIntList: {
      auto v = parse_int_list(value);
      if (!v.ok()) s = v.status();
      break;
    }
    case FlagKind::kString: break;
  }
  if (!s.ok()) return Status::invalid_argument("--" + name + ": " + s.message());
  f.value = value;
  f.set = true;
  return Status::ok_status();
}

Status FlagSet::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0)
      return Status::invalid_argument("unexpected argument '" + a + "' for '" + command_ +
                                      "': flags start with --; see `" + command_ + " --help`");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end() && name.rfind("no-", 0) == 0 && !has_value) {
      auto jt = flags_.find(name.substr(3));
      if (jt != flags_.end() && jt->second.kind == FlagKind::kBool) {
        jt->second.value = "false";
        jt->second.set = true;
        continue;
      }
    }
    if (it == flags_.end())
      return Status::invalid_argument("unknown flag --" + name + " for '" + command_ + "'; see `" +
                                      command_ + " --help` for the flags it takes");
    Flag& f = it->second;
    if (!has_value) {
      if (f.kind == FlagKind::kBool) {
        value = "true";
      } else {
        if (i + 1 >= args.size()) return Status::invalid_argument("--" + name + " needs a value");
        value = args[++i];
      }
    }
    Status s = assign(name, f, value);
    if (!s.ok()) return s;
  }
  return Status::ok_status();
}

std::string FlagSet::usage() const {
  std::string out = "usage: " + command_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind != FlagKind::kBool) left += " VALUE";
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
const std::string& FlagSet::get_string(const std::string& name) const { return find(name).value; }
std::vector<int64_t> FlagSet::get_int_list(const std::string& name) const {
  return parse_int_list(find(name).value).value();
}
bool FlagSet::was_set(const std::string& name) const { return find(name).set; }

}  // namespace untied::cli
