// Exact checks of every collective on GPU buffers, for a communicator whose ranks each own a GPU
// (the NCCL communicator). The single-process test (tests/cuda/cuda_nccl_test.cc, one rank) and
// the MPI test (tests/nccl/nccl_mpi_test.cc, one rank per process) run the same checks; the
// shared host-buffer checks (tests/comm/comm_checks.h) run on the MPI test's communicator too.
//
// As in comm_checks: every sent element is a function of its global coordinates (exact in every
// dtype), receive buffers start as the complement of what must arrive, every received element is
// compared exactly, and the first few mismatches are printed with the rank, the call, the size
// and the index. Each check is collective over `comm` and returns the number of wrong elements or
// wrong results on this rank (0 = pass). `gpu` is the rank's device, the one `comm` was made for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/expect_error.h"
#include "untied/comm/communicator.h"
#include "untied/core/allocator.h"
#include "untied/core/check.h"
#include "untied/device/device.h"

namespace untied::testing::devcomm {

constexpr int kNoDst = 0xffff;  // the dst coordinate of data every rank receives alike

inline uint8_t pattern(int src, int dst, int64_t i) {
  uint64_t x = static_cast<uint64_t>(src) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(dst + 1) * 0xC2B2AE3D27D4EB4Full ^ static_cast<uint64_t>(i);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

// In [-500, 503]: sums over a few ranks are exact in every dtype.
inline int64_t value(int src, int64_t i) { return (i * 7 + src * 13) % 1001 - 500 + src % 4; }

inline int64_t expected_reduce(int n, int64_t i, ReduceOp op) {
  int64_t acc = value(0, i);
  for (int q = 1; q < n; ++q) {
    const int64_t v = value(q, i);
    acc = op == ReduceOp::kSum ? acc + v : op == ReduceOp::kMax ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

inline const char* op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min";
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, double>) return DType::kF64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  return DType::kI64;
}

// Counts wrong elements and prints the first few.
class Tally {
 public:
  explicit Tally(const Communicator& comm) : rank_(comm.rank()), size_(comm.size()) {}
  template <typename T, typename Where>
  void expect(T got, T want, Where&& where) {
    if (got == want) return;
    if (wrong_ < 5) {
      std::ostringstream os;
      os << "device buffers, rank " << rank_ << "/" << size_ << ": " << where() << ": got " << +got
         << ", expected " << +want << "\n";
      std::fputs(os.str().c_str(), stderr);
    }
    ++wrong_;
  }
  void expect_ok(const ::testing::AssertionResult& r, const std::string& what) {
    expect(static_cast<bool>(r), true, [&] { return what + ": " + r.message(); });
  }
  int64_t wrong() const { return wrong_; }

 private:
  int rank_, size_;
  int64_t wrong_ = 0;
};

// A GPU buffer holding a copy of `host`.
template <typename T>
Buffer upload(Device& gpu, const std::vector<T>& host, const char* what) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  Buffer b = gpu.allocator().allocate(bytes, Tag::kOther, what);
  if (bytes > 0) gpu.copy(b.data(), host.data(), bytes);
  return b;
}

template <typename T>
std::vector<T> download(Device& gpu, const Buffer& b, int64_t elems) {
  std::vector<T> v(static_cast<size_t>(elems));
  if (elems > 0) gpu.copy(v.data(), b.data(), elems * static_cast<int64_t>(sizeof(T)));
  return v;
}

// send block p (pattern(me, p, i)) goes to rank p; with host_send the send buffer is host memory.
inline int64_t check_all_to_all(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (bool host_send : {false, true})
    for (int64_t bb : {int64_t{1}, int64_t{3}, int64_t{4099}, int64_t{(1 << 20) + 1}}) {
      std::vector<uint8_t> send(n * bb), init(n * bb);
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < bb; ++i) {
          send[p * bb + i] = pattern(me, p, i);
          init[p * bb + i] = static_cast<uint8_t>(~pattern(p, me, i));
        }
      Buffer ds = upload(gpu, send, "send"), dr = upload(gpu, init, "recv");
      comm.all_to_all(host_send ? static_cast<const void*>(send.data()) : ds.data(), dr.data(), bb);
      std::vector<uint8_t> got = download<uint8_t>(gpu, dr, n * bb);
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < bb; ++i)
          t.expect(got[p * bb + i], pattern(p, me, i), [&] {
            return str_cat("all_to_all", host_send ? " (host send)" : "", " block_bytes=", bb, " from rank ", p,
                           " [", i, "]");
          });
    }
  return t.wrong();
}

// Every rank receives every rank's block; with host_recv the receive buffer is host memory.
inline int64_t check_all_gather(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (bool host_recv : {false, true})
    for (int64_t bb : {int64_t{1}, int64_t{5}, int64_t{4099}, int64_t{(1 << 20) + 7}}) {
      std::vector<uint8_t> send(bb), init(n * bb);
      for (int64_t i = 0; i < bb; ++i) send[i] = pattern(me, kNoDst, i);
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < bb; ++i) init[p * bb + i] = static_cast<uint8_t>(~pattern(p, kNoDst, i));
      Buffer ds = upload(gpu, send, "send"), dr = upload(gpu, init, "recv");
      std::vector<uint8_t> got = init;
      comm.all_gather(ds.data(), host_recv ? static_cast<void*>(got.data()) : dr.data(), bb);
      if (!host_recv) got = download<uint8_t>(gpu, dr, n * bb);
      for (int p = 0; p < n; ++p)
        for (int64_t i = 0; i < bb; ++i)
          t.expect(got[p * bb + i], pattern(p, kNoDst, i), [&] {
            return str_cat("all_gather", host_recv ? " (host recv)" : "", " block_bytes=", bb, " from rank ", p,
                           " [", i, "]");
          });
    }
  return t.wrong();
}

template <typename T>
void all_reduce_once(Communicator& comm, Device& gpu, int64_t elems, ReduceOp op, bool in_place, Tally& t) {
  const int n = comm.size(), me = comm.rank();
  std::vector<T> send(elems), init(elems, T(987654));
  for (int64_t i = 0; i < elems; ++i) send[i] = static_cast<T>(value(me, i));
  Buffer ds = upload(gpu, send, "send"), dr = upload(gpu, init, "recv");
  Buffer& out = in_place ? ds : dr;
  comm.all_reduce(ds.data(), out.data(), elems, dtype_of<T>(), op);
  std::vector<T> got = download<T>(gpu, out, elems);
  for (int64_t i = 0; i < elems; ++i)
    t.expect(got[i], static_cast<T>(expected_reduce(n, i, op)), [&] {
      return str_cat("all_reduce ", dtype_name(dtype_of<T>()), " ", op_name(op), in_place ? " in-place" : "",
                     " elems=", elems, " [", i, "]");
    });
}

template <typename T>
void reduce_scatter_once(Communicator& comm, Device& gpu, int64_t block, ReduceOp op, Tally& t) {
  const int n = comm.size(), me = comm.rank();
  std::vector<T> send(n * block), init(block, T(987654));
  for (int64_t j = 0; j < n * block; ++j) send[j] = static_cast<T>(value(me, j));
  Buffer ds = upload(gpu, send, "send"), dr = upload(gpu, init, "recv");
  comm.reduce_scatter(ds.data(), dr.data(), block, dtype_of<T>(), op);
  std::vector<T> got = download<T>(gpu, dr, block);
  for (int64_t i = 0; i < block; ++i)
    t.expect(got[i], static_cast<T>(expected_reduce(n, me * block + i, op)), [&] {
      return str_cat("reduce_scatter ", dtype_name(dtype_of<T>()), " ", op_name(op), " block_elems=", block, " [",
                     i, "]");
    });
}

template <typename T>
void reductions_of(Communicator& comm, Device& gpu, Tally& t) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin})
    for (int64_t elems : {int64_t{1}, int64_t{17}, int64_t{4099}}) {
      all_reduce_once<T>(comm, gpu, elems, op, /*in_place=*/false, t);
      all_reduce_once<T>(comm, gpu, elems, op, /*in_place=*/true, t);
      reduce_scatter_once<T>(comm, gpu, elems, op, t);
    }
}

// f32/f64/i32/i64 x sum/max/min, in and out of place; a few MB in f32.
inline int64_t check_reductions(Communicator& comm, Device& gpu) {
  Tally t(comm);
  reductions_of<float>(comm, gpu, t);
  reductions_of<double>(comm, gpu, t);
  reductions_of<int32_t>(comm, gpu, t);
  reductions_of<int64_t>(comm, gpu, t);
  all_reduce_once<float>(comm, gpu, 1 << 20, ReduceOp::kSum, /*in_place=*/true, t);
  reduce_scatter_once<float>(comm, gpu, (1 << 18) + 3, ReduceOp::kSum, t);
  // In place on host memory: staged through the GPU both ways.
  const int n = comm.size(), me = comm.rank();
  std::vector<int64_t> h(1001);
  for (int64_t i = 0; i < 1001; ++i) h[i] = value(me, i);
  comm.all_reduce(h.data(), h.data(), 1001, DType::kI64, ReduceOp::kSum);
  for (int64_t i = 0; i < 1001; ++i)
    t.expect(h[i], expected_reduce(n, i, ReduceOp::kSum), [&] { return str_cat("host all_reduce in-place [", i, "]"); });
  return t.wrong();
}

// From every root.
inline int64_t check_broadcast(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  for (int root = 0; root < n; ++root)
    for (int64_t bytes : {int64_t{5}, int64_t{(1 << 20) + 3}}) {
      std::vector<uint8_t> init(bytes);
      for (int64_t i = 0; i < bytes; ++i)
        init[i] = me == root ? pattern(root, kNoDst, i) : static_cast<uint8_t>(~pattern(root, kNoDst, i));
      Buffer d = upload(gpu, init, "buf");
      comm.broadcast(d.data(), bytes, root);
      std::vector<uint8_t> got = download<uint8_t>(gpu, d, bytes);
      for (int64_t i = 0; i < bytes; ++i)
        t.expect(got[i], pattern(root, kNoDst, i),
                 [&] { return str_cat("broadcast root=", root, " bytes=", bytes, " [", i, "]"); });
    }
  return t.wrong();
}

// Ring shifts both ways with sizes that depend on the pair, and a send to self (device to
// device, and host to device).
inline int64_t check_sendrecv(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  auto once = [&](int dest, int src, int64_t base, bool host_send) {
    auto bytes_for = [&](int from, int to) { return base + 10 * from + to; };
    const int64_t sb = bytes_for(me, dest), rb = bytes_for(src, me);
    std::vector<uint8_t> send(sb), init(rb);
    for (int64_t i = 0; i < sb; ++i) send[i] = pattern(me, dest, i);
    for (int64_t i = 0; i < rb; ++i) init[i] = static_cast<uint8_t>(~pattern(src, me, i));
    Buffer ds = upload(gpu, send, "send"), dr = upload(gpu, init, "recv");
    comm.sendrecv(host_send ? static_cast<const void*>(send.data()) : ds.data(), sb, dest, dr.data(), rb, src);
    std::vector<uint8_t> got = download<uint8_t>(gpu, dr, rb);
    for (int64_t i = 0; i < rb; ++i)
      t.expect(got[i], pattern(src, me, i), [&] {
        return str_cat("sendrecv to ", dest, " from ", src, host_send ? " (host send)" : "", " bytes=", rb, " [",
                       i, "]");
      });
  };
  for (int64_t base : {int64_t{7}, int64_t{1 << 20}})
    for (bool host_send : {false, true}) {
      once((me + 1) % n, (me - 1 + n) % n, base, host_send);
      once((me - 1 + n) % n, (me + 1) % n, base, host_send);
      once(me, me, base, host_send);
    }
  return t.wrong();
}

// sendrecv_start on GPU buffers: a ring pass with two exchanges of different sizes in flight
// (ring attention's K/V block and dk/dv sums); after n steps each block is back home.
inline int64_t check_sendrecv_start(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank(), next = (me + 1) % n, prev = (me - 1 + n) % n;
  Tally t(comm);
  const int64_t big = (int64_t{1} << 20) + 3, small = 4099;
  std::vector<uint8_t> a0(big), b0(small), zero_big(big, 0), zero_small(small, 0);
  for (int64_t i = 0; i < big; ++i) a0[i] = pattern(me, kNoDst, i);
  for (int64_t i = 0; i < small; ++i) b0[i] = pattern(me, me, i);
  Buffer a[2] = {upload(gpu, a0, "a0"), upload(gpu, zero_big, "a1")};
  Buffer b[2] = {upload(gpu, b0, "b0"), upload(gpu, zero_small, "b1")};
  int cur = 0;
  std::unique_ptr<PendingExchange> pending_b;
  for (int s = 1; s <= n; ++s) {
    auto pending_a = comm.sendrecv_start(a[cur].data(), big, next, a[1 - cur].data(), big, prev);
    if (pending_b) pending_b->wait();
    pending_b = comm.sendrecv_start(b[cur].data(), small, next, b[1 - cur].data(), small, prev);
    pending_a->wait();
    cur = 1 - cur;
    const int origin = ((me - s) % n + n) % n;
    std::vector<uint8_t> got = download<uint8_t>(gpu, a[cur], big);
    for (int64_t i = 0; i < big; ++i)
      t.expect(got[i], pattern(origin, kNoDst, i),
               [&] { return str_cat("sendrecv_start step ", s, " block of rank ", origin, " [", i, "]"); });
  }
  pending_b->wait();
  std::vector<uint8_t> got = download<uint8_t>(gpu, b[cur], small);
  for (int64_t i = 0; i < small; ++i)
    t.expect(got[i], pattern(me, me, i), [&] { return str_cat("sendrecv_start small block [", i, "]"); });
  return t.wrong();
}

// all_to_all_start on GPU buffers: two in flight (the second queued behind the first on the
// communication stream), a blocking all_reduce between them, waited for in reverse order.
inline int64_t check_all_to_all_start(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  const int64_t big = (int64_t{1} << 20) + 5, small = 3;
  auto sent = [&](int64_t bb, int salt) {
    std::vector<uint8_t> v(n * bb);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i) v[p * bb + i] = pattern(me, p, i + salt);
    return v;
  };
  std::vector<uint8_t> zero_big(n * big, 0), zero_small(n * small, 0);
  Buffer s1 = upload(gpu, sent(big, 0), "s1"), r1 = upload(gpu, zero_big, "r1");
  Buffer s2 = upload(gpu, sent(small, 7), "s2"), r2 = upload(gpu, zero_small, "r2");
  auto a = comm.all_to_all_start(s1.data(), r1.data(), big);
  std::vector<int64_t> one = {me};
  Buffer sum = upload(gpu, one, "sum");
  comm.all_reduce(sum.data(), sum.data(), 1, DType::kI64, ReduceOp::kSum);
  auto b = comm.all_to_all_start(s2.data(), r2.data(), small);
  b->wait();
  a->wait();
  t.expect(download<int64_t>(gpu, sum, 1)[0], static_cast<int64_t>(n) * (n - 1) / 2,
           [] { return std::string("all_reduce between all_to_all_start"); });
  for (auto [buf, bb, salt] : {std::tuple{&r1, big, 0}, std::tuple{&r2, small, 7}}) {
    std::vector<uint8_t> got = download<uint8_t>(gpu, *buf, n * bb);
    for (int p = 0; p < n; ++p)
      for (int64_t i = 0; i < bb; ++i)
        t.expect(got[p * bb + i], pattern(p, me, i + salt),
                 [&] { return str_cat("all_to_all_start block_bytes=", bb, " from rank ", p, " [", i, "]"); });
  }
  return t.wrong();
}

// The collective reads what the device's compute stream wrote just before: the compute stream
// is kept busy (fill, then copy, many times over) so a collective that did not wait for it
// would read zeros.
inline int64_t check_waits_for_compute_stream(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  const int64_t row = int64_t{1} << 20, rows = 32, bytes = row * rows;
  std::vector<uint8_t> src(bytes), init(n * bytes);
  for (int64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(pattern(me, kNoDst, i) | 1);  // never 0
  Buffer ds = upload(gpu, src, "src"), dm = upload(gpu, std::vector<uint8_t>(bytes), "mid");
  Buffer dout = upload(gpu, init, "out");
  for (int k = 0; k < 20; ++k) {  // asynchronous on the compute stream
    gpu.fill_zero(dm.data(), bytes);
    gpu.copy_2d(dm.data(), row, ds.data(), row, row, rows);
  }
  comm.all_gather(dm.data(), dout.data(), bytes);
  std::vector<uint8_t> got = download<uint8_t>(gpu, dout, n * bytes);
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < bytes; ++i)
      t.expect(got[p * bytes + i], static_cast<uint8_t>(pattern(p, kNoDst, i) | 1),
               [&] { return str_cat("all_gather after compute-stream copies, from rank ", p, " [", i, "]"); });
  return t.wrong();
}

// Even/odd split with reversed keys, then collectives on GPU buffers of the subgroup; a nested
// split; a barrier on each.
inline int64_t check_split(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  std::vector<int> members;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == me % 2) members.push_back(q);
  std::unique_ptr<Communicator> sub = comm.split(me % 2, -me);
  const int m = static_cast<int>(members.size());
  const int want_rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  t.expect(sub->size(), m, [] { return std::string("split size"); });
  t.expect(sub->rank(), want_rank, [] { return std::string("split rank"); });
  t.expect(sub->backend() == comm.backend(), true, [] { return std::string("split backend"); });
  if (sub->size() != m || sub->rank() != want_rank) return t.wrong();  // collectives would hang
  Buffer mine = upload(gpu, std::vector<int32_t>{me}, "mine");
  Buffer all = upload(gpu, std::vector<int32_t>(m, -1), "all");
  sub->all_gather(mine.data(), all.data(), sizeof(int32_t));
  std::vector<int32_t> got = download<int32_t>(gpu, all, m);
  for (int p = 0; p < m; ++p)
    t.expect(got[p], members[p], [&] { return str_cat("all_gather on the subgroup [", p, "]"); });
  Buffer sum = upload(gpu, std::vector<int64_t>{me}, "sum");
  sub->all_reduce(sum.data(), sum.data(), 1, DType::kI64, ReduceOp::kSum);
  t.expect(download<int64_t>(gpu, sum, 1)[0], static_cast<int64_t>(std::accumulate(members.begin(), members.end(), 0)),
           [] { return std::string("all_reduce of parent ranks on the subgroup"); });
  t.expect(check_broadcast(*sub, gpu), int64_t{0}, [] { return std::string("broadcast on the subgroup"); });
  std::unique_ptr<Communicator> nested = sub->split(0, 0);
  t.expect(nested->size(), m, [] { return std::string("nested split size"); });
  t.expect(nested->rank(), want_rank, [] { return std::string("nested split rank"); });
  nested->barrier();
  sub->barrier();
  comm.barrier();
  return t.wrong();
}

// Local errors, reported before communicating; the communicator works afterwards.
inline int64_t check_errors(Communicator& comm, Device& gpu) {
  const int n = comm.size(), me = comm.rank();
  Tally t(comm);
  Buffer a = gpu.allocator().allocate(64, Tag::kOther, "a"), b = gpu.allocator().allocate(64, Tag::kOther, "b");
  t.expect_ok(throws_error([&] { comm.all_reduce(a.data(), b.data(), 2, DType::kBF16, ReduceOp::kSum); },
                           ErrorKind::kUnsupported, {"does not support reduce on bf16", "all_reduce"}),
              "all_reduce bf16");
  t.expect_ok(throws_error([&] { comm.reduce_scatter(a.data(), b.data(), 2, DType::kBF16, ReduceOp::kMax); },
                           ErrorKind::kUnsupported, {"does not support reduce on bf16", "reduce_scatter"}),
              "reduce_scatter bf16");
  t.expect_ok(throws_error([&] { comm.broadcast(a.data(), 4, n); }, ErrorKind::kInvalidArgument, {"root"}),
              "broadcast root == size");
  t.expect_ok(throws_error([&] { comm.sendrecv(a.data(), 4, me, b.data(), 8, me); }, ErrorKind::kInvalidArgument,
                           {"sent 4 bytes, this rank expected 8"}),
              "sendrecv to self of fewer bytes");
  if (n > 1)
    t.expect_ok(throws_error([&] { comm.sendrecv(a.data(), 4, me, b.data(), 4, (me + 1) % n); },
                             ErrorKind::kInvalidArgument, {"send to self must pair"}),
                "sendrecv to self, receive from another rank");
  t.expect_ok(throws_error([&] { comm.split(-1, 0); }, ErrorKind::kInvalidArgument, {"color"}), "split color -1");
  try {
    comm.bind_device(gpu);  // the device it was made for
  } catch (const Error& e) {
    t.expect_ok(::testing::AssertionFailure() << e.what(), "bind_device(the communicator's device)");
  }
  std::unique_ptr<Device> cpu = make_cpu_device({.threads = 1});
  t.expect_ok(throws_error([&] { comm.bind_device(*cpu); }, ErrorKind::kInvalidArgument, {"made for"}),
              "bind_device(another device)");
  comm.barrier();
  return t.wrong();
}

struct DeviceCommCheck {
  const char* name;
  int64_t (*run)(Communicator& comm, Device& gpu);
};

inline const std::vector<DeviceCommCheck>& device_comm_checks() {
  static const std::vector<DeviceCommCheck> checks = {
      {"all_to_all", check_all_to_all},
      {"all_gather", check_all_gather},
      {"reductions", check_reductions},
      {"broadcast", check_broadcast},
      {"sendrecv", check_sendrecv},
      {"sendrecv_start", check_sendrecv_start},
      {"all_to_all_start", check_all_to_all_start},
      {"waits_for_compute_stream", check_waits_for_compute_stream},
      {"split", check_split},
      {"errors", check_errors},
  };
  return checks;
}

}  // namespace untied::testing::devcomm
