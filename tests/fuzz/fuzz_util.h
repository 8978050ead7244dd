// Helpers of the fuzz targets: a private temporary file or directory per process, rewritten for
// each input (the parsers under test read files, as they do in use).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace untied::fuzz {

inline std::string temp_path(const char* name) {
  static const std::string dir = [] {
    std::string d = std::filesystem::temp_directory_path().string() + "/untied_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir + "/" + name;
}

// Writes the input to `path` (replacing it).
inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
}

}  // namespace untied::fuzz
