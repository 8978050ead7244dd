// The files of the file-store communicator (untied/comm/file_store.h): their format, how they
// are written so that they appear complete, how they are read, and the wait for them.
//
// A contribution or message file is a FileHeader followed by its payload. The header says which
// call wrote it and with which sizes, so a reader catches ranks that are in different calls, and
// how long the payload is, so it catches a truncated file.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <thread>

namespace untied::file_store {

enum class Call : uint32_t {
  kJoin,
  kBarrier,
  kAllToAll,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kSplit,
  kSendrecv,
};
const char* call_name(Call c);  // "all_reduce"; "call <n>" for a value outside the enum

inline constexpr char kMagic[8] = {'u', 'n', 't', 'i', 'e', 'd', 'F', 'S'};
inline constexpr uint32_t kVersion = 1;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t call;           // Call
  int64_t seq;             // the collective's number in its communicator, or the message's
  int32_t rank;            // the writer's rank in the communicator
  int32_t reserved;
  int64_t size;            // the call's size argument; must match on every rank
  int64_t arg;             // dtype and op, or root; must match on every rank
  int64_t payload_bytes;   // bytes after the header
};
static_assert(sizeof(FileHeader) == 56, "the header is part of the file format");

FileHeader make_header(Call call, int64_t seq, int rank, int64_t size, int64_t arg, int64_t payload_bytes);

struct Piece {
  const void* data;
  int64_t bytes;
};

// Writes `header` then the pieces to path + ".tmp" and renames it to `path`, so readers see the
// whole file or none. Returns "" or what failed ("cannot write PATH: No space left on device").
std::string write_store_file(const std::string& path, const FileHeader& header,
                             std::initializer_list<Piece> pieces);

// Creates `target` holding `text`, failing if it exists: `text` goes to a temporary beside it,
// linked to `target` (atomic, and exclusive on NFS too). Returns 0 or an errno value (EEXIST:
// `target` already exists).
int link_new_file(const std::string& target, const std::string& text);

// Writes `text` to `path` through a temporary and a rename. Returns 0 or an errno value.
int replace_file(const std::string& path, const std::string& text);

// Reads a small file whole. Returns 0, or an errno value (ENOENT: it does not exist).
int read_small_file(const std::string& path, std::string* text);

// A contribution or message file opened for reading; the descriptor closes with the object, and
// the data stays readable after the name is deleted.
class StoreFile {
 public:
  enum class Opened { kAbsent, kOk, kBad };

  StoreFile() = default;
  StoreFile(StoreFile&& o) noexcept : fd_(o.fd_), header_(o.header_) { o.fd_ = -1; }
  StoreFile& operator=(StoreFile&& o) noexcept;
  StoreFile(const StoreFile&) = delete;
  StoreFile& operator=(const StoreFile&) = delete;
  ~StoreFile();

  // kAbsent when `path` does not exist (yet); kOk with the header read and checked (magic,
  // version, file length); kBad with the reason in *why.
  Opened open(const std::string& path, std::string* why);
  bool is_open() const { return fd_ >= 0; }
  const FileHeader& header() const { return header_; }
  // Reads `bytes` of the payload from `offset` into dst. Returns "" or what went wrong.
  std::string read(int64_t offset, void* dst, int64_t bytes) const;

 private:
  int fd_ = -1;
  FileHeader header_{};
};

// Removes every entry of `dir` (files only; errors ignored) and then `dir` itself if empty.
void remove_folder(const std::string& dir) noexcept;

// "0.5 s", "300 s".
std::string seconds_text(double s);

// A deadline `seconds` from now (clamped to about 30 years).
std::chrono::steady_clock::time_point deadline_after(double seconds);

// Calls ready() until it returns true: between tries it calls between() (which may throw) and
// sleeps 20 us, doubling up to 2 ms. Returns false once `deadline` passes with ready() still false.
template <typename Ready, typename Between>
bool poll_until(std::chrono::steady_clock::time_point deadline, Ready&& ready, Between&& between) {
  std::chrono::microseconds pause(20);
  for (;;) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return ready();  // one last look
    between();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

}  // namespace untied::file_store
