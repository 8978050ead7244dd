// join_file_store (untied/comm/file_store.h): registration, the wait for every rank, the size
// check, and the world communicator.
//
//   1. check the options; create DIR;
//   2. register: DIR/rank_<r> created exclusively (written aside, then link()ed: an existing
//      file is a duplicate rank or a leftover), holding the size, the note and, on rank 0, the
//      job's token;
//   3. read rank_0 .. rank_{n-1} as they appear: a size unlike this rank's is refused at once;
//      all read: go on; timeout_s passed: name the missing ranks;
//   4. the world communicator DIR/<token>/w, whose first collective (confirm_join) returns once
//      every rank has read every registration: from then on each rank may remove its own.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/file_store/file_communicator.h"
#include "comm/file_store/store_files.h"
#include "untied/comm/file_store.h"
#include "untied/core/check.h"

namespace untied {
namespace {

using file_store::FileCommunicator;
using file_store::Job;

constexpr char kRegistrationHead[] = "untied file store registration 1";

struct Registration {
  int size = 0;
  std::string token;  // rank 0's only
  std::string note;
};

std::string registration_text(const Registration& r) {
  std::string t = std::string(kRegistrationHead) + "\nsize " + std::to_string(r.size) + "\n";
  if (!r.token.empty()) t += "token " + r.token + "\n";
  return t + "note " + r.note + "\n";
}

// Parses a registration; false when `text` is not one.
bool parse_registration(const std::string& text, Registration* r) {
  size_t pos = 0;
  bool head = false, size = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) return false;  // every line ends: a cut file is not one
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!head) {
      head = line == kRegistrationHead;
      if (!head) return false;
    } else if (line.rfind("size ", 0) == 0) {
      char* rest = nullptr;
      const long v = std::strtol(line.c_str() + 5, &rest, 10);
      size = *rest == '\0' && v >= 1 && v <= (1L << 30);
      r->size = static_cast<int>(v);
    } else if (line.rfind("token ", 0) == 0) {
      r->token = line.substr(6);
    } else if (line.rfind("note ", 0) == 0) {
      r->note = line.substr(5);
    }
  }
  return head && size;
}

std::string default_note() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  return std::string("host ") + host + ", pid " + std::to_string(::getpid());
}

// 16 hex digits: the job's token, fresh for every job.
std::string new_token() {
  std::random_device rd;
  const uint64_t hi = rd(), lo = rd();
  const uint64_t mix = (hi << 32 ^ lo) ^ static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
                       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(mix));
  return buf;
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> join_file_store(const FileStoreOptions& o) {
  const std::string dir = o.dir;
  const std::string who = "join_file_store as rank " + std::to_string(o.rank) + " of " + std::to_string(o.size);
  if (o.size < 1)
    return Status::invalid_argument(who + ": the world size must be at least 1, got " + std::to_string(o.size));
  if (o.rank < 0 || o.rank >= o.size)
    return Status::invalid_argument(who + ": rank " + std::to_string(o.rank) + " is outside the world [0, " +
                                    std::to_string(o.size) + "): give each process a rank in [0, size)");
  if (dir.empty())
    return Status::invalid_argument(who + ": no directory given: name one that every rank shares");
  if (!(o.timeout_s > 0))
    return Status::invalid_argument(who + ": timeout_s must be > 0 seconds, got " + std::to_string(o.timeout_s));
  set_thread_rank(o.rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(who + ": cannot create " + dir + ": " + ec.message() +
                                  "; choose a directory every rank can write");

  // 2. Register.
  Registration mine{.size = o.size, .token = o.rank == 0 ? new_token() : "", .note = o.note};
  if (mine.note.empty()) mine.note = default_note();
  for (char& c : mine.note)
    if (c == '\n' || c == '\r') c = ' ';
  auto rank_file = [&](int q) { return dir + "/rank_" + std::to_string(q); };
  const std::string own = rank_file(o.rank);
  if (int e = file_store::link_new_file(own, registration_text(mine)); e != 0) {
    if (e != EEXIST) return Status::io_error(who + ": cannot register as " + own + ": " + std::strerror(e));
    std::string text;
    Registration held;
    const bool read = file_store::read_small_file(own, &text) == 0 && parse_registration(text, &held);
    return Status::invalid_argument(
        who + ": rank " + std::to_string(o.rank) + " is already held in " + dir + " by " +
        (read ? held.note + " (world size " + std::to_string(held.size) + ")" : std::string("another registration")) +
        ": two processes were given rank " + std::to_string(o.rank) +
        ", or it was left by an earlier job: remove " + dir + " or use a new one");
  }

  // 3. Read every registration as it appears.
  std::vector<Registration> regs(static_cast<size_t>(o.size));
  std::vector<bool> seen(static_cast<size_t>(o.size), false);
  regs[static_cast<size_t>(o.rank)] = mine;
  seen[static_cast<size_t>(o.rank)] = true;
  int joined = 1;
  Status refused;
  auto ready = [&] {
    for (int q = 0; q < o.size && refused.ok(); ++q) {
      if (seen[static_cast<size_t>(q)]) continue;
      std::string text;
      const int e = file_store::read_small_file(rank_file(q), &text);
      if (e == ENOENT) continue;
      Registration& r = regs[static_cast<size_t>(q)];
      if (e != 0) {
        refused = Status::io_error(who + ": cannot read " + rank_file(q) + ": " + std::strerror(e));
      } else if (!parse_registration(text, &r) || (q == 0 && r.token.empty())) {
        refused = Status::corrupt(who + ": " + rank_file(q) + " is not a file-store registration: remove " + dir +
                                  " or use a new one");
      } else if (r.size != o.size) {
        refused = Status::invalid_argument(
            who + ": rank " + std::to_string(q) + " (" + r.note + ") joined " + dir + " with world size " +
            std::to_string(r.size) + ", this rank (" + mine.note + ") with world size " + std::to_string(o.size) +
            ": every rank must be given the same world size");
      } else {
        seen[static_cast<size_t>(q)] = true;
        ++joined;
      }
    }
    return !refused.ok() || joined == o.size;
  };
  const bool decided = file_store::poll_until(file_store::deadline_after(o.timeout_s), ready, [] {});
  if (!refused.ok()) return refused;  // the registration stays, so the others see the disagreement
  if (!decided) {
    ::unlink(own.c_str());
    std::string missing;
    for (int q = 0; q < o.size; ++q)
      if (!seen[static_cast<size_t>(q)]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    return Status::io_error(who + ": " + std::to_string(joined) + " of " + std::to_string(o.size) + " ranks joined " +
                            dir + " within " + file_store::seconds_text(o.timeout_s) + "; missing: " + missing +
                            " (is " + dir + " on a filesystem every rank shares, and is the world size right?)");
  }

  // 4. The world.
  auto job = std::make_shared<Job>();
  job->dir = dir;
  job->job_dir = dir + "/" + regs[0].token;
  job->timeout_s = o.timeout_s;
  job->world_rank = o.rank;
  std::vector<int> world(static_cast<size_t>(o.size));
  for (int q = 0; q < o.size; ++q) {
    job->notes.push_back(regs[static_cast<size_t>(q)].note);
    world[static_cast<size_t>(q)] = q;
  }
  try {
    auto comm = std::make_unique<FileCommunicator>(std::move(job), "w", o.rank, std::move(world), own);
    comm->confirm_join();
    return std::unique_ptr<Communicator>(std::move(comm));
  } catch (const Error& e) {
    return Status::io_error(who + ": every rank registered in " + dir +
                            ", but not every rank went on to confirm: " + e.what() +
                            " (a registration left by an earlier job? remove " + dir + " or use a new one)");
  }
}

}  // namespace untied
