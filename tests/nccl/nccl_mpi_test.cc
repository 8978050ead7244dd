// The NCCL communicator under mpirun (ctest runs -np 1 and -np 2), bootstrapped over
// MPI_COMM_WORLD.
//
// Where every rank of the host has its own GPU, NCCL is made and must pass every shared exact
// check on host buffers (tests/comm/comm_checks.h: staged through the GPU) and every check on GPU
// buffers (device_comm_checks.h). Otherwise (no NCCL in the build, no GPU, or more ranks than
// GPUs) every rank must get the same refusal Status, and nothing may hang. Either way a rank that
// passes a CPU device is refused on every rank alike, and the MPI communicator refuses GPU
// devices in bind_device.
//
// The exit code is the truth on every rank: all ranks agree through all_ranks_ok. Rank 0 prints
// gtest's usual output; other ranks print only their failures, prefixed with their rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "comm/comm_checks.h"
#include "core/expect_error.h"
#include "nccl/device_comm_checks.h"
#include "untied/comm/mpi.h"
#include "untied/comm/nccl.h"
#include "untied/device/cuda.h"

namespace untied::testing {
namespace {

// Set by main before the tests run.
Communicator* g_world = nullptr;
int g_gpus = 0;         // GPUs this rank sees
int g_local_ranks = 1;  // ranks on this rank's host
std::unique_ptr<Device> g_cpu;
std::unique_ptr<Device> g_gpu;           // null without a GPU
std::unique_ptr<Communicator> g_nccl;    // null where it was refused
Status g_made = Status::ok_status();     // what make_nccl_communicator returned

// Ranks sharing this rank's host name, and this rank's index among them.
void host_ranks(Communicator& world, int* local_rank, int* local_count) {
  char mine[256] = {};
  gethostname(mine, sizeof mine - 1);
  std::vector<char> all(256 * static_cast<size_t>(world.size()));
  world.all_gather(mine, all.data(), 256);
  *local_rank = 0;
  *local_count = 0;
  for (int q = 0; q < world.size(); ++q) {
    if (std::strncmp(&all[256 * static_cast<size_t>(q)], mine, 256) != 0) continue;
    ++*local_count;
    if (q < world.rank()) ++*local_rank;
  }
}

// True on every rank when `s` is the same string on every rank (collective).
bool same_on_every_rank(Communicator& world, const std::string& s) {
  int64_t len = static_cast<int64_t>(s.size());
  world.broadcast(&len, sizeof len, 0);
  std::string root(static_cast<size_t>(len), '\0');
  if (world.rank() == 0) root = s;
  world.broadcast(root.data(), len, 0);
  return all_ranks_ok(world, root == s);
}

// The refusal expected when every rank passes its own device: what the build and the host lack.
std::string expected_refusal() {
  if (!nccl_built()) return "this build has no NCCL";
  if (g_gpus == 0) return "needs this rank's CUDA device";
  return "share";
}

TEST(NcclMpi, MadeWhereEveryRankHasItsOwnGpuElseRefusedAlike) {
  const bool expect_made = nccl_built() && g_gpus > 0 && g_local_ranks <= g_gpus;
  EXPECT_EQ(g_made.ok(), expect_made) << "make_nccl_communicator with " << g_local_ranks << " ranks on this host and "
                                      << g_gpus << " GPUs: " << g_made.message();
  EXPECT_EQ(g_nccl != nullptr, g_made.ok());
  EXPECT_TRUE(same_on_every_rank(*g_world, g_made.message())) << "rank " << g_world->rank() << ": " << g_made.message();
  if (g_made.ok()) {
    EXPECT_EQ(g_nccl->backend(), "nccl");
    EXPECT_EQ(g_nccl->rank(), g_world->rank());
    EXPECT_EQ(g_nccl->size(), g_world->size());
  } else {
    EXPECT_NE(g_made.message().find(expected_refusal()), std::string::npos) << g_made.message();
  }
}

// The last rank passes a CPU device, the others their GPU (or a CPU device where there is none):
// every rank is refused with the same Status, naming the lowest failing rank.
TEST(NcclMpi, ACpuDeviceIsRefusedOnEveryRank) {
  const int n = g_world->size(), me = g_world->rank();
  Device& dev = (g_gpu != nullptr && me != n - 1) ? *g_gpu : *g_cpu;
  auto made = make_nccl_communicator(*g_world, dev);
  ASSERT_FALSE(made.ok());
  const std::string m = made.status().message();
  EXPECT_TRUE(same_on_every_rank(*g_world, m)) << "rank " << me << ": " << m;
  if (!nccl_built()) {
    EXPECT_NE(m.find("this build has no NCCL"), std::string::npos) << m;
    return;
  }
  // Ranks 0..n-2 use GPUs: they fail first when more of them share the host's GPUs than exist.
  const bool gpu_ranks_share = g_gpus > 0 && g_local_ranks - 1 > g_gpus;
  const int first = (g_gpus == 0 || gpu_ranks_share) ? 0 : n - 1;
  EXPECT_NE(m.find(gpu_ranks_share ? "share" : "needs this rank's CUDA device"), std::string::npos) << m;
  if (n > 1) {
    EXPECT_EQ(m.rfind("rank " + std::to_string(first) + ": ", 0), 0u) << m;
  }
}

TEST(NcclMpi, MpiCommunicatorMovesHostMemoryOnly) {
  EXPECT_NO_THROW(g_world->bind_device(*g_cpu));
  if (g_gpu == nullptr) return;
  EXPECT_TRUE(throws_error([] { g_world->bind_device(*g_gpu); }, ErrorKind::kUnsupported,
                           {"moves host memory only", "NCCL"}));
}

std::string skip_reason() { return "no NCCL communicator here: " + g_made.message(); }

// The shared exact checks, on host buffers.
class NcclHostChecks : public ::testing::TestWithParam<CommCheck> {};

TEST_P(NcclHostChecks, EveryElementExact) {
  if (g_nccl == nullptr) GTEST_SKIP() << skip_reason();
  const CommCheck& check = GetParam();
  EXPECT_EQ(check.run(*g_nccl), 0) << check.name << ": wrong elements on rank " << g_nccl->rank() << " of "
                                   << g_nccl->size();
}

INSTANTIATE_TEST_SUITE_P(AllChecks, NcclHostChecks, ::testing::ValuesIn(comm_checks()),
                         [](const ::testing::TestParamInfo<CommCheck>& info) {
                           return std::string(info.param.name);
                         });

// The same collectives on GPU buffers.
class NcclDeviceChecks : public ::testing::TestWithParam<devcomm::DeviceCommCheck> {};

TEST_P(NcclDeviceChecks, EveryElementExact) {
  if (g_nccl == nullptr) GTEST_SKIP() << skip_reason();
  const devcomm::DeviceCommCheck& check = GetParam();
  EXPECT_EQ(check.run(*g_nccl, *g_gpu), 0) << check.name << ": wrong elements on rank " << g_nccl->rank()
                                           << " of " << g_nccl->size();
}

INSTANTIATE_TEST_SUITE_P(AllChecks, NcclDeviceChecks, ::testing::ValuesIn(devcomm::device_comm_checks()),
                         [](const ::testing::TestParamInfo<devcomm::DeviceCommCheck>& info) {
                           return std::string(info.param.name);
                         });

// Prints only failed assertions, prefixed with the rank (for ranks other than 0).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Devices for this rank (its host-local GPU where there is one), then the NCCL communicator
// (collective; refused alike on every rank where it cannot work).
void set_up(Communicator& world) {
  g_world = &world;
  int local_rank = 0;
  host_ranks(world, &local_rank, &g_local_ranks);
  g_gpus = cuda_device_count();
  g_cpu = make_cpu_device({.threads = 1});
  if (g_gpus > 0) g_gpu = std::move(make_cuda_device({.index = local_rank % g_gpus})).value();
  auto made = make_nccl_communicator(world, g_gpu != nullptr ? *g_gpu : *g_cpu);
  if (made.ok())
    g_nccl = std::move(made).value();
  else
    g_made = made.status();
}

}  // namespace
}  // namespace untied::testing

int main(int argc, char** argv) {
  untied::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<untied::Communicator> world = session.world();
  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new untied::testing::FailurePrinter(world->rank()));
  }
  untied::testing::set_up(*world);
  const int rc = RUN_ALL_TESTS();
  const bool ok = untied::all_ranks_ok(*world, rc == 0);
  if (!ok && rc == 0) std::fprintf(stderr, "rank %d: passed, but another rank failed\n", world->rank());
  // The NCCL communicator before its device, both before the session finalises MPI.
  untied::testing::g_nccl.reset();
  untied::testing::g_gpu.reset();
  untied::testing::g_cpu.reset();
  world.reset();
  return ok ? 0 : 1;
}
