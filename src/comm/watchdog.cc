// The collective watchdog (watchdog.h): a decorator that records each call in flight, and one
// monitor thread per process that ends the process when a call is stuck.
#include "untied/comm/watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

#include "untied/core/allocator.h"
#include "untied/core/check.h"

namespace untied {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

thread_local std::string t_note[2];  // the step, and where in it

std::string current_note() {
  return t_note[1].empty() ? t_note[0] : t_note[0].empty() ? t_note[1] : t_note[0] + ", " + t_note[1];
}

// What one rank has done on one watched communicator (its flight recorder): the calls begun and
// finished, the last one begun, and the last few finished with their durations. Read by the
// monitor to say where every rank is when a call is stuck, and written to the heartbeat file.
struct Progress {
  std::string comm_id;  // the communicator, the same on every rank of it: "world", "world/1", ...
  int rank = 0, size = 0;
  std::string backend;
  int64_t started = 0, finished = 0;
  std::string last;      // the last call begun: "all_reduce #248 (8 B)"
  std::string note;      // the rank's note then
  double changed = 0;    // when `started` or `finished` last moved
  std::deque<std::string> recent;  // the last kRecent calls finished: "all_gather #246 in 0.021 s"
};
constexpr size_t kRecent = 4;

// One call in flight.
struct InFlight {
  std::string what;  // "all_to_all #1817 (2.00 MiB per block)"
  std::string note;  // the rank's note when the call began
  double since = 0;
  int rank = 0, size = 0;
  std::string backend;
  double timeout_s = 0;
  Communicator* comm = nullptr;  // the watched communicator (cancel_in_flight before the end)
  Progress* progress = nullptr;  // its rank's record
  int64_t seq = 0;               // its call number
};

std::string g_heartbeat_dir;  // set_watchdog_dir: where each process says where it is
std::string g_own_beat;       // this process's file there

// Every call in flight in this process, and the monitor thread that looks at them.
class Monitor {
 public:
  static Monitor& get() {
    static Monitor* m = new Monitor();  // never destroyed: the thread runs until the process ends
    return *m;
  }
  std::list<InFlight>::iterator begin(InFlight f) {
    std::lock_guard<std::mutex> lock(mu_);
    ensure_thread();
    Progress& p = *f.progress;
    p.started = f.seq, p.last = f.what, p.note = f.note, p.changed = f.since;
    return calls_.insert(calls_.end(), std::move(f));
  }
  void end(std::list<InFlight>::iterator it) {
    std::lock_guard<std::mutex> lock(mu_);
    Progress& p = *it->progress;
    p.finished = it->seq;
    p.changed = now_s();
    char took[32];
    std::snprintf(took, sizeof took, " in %.3f s", p.changed - it->since);
    p.recent.push_back(it->what.substr(0, it->what.find(" (")) + took);
    if (p.recent.size() > kRecent) p.recent.pop_front();
    calls_.erase(it);
  }
  Progress* enroll(Progress p) {
    std::lock_guard<std::mutex> lock(mu_);
    ensure_thread();
    return &*board_.insert(board_.end(), std::move(p));
  }
  void leave(Progress* p) {
    std::lock_guard<std::mutex> lock(mu_);
    board_.remove_if([p](const Progress& q) { return &q == p; });
  }

 private:
  void ensure_thread() {
    if (started_) return;
    started_ = true;
    std::thread([this] { run(); }).detach();
  }
  // This process's records as heartbeat lines: "comm_id rank size started finished age|last|note".
  std::string heartbeat_locked(double t) const {
    std::string out;
    for (const Progress& p : board_) {
      char head[160];
      std::snprintf(head, sizeof head, "%s %d %d %lld %lld %.1f|", p.comm_id.c_str(), p.rank, p.size,
                    (long long)p.started, (long long)p.finished, t - p.changed);
      out += head + p.last + "|" + p.note + "\n";
    }
    return out;
  }
  // Every process's records of the job: this one's, and the other processes' heartbeat files.
  std::vector<Progress> everyone_locked(double t) const {
    std::vector<Progress> all(board_.begin(), board_.end());
    if (g_heartbeat_dir.empty()) return all;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(g_heartbeat_dir, ec)) {
      if (e.path().filename() == own_file_ || e.path().extension() != ".beat") continue;
      std::ifstream f(e.path());
      for (std::string line; std::getline(f, line);) {
        Progress p;
        char id[96];
        long long started = 0, finished = 0;
        double age = 0;
        int used = 0;
        if (std::sscanf(line.c_str(), "%95s %d %d %lld %lld %lf|%n", id, &p.rank, &p.size, &started, &finished, &age,
                        &used) < 6 || used <= 0)
          continue;
        p.comm_id = id, p.started = started, p.finished = finished, p.changed = t - age;
        const std::string rest = line.substr(static_cast<size_t>(used));
        p.last = rest.substr(0, rest.find('|'));
        p.note = rest.find('|') == std::string::npos ? "" : rest.substr(rest.find('|') + 1);
        all.push_back(std::move(p));
      }
    }
    return all;
  }
  // For a call stuck at number `seq` of communicator `f`: the ranks of it that never began that
  // call, where each of them is, and those nothing is known of.
  std::string stragglers_locked(const InFlight& f, const std::vector<Progress>& all, double t) const {
    std::vector<bool> known(static_cast<size_t>(f.size), false);
    std::string behind;
    for (const Progress& p : all) {
      if (p.comm_id != f.progress->comm_id || p.size != f.size || p.rank < 0 || p.rank >= f.size) continue;
      known[static_cast<size_t>(p.rank)] = true;
      if (p.started >= f.seq) continue;
      char line[96];
      std::snprintf(line, sizeof line, "; rank %d never began it: its last call was ", p.rank);
      behind += line + (p.last.empty() ? std::string("none") : p.last) + (p.note.empty() ? "" : " at " + p.note);
      std::snprintf(line, sizeof line, ", %s %.1f s ago", p.started > p.finished ? "begun" : "ended", t - p.changed);
      behind += line;
    }
    std::string unknown;
    for (int r = 0; r < f.size; ++r)
      if (!known[static_cast<size_t>(r)]) unknown += (unknown.empty() ? "" : ", ") + std::to_string(r);
    if (!unknown.empty())
      behind += "; nothing heard from rank(s) " + unknown +
                (g_heartbeat_dir.empty() ? "" : " (no heartbeat in " + g_heartbeat_dir + ": another node? set UNTIED_WATCHDOG_DIR to a directory every node shares)");
    return behind;
  }
  void beat_locked(double t) {
    if (g_heartbeat_dir.empty() || t - last_beat_ < 1.0) return;
    last_beat_ = t;
    if (own_file_.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(g_heartbeat_dir, ec);
      char host[128] = "host";
      ::gethostname(host, sizeof host - 1);
      own_file_ = std::string(host) + "." + std::to_string(::getpid()) + ".beat";
      g_own_beat = g_heartbeat_dir + "/" + own_file_;
      std::atexit([] {  // a process that ends normally takes its heartbeat (and an empty directory) with it
        std::remove(g_own_beat.c_str());
        ::rmdir(g_heartbeat_dir.c_str());
      });
    }
    const std::string path = g_heartbeat_dir + "/" + own_file_, tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << heartbeat_locked(t);
    }
    std::rename(tmp.c_str(), path.c_str());
  }
  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      std::lock_guard<std::mutex> lock(mu_);
      const double t = now_s();
      beat_locked(t);
      bool expired = false;
      for (const InFlight& f : calls_) expired = expired || t - f.since > f.timeout_s;
      if (!expired) continue;
      // Where every rank of the job is, as far as this process knows: its own ranks, and the
      // others' heartbeats (a rank that never began the stuck call is the straggler).
      const std::vector<Progress> all = everyone_locked(t);
      for (const InFlight& f : calls_) {
        std::string before;
        for (const std::string& r : f.progress->recent) before += (before.empty() ? "" : ", ") + r;
        std::fprintf(stderr, "untied: watchdog: rank %d of %d (%s) stuck %.1f s in %s%s%s%s%s; the job is aborted "
                             "(--collective-timeout %.0f)\n",
                     f.rank, f.size, f.backend.c_str(), t - f.since, f.what.c_str(), f.note.empty() ? "" : ", ",
                     f.note.c_str(), before.empty() ? "" : "; before it: ", before.c_str(), f.timeout_s);
      }
      // One line per stuck call number: who never reached it (from the lowest stuck rank here).
      std::vector<std::string> said;
      for (const InFlight& f : calls_) {
        const std::string key = f.progress->comm_id + "#" + std::to_string(f.seq);
        if (std::find(said.begin(), said.end(), key) != said.end()) continue;
        said.push_back(key);
        const std::string behind = stragglers_locked(f, all, t);
        if (!behind.empty())
          std::fprintf(stderr, "untied: watchdog: %s%s\n", f.what.c_str(), behind.c_str());
      }
      std::fflush(stderr);
      // Device work in flight is cancelled (NCCL: ncclCommAbort) so that no collective kernel
      // outlives the process; host transports end with it.
      for (const InFlight& f : calls_) {
        const std::string done = f.comm->cancel_in_flight();
        if (!done.empty()) std::fprintf(stderr, "untied: watchdog: %s\n", done.c_str());
      }
      std::fflush(stderr);
      std::_Exit(124);
    }
  }

  std::mutex mu_;
  std::list<InFlight> calls_;
  std::list<Progress> board_;  // every watched communicator's rank in this process
  bool started_ = false;
  double last_beat_ = 0;
  std::string own_file_;  // this process's heartbeat file's name
};

class Watched;

// Records one call for the duration of its scope.
class Scope {
 public:
  Scope(const Watched& c, const std::string& what);
  ~Scope() {
    if (active_) Monitor::get().end(it_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_ = false;  // false with the watchdog off
  std::list<InFlight>::iterator it_;
};

class WatchedExchange final : public PendingExchange {
 public:
  WatchedExchange(std::unique_ptr<PendingExchange> inner, std::unique_ptr<Scope> scope)
      : inner_(std::move(inner)), scope_(std::move(scope)) {}
  ~WatchedExchange() override {
    inner_.reset();  // waits, as its destructor does
    scope_.reset();
  }
  void wait() override {
    inner_->wait();
    scope_.reset();
  }

 private:
  std::unique_ptr<PendingExchange> inner_;
  std::unique_ptr<Scope> scope_;
};

// What each rank says it is calling, exchanged before the call with --verify-schedule.
struct ScheduleRecord {
  char op[24] = {};     // "all_to_all"
  int64_t bytes = 0;    // the call's size (per block for the block collectives)
  int64_t seq = 0;      // its call number on this communicator
  char where[88] = {};  // the rank's note: "step 3, backward, block 5"
};
static_assert(sizeof(ScheduleRecord) == 128);

ScheduleRecord make_record(const char* op, int64_t bytes, int64_t seq, const std::string& where) {
  ScheduleRecord r;
  std::snprintf(r.op, sizeof r.op, "%s", op);
  r.bytes = bytes;
  r.seq = seq;
  std::snprintf(r.where, sizeof r.where, "%s", where.c_str());
  return r;
}

std::string describe(const ScheduleRecord& r) {
  return std::string(r.op) + " #" + std::to_string(r.seq) + " (" + std::to_string(r.bytes) + " B)" +
         (r.where[0] != '\0' ? std::string(" at ") + r.where : std::string());
}

bool same_call(const ScheduleRecord& a, const ScheduleRecord& b) {
  return std::strncmp(a.op, b.op, sizeof a.op) == 0 && a.bytes == b.bytes && a.seq == b.seq;
}

// A name for each communicator watched at the top, the same on every rank: the order in which the
// rank (its thread) watched them ("c0", "c1", ...); every rank makes its communicators alike.
thread_local int t_watched = 0;

class Watched final : public Communicator {
 public:
  Watched(std::unique_ptr<Communicator> owned, const WatchdogOptions& o, std::string id = "")
      : owned_(std::move(owned)), inner_(owned_.get()), o_(o) {
    enroll(std::move(id));
  }
  Watched(Communicator& inner, const WatchdogOptions& o) : inner_(&inner), o_(o) { enroll(""); }
  ~Watched() override {
    if (progress_ != nullptr) Monitor::get().leave(progress_);
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  void bind_device(Device& dev) override { inner_->bind_device(dev); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    Scope s(*this, call("split", -1));
    agree("split", 0);
    return std::make_unique<Watched>(inner_->split(color, key), o_, id_ + "/" + std::to_string(color));
  }
  void all_to_all(const void* send, void* recv, int64_t block_bytes) override {
    Scope s(*this, call("all_to_all", block_bytes, " per block"));
    agree("all_to_all", block_bytes);
    inner_->all_to_all(send, recv, block_bytes);
  }
  std::unique_ptr<PendingExchange> all_to_all_start(const void* send, void* recv, int64_t block_bytes) override {
    auto scope = std::make_unique<Scope>(*this, call("all_to_all (in flight)", block_bytes, " per block"));
    agree("all_to_all", block_bytes);
    return std::make_unique<WatchedExchange>(inner_->all_to_all_start(send, recv, block_bytes), std::move(scope));
  }
  void all_gather(const void* send, void* recv, int64_t block_bytes) override {
    Scope s(*this, call("all_gather", block_bytes, " per block"));
    agree("all_gather", block_bytes);
    inner_->all_gather(send, recv, block_bytes);
  }
  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype, ReduceOp op) override {
    Scope s(*this, call("reduce_scatter", block_elems * dtype_size(dtype), " per block"));
    agree("reduce_scatter", block_elems * dtype_size(dtype));
    inner_->reduce_scatter(send, recv, block_elems, dtype, op);
  }
  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override {
    Scope s(*this, call("all_reduce", elems * dtype_size(dtype)));
    agree("all_reduce", elems * dtype_size(dtype));
    inner_->all_reduce(send, recv, elems, dtype, op);
  }
  void broadcast(void* buf, int64_t bytes, int root) override {
    Scope s(*this, call("broadcast", bytes, " from rank " + std::to_string(root)));
    agree("broadcast", bytes);
    inner_->broadcast(buf, bytes, root);
  }
  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes, int src) override {
    Scope s(*this, call("sendrecv", send_bytes, " to rank " + std::to_string(dest) + ", from rank " + std::to_string(src)));
    inner_->sendrecv(send, send_bytes, dest, recv, recv_bytes, src);
  }
  std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest, void* recv,
                                                  int64_t recv_bytes, int src) override {
    auto scope = std::make_unique<Scope>(
        *this, call("sendrecv (in flight)", send_bytes, " to rank " + std::to_string(dest) + ", from rank " +
                                                            std::to_string(src)));
    return std::make_unique<WatchedExchange>(inner_->sendrecv_start(send, send_bytes, dest, recv, recv_bytes, src),
                                             std::move(scope));
  }
  void barrier() override {
    Scope s(*this, call("barrier", -1));
    agree("barrier", 0);
    inner_->barrier();
  }
  void abort(int code) noexcept override { inner_->abort(code); }
  std::string cancel_in_flight() noexcept override { return inner_->cancel_in_flight(); }

  double timeout_s() const { return o_.timeout_s; }
  Communicator* inner() const { return inner_; }
  Progress* progress() const { return progress_; }
  int64_t calls() const { return calls_; }

 private:
  // --verify-schedule: every rank's record of this collective, gathered; any that differs from
  // this rank's stops the job, naming both sides. The records are host memory, which every
  // backend takes (NCCL and a GPU-bound in-process communicator stage it through the device).
  // Point-to-point exchanges are not checked: a record sent between a pair would overtake, or be
  // overtaken by, the exchanges that pair has in flight.
  void agree(const char* op, int64_t bytes) {
    if (!o_.verify_schedule) return;
    const ScheduleRecord mine = make_record(op, bytes, calls_, current_note());
    std::vector<ScheduleRecord> all(static_cast<size_t>(size()));
    inner_->all_gather(&mine, all.data(), sizeof mine);
    for (int r = 0; r < size(); ++r)
      UNTIED_CHECK(same_call(all[static_cast<size_t>(r)], mine), "--verify-schedule: rank ", rank(), " of ", size(),
                   " (", backend(), ") calls ", describe(mine), ", but rank ", r, " calls ",
                   describe(all[static_cast<size_t>(r)]), ": the ranks run different schedules");
  }
  // "all_to_all #12 (2.00 MiB per block)"
  std::string call(const char* op, int64_t bytes, const std::string& more = "") {
    std::string s = std::string(op) + " #" + std::to_string(++calls_);
    if (bytes >= 0) s += " (" + format_bytes(bytes) + more + ")";
    else if (!more.empty()) s += " (" + more + ")";
    return s;
  }

  void enroll(std::string id) {
    id_ = id.empty() ? "c" + std::to_string(t_watched++) : std::move(id);
    if (o_.timeout_s > 0)
      progress_ = Monitor::get().enroll(Progress{.comm_id = id_, .rank = rank(), .size = size(),
                                                 .backend = backend(), .changed = now_s()});
  }

  std::unique_ptr<Communicator> owned_;  // null when watching a communicator owned elsewhere
  Communicator* inner_;
  WatchdogOptions o_;
  int64_t calls_ = 0;
  std::string id_;                 // the same on every rank of this communicator
  Progress* progress_ = nullptr;   // this rank's record on the monitor's board (with a timeout)
};

Scope::Scope(const Watched& c, const std::string& what) : active_(c.timeout_s() > 0) {
  if (active_)
    it_ = Monitor::get().begin(InFlight{.what = what, .note = current_note(), .since = now_s(), .rank = c.rank(),
                                        .size = c.size(), .backend = c.backend(), .timeout_s = c.timeout_s(),
                                        .comm = c.inner(), .progress = c.progress(), .seq = c.calls()});
}

}  // namespace

std::unique_ptr<Communicator> watch(std::unique_ptr<Communicator> inner, const WatchdogOptions& options) {
  if (!(options.timeout_s > 0) && !options.verify_schedule) return inner;
  return std::make_unique<Watched>(std::move(inner), options);
}

std::unique_ptr<Communicator> watch(Communicator& inner, const WatchdogOptions& options) {
  return std::make_unique<Watched>(inner, options);
}

void set_watchdog_dir(const std::string& dir) { g_heartbeat_dir = dir; }

void watchdog_note(int level, const std::string& note) {
  if (level <= 0) {
    t_note[0] = note;
    t_note[1].clear();
  } else {
    t_note[1] = note;
  }
}

}  // namespace untied
