#include "untied/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "untied/core/allocator.h"

namespace untied {

namespace {
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}
}  // namespace

StatusOr<int> open_regular_file(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::not_found(std::string(what) + " " + path + ": cannot open it (" + std::strerror(errno) +
                             "); check the path");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd, &st) == 0 ? kind_of(st.st_mode) : std::strerror(errno);
    ::close(fd);
    return Status::invalid_argument(std::string(what) + " " + path + " is " + kind + ", not a regular file: name a file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

StatusOr<std::string> read_regular_file(const std::string& path, int64_t max_bytes, std::string_view what) {
  StatusOr<int> fd = open_regular_file(path, what);
  if (!fd.ok()) return fd.status();
  struct stat st;
  ::fstat(fd.value(), &st);
  if (st.st_size > max_bytes) {
    ::close(fd.value());
    return Status::invalid_argument(std::string(what) + " " + path + " holds " + format_bytes(st.st_size) +
                                    ", more than the " + format_bytes(max_bytes) + " such a file may hold");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const int err = pread_all(fd.value(), text.data(), text.size(), 0);
  ::close(fd.value());
  if (err > 0) return Status::io_error(std::string(what) + " " + path + ": reading it failed: " + std::strerror(err));
  if (err < 0) return Status::io_error(std::string(what) + " " + path + " changed size while it was read");
  return text;
}

int pread_all(int fd, void* buf, size_t n, int64_t offset) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return 0;
}

bool write_file_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (out && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return false;
}

}  // namespace untied
