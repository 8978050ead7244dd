// Small POSIX file helpers shared by the file formats (token files, safetensors) and the small
// files untied writes (configs, metrics, plots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "untied/core/status.h"

namespace untied {

// Opens `path` read-only once it is known to be a regular file: a FIFO, a device (/dev/zero), a
// directory or a socket is refused without blocking on it (the open is non-blocking, then
// fstat), naming `what` ("--config", "the model's config.json") and what the path is. The fd is
// close-on-exec and blocking again; the caller closes it. not_found where it cannot be opened.
StatusOr<int> open_regular_file(const std::string& path, std::string_view what);
// The whole regular file at `path` (as open_regular_file checks it), at most max_bytes: a larger
// one is refused naming the limit, before any of it is read.
StatusOr<std::string> read_regular_file(const std::string& path, int64_t max_bytes, std::string_view what);

// Reads exactly n bytes at `offset` of fd into buf (retrying short reads and EINTR). Returns 0,
// an errno value, or -1 at end of file.
int pread_all(int fd, void* buf, size_t n, int64_t offset);

// Writes text to path atomically: to path + ".tmp", renamed over path once complete. False (the
// temporary removed, a file already at path untouched) when it cannot be written or renamed;
// the caller says what to change.
bool write_file_atomically(const std::string& path, std::string_view text);

}  // namespace untied
