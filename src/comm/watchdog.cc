// The collective watchdog (watchdog.h): a decorator that records each call in flight, and one
// monitor thread per process that ends the process when a call is stuck.
#include "untied/comm/watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

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

// One call in flight.
struct InFlight {
  std::string what;  // "all_to_all #1817 (2.00 MiB per block)"
  std::string note;  // the rank's note when the call began
  double since = 0;
  int rank = 0, size = 0;
  std::string backend;
  double timeout_s = 0;
  Communicator* comm = nullptr;  // the watched communicator (cancel_in_flight before the end)
};

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
    return calls_.insert(calls_.end(), std::move(f));
  }
  void end(std::list<InFlight>::iterator it) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(it);
  }

 private:
  void ensure_thread() {
    if (started_) return;
    started_ = true;
    std::thread([this] { run(); }).detach();
  }
  void run() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      std::lock_guard<std::mutex> lock(mu_);
      const double t = now_s();
      bool expired = false;
      for (const InFlight& f : calls_) expired = expired || t - f.since > f.timeout_s;
      if (!expired) continue;
      for (const InFlight& f : calls_)
        std::fprintf(stderr, "untied: watchdog: rank %d of %d (%s) stuck %.1f s in %s%s%s; the job is aborted "
                             "(--collective-timeout %.0f)\n",
                     f.rank, f.size, f.backend.c_str(), t - f.since, f.what.c_str(), f.note.empty() ? "" : ", ",
                     f.note.c_str(), f.timeout_s);
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
  bool started_ = false;
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

class Watched final : public Communicator {
 public:
  Watched(std::unique_ptr<Communicator> owned, const WatchdogOptions& o)
      : owned_(std::move(owned)), inner_(owned_.get()), o_(o) {}
  Watched(Communicator& inner, const WatchdogOptions& o) : inner_(&inner), o_(o) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  void bind_device(Device& dev) override { inner_->bind_device(dev); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    Scope s(*this, call("split", -1));
    agree("split", 0);
    return std::make_unique<Watched>(inner_->split(color, key), o_);
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

  std::unique_ptr<Communicator> owned_;  // null when watching a communicator owned elsewhere
  Communicator* inner_;
  WatchdogOptions o_;
  int64_t calls_ = 0;
};

Scope::Scope(const Watched& c, const std::string& what) : active_(c.timeout_s() > 0) {
  if (active_)
    it_ = Monitor::get().begin(InFlight{.what = what, .note = current_note(), .since = now_s(), .rank = c.rank(),
                                        .size = c.size(), .backend = c.backend(), .timeout_s = c.timeout_s(),
                                        .comm = c.inner()});
}

}  // namespace

std::unique_ptr<Communicator> watch(std::unique_ptr<Communicator> inner, const WatchdogOptions& options) {
  if (!(options.timeout_s > 0) && !options.verify_schedule) return inner;
  return std::make_unique<Watched>(std::move(inner), options);
}

std::unique_ptr<Communicator> watch(Communicator& inner, const WatchdogOptions& options) {
  return std::make_unique<Watched>(inner, options);
}

void watchdog_note(int level, const std::string& note) {
  if (level <= 0) {
    t_note[0] = note;
    t_note[1].clear();
  } else {
    t_note[1] = note;
  }
}

}  // namespace untied
