// The in-process backend of Communicator: threads act as ranks, collectives are memory copies.
//
// Layout of the shared state:
//   World   one per run_in_process call: the `aborted` flag, the failures seen so far, and every
//           Group made in it (so an abort can wake every waiting thread).
//   Group   one per communicator group (the world group, and one per split colour): a barrier,
//           one Slot per rank, and one Mailbox per (src, dst) pair for sendrecv.
//
// A collective runs in three steps:
//   1. enter: the rank publishes its call name, sizes and buffer pointers in its Slot, then
//      waits at the barrier; after it, every rank checks that all ranks are in the same call
//      with the same sizes (a mismatch throws kInvalidArgument on every rank alike).
//   2. each rank reads the others' buffers and writes only its own receive buffer; reductions
//      run in rank order 0..n-1, so results are bitwise identical on every rank and run to run.
//   3. leave: a second barrier, so no rank returns (and reuses its send buffer, or publishes
//      the next call in its Slot) while another rank still reads from it.
// In-place all_reduce reduces into a temporary and copies it out after step 3, because other
// ranks read this rank's send buffer (== its receive buffer) during step 2.
//
// sendrecv does not use the barrier: the message is copied into the (src, dst) mailbox and the
// call then waits for the (src', me) mailbox, so ring patterns cannot deadlock.
//
// Device memory (bind_device with a GPU device; several ranks then share one GPU): before
// publishing, a rank waits for its device's work (so its send buffer is complete), and every
// copy goes through its device (Device::copy: a device-to-device copy on the GPU, synchronous).
// Reductions read the ranks' blocks into host memory, reduce there in rank order as above, and
// copy the result back: exact and rarely used on that path (metrics and agreements).
//
// Aborts: when a body throws, or a rank calls abort(), the world is marked aborted and every
// barrier and mailbox is woken; blocked and later calls throw Error(kAborted).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/deferred_exchange.h"
#include "untied/comm/inproc.h"
#include "untied/core/check.h"

namespace untied {
namespace {

[[noreturn]] void fail_aborted(const char* call) {
  fail(ErrorKind::kAborted, error_prefix(__FILE__, __LINE__) + "inproc " + call +
                                ": another rank failed or called abort(); this rank stops");
}

bool is_abort_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind() == ErrorKind::kAborted;
  } catch (...) {
    return false;
  }
}

class Group;

// State shared by all ranks of one run_in_process call. Thread-safe.
class World {
 public:
  bool aborted() const { return aborted_.load(); }

  // Marks the world failed and wakes every thread blocked in any of its groups.
  void abort() noexcept;

  // Records a rank's exception (in the order they happen) and aborts the world.
  void record_failure(std::exception_ptr e) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      failures_.push_back(std::move(e));
    }
    abort();
  }

  // Records that a rank called Communicator::abort(code).
  void record_abort_call(std::string note) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (abort_note_.empty()) abort_note_ = std::move(note);
    }
    abort();
  }

  void add_group(const std::shared_ptr<Group>& g) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(groups_, [](const std::weak_ptr<Group>& w) { return w.expired(); });
    groups_.push_back(g);
  }

  // After all ranks joined: rethrows the first failure that is not an abort; else reports an
  // abort() call; else rethrows the first failure (an abort); else returns.
  void rethrow_first_failure() {
    for (const std::exception_ptr& e : failures_)
      if (!is_abort_error(e)) std::rethrow_exception(e);
    if (!abort_note_.empty())
      fail(ErrorKind::kAborted, "run_in_process: the world stopped because " + abort_note_);
    if (!failures_.empty()) std::rethrow_exception(failures_.front());
  }

 private:
  std::atomic<bool> aborted_{false};
  std::mutex mu_;  // guards the members below
  std::vector<std::weak_ptr<Group>> groups_;
  std::vector<std::exception_ptr> failures_;
  std::string abort_note_;
};

// A reusable barrier for n threads (mutex + condition variable + generation counter) that
// throws kAborted instead of waiting forever once the world is aborted.
class Barrier {
 public:
  Barrier(const World* world, int n) : world_(world), n_(n) {}

  void wait(const char* call) {
    std::unique_lock<std::mutex> lock(mu_);
    if (world_->aborted()) fail_aborted(call);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || world_->aborted(); });
    if (generation_ == gen) fail_aborted(call);
  }

  void wake() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }

 private:
  const World* world_;
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// Messages from one rank to another, in order (buffered copies).
class Mailbox {
 public:
  explicit Mailbox(const World* world) : world_(world) {}

  void put(const void* data, int64_t bytes) {
    std::vector<std::byte> msg(static_cast<size_t>(bytes));
    if (bytes > 0) std::memcpy(msg.data(), data, static_cast<size_t>(bytes));
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(std::move(msg));
    cv_.notify_all();
  }

  std::vector<std::byte> take(const char* call) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !messages_.empty() || world_->aborted(); });
    if (world_->aborted()) fail_aborted(call);
    std::vector<std::byte> msg = std::move(messages_.front());
    messages_.pop_front();
    return msg;
  }

  void wake() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }

 private:
  const World* world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<std::byte>> messages_;
};

// What one rank publishes for the collective it is in. Written by its owner before the first
// barrier of a call, read by all ranks between the first and the last barrier.
struct Slot {
  const char* call = nullptr;  // the collective's name; must match on every rank
  int64_t size = 0;            // its size argument; must match on every rank
  int64_t arg = 0;             // dtype/op/root; must match on every rank
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0;  // split only
  int key = 0;    // split only
  std::shared_ptr<Group> split_result =
      nullptr;  // split only: the new group, published by its leader
};

class Group {
 public:
  Group(std::shared_ptr<World> world, int size)
      : world_(std::move(world)), size_(size), barrier_(world_.get(), size), slots_(size) {
    mailboxes_.reserve(static_cast<size_t>(size) * size);
    for (int i = 0; i < size * size; ++i)
      mailboxes_.push_back(std::make_unique<Mailbox>(world_.get()));
  }

  World& world() { return *world_; }
  const std::shared_ptr<World>& shared_world() const { return world_; }
  int size() const { return size_; }
  Barrier& barrier() { return barrier_; }
  Slot& slot(int rank) { return slots_[rank]; }
  Mailbox& mailbox(int src, int dst) { return *mailboxes_[static_cast<size_t>(src) * size_ + dst]; }

  void wake_all() noexcept {
    barrier_.wake();
    for (auto& m : mailboxes_) m->wake();
  }

 private:
  std::shared_ptr<World> world_;
  const int size_;
  Barrier barrier_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
};

void World::abort() noexcept {
  aborted_.store(true);
  // Waiters check `aborted_` under their own mutex; taking that mutex before notifying means
  // none can miss the wake-up.
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::weak_ptr<Group>& w : groups_)
    if (std::shared_ptr<Group> g = w.lock()) g->wake_all();
}

void copy_bytes(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

// Fails unless `t` can be reduced: bf16 is refused, as by the MPI backend.
void check_reducible(DType t, const char* call) {
  UNTIED_CHECK_KIND(ErrorKind::kUnsupported, t != DType::kBF16,
                    "inproc does not support reduce on bf16 (", call, "); reduce in f32 instead");
}

// out[i] = srcs[0][i] op srcs[1][i] op ... in rank order. `out` aliases no source.
template <typename T>
void reduce_typed(void* out_v, const std::vector<const void*>& srcs, int64_t n, ReduceOp op) {
  T* out = static_cast<T*>(out_v);
  if (n == 0) return;
  std::memcpy(out, srcs[0], static_cast<size_t>(n) * sizeof(T));
  for (size_t q = 1; q < srcs.size(); ++q) {
    const T* s = static_cast<const T*>(srcs[q]);
    switch (op) {
      case ReduceOp::kSum:
        for (int64_t i = 0; i < n; ++i) out[i] = out[i] + s[i];
        break;
      case ReduceOp::kMax:
        for (int64_t i = 0; i < n; ++i) out[i] = out[i] < s[i] ? s[i] : out[i];
        break;
      case ReduceOp::kMin:
        for (int64_t i = 0; i < n; ++i) out[i] = s[i] < out[i] ? s[i] : out[i];
        break;
    }
  }
}

void reduce(void* out, const std::vector<const void*>& srcs, int64_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: return reduce_typed<float>(out, srcs, n, op);
    case DType::kF64: return reduce_typed<double>(out, srcs, n, op);
    case DType::kI32: return reduce_typed<int32_t>(out, srcs, n, op);
    case DType::kI64: return reduce_typed<int64_t>(out, srcs, n, op);
    case DType::kBF16: break;
  }
  check_reducible(t, "reduce");
}

int64_t reduce_arg(DType t, ReduceOp op) {
  return static_cast<int64_t>(t) * 16 + static_cast<int>(op);
}

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(std::shared_ptr<Group> group, int rank, Device* dev = nullptr)
      : group_(std::move(group)), rank_(rank), dev_(dev) {}

  void bind_device(Device& dev) override { dev_ = dev.kind() == DeviceKind::kCpu ? nullptr : &dev; }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string backend() const override { return "inproc"; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    UNTIED_CHECK(color >= 0, "split: color must be >= 0, got ", color);
    enter({.call = "split", .color = color, .key = key});
    // Members of this colour ordered by (key, rank); the first one creates the group.
    std::vector<int> members;
    for (int q = 0; q < size(); ++q)
      if (group_->slot(q).color == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return group_->slot(a).key < group_->slot(b).key; });
    const int leader = members.front();
    if (rank_ == leader) {
      auto g = std::make_shared<Group>(group_->shared_world(), static_cast<int>(members.size()));
      group_->world().add_group(g);
      group_->slot(rank_).split_result = std::move(g);
    }
    group_->barrier().wait("split");
    std::shared_ptr<Group> g = group_->slot(leader).split_result;
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    leave("split");  // after this no rank reads the leader's split_result
    if (rank_ == leader) group_->slot(rank_).split_result.reset();
    return std::make_unique<InprocCommunicator>(std::move(g), new_rank, dev_);
  }

  void all_to_all(const void* send, void* recv, int64_t block_bytes) override {
    UNTIED_CHECK(block_bytes >= 0, "all_to_all: negative block size ", block_bytes);
    enter({.call = "all_to_all", .size = block_bytes, .send = send, .recv = recv});
    for (int p = 0; p < size(); ++p)
      move(static_cast<char*>(recv) + p * block_bytes,
           static_cast<const char*>(group_->slot(p).send) + rank_ * block_bytes, block_bytes);
    leave("all_to_all");
  }

  void all_gather(const void* send, void* recv, int64_t block_bytes) override {
    UNTIED_CHECK(block_bytes >= 0, "all_gather: negative block size ", block_bytes);
    enter({.call = "all_gather", .size = block_bytes, .send = send, .recv = recv});
    for (int p = 0; p < size(); ++p)
      move(static_cast<char*>(recv) + p * block_bytes, group_->slot(p).send, block_bytes);
    leave("all_gather");
  }

  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype,
                      ReduceOp op) override {
    check_reducible(dtype, "reduce_scatter");
    UNTIED_CHECK(block_elems >= 0, "reduce_scatter: negative block size ", block_elems);
    enter({.call = "reduce_scatter",
           .size = block_elems,
           .arg = reduce_arg(dtype, op),
           .send = send,
           .recv = recv});
    const int64_t block_bytes = block_elems * dtype_size(dtype);
    std::vector<const void*> srcs(size());
    for (int q = 0; q < size(); ++q)
      srcs[q] = static_cast<const char*>(group_->slot(q).send) + rank_ * block_bytes;
    reduce_staged(recv, srcs, block_elems, dtype, op);
    leave("reduce_scatter");
  }

  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override {
    check_reducible(dtype, "all_reduce");
    UNTIED_CHECK(elems >= 0, "all_reduce: negative size ", elems);
    enter({.call = "all_reduce",
           .size = elems,
           .arg = reduce_arg(dtype, op),
           .send = send,
           .recv = recv});
    std::vector<const void*> srcs(size());
    for (int q = 0; q < size(); ++q) srcs[q] = group_->slot(q).send;
    if (send != recv) {
      reduce_staged(recv, srcs, elems, dtype, op);
      leave("all_reduce");
      return;
    }
    std::vector<std::byte> tmp(static_cast<size_t>(elems * dtype_size(dtype)));
    reduce_staged(tmp.data(), srcs, elems, dtype, op, /*out_on_host=*/true);
    leave("all_reduce");
    move(recv, tmp.data(), static_cast<int64_t>(tmp.size()));
  }

  void broadcast(void* buf, int64_t bytes, int root) override {
    UNTIED_CHECK(bytes >= 0, "broadcast: negative size ", bytes);
    UNTIED_CHECK(root >= 0 && root < size(), "broadcast: root ", root,
                 " is not a rank of a group of ", size());
    enter({.call = "broadcast", .size = bytes, .arg = root, .send = buf, .recv = buf});
    if (rank_ != root) move(buf, group_->slot(root).send, bytes);
    leave("broadcast");
  }

  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src) override {
    post(send, send_bytes, dest, recv_bytes, src);
    receive(recv, recv_bytes, src);
  }

  std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest, void* recv,
                                                  int64_t recv_bytes, int src) override {
    // The message is posted (copied into the mailbox) at once; wait() takes the peer's.
    post(send, send_bytes, dest, recv_bytes, src);
    return std::make_unique<DeferredExchange>([this, recv, recv_bytes, src] { receive(recv, recv_bytes, src); });
  }

  void barrier() override {
    enter({.call = "barrier"});
    leave("barrier");
  }

  void abort(int code) noexcept override {
    try {
      group_->world().record_abort_call(error_prefix(__FILE__, __LINE__) + "abort(" +
                                        std::to_string(code) + ") was called");
    } catch (...) {
      group_->world().abort();
    }
  }

 private:
  // Step 1 of a collective (see the top of the file): publish, wait, check that all ranks
  // are in the same call with the same sizes.
  void enter(Slot s) {
    if (group_->world().aborted()) fail_aborted(s.call);
    if (dev_) dev_->synchronize();  // this rank's send buffer is complete before others read it
    const char* call = s.call;
    group_->slot(rank_) = std::move(s);
    group_->barrier().wait(call);
    const Slot& mine = group_->slot(rank_);
    for (int q = 0; q < size(); ++q) {
      const Slot& other = group_->slot(q);
      UNTIED_CHECK(std::strcmp(other.call, call) == 0, "inproc: rank ", q, " called ", other.call,
                   " while rank ", rank_, " called ", call,
                   "; every rank must call the same collectives in the same order");
      UNTIED_CHECK(other.size == mine.size && other.arg == mine.arg, "inproc ", call, ": rank ", q,
                   " passed size ", other.size, " (arg ", other.arg, "), rank ", rank_,
                   " passed size ", mine.size, " (arg ", mine.arg,
                   "); every rank must pass the same sizes, types and root");
    }
  }

  // Step 3: no rank leaves before every rank has finished reading the others' buffers.
  void leave(const char* call) { group_->barrier().wait(call); }

  // Copies bytes between this rank's buffers and others' (host memcpy, or the bound device's copy).
  // The two halves of a sendrecv: the message into the (rank, dest) mailbox; the peer's out of
  // the (src, rank) one.
  void post(const void* send, int64_t send_bytes, int dest, int64_t recv_bytes, int src) {
    UNTIED_CHECK(send_bytes >= 0 && recv_bytes >= 0, "sendrecv: negative size (send ", send_bytes,
                 ", recv ", recv_bytes, ")");
    UNTIED_CHECK(dest >= 0 && dest < size(), "sendrecv: dest ", dest,
                 " is not a rank of a group of ", size());
    UNTIED_CHECK(src >= 0 && src < size(), "sendrecv: src ", src, " is not a rank of a group of ",
                 size());
    if (group_->world().aborted()) fail_aborted("sendrecv");
    if (dev_) {  // the message is buffered on the host
      dev_->synchronize();
      std::vector<std::byte> staged(static_cast<size_t>(send_bytes));
      move(staged.data(), send, send_bytes);
      group_->mailbox(rank_, dest).put(staged.data(), send_bytes);
    } else {
      group_->mailbox(rank_, dest).put(send, send_bytes);
    }
  }
  void receive(void* recv, int64_t recv_bytes, int src) {
    std::vector<std::byte> msg = group_->mailbox(src, rank_).take("sendrecv");
    UNTIED_CHECK(static_cast<int64_t>(msg.size()) == recv_bytes, "sendrecv: rank ", src, " sent ",
                 msg.size(), " bytes, this rank expected ", recv_bytes);
    move(recv, msg.data(), recv_bytes);
  }

  void move(void* dst, const void* src, int64_t bytes) {
    if (bytes <= 0) return;
    if (dev_) dev_->copy(dst, src, bytes);
    else copy_bytes(dst, src, bytes);
  }

  // reduce() over the ranks' blocks; with a bound device, through host copies of them (`out` is
  // device memory unless out_on_host).
  void reduce_staged(void* out, const std::vector<const void*>& srcs, int64_t n, DType t, ReduceOp op,
                     bool out_on_host = false) {
    if (!dev_) return reduce(out, srcs, n, t, op);
    const int64_t bytes = n * dtype_size(t);
    std::vector<std::vector<std::byte>> host(srcs.size(), std::vector<std::byte>(static_cast<size_t>(bytes)));
    std::vector<const void*> host_srcs(srcs.size());
    for (size_t q = 0; q < srcs.size(); ++q) {
      move(host[q].data(), srcs[q], bytes);
      host_srcs[q] = host[q].data();
    }
    if (out_on_host) return reduce(out, host_srcs, n, t, op);
    std::vector<std::byte> result(static_cast<size_t>(bytes));
    reduce(result.data(), host_srcs, n, t, op);
    move(out, result.data(), bytes);
  }

  std::shared_ptr<Group> group_;
  int rank_;
  Device* dev_;  // null: host memory
};

}  // namespace

void run_in_process(int ranks, const std::function<void(Communicator&)>& body) {
  UNTIED_CHECK(ranks >= 1, "run_in_process needs at least 1 rank, got ", ranks);
  auto world = std::make_shared<World>();
  auto group = std::make_shared<Group>(world, ranks);
  world->add_group(group);

  auto run_rank = [&](int r) {
    set_thread_rank(r);
    try {
      InprocCommunicator comm(group, r);
      body(comm);
    } catch (...) {
      world->record_failure(std::current_exception());
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  try {
    for (int r = 0; r < ranks; ++r) threads.emplace_back(run_rank, r);
  } catch (...) {  // thread creation failed: stop the ranks already started
    world->record_failure(std::current_exception());
  }
  for (std::thread& t : threads) t.join();
  world->rethrow_first_failure();
}

}  // namespace untied
