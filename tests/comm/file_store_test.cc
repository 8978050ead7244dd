// The file-store communicator: every shared check (comm_checks.h) at 1, 2, 3 and 4 ranks, each
// rank a thread with its own communicator over one fresh directory; then what only this backend
// promises: join errors that say what to change and come back within the timeout (a missing
// rank, a duplicate rank, a wrong size, a rank outside the world), a collective that times out
// naming the rank that never came, abort() in another process stopping a waiting rank, calls
// that do not match, rank-order reductions, and a directory left as it was found.
#include "untied/comm/file_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/comm_checks.h"
#include "core/expect_error.h"
#include "untied/device/device.h"

namespace untied::testing {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A fresh folder (mkdtemp) removed with everything in it at the end; the store is a subfolder
// that join_file_store must create.
class TempDir {
 public:
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "untied-file-store-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  std::string store() const { return root_ + "/job/store"; }

 private:
  std::string root_;
};

// Timeouts where a timeout is not what is tested: long enough for a loaded machine, short enough
// that a broken check fails the test instead of hanging it.
constexpr double kPatient = 60;
// How much later than its timeout a refusal may come back on a loaded 2-core machine.
constexpr double kMargin = 5;

FileStoreOptions options(const std::string& dir, int rank, int size, double timeout_s) {
  return {.dir = dir, .rank = rank, .size = size, .timeout_s = timeout_s, .note = "test rank " + std::to_string(rank)};
}

// Runs body on `ranks` threads, each joined to `dir` as its rank; a rank that cannot join or
// whose body throws fails the test, naming the rank.
void run_ranks(int ranks, const std::string& dir, double timeout_s, const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        StatusOr<std::unique_ptr<Communicator>> c = join_file_store(options(dir, r, ranks, timeout_s));
        if (!c.ok()) {
          errors[static_cast<size_t>(r)] = "join: " + c.status().message();
          return;
        }
        std::unique_ptr<Communicator> comm = std::move(c).value();
        body(*comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r << " of " << ranks;
}

class FileChecks : public ::testing::TestWithParam<std::tuple<CommCheck, int>> {};

// check_barrier holds here: ranks are threads of one process, so steady_clock is one clock.
TEST_P(FileChecks, EveryElementExact) {
  const auto& [check, ranks] = GetParam();
  TempDir dir;
  std::vector<int64_t> wrong(static_cast<size_t>(ranks), -1);
  run_ranks(ranks, dir.store(), kPatient, [&, &check = check](Communicator& comm) {
    EXPECT_EQ(comm.backend(), "file");
    EXPECT_EQ(comm.size(), ranks);
    wrong[static_cast<size_t>(comm.rank())] = check.run(comm);
  });
  for (int r = 0; r < ranks; ++r)
    EXPECT_EQ(wrong[static_cast<size_t>(r)], 0) << check.name << ": wrong elements on rank " << r << " of " << ranks;
  // Every communicator was destroyed on every rank: nothing is left behind.
  EXPECT_FALSE(std::filesystem::exists(dir.store())) << check.name << ": " << dir.store() << " was left behind";
}

INSTANTIATE_TEST_SUITE_P(AllChecks, FileChecks,
                         ::testing::Combine(::testing::ValuesIn(comm_checks()), ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<CommCheck, int>>& info) {
                           return std::string(std::get<0>(info.param).name) + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- join ----------------------------------------------------------------------------------

struct Joined {
  Status status;
  double seconds = 0;
};

// Joins on one thread per entry of `opts`, each starting once start(i) returns; keeps what
// every join returned and how long it took. Once its join returns, a thread calls hold(i), then
// (when it joined) a barrier.
std::vector<Joined> join_all(const std::vector<FileStoreOptions>& opts,
                             const std::function<void(size_t)>& start = [](size_t) {},
                             const std::function<void(size_t)>& hold = [](size_t) {}) {
  std::vector<Joined> out(opts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < opts.size(); ++i)
    threads.emplace_back([&, i] {
      start(i);
      const auto t0 = Clock::now();
      StatusOr<std::unique_ptr<Communicator>> c = join_file_store(opts[i]);
      out[i].seconds = seconds_since(t0);
      out[i].status = c.ok() ? Status::ok_status() : c.status();
      hold(i);
      if (c.ok()) std::move(c).value()->barrier();  // the world works
    });
  for (std::thread& t : threads) t.join();
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(FileStoreJoin, AMissingRankTimesOutNamingIt) {
  TempDir dir;
  const double timeout = 1;
  std::vector<FileStoreOptions> opts;
  for (int r = 0; r < 3; ++r) opts.push_back(options(dir.store(), r, 4, timeout));  // rank 3 never comes
  for (const Joined& j : join_all(opts)) {
    const std::string& m = j.status.message();
    EXPECT_EQ(j.status.code(), Status::Code::kIoError) << m;
    for (const char* part : {"3 of 4 ranks joined", "within 1 s", "missing: 3 (", "every rank shares",
                             "world size right"})
      EXPECT_TRUE(contains(m, part)) << "lacks \"" << part << "\": " << m;
    EXPECT_GE(j.seconds, timeout * 0.99) << m;
    EXPECT_LT(j.seconds, timeout + kMargin) << m;
  }
}

TEST(FileStoreJoin, ADuplicateRankIsRefusedNamingTheFirst) {
  TempDir dir;
  std::vector<FileStoreOptions> opts;
  for (int r = 0; r < 4; ++r) opts.push_back(options(dir.store(), r, 4, kPatient));
  opts.push_back(options(dir.store(), 1, 4, kPatient));
  opts.back().note = "the second rank 1";
  // The duplicate starts once the first rank 1 has registered; the world stays (and holds rank 1)
  // until the duplicate has its answer.
  std::atomic<bool> answered{false};
  const std::vector<Joined> got = join_all(
      opts,
      [&](size_t i) {
        while (i == 4 && !std::filesystem::exists(dir.store() + "/rank_1"))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      [&](size_t i) {
        if (i == 4) return answered.store(true);
        const auto t0 = Clock::now();
        while (!answered.load() && seconds_since(t0) < kPatient) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      });
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(got[static_cast<size_t>(r)].status.ok()) << got[static_cast<size_t>(r)].status.message();
  const std::string& m = got[4].status.message();
  EXPECT_EQ(got[4].status.code(), Status::Code::kInvalidArgument) << m;
  for (const char* part : {"rank 1 is already held", "by test rank 1 (world size 4)", "two processes were given rank 1",
                           "left by an earlier job", "remove " , "or use a new one"})
    EXPECT_TRUE(contains(m, part)) << "lacks \"" << part << "\": " << m;
  EXPECT_LT(got[4].seconds, kMargin) << "the duplicate is refused at once, not after the timeout";
}

TEST(FileStoreJoin, AWrongSizeIsRefusedOnEveryRank) {
  TempDir dir;
  const double timeout = 3;
  std::vector<FileStoreOptions> opts;
  for (int r = 0; r < 4; ++r) opts.push_back(options(dir.store(), r, r == 1 ? 3 : 4, timeout));
  const std::vector<Joined> got = join_all(opts);
  for (int r = 0; r < 4; ++r) {
    const Joined& j = got[static_cast<size_t>(r)];
    const std::string& m = j.status.message();
    // No rank hangs: each is refused, and none waits past its timeout.
    EXPECT_LT(j.seconds, timeout + kMargin) << "rank " << r << ": " << m;
    // Each rank sees the other side's registration (a refused rank leaves its own), so each decides.
    EXPECT_EQ(j.status.code(), Status::Code::kInvalidArgument) << "rank " << r << ": " << m;
    // Rank 1 names whichever rank of size 4 it read first (0 or 2); the others name rank 1.
    if (r == 1)
      EXPECT_TRUE(contains(m, "rank 0 (test rank 0) joined") || contains(m, "rank 2 (test rank 2) joined")) << m;
    else
      EXPECT_TRUE(contains(m, "rank 1 (test rank 1) joined")) << "rank " << r << ": " << m;
    for (const char* part : {"world size 3", "world size 4", "same world size"})
      EXPECT_TRUE(contains(m, part)) << "rank " << r << ": lacks \"" << part << "\": " << m;
  }
}

TEST(FileStoreJoin, ARankOutsideTheWorldIsRefused) {
  TempDir dir;
  for (int rank : {4, -1}) {
    StatusOr<std::unique_ptr<Communicator>> c = join_file_store(options(dir.store(), rank, 4, 1));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Status::Code::kInvalidArgument);
    EXPECT_TRUE(contains(c.status().message(), "rank " + std::to_string(rank) + " is outside the world [0, 4)"))
        << c.status().message();
  }
  StatusOr<std::unique_ptr<Communicator>> c = join_file_store(options(dir.store(), 0, 0, 1));
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "at least 1, got 0")) << c.status().message();
  c = join_file_store({.dir = "", .rank = 0, .size = 1});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(contains(c.status().message(), "no directory")) << c.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir.store())) << "a refused join created the directory";
}

// A job that ended cleanly leaves nothing: the next one joins the same directory.
TEST(FileStoreJoin, TheNextJobReusesTheDirectory) {
  TempDir dir;
  for (int job = 0; job < 2; ++job)
    run_ranks(3, dir.store(), kPatient, [&](Communicator& comm) {
      int64_t x = comm.rank() + job;
      comm.all_reduce(&x, &x, 1, DType::kI64, ReduceOp::kSum);
      EXPECT_EQ(x, 3 + 3 * job);
    });
  EXPECT_FALSE(std::filesystem::exists(dir.store()));
}

// ---- collectives that cannot complete ----------------------------------------------------------

TEST(FileStore, ACollectiveTimesOutNamingTheRankThatNeverCame) {
  TempDir dir;
  const double timeout = 2;
  std::atomic<int> done{0};
  run_ranks(3, dir.store(), timeout, [&](Communicator& comm) {
    if (comm.rank() == 2) {  // joins, then never calls the all_reduce
      const auto t0 = Clock::now();
      while (done.load() < 2 && seconds_since(t0) < kPatient) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    int64_t x = 1;
    const auto t0 = Clock::now();
    EXPECT_TRUE(throws_error([&] { comm.all_reduce(&x, &x, 1, DType::kI64, ReduceOp::kSum); }, ErrorKind::kIo,
                             {"file store all_reduce #1 on w", "no file from rank(s) 2 (test rank 2)", "within 2 s"}));
    EXPECT_GE(seconds_since(t0), timeout * 0.99);
    EXPECT_LT(seconds_since(t0), timeout + kMargin);
    done.fetch_add(1);
  });
}

TEST(FileStore, ASendrecvTimesOutNamingTheSilentRank) {
  TempDir dir;
  const double timeout = 2;
  std::atomic<bool> done{false};
  run_ranks(2, dir.store(), timeout, [&](Communicator& comm) {
    if (comm.rank() == 1) {  // joins, then never sends
      const auto t0 = Clock::now();
      while (!done.load() && seconds_since(t0) < kPatient) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    char a = 1, b = 0;
    const auto t0 = Clock::now();
    EXPECT_TRUE(throws_error([&] { comm.sendrecv(&a, 1, 1, &b, 1, 1); }, ErrorKind::kIo,
                             {"file store sendrecv", "message #0 from rank 1 (test rank 1) did not come within 2 s"}));
    EXPECT_LT(seconds_since(t0), timeout + kMargin);
    done = true;
  });
}

// abort() ends its process; a rank of another process waiting in a collective throws kAborted
// naming it. `wait_in_subgroup`: the waiting call is on a communicator split from the world.
void check_abort_in_child(bool wait_in_subgroup) {
  TempDir dir;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child: rank 1; only _Exit leaves it, so no test state is torn down twice
    try {
      FileStoreOptions o = options(dir.store(), 1, 2, kPatient);
      o.note = "the child";
      StatusOr<std::unique_ptr<Communicator>> c = join_file_store(o);
      if (!c.ok()) ::_Exit(90);
      std::unique_ptr<Communicator> comm = std::move(c).value();
      std::unique_ptr<Communicator> sub = comm->split(0, 0);
      comm->barrier();
      comm->abort(7);
    } catch (...) {
    }
    ::_Exit(91);
  }
  {
    StatusOr<std::unique_ptr<Communicator>> c = join_file_store(options(dir.store(), 0, 2, kPatient));
    ASSERT_TRUE(c.ok()) << c.status().message();
    std::unique_ptr<Communicator> comm = std::move(c).value();
    std::unique_ptr<Communicator> sub = comm->split(0, 0);
    comm->barrier();
    Communicator& waiting = wait_in_subgroup ? *sub : *comm;
    int64_t x = 1;
    const auto t0 = Clock::now();
    EXPECT_TRUE(throws_error([&] { waiting.all_reduce(&x, &x, 1, DType::kI64, ReduceOp::kSum); },
                             ErrorKind::kAborted,
                             {wait_in_subgroup ? "all_reduce #0 on w.s0c0" : "all_reduce #3 on w",
                              "rank 1 (the child) called abort(7)", "this rank stops"}));
    EXPECT_LT(seconds_since(t0), kMargin) << "the abort is seen long before the timeout";
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7) << "the child's abort(7) must end it with code 7";
}

TEST(FileStore, AbortInAnotherProcessStopsAWaitingRank) { check_abort_in_child(false); }
TEST(FileStore, AbortReachesSubgroups) { check_abort_in_child(true); }

// ---- what ranks must agree on --------------------------------------------------------------

TEST(FileStore, MismatchedCollectivesAreCaughtOnEveryRank) {
  TempDir dir;
  run_ranks(2, dir.store(), kPatient, [](Communicator& comm) {
    int x = 0;
    EXPECT_TRUE(throws_error(
        [&] {
          if (comm.rank() == 0) comm.barrier();
          else comm.broadcast(&x, sizeof x, 0);
        },
        ErrorKind::kInvalidArgument,
        {comm.rank() == 0 ? "rank 1 called broadcast while rank 0 called barrier"
                          : "rank 0 called barrier while rank 1 called broadcast",
         "same collectives"}));
  });
}

TEST(FileStore, MismatchedSizesAreCaughtOnEveryRank) {
  TempDir dir;
  run_ranks(2, dir.store(), kPatient, [](Communicator& comm) {
    std::vector<char> send(16), recv(32);
    EXPECT_TRUE(throws_error([&] { comm.all_gather(send.data(), recv.data(), comm.rank() == 0 ? 8 : 16); },
                             ErrorKind::kInvalidArgument, {"all_gather", "same sizes"}));
  });
}

// The sum runs in rank order: ((x0 + x1) + x2) + x3 on every rank (1e8 + 1 rounds back to 1e8,
// so another order gives another float).
TEST(FileStore, ReductionOrderIsRankOrder) {
  TempDir dir;
  const float xs[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  const float want = ((xs[0] + xs[1]) + xs[2]) + xs[3];
  std::vector<float> got(4, -1.0f);
  run_ranks(4, dir.store(), kPatient, [&](Communicator& comm) {
    float x = xs[comm.rank()];
    comm.all_reduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    got[static_cast<size_t>(comm.rank())] = x;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
}

// A device that claims to be a GPU: the file store refuses it, as MPI does.
class FakeGpu final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return "fake gpu"; }
  Allocator& allocator() override { return alloc_; }
  void copy(void*, const void*, int64_t) override {}
  void copy_2d(void*, int64_t, const void*, int64_t, int64_t, int64_t) override {}
  void fill_zero(void*, int64_t) override {}
  void synchronize() override {}
  int threads() const override { return 1; }

 private:
  Allocator alloc_;
};

TEST(FileStore, BindsCpuDevicesOnly) {
  TempDir dir;
  run_ranks(1, dir.store(), kPatient, [](Communicator& comm) {
    auto cpu = make_cpu_device({});
    comm.bind_device(*cpu);
    FakeGpu gpu;
    EXPECT_TRUE(throws_error([&] { comm.bind_device(gpu); }, ErrorKind::kUnsupported,
                             {"host memory only", "fake gpu", "NCCL"}));
  });
}

}  // namespace
}  // namespace untied::testing
