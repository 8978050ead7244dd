// The in-process communicator: every shared check (comm_checks.h) at 1, 2, 3 and 4 ranks, then
// what only this backend promises: a failing rank stops the world without hanging, the first
// real error comes back from run_in_process, mismatched calls are caught, reductions are
// bitwise deterministic.
#include "untied/comm/inproc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "comm/comm_checks.h"
#include "core/expect_error.h"
#include "untied/device/device.h"

namespace untied::testing {
namespace {

class InprocChecks : public ::testing::TestWithParam<std::tuple<CommCheck, int>> {};

TEST_P(InprocChecks, EveryElementExact) {
  const auto& [check, ranks] = GetParam();
  std::vector<int64_t> wrong(ranks, -1);
  run_in_process(ranks, [&, &check = check](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "inproc");
    EXPECT_EQ(comm.size(), ranks);
    wrong[comm.rank()] = check.run(comm);
  });
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(wrong[r], 0) << check.name << ": wrong elements on rank " << r << " of " << ranks;
}

INSTANTIATE_TEST_SUITE_P(AllChecks, InprocChecks,
                         ::testing::Combine(::testing::ValuesIn(comm_checks()),
                                            ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<CommCheck, int>>& info) {
                           return std::string(std::get<0>(info.param).name) + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Runs `body` on `ranks` ranks; each rank's untied::Error kind (kNoError if none) lands in `kinds`.
constexpr int kNoError = -1;
void run_recording(int ranks, std::vector<int>& kinds,
                   const std::function<void(Communicator&)>& body) {
  kinds.assign(ranks, kNoError);
  run_in_process(ranks, [&](Communicator& comm) {
    try {
      body(comm);
    } catch (const Error& e) {
      kinds[comm.rank()] = static_cast<int>(e.kind());
      throw;
    }
  });
}

TEST(Inproc, ThrowingRankIsRethrownAndOthersAbortInBarrier) {
  for (int ranks : {2, 3, 4}) {
    const int failing = ranks - 1;
    std::vector<int> kinds;
    EXPECT_TRUE(throws_error(
        [&] {
          run_recording(ranks, kinds, [&](Communicator& comm) {
            if (comm.rank() == failing) UNTIED_CHECK(false, "boom");
            comm.barrier();
          });
        },
        ErrorKind::kInvalidArgument, {"rank " + std::to_string(failing) + ":", "boom"}));
    for (int r = 0; r < ranks; ++r) {
      if (r == failing) continue;
      EXPECT_EQ(kinds[r], static_cast<int>(ErrorKind::kAborted)) << "rank " << r;
    }
  }
}

TEST(Inproc, ThrowingRankWakesRanksWaitingInSendrecv) {
  std::vector<int> kinds;
  EXPECT_TRUE(throws_error(
      [&] {
        run_recording(4, kinds, [&](Communicator& comm) {
          const int me = comm.rank(), n = comm.size();
          if (me == 1) fail(ErrorKind::kIo, "disk on fire");
          int x = me, y = -1;
          comm.sendrecv(&x, sizeof x, (me + 1) % n, &y, sizeof y, (me - 1 + n) % n);
          comm.barrier();
        });
      },
      ErrorKind::kIo, {"disk on fire"}));
  for (int r : {0, 2, 3})
    EXPECT_EQ(kinds[r], static_cast<int>(ErrorKind::kAborted)) << "rank " << r;
}

TEST(Inproc, ThrowingRankWakesRanksWaitingInASubgroup) {
  std::vector<int> kinds;
  EXPECT_TRUE(throws_error(
      [&] {
        run_recording(4, kinds, [&](Communicator& comm) {
          std::unique_ptr<Communicator> sub = comm.split(comm.rank() % 2, comm.rank());
          if (comm.rank() == 0) UNTIED_CHECK(false, "rank 0 gives up");
          sub->barrier();  // rank 2 waits here for rank 0
          comm.barrier();
        });
      },
      ErrorKind::kInvalidArgument, {"rank 0 gives up"}));
  for (int r : {1, 2, 3})
    EXPECT_EQ(kinds[r], static_cast<int>(ErrorKind::kAborted)) << "rank " << r;
}

TEST(Inproc, NonUntiedExceptionIsRethrownAsIs) {
  try {
    run_in_process(3, [](Communicator& comm) {
      if (comm.rank() == 0) throw std::runtime_error("plain failure");
      std::vector<float> x(8, 1.0f);
      comm.all_reduce(x.data(), x.data(), 8, DType::kF32, ReduceOp::kSum);
    });
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    ADD_FAILURE() << "got untied::Error instead of the original: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "plain failure");
  }
}

TEST(Inproc, AbortStopsTheWorld) {
  std::vector<int> kinds;
  EXPECT_TRUE(throws_error(
      [&] {
        run_recording(3, kinds, [&](Communicator& comm) {
          if (comm.rank() == 1) {
            comm.abort(7);
            return;
          }
          comm.barrier();
        });
      },
      ErrorKind::kAborted, {"abort(7)", "rank 1:"}));
  EXPECT_EQ(kinds[0], static_cast<int>(ErrorKind::kAborted));
  EXPECT_EQ(kinds[1], kNoError);
  EXPECT_EQ(kinds[2], static_cast<int>(ErrorKind::kAborted));
}

TEST(Inproc, NeedsAtLeastOneRank) {
  EXPECT_TRUE(throws_error([] { run_in_process(0, [](Communicator&) {}); },
                           ErrorKind::kInvalidArgument, {"at least 1 rank", "got 0"}));
}

TEST(Inproc, MismatchedSizesAreCaught) {
  EXPECT_TRUE(throws_error(
      [] {
        run_in_process(2, [](Communicator& comm) {
          std::vector<char> send(16), recv(32);
          comm.all_gather(send.data(), recv.data(), comm.rank() == 0 ? 8 : 16);
        });
      },
      ErrorKind::kInvalidArgument, {"all_gather", "same sizes"}));
}

TEST(Inproc, MismatchedCollectivesAreCaught) {
  EXPECT_TRUE(throws_error(
      [] {
        run_in_process(2, [](Communicator& comm) {
          int x = 0;
          if (comm.rank() == 0)
            comm.barrier();
          else
            comm.broadcast(&x, sizeof x, 0);
        });
      },
      ErrorKind::kInvalidArgument, {"same collectives"}));
}

TEST(Inproc, SendrecvSizeMismatchIsCaught) {
  EXPECT_TRUE(throws_error(
      [] {
        run_in_process(1, [](Communicator& comm) {
          char a[16] = {}, b[8];
          comm.sendrecv(a, 16, 0, b, 8, 0);
        });
      },
      ErrorKind::kInvalidArgument, {"sent 16 bytes", "expected 8"}));
}

// The sum runs in rank order: ((x0 + x1) + x2) + x3, identical on every rank. These values
// give a different float for other orders (1e8 + 1 rounds back to 1e8).
TEST(Inproc, ReductionOrderIsRankOrder) {
  const float xs[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  const float want = ((xs[0] + xs[1]) + xs[2]) + xs[3];
  std::vector<float> got(4, -1.0f);
  run_in_process(4, [&](Communicator& comm) {
    float x = xs[comm.rank()];
    comm.all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    got[comm.rank()] = x;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r], want) << "rank " << r;
}


// ---- ranks with a bound (non-CPU) device -------------------------------------------------------
//
// bind_device with a GPU device makes the in-process communicator move every byte through that
// device's copy() and wait for its work (synchronize()) before publishing a buffer; reductions
// go through host copies. A device that claims to be a GPU but keeps host memory runs that
// path here: every shared check must stay exact, every byte must go through the device, and
// every rank must wait for its device before others read its buffers.
class HostBackedGpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "host-backed test gpu"; }
  Allocator& allocator() override { return alloc_; }
  void copy(void* dst, const void* src, int64_t bytes) override {
    ++copies;
    if (bytes > 0) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r)
      copy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
  }
  void fill_zero(void* dst, int64_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, static_cast<size_t>(bytes));
  }
  void synchronize() override { ++syncs; }
  int threads() const override { return 1; }
  int64_t copies = 0, syncs = 0;

 private:
  Allocator alloc_;
};

class InprocDeviceChecks : public ::testing::TestWithParam<std::tuple<CommCheck, int>> {};

TEST_P(InprocDeviceChecks, EveryElementExactThroughTheDevice) {
  const auto& [check, ranks] = GetParam();
  std::vector<int64_t> wrong(ranks, -1), copies(ranks, 0), syncs(ranks, 0);
  run_in_process(ranks, [&, &check = check](Communicator& comm) {
    HostBackedGpuDevice dev;
    comm.bind_device(dev);
    wrong[comm.rank()] = check.run(comm);
    copies[comm.rank()] = dev.copies;
    syncs[comm.rank()] = dev.syncs;
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(wrong[r], 0) << check.name << ": wrong elements on rank " << r << " of " << ranks;
    EXPECT_GT(syncs[r], 0) << check.name << ": rank " << r << " never waited for its device";
    if (std::string(check.name) != "argument_errors") {
      EXPECT_GT(copies[r], 0) << check.name << ": rank " << r << " moved no bytes through its device";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllChecks, InprocDeviceChecks,
                         ::testing::Combine(::testing::ValuesIn(comm_checks()), ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<CommCheck, int>>& info) {
                           return std::string(std::get<0>(info.param).name) + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

// A CPU device leaves the host path as it is: no device copies.
TEST(Inproc, BindingACpuDeviceKeepsHostCopies) {
  run_in_process(2, [](Communicator& comm) {
    auto cpu = make_cpu_device({});
    comm.bind_device(*cpu);
    int64_t send[2] = {comm.rank() * 10, comm.rank() * 10 + 1}, recv[2] = {-1, -1};
    comm.all_to_all(send, recv, sizeof(int64_t));
    EXPECT_EQ(recv[0], comm.rank());
    EXPECT_EQ(recv[1], 10 + comm.rank());
  });
}

}  // namespace
}  // namespace untied::testing
