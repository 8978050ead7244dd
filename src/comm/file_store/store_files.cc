// The file-store communicator's files (see store_files.h).
#include "comm/file_store/store_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "untied/core/file_io.h"

namespace untied::file_store {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// Writes all n bytes (retrying short writes and EINTR). Returns 0 or an errno value.
int write_all(int fd, const void* data, int64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= w;
  }
  return 0;
}

// Writes the pieces to a new file at `path` (truncating one left there). Returns 0 or an errno.
int write_new(const std::string& path, std::initializer_list<Piece> pieces) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int e = 0;
  for (const Piece& p : pieces)
    if (e == 0 && p.bytes > 0) e = write_all(fd, p.data, p.bytes);
  if (::close(fd) != 0 && e == 0) e = errno;  // NFS reports a failed write at close
  if (e != 0) ::unlink(path.c_str());
  return e;
}

// A temporary name beside `target` that no other thread or process uses.
std::string temporary_beside(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash);
  const std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  return dir + "/." + base + "." + host + "." + std::to_string(::getpid()) + "." +
         std::to_string(counter.fetch_add(1)) + ".tmp";
}

}  // namespace

const char* call_name(Call c) {
  switch (c) {
    case Call::kJoin: return "join";
    case Call::kBarrier: return "barrier";
    case Call::kAllToAll: return "all_to_all";
    case Call::kAllGather: return "all_gather";
    case Call::kReduceScatter: return "reduce_scatter";
    case Call::kAllReduce: return "all_reduce";
    case Call::kBroadcast: return "broadcast";
    case Call::kSplit: return "split";
    case Call::kSendrecv: return "sendrecv";
  }
  return "an unknown call";
}

FileHeader make_header(Call call, int64_t seq, int rank, int64_t size, int64_t arg, int64_t payload_bytes) {
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.call = static_cast<uint32_t>(call);
  h.seq = seq;
  h.rank = rank;
  h.size = size;
  h.arg = arg;
  h.payload_bytes = payload_bytes;
  return h;
}

std::string write_store_file(const std::string& path, const FileHeader& header,
                             std::initializer_list<Piece> pieces) {
  const std::string tmp = path + ".tmp";  // one writer per path: the rank that owns it
  int e = 0;
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot create " + tmp + ": " + errno_text(errno);
    e = write_all(fd, &header, sizeof header);
    for (const Piece& p : pieces)
      if (e == 0 && p.bytes > 0) e = write_all(fd, p.data, p.bytes);
    if (::close(fd) != 0 && e == 0) e = errno;
  }
  if (e == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e == 0) return "";
  ::unlink(tmp.c_str());
  return "cannot write " + path + ": " + errno_text(e);
}

int link_new_file(const std::string& target, const std::string& text) {
  const std::string tmp = temporary_beside(target);
  if (int e = write_new(tmp, {Piece{text.data(), static_cast<int64_t>(text.size())}}); e != 0) return e;
  const int e = ::link(tmp.c_str(), target.c_str()) == 0 ? 0 : errno;
  ::unlink(tmp.c_str());
  return e;
}

int replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_beside(path);
  if (int e = write_new(tmp, {Piece{text.data(), static_cast<int64_t>(text.size())}}); e != 0) return e;
  if (::rename(tmp.c_str(), path.c_str()) == 0) return 0;
  const int e = errno;
  ::unlink(tmp.c_str());
  return e;
}

int read_small_file(const std::string& path, std::string* text) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  text->clear();
  char buf[4096];
  int e = 0;
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) e = errno;
    if (r <= 0 || text->size() > (1u << 20)) break;
    text->append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return e;
}

StoreFile& StoreFile::operator=(StoreFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    header_ = o.header_;
    o.fd_ = -1;
  }
  return *this;
}

StoreFile::~StoreFile() {
  if (fd_ >= 0) ::close(fd_);
}

StoreFile::Opened StoreFile::open(const std::string& path, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Opened::kAbsent;
    *why = "cannot open " + path + ": " + errno_text(errno);
    return Opened::kBad;
  }
  FileHeader h{};
  struct stat st {};
  const int e = pread_all(fd, &h, sizeof h, 0);
  if (e != 0 || ::fstat(fd, &st) != 0) {
    *why = path + " is shorter than a file-store header";
  } else if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.version != kVersion) {
    *why = path + " is not a file-store file of version " + std::to_string(kVersion);
  } else if (h.payload_bytes < 0 || st.st_size != static_cast<off_t>(sizeof h + h.payload_bytes)) {
    *why = path + " holds " + std::to_string(st.st_size) + " bytes, its header says " +
           std::to_string(sizeof h + h.payload_bytes) + " (truncated?)";
  } else {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    header_ = h;
    return Opened::kOk;
  }
  ::close(fd);
  return Opened::kBad;
}

std::string StoreFile::read(int64_t offset, void* dst, int64_t bytes) const {
  if (bytes <= 0) return "";
  if (offset < 0 || offset + bytes > header_.payload_bytes)
    return "asked for bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
           ") of a payload of " + std::to_string(header_.payload_bytes);
  const int e = pread_all(fd_, dst, static_cast<size_t>(bytes), static_cast<int64_t>(sizeof header_) + offset);
  if (e == 0) return "";
  return e < 0 ? std::string("unexpected end of file") : errno_text(e);
}

void remove_folder(const std::string& dir) noexcept {
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (const dirent* ent = ::readdir(d)) {
      const std::string name = ent->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : names) ::unlink((dir + "/" + name).c_str());
  }
  ::rmdir(dir.c_str());
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::chrono::steady_clock::time_point deadline_after(double seconds) {
  const double s = std::isfinite(seconds) ? std::min(seconds, 1e9) : 1e9;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace untied::file_store
