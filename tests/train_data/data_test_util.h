// Test helpers for the data layer: a temporary directory, raw file bytes, and a check that a
// Status failed with a given code and a message holding given parts.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/status.h"

namespace untied::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "untied_train_data_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  // Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline const char* code_name(Status::Code c) {
  switch (c) {
    case Status::Code::kOk: return "ok";
    case Status::Code::kInvalidArgument: return "invalid_argument";
    case Status::Code::kNotFound: return "not_found";
    case Status::Code::kCorrupt: return "corrupt";
    case Status::Code::kIoError: return "io_error";
    case Status::Code::kUnsupported: return "unsupported";
  }
  return "?";
}

// Success when s has code `code` and its message contains every part.
inline ::testing::AssertionResult fails_with(const Status& s, Status::Code code,
                                             std::initializer_list<std::string_view> parts) {
  if (s.ok()) return ::testing::AssertionFailure() << "returned ok, expected " << code_name(code);
  if (s.code() != code)
    return ::testing::AssertionFailure() << "returned " << code_name(s.code()) << ", expected " << code_name(code)
                                         << "; message: " << s.message();
  for (std::string_view p : parts)
    if (s.message().find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\"; message: " << s.message();
  return ::testing::AssertionSuccess() << s.message();
}

}  // namespace untied::testing
