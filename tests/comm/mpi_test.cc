// The MPI communicator, run by ctest as `mpirun -np N` for N = 1..4: every shared check
// (comm_checks.h) on MPI_COMM_WORLD, then what only this backend promises (64-bit size
// handling, errors that name the MPI call and the rank).
//
// The exit code is the truth on every rank: all ranks agree through all_ranks_ok, so a
// failure on any rank makes every process exit non-zero. Rank 0 prints gtest's usual output;
// other ranks print only their failures, prefixed with their rank.
#include "untied/comm/mpi.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_checks.h"
#include "comm/mpi/mpi_check.h"
#include "core/expect_error.h"

namespace untied::testing {
namespace {

Communicator* g_world = nullptr;  // set by main before the tests run

class MpiChecks : public ::testing::TestWithParam<CommCheck> {};

TEST_P(MpiChecks, EveryElementExact) {
  const CommCheck& check = GetParam();
  EXPECT_EQ(check.run(*g_world), 0)
      << check.name << ": wrong elements on rank " << g_world->rank() << " of " << g_world->size();
}

INSTANTIATE_TEST_SUITE_P(AllChecks, MpiChecks, ::testing::ValuesIn(comm_checks()),
                         [](const ::testing::TestParamInfo<CommCheck>& info) {
                           return std::string(info.param.name);
                         });

TEST(Mpi, Backend) {
  EXPECT_EQ(g_world->backend(), "mpi");
  EXPECT_TRUE(MpiSession::launched_by_mpirun());
}

TEST(Mpi, ByteLayoutKeepsCountsUnderIntMax) {
  const int64_t kIntMax = INT_MAX;
  MpiByteLayout small = mpi_byte_layout(12345);
  EXPECT_EQ(small.unit_bytes, 1);
  EXPECT_EQ(small.count, 12345);
  MpiByteLayout edge = mpi_byte_layout(kIntMax);
  EXPECT_EQ(edge.unit_bytes, 1);
  EXPECT_EQ(edge.count, kIntMax);
  MpiByteLayout two_gib = mpi_byte_layout(kIntMax + 1);  // 2^31
  EXPECT_EQ(two_gib.unit_bytes, 2);
  EXPECT_EQ(two_gib.count, int64_t{1} << 30);
  MpiByteLayout six_gib = mpi_byte_layout(int64_t{3} << 31);  // unit 2 would leave 3 * 2^30
  EXPECT_EQ(six_gib.unit_bytes, 4);
  EXPECT_EQ(six_gib.count, int64_t{3} << 29);
  EXPECT_TRUE(throws_error([&] { mpi_byte_layout(kIntMax + 2); }, ErrorKind::kUnsupported,
                           {"2147483649 bytes", "multiple of 2"}));
  EXPECT_TRUE(throws_error([] { mpi_byte_layout(-1); }, ErrorKind::kInvalidArgument, {"negative"}));
}

TEST(Mpi, ErrorsNameTheCallAndTheRank) {
  const int me = g_world->rank(), n = g_world->size();
  EXPECT_TRUE(
      throws_error([] { mpi_fail(1, "MPI_Fake(x, y)", __FILE__, __LINE__); }, ErrorKind::kInternal,
                   {"rank " + std::to_string(me) + ":", "mpi_test.cc:", "MPI_Fake(x, y) -> "}));
  if (n == 1) GTEST_SKIP() << "Open MPI does not report truncation of a message to self";
  // Every rank sends 16 bytes around the ring and receives into 8: MPI reports truncation.
  std::vector<char> a(16, 'x'), b(8);
  EXPECT_TRUE(throws_error(
      [&] { g_world->sendrecv(a.data(), 16, (me + 1) % n, b.data(), 8, (me - 1 + n) % n); },
      ErrorKind::kInternal,
      {"rank " + std::to_string(me) + ":", "mpi_communicator.cc:", "MPI_Sendrecv(",
       "-> MPI_ERR_TRUNCATE"}));
  g_world->barrier();  // still usable
}

TEST(Mpi, HugeReduceScatterBlocksFailClearly) {
  EXPECT_TRUE(throws_error(
      [] {
        g_world->reduce_scatter(nullptr, nullptr, int64_t{INT_MAX} + 1, DType::kF32,
                                ReduceOp::kSum);
      },
      ErrorKind::kUnsupported, {"INT_MAX", "reduce_scatter"}));
}

// Prints only failed assertions, prefixed with the rank (for ranks other than 0).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace untied::testing

int main(int argc, char** argv) {
  untied::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<untied::Communicator> world = session.world();
  untied::testing::g_world = world.get();
  if (world->rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new untied::testing::FailurePrinter(world->rank()));
  }
  const int rc = RUN_ALL_TESTS();
  const bool ok = untied::all_ranks_ok(*world, rc == 0);
  if (!ok && rc == 0)
    std::fprintf(stderr, "rank %d: passed, but another rank failed\n", world->rank());
  world.reset();  // before the session finalises MPI
  return ok ? 0 : 1;
}
