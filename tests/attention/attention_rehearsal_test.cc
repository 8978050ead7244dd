// Rehearsal: on counting devices (make_cpu_device({.rehearsal = true}): buffers counted, not
// backed) forward + backward run the real schedule without touching memory (every tensor is
// passed with nullptr data, so any touch would crash), and every rank's allocator sees exactly
// what it sees in the real (backed) run of the same config: the same peak per tag, per phase
// and in total, the same live bytes per tag at the total peak, and the same number of
// allocations. This is what lets a budget be checked before a long run starts (STYLE.md habit 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "attention/block_harness.h"
#include "untied/core/allocator.h"

namespace untied::attntest {
namespace {

struct RehearsalCase {
  BlockDims d;
  RunSpec spec;
};

std::vector<RehearsalCase> rehearsal_cases() {
  auto d = [](int64_t H, int64_t G) {
    return BlockDims{.seq = 48, .hidden = 32, .heads = H, .kv_heads = G, .head_dim = 16, .theta = 10000.0};
  };
  std::vector<RehearsalCase> c;
  for (DType t : {DType::kF32, DType::kBF16}) {
    c.push_back({d(8, 2), {.strategy = Strategy::kLocal, .ranks = 1, .dtype = t}});
    c.push_back({d(8, 2), {.strategy = Strategy::kUlysses, .ranks = 2, .dtype = t}});
    c.push_back({d(8, 2), {.strategy = Strategy::kUlysses, .ranks = 4, .dtype = t}});
    c.push_back({d(8, 2), {.strategy = Strategy::kUPipe, .ranks = 4, .upipe_heads = 4, .dtype = t}});   // G < C
    c.push_back({d(8, 2), {.strategy = Strategy::kUPipe, .ranks = 4, .upipe_heads = 8, .dtype = t}});
    c.push_back({d(8, 1), {.strategy = Strategy::kUPipe, .ranks = 8, .upipe_heads = 8, .dtype = t}});
    c.push_back({d(16, 4), {.strategy = Strategy::kUPipe, .ranks = 4, .upipe_heads = 8, .dtype = t}});
    c.push_back({d(6, 3), {.strategy = Strategy::kUPipe, .ranks = 3, .upipe_heads = 3, .dtype = t}});
    c.push_back({d(8, 2), {.strategy = Strategy::kUPipe, .ranks = 4, .upipe_heads = 4, .dtype = t, .overlap = true}});
    c.push_back({d(16, 4), {.strategy = Strategy::kUPipe, .ranks = 4, .upipe_heads = 8, .dtype = t, .overlap = true}});
    c.push_back({d(6, 3), {.strategy = Strategy::kUPipe, .ranks = 3, .upipe_heads = 3, .dtype = t, .overlap = true}});
  }
  return c;
}

std::string tag_list(const std::array<int64_t, kNumTags>& a) {
  std::string s;
  for (int i = 0; i < kNumTags; ++i)
    if (a[i] != 0) s += std::string(s.empty() ? "" : ", ") + std::string(tag_name(static_cast<Tag>(i))) + " " +
                        std::to_string(a[i]);
  return s.empty() ? "none" : s;
}

TEST(AttentionRehearsal, CountsExactlyWhatTheRealRunAllocates) {
  for (const RehearsalCase& c : rehearsal_cases()) {
    const BlockInputs in = random_inputs(c.d, 3, c.spec.dtype);
    RunSpec rehearse = c.spec;
    rehearse.rehearsal = true;
    const BlockRun real = run_block(in, c.spec);
    const BlockRun counted = run_block(in, rehearse);  // would crash if it touched memory
    const std::string label = "H=" + std::to_string(c.d.heads) + " G=" + std::to_string(c.d.kv_heads) + " " +
                              c.spec.name();
    // One failure per case, naming the first rank that differs and every counter that does.
    std::string diff;
    int first_bad_rank = -1, bad_ranks = 0;
    for (int r = 0; r < c.spec.ranks; ++r) {
      const MemoryStats& a = real.stats[r];
      const MemoryStats& b = counted.stats[r];
      std::string d;
      if (a.peak != b.peak) d += "\n    peak per tag: real {" + tag_list(a.peak) + "}, rehearsal {" + tag_list(b.peak) + "}";
      if (a.peak_total != b.peak_total)
        d += "\n    peak total: real " + std::to_string(a.peak_total) + ", rehearsal " + std::to_string(b.peak_total);
      if (a.at_total_peak != b.at_total_peak)
        d += "\n    live at the total peak: real {" + tag_list(a.at_total_peak) + "}, rehearsal {" +
             tag_list(b.at_total_peak) + "}";
      for (int ph = 0; ph < kNumPhases; ++ph)
        if (a.phase_peak[ph] != b.phase_peak[ph])
          d += "\n    " + std::string(phase_name(static_cast<Phase>(ph))) + " peak: real {" + tag_list(a.phase_peak[ph]) +
               "}, rehearsal {" + tag_list(b.phase_peak[ph]) + "}";
      if (a.num_allocations != b.num_allocations)
        d += "\n    allocations: real " + std::to_string(a.num_allocations) + ", rehearsal " +
             std::to_string(b.num_allocations);
      if (real.stats_after_forward[r].live != counted.stats_after_forward[r].live)
        d += "\n    kept by forward for backward: real {" + tag_list(real.stats_after_forward[r].live) +
             "}, rehearsal {" + tag_list(counted.stats_after_forward[r].live) + "}";
      if (a.live_total != 0 || b.live_total != 0)
        d += "\n    still live after backward: real {" + tag_list(a.live) + "}, rehearsal {" + tag_list(b.live) + "}";
      if (!d.empty()) {
        ++bad_ranks;
        if (first_bad_rank < 0) {
          first_bad_rank = r;
          diff = d;
        }
      }
    }
    EXPECT_EQ(bad_ranks, 0) << label << ": rehearsal differs from the real run on " << bad_ranks << " of "
                            << c.spec.ranks << " ranks; rank " << first_bad_rank << ":" << diff;
    std::printf("  %-34s rank 0 peak %s | total %lld, %lld allocations\n", label.c_str(),
                tag_list(counted.stats[0].peak).c_str(), static_cast<long long>(counted.stats[0].peak_total),
                static_cast<long long>(counted.stats[0].num_allocations));
  }
}

// What --overlap costs: the next stage's exchange buffers, live beside the stage in progress. At
// most one stage's worth, and only in the phases that hold a stage: the backward's inputs (q
// send and receive, dO send and receive in the block's dtype, D send and receive in fp32, and at
// a round's start k and v send and receive) bound what any phase may grow by.
TEST(AttentionRehearsal, OverlapCostsAtMostOneMoreStage) {
  auto d = [](int64_t H, int64_t G) {
    return BlockDims{.seq = 48, .hidden = 32, .heads = H, .kv_heads = G, .head_dim = 16, .theta = 10000.0};
  };
  struct Case {
    BlockDims d;
    int C;
    int64_t U;
  };
  for (DType t : {DType::kF32, DType::kBF16})
    for (const Case& c : {Case{d(8, 2), 4, 4}, Case{d(16, 4), 4, 8}, Case{d(6, 3), 3, 3}, Case{d(8, 8), 2, 2}}) {
      const BlockInputs in = random_inputs(c.d, 3, t);
      RunSpec spec{.strategy = Strategy::kUPipe, .ranks = c.C, .upipe_heads = c.U, .dtype = t, .rehearsal = true};
      const BlockRun plain = run_block(in, spec);
      spec.overlap = true;
      const BlockRun over = run_block(in, spec);
      const int64_t S = c.d.seq, D = c.d.head_dim, es = dtype_size(t);
      const int64_t u = over.stage_heads / c.C;                  // query heads per rank and stage
      const int64_t w = std::max<int64_t>(1, c.d.kv_heads / c.C);  // KV heads per rank (at most)
      const int64_t stage = 2 * (S * u * D * es) * 2 + 2 * (u * S * 4) + 2 * 2 * (S * w * D * es);
      const int64_t grow = over.stats[0].peak_total - plain.stats[0].peak_total;
      EXPECT_GT(grow, 0) << spec.name() << ": overlap holds more buffers, so the peak must grow";
      EXPECT_LE(grow, stage) << spec.name() << ": overlap grew the peak by " << grow << " B, more than one stage ("
                             << stage << " B)";
      std::printf("  H=%lld G=%lld %-28s peak %lld -> %lld B (+%lld; one stage's inputs %lld B)\n",
                  static_cast<long long>(c.d.heads), static_cast<long long>(c.d.kv_heads), spec.name().c_str(),
                  static_cast<long long>(plain.stats[0].peak_total), static_cast<long long>(over.stats[0].peak_total),
                  static_cast<long long>(grow), static_cast<long long>(stage));
    }
}

}  // namespace
}  // namespace untied::attntest
