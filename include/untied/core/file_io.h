// Small POSIX file helpers shared by the file formats (token files, safetensors) and the small
// files untied writes (configs, metrics, plots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace untied {

// Reads exactly n bytes at `offset` of fd into buf (retrying short reads and EINTR). Returns 0,
// an errno value, or -1 at end of file.
int pread_all(int fd, void* buf, size_t n, int64_t offset);

// Writes text to path atomically: to path + ".tmp", renamed over path once complete. False (the
// temporary removed, a file already at path untouched) when it cannot be written or renamed;
// the caller says what to change.
bool write_file_atomically(const std::string& path, std::string_view text);

}  // namespace untied
