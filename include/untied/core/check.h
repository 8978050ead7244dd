// Check macros and the error type every failed check throws.
//
// UNTIED_CHECK(cond, ...) is always on. On failure it throws untied::Error whose
// message reads
//     rank 3: src/attention/block_ops.cc:20: check `t.dtype() == dtype` failed: <message>
// The message parts are streamed, so UNTIED_CHECK(a == b, "got ", a, ", expected ", b) works.
//
// The rank printed is the one registered for the calling thread with set_thread_rank();
// communicators register it when they are created, so in-process ranks (threads) and MPI
// ranks (processes) both print their own. -1 (unregistered) prints no rank.
//
// Backend checks (UNTIED_MPI_CHECK, UNTIED_CUDA_CHECK, UNTIED_NCCL_CHECK) live next to the
// backend that owns the raw handles and build on untied::fail().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace untied {

// The exception behind every failed check. Kinds let callers react without parsing text.
enum class ErrorKind { kInvalidArgument, kOutOfBudget, kInternal, kAborted, kIo, kUnsupported };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// The rank reported by check messages raised on this thread (thread-local; -1 = none).
void set_thread_rank(int rank);
int thread_rank();

// "rank r: file:line: " (or "file:line: " without a rank).
std::string error_prefix(const char* file, int line);

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void fail(ErrorKind kind, const std::string& msg);

}  // namespace untied

#define UNTIED_CHECK_KIND(kind, cond, ...)                                                  \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::untied::fail(kind, ::untied::error_prefix(__FILE__, __LINE__) + "check `" #cond     \
                               "` failed: " + ::untied::str_cat(__VA_ARGS__));              \
    }                                                                                       \
  } while (0)

// Invariants and argument checks at API boundaries.
#define UNTIED_CHECK(cond, ...) UNTIED_CHECK_KIND(::untied::ErrorKind::kInvalidArgument, cond, __VA_ARGS__)
// Conditions that can only fail through a bug in untied.
#define UNTIED_ASSERT(cond, ...) UNTIED_CHECK_KIND(::untied::ErrorKind::kInternal, cond, __VA_ARGS__)
