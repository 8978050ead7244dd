// The NCCL communicator in one process: its refusals (a build without NCCL, a CPU device, two
// ranks on one GPU) come back as the same Status on every rank, never a crash or a hang; with a
// GPU, a one-rank NCCL communicator passes every device-buffer check (tests/nccl/
// device_comm_checks.h) and its abort() stops the world. The multi-rank checks run under mpirun
// (tests/nccl/nccl_mpi_test.cc).
#include "untied/comm/nccl.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/expect_error.h"
#include "common/gpu.h"
#include "nccl/device_comm_checks.h"
#include "untied/comm/inproc.h"
#include "untied/device/cuda.h"

namespace untied::testing {
namespace {

// What make_nccl_communicator returned on each in-process rank.
struct Outcome {
  bool ok = false;
  std::string message;
};

std::vector<Outcome> make_on_each_rank(int ranks, const std::function<std::unique_ptr<Device>(int rank)>& device) {
  std::vector<Outcome> out(ranks);
  run_in_process(ranks, [&](Communicator& world) {
    std::unique_ptr<Device> dev = device(world.rank());
    auto made = make_nccl_communicator(world, *dev);
    Outcome& o = out[world.rank()];
    o.ok = made.ok();
    if (!made.ok()) o.message = made.status().message();
  });
  return out;
}

// Every rank refused, with one message containing `part`.
void expect_same_refusal(const std::vector<Outcome>& out, const std::string& part) {
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_FALSE(out[r].ok) << "rank " << r;
    EXPECT_EQ(out[r].message, out[0].message) << "rank " << r << " got another Status than rank 0";
    EXPECT_NE(out[r].message.find(part), std::string::npos) << "rank " << r << ": " << out[r].message;
  }
}

TEST(Nccl, BuiltOnlyWithTheCudaBackend) {
  if (nccl_built()) {
    EXPECT_TRUE(cuda_built());
  }
}

TEST(Nccl, WithoutNcclTheRefusalSaysWhatToDo) {
  if (nccl_built()) GTEST_SKIP() << "this build has NCCL";
  std::vector<Outcome> out =
      make_on_each_rank(2, [](int) { return make_cpu_device({.threads = 1}); });
  expect_same_refusal(out, "this build has no NCCL");
  EXPECT_NE(out[0].message.find("NCCL_HOME"), std::string::npos) << out[0].message;
}

// Works without a GPU: the refusal is agreed over the bootstrap and names the lowest failing
// rank when there are several.
TEST(Nccl, CpuDevicesAreRefusedAlikeOnEveryRank) {
  for (int ranks : {1, 2, 3}) {
    std::vector<Outcome> out =
        make_on_each_rank(ranks, [](int) { return make_cpu_device({.threads = 1}); });
    if (!nccl_built()) {
      expect_same_refusal(out, "this build has no NCCL");
      continue;
    }
    expect_same_refusal(out, "needs this rank's CUDA device");
    EXPECT_NE(out[0].message.find("cpu"), std::string::npos) << out[0].message;  // names the device
    if (ranks > 1) {
      EXPECT_EQ(out[0].message.rfind("rank 0: ", 0), 0u) << out[0].message;
    }
  }
}

TEST(Nccl, TwoRanksOnOneGpuAreRefusedAlike) {
  REQUIRE_GPU();
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  // Both in-process ranks make a device on GPU 0 (on their own thread, as a rank does).
  std::vector<Outcome> out = make_on_each_rank(2, [](int) { return std::move(make_cuda_device({.index = 0})).value(); });
  expect_same_refusal(out, "share");
  EXPECT_NE(out[0].message.find("NCCL needs one GPU per rank"), std::string::npos) << out[0].message;
}

// A one-rank NCCL communicator over a one-rank in-process bootstrap: every collective on GPU
// buffers (and staged host buffers) is exact; splits work; argument errors are local.
TEST(Nccl, EveryCollectiveOnOneGpu) {
  REQUIRE_GPU();
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  run_in_process(1, [](Communicator& world) {
    std::unique_ptr<Device> gpu = std::move(make_cuda_device({})).value();
    auto made = make_nccl_communicator(world, *gpu);
    ASSERT_TRUE(made.ok()) << made.status().message();
    std::unique_ptr<Communicator> comm = std::move(made).value();
    EXPECT_EQ(comm->backend(), "nccl");
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    for (const devcomm::DeviceCommCheck& check : devcomm::device_comm_checks())
      EXPECT_EQ(check.run(*comm, *gpu), 0) << check.name << ": wrong elements";
    // Zero-sized calls return at once.
    comm->all_to_all(nullptr, nullptr, 0);
    comm->all_reduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum);
    comm->barrier();
    EXPECT_EQ(gpu->allocator().stats().live[static_cast<int>(Tag::kCommunication)], 0)
        << "staging buffers are freed when each call returns";
  });
}

TEST(Nccl, AbortStopsTheWorld) {
  REQUIRE_GPU();
  if (!nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  EXPECT_TRUE(throws_error(
      [] {
        run_in_process(1, [](Communicator& world) {
          std::unique_ptr<Device> gpu = std::move(make_cuda_device({})).value();
          std::unique_ptr<Communicator> comm = std::move(make_nccl_communicator(world, *gpu)).value();
          comm->abort(3);  // aborts NCCL, then the in-process world
          EXPECT_TRUE(throws_error([&] { comm->barrier(); }, ErrorKind::kAborted, {"aborted"}));
        });
      },
      ErrorKind::kAborted, {"abort(3)"}));
}

}  // namespace
}  // namespace untied::testing
