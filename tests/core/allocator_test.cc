// The tagged allocator: exact live/peak accounting per tag, in total, at the total peak and per
// phase, against values computed by hand in the comments; budgets; Buffer ownership; counting
// (rehearsal) memory; format_bytes / parse_bytes.
#include "untied/core/allocator.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/expect_error.h"

namespace untied {
namespace {

using testing::quoted;
using testing::throws_error;
using Tags = std::array<int64_t, kNumTags>;

constexpr int kP = static_cast<int>(Tag::kParameters);
constexpr int kG = static_cast<int>(Tag::kGradients);
constexpr int kO = static_cast<int>(Tag::kOptimizer);
constexpr int kA = static_cast<int>(Tag::kActivations);
constexpr int kW = static_cast<int>(Tag::kAttnWorkspace);
constexpr int kC = static_cast<int>(Tag::kCommunication);

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;
constexpr int64_t kTiB = 1024 * kGiB;

// Tags in declaration order: {parameters, gradients, optimizer, activations, attn_workspace,
// communication, other}.
Tags tags(int64_t p, int64_t g, int64_t o, int64_t a, int64_t w, int64_t c, int64_t x) {
  return Tags{p, g, o, a, w, c, x};
}

Allocator counting_allocator(int64_t budget = 0) {
  return Allocator(make_counting_memory(), Allocator::Options{.budget_bytes = budget, .name = "test"});
}

int phase_index(Phase p) { return static_cast<int>(p); }

TEST(Allocator, TagAndPhaseNames) {
  EXPECT_EQ(tag_name(Tag::kParameters), "parameters");
  EXPECT_EQ(tag_name(Tag::kGradients), "gradients");
  EXPECT_EQ(tag_name(Tag::kOptimizer), "optimizer");
  EXPECT_EQ(tag_name(Tag::kActivations), "activations");
  EXPECT_EQ(tag_name(Tag::kAttnWorkspace), "attn_workspace");
  EXPECT_EQ(tag_name(Tag::kCommunication), "communication");
  EXPECT_EQ(tag_name(Tag::kOther), "other");
  EXPECT_EQ(phase_name(Phase::kSetup), "setup");
  EXPECT_EQ(phase_name(Phase::kForward), "forward");
  EXPECT_EQ(phase_name(Phase::kBackward), "backward");
  EXPECT_EQ(phase_name(Phase::kOptimizer), "optimizer");
}

TEST(Allocator, LiveAndPeakPerTagAndTotal) {
  Allocator a;  // host memory: the counters must not depend on the backing
  Buffer p = a.allocate(1000, Tag::kParameters, "p");    // total 1000
  Buffer g = a.allocate(500, Tag::kGradients, "g");      // total 1500
  Buffer x1 = a.allocate(300, Tag::kActivations, "x1");  // total 1800 (peak so far)
  x1.reset();                                            // total 1500, activations peak 300
  Buffer w = a.allocate(200, Tag::kAttnWorkspace, "w");  // total 1700 < 1800: no new total peak
  {
    MemoryStats s = a.stats();
    EXPECT_EQ(s.live, tags(1000, 500, 0, 0, 200, 0, 0));
    EXPECT_EQ(s.peak, tags(1000, 500, 0, 300, 200, 0, 0));
    EXPECT_EQ(s.peak_total, 1800);
    // The snapshot is from the moment the total reached 1800: p, g, x1 live; w not yet.
    EXPECT_EQ(s.at_total_peak, tags(1000, 500, 0, 300, 0, 0, 0));
  }
  Buffer x2 = a.allocate(400, Tag::kActivations, "x2");  // total 2100: new total peak
  g.reset();                                             // total 1600
  x2.reset();                                            // total 1200
  Buffer c = a.allocate(800, Tag::kCommunication, "c");  // total 2000 < 2100

  MemoryStats s = a.stats();
  EXPECT_EQ(s.live, tags(1000, 0, 0, 0, 200, 800, 0));
  EXPECT_EQ(s.live_total, 2000);
  EXPECT_EQ(s.peak, tags(1000, 500, 0, 400, 200, 800, 0));
  EXPECT_EQ(s.peak_total, 2100);
  // At 2100: p 1000, g 500, x2 400, w 200; x1 was freed and c not yet allocated.
  EXPECT_EQ(s.at_total_peak, tags(1000, 500, 0, 400, 200, 0, 0));
  EXPECT_EQ(s.num_allocations, 6);
  // Everything happened in the setup phase.
  EXPECT_EQ(s.phase_peak[phase_index(Phase::kSetup)], s.peak);
  EXPECT_EQ(s.phase_peak_total[phase_index(Phase::kSetup)], 2100);
  for (Phase ph : {Phase::kForward, Phase::kBackward, Phase::kOptimizer}) {
    EXPECT_EQ(s.phase_peak[phase_index(ph)], tags(0, 0, 0, 0, 0, 0, 0)) << phase_name(ph);
    EXPECT_EQ(s.phase_peak_total[phase_index(ph)], 0) << phase_name(ph);
  }

  p.reset();
  w.reset();
  c.reset();
  s = a.stats();
  EXPECT_EQ(s.live, tags(0, 0, 0, 0, 0, 0, 0));
  EXPECT_EQ(s.live_total, 0);
  EXPECT_EQ(s.peak_total, 2100);  // peaks survive frees
}

TEST(Allocator, DestroyingABufferFreesIt) {
  Allocator a = counting_allocator();
  {
    Buffer b = a.allocate(4096, Tag::kOther, "scoped");
    EXPECT_EQ(a.stats().live_total, 4096);
  }
  EXPECT_EQ(a.stats().live_total, 0);
  EXPECT_EQ(a.stats().live[static_cast<int>(Tag::kOther)], 0);
}

// A short training step. What is live on entering a phase counts toward that phase's peak.
struct StepAllocations {
  Buffer params, act1, act2, grads, opt;
};

void run_step(Allocator& a, StepAllocations& b) {
  b.params = a.allocate(1000, Tag::kParameters, "params");  // setup: total 1000
  a.set_phase(Phase::kForward);                              // enters with P 1000
  b.act1 = a.allocate(300, Tag::kActivations, "act1");       // 1300
  Buffer ws = a.allocate(200, Tag::kAttnWorkspace, "ws");    // 1500: forward total peak
  ws.reset();                                                // 1300
  b.act2 = a.allocate(100, Tag::kActivations, "act2");       // activations 400, total 1400
  a.set_phase(Phase::kBackward);                             // enters with P 1000, A 400: 1400
  b.grads = a.allocate(1000, Tag::kGradients, "grads");      // 2400
  b.act2.reset();                                            // 2300
  b.act1.reset();                                            // 2000
  Buffer ws2 = a.allocate(600, Tag::kAttnWorkspace, "ws2");  // 2600: backward total peak
  ws2.reset();                                               // 2000
  a.set_phase(Phase::kOptimizer);                            // enters with P 1000, G 1000
  b.opt = a.allocate(2000, Tag::kOptimizer, "opt");          // 4000
  b.grads.reset();                                           // 3000: P 1000, O 2000
}

TEST(Allocator, PhasePeaks) {
  Allocator a = counting_allocator();
  EXPECT_EQ(a.phase(), Phase::kSetup);
  StepAllocations b;
  run_step(a, b);
  EXPECT_EQ(a.phase(), Phase::kOptimizer);

  MemoryStats s = a.stats();
  const int su = phase_index(Phase::kSetup), fw = phase_index(Phase::kForward),
            bw = phase_index(Phase::kBackward), op = phase_index(Phase::kOptimizer);
  EXPECT_EQ(s.phase_peak[su], tags(1000, 0, 0, 0, 0, 0, 0));
  EXPECT_EQ(s.phase_peak_total[su], 1000);
  EXPECT_EQ(s.phase_peak[fw], tags(1000, 0, 0, 400, 200, 0, 0));
  EXPECT_EQ(s.phase_peak_total[fw], 1500);
  // Parameters and the forward's activations were live on entry; they count for backward.
  EXPECT_EQ(s.phase_peak[bw], tags(1000, 1000, 0, 400, 600, 0, 0));
  EXPECT_EQ(s.phase_peak_total[bw], 2600);
  EXPECT_EQ(s.phase_peak[op], tags(1000, 1000, 2000, 0, 0, 0, 0));
  EXPECT_EQ(s.phase_peak_total[op], 4000);

  EXPECT_EQ(s.peak, tags(1000, 1000, 2000, 400, 600, 0, 0));
  EXPECT_EQ(s.peak_total, 4000);
  EXPECT_EQ(s.at_total_peak, tags(1000, 1000, 2000, 0, 0, 0, 0));
  EXPECT_EQ(s.live, tags(1000, 0, 2000, 0, 0, 0, 0));
  EXPECT_EQ(s.live_total, 3000);
  EXPECT_EQ(s.num_allocations, 7);
}

TEST(Allocator, EnteringAPhaseCountsWhatIsLive) {
  Allocator a = counting_allocator();
  Buffer p = a.allocate(700, Tag::kParameters, "p");
  a.set_phase(Phase::kBackward);  // no allocation inside the phase at all
  MemoryStats s = a.stats();
  EXPECT_EQ(s.phase_peak[phase_index(Phase::kBackward)], tags(700, 0, 0, 0, 0, 0, 0));
  EXPECT_EQ(s.phase_peak_total[phase_index(Phase::kBackward)], 700);
  EXPECT_EQ(s.phase_peak_total[phase_index(Phase::kForward)], 0);  // never entered
}

TEST(Allocator, ResetPeaksRestartsFromLive) {
  Allocator a = counting_allocator();
  StepAllocations b;
  run_step(a, b);  // ends in the optimizer phase with P 1000, O 2000 live (3000)
  a.reset_peaks();

  MemoryStats s = a.stats();
  const Tags live = tags(1000, 0, 2000, 0, 0, 0, 0);
  EXPECT_EQ(s.peak, live);
  EXPECT_EQ(s.peak_total, 3000);
  EXPECT_EQ(s.at_total_peak, live);
  EXPECT_EQ(s.phase_peak[phase_index(Phase::kOptimizer)], live);  // the current phase
  EXPECT_EQ(s.phase_peak_total[phase_index(Phase::kOptimizer)], 3000);
  for (Phase ph : {Phase::kSetup, Phase::kForward, Phase::kBackward}) {
    EXPECT_EQ(s.phase_peak[phase_index(ph)], tags(0, 0, 0, 0, 0, 0, 0)) << phase_name(ph);
    EXPECT_EQ(s.phase_peak_total[phase_index(ph)], 0) << phase_name(ph);
  }
  EXPECT_EQ(s.num_allocations, 7);  // counts since construction, not since reset

  // The next step: entering forward counts the 3000 live, then an activation adds 100.
  a.set_phase(Phase::kForward);
  Buffer x = a.allocate(100, Tag::kActivations, "x");
  s = a.stats();
  EXPECT_EQ(s.phase_peak[phase_index(Phase::kForward)], tags(1000, 0, 2000, 100, 0, 0, 0));
  EXPECT_EQ(s.phase_peak_total[phase_index(Phase::kForward)], 3100);
  EXPECT_EQ(s.peak_total, 3100);
  EXPECT_EQ(s.at_total_peak, tags(1000, 0, 2000, 100, 0, 0, 0));
  EXPECT_EQ(s.peak[kG], 0);  // gradients peaked at 1000 before the reset
  EXPECT_EQ(s.num_allocations, 8);
}

TEST(Allocator, NumAllocationsCountsEveryAllocation) {
  Allocator a = counting_allocator();
  for (int i = 0; i < 5; ++i) Buffer b = a.allocate(10 * i, Tag::kOther, "loop");  // incl. 0 B
  EXPECT_EQ(a.stats().num_allocations, 5);
  EXPECT_EQ(a.stats().live_total, 0);
  EXPECT_EQ(a.stats().peak_total, 40);
}

TEST(Buffer, MoveConstructTransfersOwnership) {
  Allocator a;
  Buffer src = a.allocate(128, Tag::kParameters, "src");
  void* data = src.data();
  ASSERT_NE(data, nullptr);
  Buffer dst(std::move(src));
  EXPECT_TRUE(src.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(src.data(), nullptr);
  EXPECT_EQ(src.bytes(), 0);
  EXPECT_FALSE(dst.empty());
  EXPECT_EQ(dst.data(), data);
  EXPECT_EQ(dst.bytes(), 128);
  EXPECT_EQ(dst.tag(), Tag::kParameters);
  src.reset();  // the moved-from buffer frees nothing
  EXPECT_EQ(a.stats().live_total, 128);
  EXPECT_EQ(a.stats().live[kP], 128);
  dst.reset();
  EXPECT_EQ(a.stats().live_total, 0);
  EXPECT_TRUE(dst.empty());
}

TEST(Buffer, MovedFromBufferFreesNothingOnDestruction) {
  Allocator a = counting_allocator();
  Buffer keep;
  {
    Buffer src = a.allocate(64, Tag::kGradients, "src");
    keep = std::move(src);
  }  // src destroyed here
  EXPECT_EQ(a.stats().live[kG], 64);
  EXPECT_EQ(a.stats().live_total, 64);
}

TEST(Buffer, MoveAssignFreesTheOldAllocation) {
  Allocator a;
  Buffer x = a.allocate(100, Tag::kParameters, "x");
  Buffer y = a.allocate(50, Tag::kGradients, "y");
  void* y_data = y.data();
  x = std::move(y);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.live, tags(0, 50, 0, 0, 0, 0, 0));
  EXPECT_EQ(s.live_total, 50);
  EXPECT_EQ(x.bytes(), 50);
  EXPECT_EQ(x.tag(), Tag::kGradients);
  EXPECT_EQ(x.data(), y_data);
  EXPECT_TRUE(y.empty());  // NOLINT(bugprone-use-after-move)

  Buffer& alias = x;  // self-move-assignment keeps the allocation
  x = std::move(alias);
  EXPECT_EQ(x.bytes(), 50);
  EXPECT_EQ(a.stats().live_total, 50);
}

TEST(Allocator, ZeroByteAllocation) {
  Allocator a(make_host_memory(), Allocator::Options{.budget_bytes = 100, .name = "host"});
  Buffer full = a.allocate(100, Tag::kParameters, "fills the budget");
  Buffer z = a.allocate(0, Tag::kActivations, "nothing");  // fits even in a full budget
  EXPECT_EQ(z.data(), nullptr);
  EXPECT_EQ(z.bytes(), 0);
  EXPECT_EQ(z.tag(), Tag::kActivations);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.live_total, 100);
  EXPECT_EQ(s.live[kA], 0);
  EXPECT_EQ(s.num_allocations, 2);
  z.reset();
  EXPECT_EQ(a.stats().live_total, 100);
}

TEST(Allocator, NegativeSizeIsInvalidArgument) {
  Allocator a = counting_allocator();
  EXPECT_TRUE(throws_error([&] { a.allocate(-1, Tag::kOther, "bad size"); },
                           ErrorKind::kInvalidArgument, {"-1 bytes", "'bad size'"}));
  MemoryStats s = a.stats();
  EXPECT_EQ(s.num_allocations, 0);
  EXPECT_EQ(s.live_total, 0);
  EXPECT_EQ(s.peak_total, 0);
}

TEST(Allocator, NegativeBudgetIsRejected) {
  EXPECT_TRUE(throws_error([] { counting_allocator(-1); }, ErrorKind::kInvalidArgument,
                           {"budget", "-1"}));
}

TEST(Allocator, BudgetExceededThrowsAndCountsNothing) {
  Allocator a = counting_allocator(8 * kMiB);
  EXPECT_EQ(a.budget_bytes(), 8 * kMiB);
  Buffer p = a.allocate(4 * kMiB, Tag::kParameters, "weights");
  Buffer g = a.allocate(3 * kMiB, Tag::kGradients, "grads");
  const MemoryStats before = a.stats();

  EXPECT_TRUE(throws_error(
      [&] { a.allocate(3 * kMiB / 2, Tag::kActivations, "block 3 input"); },
      ErrorKind::kOutOfBudget,
      {"1.50 MiB", "'block 3 input'", "(activations)", "8.50 MiB", "budget of 8.00 MiB",
       "live 7.00 MiB", "parameters 4.00 MiB", "gradients 3.00 MiB"}));

  MemoryStats s = a.stats();
  EXPECT_EQ(s.live, before.live);
  EXPECT_EQ(s.live_total, 7 * kMiB);
  EXPECT_EQ(s.peak, before.peak);
  EXPECT_EQ(s.peak_total, 7 * kMiB);
  EXPECT_EQ(s.num_allocations, 2);
  EXPECT_EQ(s.phase_peak_total, before.phase_peak_total);

  // Exactly up to the budget fits; one byte more does not.
  Buffer x = a.allocate(1 * kMiB, Tag::kActivations, "exact fit");
  EXPECT_EQ(a.stats().live_total, 8 * kMiB);
  EXPECT_EQ(a.stats().peak_total, 8 * kMiB);
  EXPECT_TRUE(throws_error([&] { a.allocate(1, Tag::kOther, "one more byte"); },
                           ErrorKind::kOutOfBudget, {"'one more byte'", "(other)"}));
  EXPECT_EQ(a.stats().num_allocations, 3);
  // Freeing makes room again.
  x.reset();
  Buffer y = a.allocate(1 * kMiB, Tag::kOther, "after free");
  EXPECT_EQ(a.stats().live_total, 8 * kMiB);
}

TEST(Allocator, BudgetSingleRequestLargerThanBudget) {
  Allocator a(make_host_memory(), Allocator::Options{.budget_bytes = 1000, .name = "host"});
  EXPECT_TRUE(throws_error([&] { a.allocate(1001, Tag::kParameters, "too big"); },
                           ErrorKind::kOutOfBudget, {"1001 B", "budget of 1000 B", "live 0 B"}));
  EXPECT_EQ(a.stats().num_allocations, 0);
  Buffer b = a.allocate(1000, Tag::kParameters, "exactly the budget");
  EXPECT_NE(b.data(), nullptr);
}

// A request so large that live_total + bytes overflows int64 must still be refused.
TEST(Allocator, BudgetHugeRequestDoesNotOverflow) {
  Allocator a = counting_allocator(1 * kGiB);
  Buffer one = a.allocate(1, Tag::kOther, "one byte");
  EXPECT_TRUE(throws_error(
      [&] { a.allocate(std::numeric_limits<int64_t>::max(), Tag::kActivations, "huge"); },
      ErrorKind::kOutOfBudget, {"'huge'"}));
  EXPECT_EQ(a.stats().live_total, 1);
  EXPECT_EQ(a.stats().num_allocations, 1);
}

TEST(Allocator, DescribeLive) {
  Allocator a = counting_allocator(2 * kGiB);
  EXPECT_EQ(a.describe_live(), "live 0 B of budget 2.00 GiB");
  Buffer p = a.allocate(1 * kGiB, Tag::kParameters, "p");
  Buffer x = a.allocate(512 * kMiB, Tag::kActivations, "x");
  EXPECT_EQ(a.describe_live(), "live 1.50 GiB of budget 2.00 GiB: parameters 1.00 GiB, activations 512.00 MiB");
  Allocator unlimited = counting_allocator();
  Buffer c = unlimited.allocate(512, Tag::kCommunication, "c");
  EXPECT_EQ(unlimited.describe_live(), "live 512 B: communication 512 B");
}

TEST(Allocator, HostMemoryIsAlignedAndWritable) {
  Allocator a;
  EXPECT_TRUE(a.backed());
  EXPECT_EQ(a.name(), "host");
  for (int64_t n : {1, 63, 64, 65, 1000, 4096 + 3}) {
    Buffer b = a.allocate(n, Tag::kOther, "bytes");
    ASSERT_NE(b.data(), nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u) << n;
    auto* p = b.as<unsigned char>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(i * 7 + 1);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += p[i] != static_cast<unsigned char>(i * 7 + 1);
    EXPECT_EQ(wrong, 0) << n;
  }
}

TEST(Allocator, HostMemoryExhaustedCountsNothing) {
  Allocator a;  // no budget: the request reaches malloc, which cannot give 4 EiB
  EXPECT_TRUE(throws_error([&] { a.allocate(int64_t{1} << 62, Tag::kActivations, "absurd"); },
                           ErrorKind::kOutOfBudget, {"host memory exhausted"}));
  MemoryStats s = a.stats();
  EXPECT_EQ(s.live_total, 0);
  EXPECT_EQ(s.peak_total, 0);
  EXPECT_EQ(s.num_allocations, 0);
}

TEST(CountingMemory, BacksNothing) {
  auto src = make_counting_memory();
  EXPECT_EQ(src->name(), "counting");
  EXPECT_FALSE(src->backed());
  EXPECT_EQ(src->allocate(1 << 20), nullptr);
  auto host = make_host_memory();
  EXPECT_EQ(host->name(), "host");
  EXPECT_TRUE(host->backed());
}

TEST(CountingMemory, CountsExactlyWithoutBacking) {
  Allocator a = counting_allocator();
  EXPECT_FALSE(a.backed());
  Buffer p = a.allocate(2 * kTiB, Tag::kParameters, "more than this machine has");
  Buffer x = a.allocate(3 * kGiB, Tag::kActivations, "x");
  EXPECT_EQ(p.data(), nullptr);
  EXPECT_EQ(x.data(), nullptr);
  EXPECT_EQ(p.bytes(), 2 * kTiB);
  MemoryStats s = a.stats();
  EXPECT_EQ(s.live, tags(2 * kTiB, 0, 0, 3 * kGiB, 0, 0, 0));
  EXPECT_EQ(s.live_total, 2 * kTiB + 3 * kGiB);
  x.reset();
  s = a.stats();
  EXPECT_EQ(s.live_total, 2 * kTiB);
  EXPECT_EQ(s.peak_total, 2 * kTiB + 3 * kGiB);
  EXPECT_EQ(s.at_total_peak, tags(2 * kTiB, 0, 0, 3 * kGiB, 0, 0, 0));
}

TEST(Allocator, ConcurrentAllocationsAreCountedExactly) {
  Allocator a = counting_allocator();
  constexpr int kThreads = 4, kIters = 2000;
  const Tag thread_tag[kThreads] = {Tag::kParameters, Tag::kGradients, Tag::kActivations,
                                    Tag::kCommunication};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        Buffer b = a.allocate(64, thread_tag[t], "per-thread");
        Buffer c = a.allocate(32, thread_tag[t], "per-thread");
      }
    });
  }
  for (auto& th : threads) th.join();
  MemoryStats s = a.stats();
  EXPECT_EQ(s.num_allocations, int64_t{2} * kThreads * kIters);
  EXPECT_EQ(s.live_total, 0);
  for (int t = 0; t < kThreads; ++t) {
    int i = static_cast<int>(thread_tag[t]);
    EXPECT_EQ(s.live[i], 0) << tag_name(thread_tag[t]);
    EXPECT_EQ(s.peak[i], 96) << tag_name(thread_tag[t]);  // one thread per tag holds <= 96 B
  }
  EXPECT_GE(s.peak_total, 96);
  EXPECT_LE(s.peak_total, 96 * kThreads);
}

TEST(FormatBytes, Examples) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(12 * kMiB), "12.00 MiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(2 * kTiB), "2.00 TiB");
  EXPECT_EQ(format_bytes(2048 * kTiB), "2048.00 TiB");  // TiB is the largest unit
  EXPECT_EQ(format_bytes(-2048), "-2.00 KiB");
}

TEST(ParseBytes, Examples) {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  const Case cases[] = {
      {"4096", 4096},
      {"512K", 512 * kKiB},
      {"512M", 512 * kMiB},
      {"8G", 8 * kGiB},
      {"1.5G", 3 * kGiB / 2},
      {"8GiB", 8 * kGiB},
      {"8GB", 8 * kGiB},
      {"512MiB", 512 * kMiB},
      {"1k", kKiB},
      {"2t", 2 * kTiB},
      {"100B", 100},
      {"0.5K", 512},
  };
  for (const Case& c : cases) {
    StatusOr<int64_t> r = parse_bytes(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().to_string();
    EXPECT_EQ(r.value(), c.bytes) << c.text;
  }
}

TEST(ParseBytes, BadInputSaysWhatToWrite) {
  for (const char* text : {"", "abc", "12X", "G", "8 G", "1e400", "8GG"}) {
    StatusOr<int64_t> r = parse_bytes(text);
    ASSERT_FALSE(r.ok()) << "'" << text << "' was accepted as " << r.value();
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << text;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find(quoted(text)), std::string::npos) << m;
    EXPECT_NE(m.find("e.g. 4096, 512M, 8G, 1.5G"), std::string::npos) << m;
  }
  for (const char* text : {"-1G", "0", "0G", "-5", "nan", "inf", "1e30G"}) {
    StatusOr<int64_t> r = parse_bytes(text);
    ASSERT_FALSE(r.ok()) << "'" << text << "' was accepted as " << r.value();
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument) << text;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find(quoted(text)), std::string::npos) << m;
    EXPECT_NE(m.find("must be positive"), std::string::npos) << m;
  }
}

// A fraction of a byte must not round to 0, which a budget would read as "unlimited".
TEST(ParseBytes, CountThatRoundsToZeroIsRejected) {
  for (const char* text : {"0.4", "0.0001K"}) {
    StatusOr<int64_t> r = parse_bytes(text);
    EXPECT_FALSE(r.ok()) << "'" << text << "' was accepted as " << r.value() << " bytes";
  }
}

}  // namespace
}  // namespace untied
