// UNTIED_CHECK / UNTIED_ASSERT / fail and the per-thread rank in their messages.
#include "untied/core/check.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "core/expect_error.h"

namespace untied {
namespace {

using testing::throws_error;

// Sets this thread's rank for a scope and always restores "no rank", even when a check fails.
class ScopedRank {
 public:
  explicit ScopedRank(int rank) { set_thread_rank(rank); }
  ~ScopedRank() { set_thread_rank(-1); }
};

TEST(Check, PassingCheckEvaluatesConditionOnceAndMessageNever) {
  int cond_evals = 0, msg_evals = 0;
  auto cond = [&] { ++cond_evals; return true; };
  auto msg = [&] { ++msg_evals; return "never built"; };
  UNTIED_CHECK(cond(), msg());
  EXPECT_EQ(cond_evals, 1);
  EXPECT_EQ(msg_evals, 0);
}

TEST(Check, FailureMessageNamesPlaceConditionAndMessage) {
  ASSERT_EQ(thread_rank(), -1);
  const int v = 1;
  auto f = [&] { UNTIED_CHECK(v + 1 == 3, "got ", v + 1, ", want ", 3); }; const int line = __LINE__;
  std::string msg;
  ASSERT_TRUE(throws_error(f, ErrorKind::kInvalidArgument, {}, &msg));
  // The whole message, with the prefix computed for this file and line.
  EXPECT_EQ(msg, error_prefix(__FILE__, line) + "check `v + 1 == 3` failed: got 2, want 3");
  // And its parts: "file:line", the stringified condition, the streamed message.
  EXPECT_NE(msg.find("check_test.cc:" + std::to_string(line) + ": "), std::string::npos) << msg;
  EXPECT_NE(msg.find("`v + 1 == 3`"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 2, want 3"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("rank", 0), std::string::npos) << "no rank registered: " << msg;
}

TEST(Check, MessageStartsWithTheThreadRank) {
  std::string without_rank = error_prefix("/x/tests/core/check_test.cc", 10);
  EXPECT_EQ(without_rank, "tests/core/check_test.cc:10: ");
  {
    ScopedRank rank(3);
    EXPECT_EQ(thread_rank(), 3);
    EXPECT_EQ(error_prefix("/x/tests/core/check_test.cc", 10), "rank 3: " + without_rank);
    auto f = [] { UNTIED_CHECK(false, "boom"); }; const int line = __LINE__;
    std::string msg;
    ASSERT_TRUE(throws_error(f, ErrorKind::kInvalidArgument, {}, &msg));
    EXPECT_EQ(msg.rfind("rank 3: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("check_test.cc:" + std::to_string(line) + ": check `false` failed: boom"),
              std::string::npos)
        << msg;

    // The rank is per thread: another thread has none.
    std::string other;
    int other_rank = 0;
    std::thread([&] {
      other_rank = thread_rank();
      try {
        UNTIED_CHECK(false, "on another thread");
      } catch (const Error& e) {
        other = e.what();
      }
    }).join();
    EXPECT_EQ(other_rank, -1);
    EXPECT_EQ(other.find("rank"), std::string::npos) << other;
    EXPECT_NE(other.find("on another thread"), std::string::npos) << other;
  }
  EXPECT_EQ(thread_rank(), -1);
  EXPECT_EQ(error_prefix("/x/tests/core/check_test.cc", 10), without_rank);
}

TEST(Check, AssertIsInternal) {
  EXPECT_TRUE(throws_error([] { UNTIED_ASSERT(1 > 2, "invariant ", 7); }, ErrorKind::kInternal,
                           {"check `1 > 2` failed: invariant 7"}));
}

TEST(Check, CheckKindAndFail) {
  EXPECT_TRUE(throws_error([] { UNTIED_CHECK_KIND(ErrorKind::kIo, false, "disk"); },
                           ErrorKind::kIo, {"failed: disk"}));
  EXPECT_TRUE(throws_error([] { fail(ErrorKind::kAborted, "peer died"); }, ErrorKind::kAborted,
                           {"peer died"}));
  try {
    fail(ErrorKind::kUnsupported, "exact text");
    ADD_FAILURE() << "fail() returned";
  } catch (const std::runtime_error& e) {  // Error is a std::runtime_error
    EXPECT_STREQ(e.what(), "exact text");
  }
}

TEST(Check, StrCat) {
  EXPECT_EQ(str_cat("a", 1, '-', 2.5, std::string("z")), "a1-2.5z");
}

TEST(ErrorPrefix, PathsRelativeToTheSourceTree) {
  EXPECT_EQ(error_prefix("/home/u/untied/src/core/tensor.cc", 12), "src/core/tensor.cc:12: ");
  EXPECT_EQ(error_prefix("/home/u/untied/include/untied/core/status.h", 40),
            "include/untied/core/status.h:40: ");
  EXPECT_EQ(error_prefix("/home/u/untied/tests/core/x_test.cc", 7), "tests/core/x_test.cc:7: ");
  EXPECT_EQ(error_prefix("/srv/src/untied/src/core/tensor.cc", 5), "src/core/tensor.cc:5: ");
  EXPECT_EQ(error_prefix("relative.cc", 1), "relative.cc:1: ");
}

// A checkout under a directory named src (~/src/untied is common) must still print paths
// relative to the tree, not to that outer src/.
TEST(ErrorPrefix, CheckoutUnderASrcDirectory) {
  EXPECT_EQ(error_prefix("/home/u/src/untied/include/untied/core/status.h", 40),
            "include/untied/core/status.h:40: ");
  EXPECT_EQ(error_prefix("/home/u/src/untied/tests/core/x_test.cc", 7), "tests/core/x_test.cc:7: ");
}

}  // namespace
}  // namespace untied
