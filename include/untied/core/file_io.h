// Small POSIX file helpers shared by the file formats (token files, safetensors).
#pragma once

#include <cstddef>
#include <cstdint>

namespace untied {

// Reads exactly n bytes at `offset` of fd into buf (retrying short reads and EINTR). Returns 0,
// an errno value, or -1 at end of file.
int pread_all(int fd, void* buf, size_t n, int64_t offset);

}  // namespace untied
