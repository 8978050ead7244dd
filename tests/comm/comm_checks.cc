// Exact communicator checks (see comm_checks.h). Values are built from global coordinates:
//   bytes:       pattern(src, dst, i), a hash of the coordinates reduced to one byte;
//   reductions:  value(src, i), a small integer, so every sum/max/min is exact in every dtype
//                and the expected result is computed in int64 from the formula alone.
#include "comm/comm_checks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>

#include "untied/core/check.h"

namespace untied::testing {
namespace {

constexpr int kNoDst = 0xffff;  // the dst coordinate of data every rank receives alike
constexpr int64_t kMaxPrinted = 5;

uint8_t pattern(int src, int dst, int64_t i) {
  uint64_t x = static_cast<uint64_t>(src) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(dst + 1) * 0xC2B2AE3D27D4EB4Full ^ static_cast<uint64_t>(i);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

// In [-500, 503]: a sum over up to ~4000 ranks stays exact even in f32 (< 2^24).
int64_t value(int src, int64_t i) { return (i * 7 + src * 13) % 1001 - 500 + src % 4; }

int64_t combine(int64_t a, int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return 0;
}

// op over ranks 0..n-1 of value(q, i).
int64_t expected_reduce(int n, int64_t i, ReduceOp op) {
  int64_t acc = value(0, i);
  for (int q = 1; q < n; ++q) acc = combine(acc, value(q, i), op);
  return acc;
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  return DType::kI64;
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};

// Counts wrong elements on this rank and prints the first few. `where` builds the element's
// description only on a mismatch.
class Tally {
 public:
  explicit Tally(const Communicator& comm)
      : rank_(comm.rank()), size_(comm.size()), backend_(comm.backend()) {}

  template <typename T, typename Where>
  void expect(T got, T want, Where&& where) {
    if (got == want) return;
    if (wrong_ < kMaxPrinted) {
      std::ostringstream os;
      os << backend_ << " rank " << rank_ << "/" << size_ << ": " << where() << ": got " << +got
         << ", expected " << +want << "\n";
      std::fputs(os.str().c_str(), stderr);
    }
    ++wrong_;
  }
  void expect_true(bool ok, const std::string& what) {
    expect(ok, true, [&] { return what; });
  }
  int64_t wrong() const { return wrong_; }

 private:
  int rank_, size_;
  std::string backend_;
  int64_t wrong_ = 0;
};

}  // namespace

// ---- byte collectives ----

int64_t check_all_to_all(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int64_t bb : {0, 1, 3, 4096, 1 << 20}) {
    std::vector<uint8_t> send(n * bb), recv(n * bb);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i) {
        send[p * bb + i] = pattern(me, p, i);
        recv[p * bb + i] = ~pattern(p, me, i);
      }
    comm.all_to_all(send.data(), recv.data(), bb);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i)
        t.expect(recv[p * bb + i], pattern(p, me, i), [&] {
          return str_cat("all_to_all block_bytes=", bb, " from rank ", p, " [", i, "]");
        });
  }
  return t.wrong();
}

// all_to_allv: blocks of different sizes each way, zero-byte ones among them (a rank sending
// nothing to some, receiving nothing from others), every byte where the sizes put it.
int64_t check_all_to_allv(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  auto bytes = [](int from, int to, int64_t scale) { return ((from * 7 + to * 3) % 5) * scale; };
  for (int64_t scale : {1, 3, 4096}) {
    std::vector<int64_t> send_bytes(n), recv_bytes(n);
    int64_t s_total = 0, r_total = 0;
    for (int p = 0; p < n; ++p) {
      send_bytes[p] = bytes(me, p, scale), recv_bytes[p] = bytes(p, me, scale);
      s_total += send_bytes[p], r_total += recv_bytes[p];
    }
    std::vector<uint8_t> send(s_total), recv(r_total, 0xAB);
    for (int p = 0, at = 0; p < n; at += static_cast<int>(send_bytes[p]), ++p)
      for (int64_t i = 0; i < send_bytes[p]; ++i) send[at + i] = pattern(me, p, i);
    comm.all_to_allv(send.data(), send_bytes, recv.data(), recv_bytes);
    for (int p = 0, at = 0; p < n; at += static_cast<int>(recv_bytes[p]), ++p)
      for (int64_t i = 0; i < recv_bytes[p]; ++i)
        t.expect(recv[at + i], pattern(p, me, i), [&] {
          return str_cat("all_to_allv scale=", scale, " from rank ", p, " [", i, "]");
        });
  }
  return t.wrong();
}

// Two all_to_all in flight with a blocking collective between them, waited for in reverse
// order of starting, then one dropped without wait() (its destructor completes it).
int64_t check_all_to_all_start(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  const int64_t big = (int64_t{1} << 20) + 5, small = 3;
  auto fill = [&](std::vector<uint8_t>& send, std::vector<uint8_t>& recv, int64_t bb, int salt) {
    send.assign(n * bb, 0);
    recv.assign(n * bb, 0);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i) {
        send[p * bb + i] = pattern(me, p, i + salt);
        recv[p * bb + i] = ~pattern(p, me, i + salt);
      }
  };
  auto expect = [&](const std::vector<uint8_t>& recv, int64_t bb, int salt, const char* what) {
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i)
        t.expect(recv[p * bb + i], pattern(p, me, i + salt),
                 [&] { return str_cat("all_to_all_start ", what, " block_bytes=", bb, " from rank ", p, " [", i, "]"); });
  };
  std::vector<uint8_t> s1, r1, s2, r2;
  fill(s1, r1, big, 0);
  fill(s2, r2, small, 7);
  auto a = comm.all_to_all_start(s1.data(), r1.data(), big);
  int64_t sum = me;  // a blocking collective while `a` is in flight
  comm.all_reduce(&sum, &sum, 1, DType::kI64, ReduceOp::kSum);
  t.expect(sum, static_cast<int64_t>(n) * (n - 1) / 2, [] { return std::string("all_reduce between all_to_all_start"); });
  auto b = comm.all_to_all_start(s2.data(), r2.data(), small);
  b->wait();
  a->wait();
  a->wait();  // a second wait() returns at once
  expect(r1, big, 0, "first");
  expect(r2, small, 7, "second");
  fill(s1, r1, 4096, 3);
  { auto dropped = comm.all_to_all_start(s1.data(), r1.data(), 4096); }
  expect(r1, 4096, 3, "dropped");
  auto empty = comm.all_to_all_start(nullptr, nullptr, 0);
  empty->wait();
  return t.wrong();
}

int64_t check_all_gather(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int64_t bb : {0, 1, 5, 4096, 1 << 20}) {
    std::vector<uint8_t> send(bb), recv(n * bb);
    for (int64_t i = 0; i < bb; ++i) send[i] = pattern(me, kNoDst, i);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i) recv[p * bb + i] = ~pattern(p, kNoDst, i);
    comm.all_gather(send.data(), recv.data(), bb);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i)
        t.expect(recv[p * bb + i], pattern(p, kNoDst, i), [&] {
          return str_cat("all_gather block_bytes=", bb, " from rank ", p, " [", i, "]");
        });
  }
  return t.wrong();
}

int64_t check_broadcast(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int root = 0; root < n; ++root) {
    for (int64_t bytes : {0, 5, (1 << 20) + 3}) {
      std::vector<uint8_t> buf(bytes);
      for (int64_t i = 0; i < bytes; ++i)
        buf[i] = me == root ? pattern(root, kNoDst, i) : ~pattern(root, kNoDst, i);
      comm.broadcast(buf.data(), bytes, root);
      for (int64_t i = 0; i < bytes; ++i)
        t.expect(buf[i], pattern(root, kNoDst, i),
                 [&] { return str_cat("broadcast root=", root, " bytes=", bytes, " [", i, "]"); });
    }
  }
  return t.wrong();
}

namespace {

// Sends the pattern for (me -> dest) and checks the one for (src -> me). Message sizes depend on
// the pair, so send and receive sizes differ.
void sendrecv_once(Communicator& comm, int dest, int src, int64_t base, Tally& t) {
  const int me = comm.rank();
  auto bytes_for = [&](int from, int to) { return base == 0 ? 0 : base + 10 * from + to; };
  const int64_t sb = bytes_for(me, dest), rb = bytes_for(src, me);
  std::vector<uint8_t> send(sb), recv(rb);
  for (int64_t i = 0; i < sb; ++i) send[i] = pattern(me, dest, i);
  for (int64_t i = 0; i < rb; ++i) recv[i] = ~pattern(src, me, i);
  comm.sendrecv(send.data(), sb, dest, recv.data(), rb, src);
  for (int64_t i = 0; i < rb; ++i)
    t.expect(recv[i], pattern(src, me, i), [&] {
      return str_cat("sendrecv to ", dest, " from ", src, " bytes=", rb, " [", i, "]");
    });
}

}  // namespace

int64_t check_sendrecv(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int64_t base : {0, 7, 1 << 20}) {
    sendrecv_once(comm, (me + 1) % n, (me - 1 + n) % n, base, t);  // ring to the right
    sendrecv_once(comm, (me - 1 + n) % n, (me + 1) % n, base, t);  // ring to the left
    sendrecv_once(comm, me, me, base, t);                          // to self
  }
  // A full ring pass, as ring attention does: forward what arrived last step; after step s
  // this rank holds the block that started on rank me - s.
  const int64_t bb = 4099;
  std::vector<uint8_t> cur(bb), next(bb);
  for (int64_t i = 0; i < bb; ++i) cur[i] = pattern(me, kNoDst, i);
  for (int s = 1; s < n; ++s) {
    comm.sendrecv(cur.data(), bb, (me + 1) % n, next.data(), bb, (me - 1 + n) % n);
    std::swap(cur, next);
    const int origin = ((me - s) % n + n) % n;
    for (int64_t i = 0; i < bb; ++i)
      t.expect(cur[i], pattern(origin, kNoDst, i), [&] {
        return str_cat("ring pass step ", s, " block of rank ", origin, " [", i, "]");
      });
  }
  return t.wrong();
}

int64_t check_sendrecv_start(Communicator& comm) {
  const int n = comm.size(), me = comm.rank(), next = (me + 1) % n, prev = (me - 1 + n) % n;
  Tally t(comm);
  const int64_t big = (int64_t{1} << 20) + 3, small = 4099;  // two messages of different sizes per step
  std::vector<uint8_t> a[2] = {std::vector<uint8_t>(big), std::vector<uint8_t>(big)};
  std::vector<uint8_t> b[2] = {std::vector<uint8_t>(small), std::vector<uint8_t>(small)};
  for (int64_t i = 0; i < big; ++i) a[0][i] = pattern(me, kNoDst, i);
  for (int64_t i = 0; i < small; ++i) b[0][i] = pattern(me, me, i);
  int cur = 0;
  std::unique_ptr<PendingExchange> pending_b;
  for (int s = 1; s <= n; ++s) {
    // Start the big block's exchange, then (the previous step's) small one finishes, then a new
    // small one starts: two in flight, in the same order on every rank.
    auto pending_a = comm.sendrecv_start(a[cur].data(), big, next, a[1 - cur].data(), big, prev);
    if (pending_b) pending_b->wait();
    pending_b = comm.sendrecv_start(b[cur].data(), small, next, b[1 - cur].data(), small, prev);
    pending_a->wait();
    cur = 1 - cur;
    const int origin = ((me - s) % n + n) % n;
    for (int64_t i = 0; i < big; ++i)
      t.expect(a[cur][i], pattern(origin, kNoDst, i), [&] {
        return str_cat("sendrecv_start step ", s, " big block of rank ", origin, " [", i, "]");
      });
  }
  pending_b->wait();  // after n steps the small block has gone round once: this rank's own
  for (int64_t i = 0; i < small; ++i)
    t.expect(b[cur][i], pattern(me, me, i), [&] { return str_cat("sendrecv_start small block [", i, "]"); });
  // A started exchange that is dropped without wait() still completes (its destructor waits).
  std::vector<uint8_t> x(64, static_cast<uint8_t>(me)), y(64, 0xff);
  { auto dropped = comm.sendrecv_start(x.data(), 64, next, y.data(), 64, prev); }
  for (int64_t i = 0; i < 64; ++i)
    t.expect(y[i], static_cast<uint8_t>(prev), [&] { return str_cat("dropped sendrecv_start [", i, "]"); });
  return t.wrong();
}

// ---- reductions ----

namespace {

template <typename T>
void all_reduce_once(Communicator& comm, int64_t elems, ReduceOp op, bool in_place, Tally& t) {
  const int n = comm.size(), me = comm.rank();
  std::vector<T> send(elems), recv(elems, T(987654));
  for (int64_t i = 0; i < elems; ++i) send[i] = static_cast<T>(value(me, i));
  T* out = in_place ? send.data() : recv.data();
  comm.all_reduce(send.data(), out, elems, dtype_of<T>(), op);
  for (int64_t i = 0; i < elems; ++i)
    t.expect(out[i], static_cast<T>(expected_reduce(n, i, op)), [&] {
      return str_cat("all_reduce ", dtype_name(dtype_of<T>()), " ", op_name(op),
                     in_place ? " in-place" : "", " elems=", elems, " [", i, "]");
    });
}

template <typename T>
void reduce_scatter_once(Communicator& comm, int64_t block, ReduceOp op, Tally& t) {
  const int n = comm.size(), me = comm.rank();
  std::vector<T> send(n * block), recv(block, T(987654));
  for (int64_t j = 0; j < n * block; ++j) send[j] = static_cast<T>(value(me, j));
  comm.reduce_scatter(send.data(), recv.data(), block, dtype_of<T>(), op);
  for (int64_t i = 0; i < block; ++i)
    t.expect(recv[i], static_cast<T>(expected_reduce(n, me * block + i, op)), [&] {
      return str_cat("reduce_scatter ", dtype_name(dtype_of<T>()), " ", op_name(op),
                     " block_elems=", block, " [", i, "]");
    });
}

template <typename T>
void all_reduce_all_ops(Communicator& comm, Tally& t) {
  for (ReduceOp op : kOps)
    for (bool in_place : {false, true})
      for (int64_t elems : {0, 1, 17, 4099}) all_reduce_once<T>(comm, elems, op, in_place, t);
}

template <typename T>
void reduce_scatter_all_ops(Communicator& comm, Tally& t) {
  for (ReduceOp op : kOps)
    for (int64_t block : {0, 1, 17, 4099}) reduce_scatter_once<T>(comm, block, op, t);
}

}  // namespace

int64_t check_all_reduce(Communicator& comm) {
  Tally t(comm);
  all_reduce_all_ops<float>(comm, t);
  all_reduce_all_ops<double>(comm, t);
  all_reduce_all_ops<int32_t>(comm, t);
  all_reduce_all_ops<int64_t>(comm, t);
  for (bool in_place : {false, true}) {  // a few MB
    all_reduce_once<float>(comm, 1 << 20, ReduceOp::kSum, in_place, t);
    all_reduce_once<double>(comm, 1 << 20, ReduceOp::kMax, in_place, t);
  }
  return t.wrong();
}

int64_t check_reduce_scatter(Communicator& comm) {
  Tally t(comm);
  reduce_scatter_all_ops<float>(comm, t);
  reduce_scatter_all_ops<double>(comm, t);
  reduce_scatter_all_ops<int32_t>(comm, t);
  reduce_scatter_all_ops<int64_t>(comm, t);
  reduce_scatter_once<float>(comm, 1 << 18, ReduceOp::kSum, t);  // 1 MB blocks
  return t.wrong();
}

// ---- groups and synchronisation ----

namespace {

// Checks a split result: rank and size, then an all_gather and an all_reduce of the parent
// ranks. `members` are the parent ranks of the new group in its rank order.
void check_subgroup(Communicator& sub, int parent_rank, const std::vector<int>& members,
                    const std::string& what, Tally& t) {
  const int m = static_cast<int>(members.size());
  const int want_rank =
      static_cast<int>(std::find(members.begin(), members.end(), parent_rank) - members.begin());
  t.expect(sub.size(), m, [&] { return what + ": size"; });
  t.expect(sub.rank(), want_rank, [&] { return what + ": rank"; });
  if (sub.size() != m || sub.rank() != want_rank) return;  // the collectives below would hang
  std::vector<int32_t> gathered(m, -1);
  int32_t mine = parent_rank;
  sub.all_gather(&mine, gathered.data(), sizeof mine);
  for (int p = 0; p < m; ++p)
    t.expect(gathered[p], members[p], [&] { return str_cat(what, ": all_gather [", p, "]"); });
  int64_t sum = parent_rank;
  sub.all_reduce(&sum, &sum, 1, DType::kI64, ReduceOp::kSum);
  t.expect(sum, static_cast<int64_t>(std::accumulate(members.begin(), members.end(), 0)),
           [&] { return what + ": all_reduce sum of parent ranks"; });
}

}  // namespace

int64_t check_split(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  {  // even/odd, key reverses the order
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q)
      if (q % 2 == me % 2) members.push_back(q);
    std::unique_ptr<Communicator> sub = comm.split(me % 2, -me);
    check_subgroup(*sub, me, members, "split even/odd reversed", t);
    // The full checks on the subgroup, while the other colour runs its own concurrently.
    t.expect(check_all_gather(*sub), int64_t{0}, [] { return "all_gather on even/odd subgroup"; });
    t.expect(check_sendrecv(*sub), int64_t{0}, [] { return "sendrecv on even/odd subgroup"; });
    // Nested: the subgroup split again into one colour, order kept (equal keys).
    std::vector<int> sub_members(members.size());
    std::iota(sub_members.begin(), sub_members.end(), 0);
    std::unique_ptr<Communicator> nested = sub->split(0, 0);
    check_subgroup(*nested, sub->rank(), sub_members, "nested split", t);
    nested->barrier();
  }
  {  // one colour, equal keys: the same group in the same order
    std::vector<int> members(n);
    std::iota(members.begin(), members.end(), 0);
    std::unique_ptr<Communicator> sub = comm.split(3, 0);
    check_subgroup(*sub, me, members, "split one colour", t);
  }
  {  // one rank per colour
    std::unique_ptr<Communicator> sub = comm.split(me, 0);
    check_subgroup(*sub, me, {me}, "split one rank per colour", t);
    t.expect(check_broadcast(*sub), int64_t{0}, [] { return "broadcast on a one-rank group"; });
  }
  comm.barrier();
  return t.wrong();
}

int64_t check_barrier(Communicator& comm) {
  using Clock = std::chrono::steady_clock;
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int late = 0; late < n; ++late) {
    if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int64_t enter = Clock::now().time_since_epoch().count();
    comm.barrier();
    const int64_t leave = Clock::now().time_since_epoch().count();
    std::vector<int64_t> enters(n);
    comm.all_gather(&enter, enters.data(), sizeof enter);
    const int64_t last_enter = *std::max_element(enters.begin(), enters.end());
    t.expect_true(leave >= last_enter,
                  str_cat("barrier with rank ", late, " late: left ", last_enter - leave,
                          " ns before the last rank entered"));
  }
  return t.wrong();
}

int64_t check_all_ranks_ok(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  t.expect_true(all_ranks_ok(comm, true) == true, "all_ranks_ok(all true)");
  t.expect_true(all_ranks_ok(comm, me != n - 1) == false, "all_ranks_ok(last rank false)");
  t.expect_true(all_ranks_ok(comm, me != 0) == false, "all_ranks_ok(rank 0 false)");
  return t.wrong();
}

int64_t check_many_small(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int it = 0; it < 300; ++it) {
    int64_t x = it * (me + 1);
    comm.all_reduce(&x, &x, 1, DType::kI64, ReduceOp::kSum);
    t.expect(x, static_cast<int64_t>(it) * n * (n + 1) / 2,
             [&] { return str_cat("small all_reduce iteration ", it); });
    const int root = it % n;
    int32_t y = me == root ? it : -1;
    comm.broadcast(&y, sizeof y, root);
    t.expect(y, it, [&] { return str_cat("small broadcast iteration ", it); });
    if (it % 50 == 0) comm.barrier();
  }
  return t.wrong();
}

namespace {

// True when `f` throws untied::Error of `kind` whose message contains `part`; prints otherwise.
bool throws(const std::function<void()>& f, ErrorKind kind, const std::string& part, Tally& t,
            const std::string& what) {
  std::string problem;
  try {
    f();
    problem = "did not throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    if (e.kind() != kind)
      problem = "threw the wrong kind: " + msg;
    else if (msg.find(part) == std::string::npos)
      problem = "message lacks \"" + part + "\": " + msg;
  }
  t.expect_true(problem.empty(), what + ": " + problem);
  return problem.empty();
}

}  // namespace

int64_t check_argument_errors(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  std::vector<uint16_t> a(2 * n), b(2 * n);
  throws([&] { comm.all_reduce(a.data(), b.data(), 2, DType::kBF16, ReduceOp::kSum); },
         ErrorKind::kUnsupported, "does not support reduce on bf16", t, "all_reduce bf16");
  throws([&] { comm.all_reduce(a.data(), a.data(), 2, DType::kBF16, ReduceOp::kMax); },
         ErrorKind::kUnsupported, "does not support reduce on bf16", t, "all_reduce bf16 in place");
  throws([&] { comm.reduce_scatter(a.data(), b.data(), 2, DType::kBF16, ReduceOp::kSum); },
         ErrorKind::kUnsupported, "does not support reduce on bf16", t, "reduce_scatter bf16");
  throws([&] { comm.broadcast(a.data(), 4, n); }, ErrorKind::kInvalidArgument, "root", t,
         "broadcast root == size");
  throws([&] { comm.sendrecv(a.data(), 4, -1, b.data(), 4, me); }, ErrorKind::kInvalidArgument,
         "dest", t, "sendrecv dest -1");
  throws([&] { comm.sendrecv(a.data(), 4, me, b.data(), 4, n); }, ErrorKind::kInvalidArgument,
         "src", t, "sendrecv src == size");
  throws([&] { comm.split(-1, 0); }, ErrorKind::kInvalidArgument, "color", t, "split color -1");
  throws([&] { comm.sendrecv(a.data(), 4, me, b.data(), 8, me); }, ErrorKind::kInvalidArgument,
         "sent 4 bytes, this rank expected 8", t, "sendrecv of a shorter message");
  comm.barrier();  // the communicator still works after local argument errors
  return t.wrong();
}

const std::vector<CommCheck>& comm_checks() {
  static const std::vector<CommCheck> checks = {
      {"all_to_all", check_all_to_all},
      {"all_to_all_start", check_all_to_all_start},
      {"all_to_allv", check_all_to_allv},
      {"all_gather", check_all_gather},
      {"reduce_scatter", check_reduce_scatter},
      {"all_reduce", check_all_reduce},
      {"broadcast", check_broadcast},
      {"sendrecv", check_sendrecv},
      {"sendrecv_start", check_sendrecv_start},
      {"split", check_split},
      {"barrier", check_barrier},
      {"all_ranks_ok", check_all_ranks_ok},
      {"many_small", check_many_small},
      {"argument_errors", check_argument_errors},
  };
  return checks;
}

}  // namespace untied::testing
