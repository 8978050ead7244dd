// Weights in the standard (Hugging Face Llama) layout work unchanged under every strategy.
//
// paper.md §3.5: the official UPipe code pairs contiguous Wq rows with out-of-order KV heads and
// relabels the outputs, which is a valid model only when trained from scratch; a checkpoint
// trained elsewhere would silently compute something else. untied selects rows instead
// (head_schedule.h). Two checks:
//   1. A checkpoint-like weight set, whose heads differ strongly from each other (per-head score
//      scales and value offsets, so any mispairing changes y by O(1)), gives the same y under
//      upipe with GQA (H=8, G=2, C=4, U=4, and others) as under local and as the fp64 reference.
//   2. Head isolation: with only query head h's rows of wq and columns of wo non-zero, y depends
//      only on h's KV head h / (H/G): zeroing every other KV head's wk/wv rows leaves y
//      unchanged, and zeroing h's own KV head changes it (the check has power). A schedule that
//      pairs h with the wrong KV head fails one or the other.
// Tolerances: as in attention_block_test.cc (block_harness.h): 4 x |local - fp64| + floor.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention/block_harness.h"
#include "untied/attention/attention_block.h"

namespace untied::attntest {
namespace {

struct WeightCase {
  int64_t H, G;
  int C;
  Strategy strategy;
  int64_t U;
};

std::string name(const WeightCase& c) {
  RunSpec s{.strategy = c.strategy, .ranks = c.C, .upipe_heads = c.U};
  return "H=" + std::to_string(c.H) + " G=" + std::to_string(c.G) + " " + s.name();
}

const std::vector<WeightCase>& cases() {
  static const std::vector<WeightCase> c = {
      {8, 2, 4, Strategy::kUPipe, 4},    // the brief's case: replicated KV (G < C), g = 4
      {8, 2, 4, Strategy::kUPipe, 8},
      {8, 2, 4, Strategy::kUlysses, 0},
      {8, 2, 2, Strategy::kUPipe, 2},    // G = C
      {8, 4, 8, Strategy::kUPipe, 8},    // replicated x2
      {16, 4, 4, Strategy::kUPipe, 4},   // the paper's example
      {16, 4, 4, Strategy::kUPipe, 8},   // two query heads per rank per stage
      {16, 8, 4, Strategy::kUPipe, 8},   // two KV heads resident per rank
      {6, 3, 3, Strategy::kUPipe, 3},
      {6, 1, 3, Strategy::kUPipe, 6},
  };
  return c;
}

BlockDims dims_for(const WeightCase& c) {
  return BlockDims{.seq = 48, .hidden = 32, .heads = c.H, .kv_heads = c.G, .head_dim = 16, .theta = 500000.0};
}

// Heads that differ from each other the way trained heads do: query head h's scores are scaled
// by 0.5 * 4^(h/(H-1)) (from diffuse to sharp), KV head k's values carry an offset (k+1) along
// a direction of its own. Standard layout, nothing permuted.
BlockInputs checkpoint_like(const BlockDims& d) {
  BlockInputs in = random_inputs(d, 99, DType::kF32);
  const int64_t E = d.hidden, D = d.head_dim, H = d.heads, G = d.kv_heads;
  for (int64_t h = 0; h < H; ++h) {
    const double scale = 0.5 * std::pow(4.0, H > 1 ? static_cast<double>(h) / (H - 1) : 0.0);
    for (int64_t i = h * D * E; i < (h + 1) * D * E; ++i) in.wq[i] = static_cast<float>(in.wq[i] * scale);
  }
  for (int64_t k = 0; k < G; ++k)
    for (int64_t c = 0; c < D; ++c)
      in.wv[(k * D + c) * E + (k + c) % E] += static_cast<float>((k + 1) * 0.5);
  return in;
}

TEST(AttentionWeights, StandardLayoutCheckpointGivesLocalsOutput) {
  for (const WeightCase& c : cases()) {
    const BlockDims d = dims_for(c);
    const BlockInputs in = checkpoint_like(d);
    const Outputs ref = reference_outputs(in, true);
    const BlockRun local = run_block(in, RunSpec{.strategy = Strategy::kLocal});
    const BlockRun run = run_block(in, RunSpec{.strategy = c.strategy, .ranks = c.C, .upipe_heads = c.U});
    const double base = max_abs_error(local.out[0], ref[0]);
    const double floor = kFloorUlps * FLT_EPSILON * max_abs(ref[0]);
    char how[64];
    std::snprintf(how, sizeof how, "4 x |local - fp64| %.2e + floor", base);
    EXPECT_TRUE(expect_within(name(c) + " y vs local", run.out[0], local.out[0], kErrFactor * base + floor, d.hidden,
                              how));
    // Against the fp64 reference: |s - ref| <= |s - local| + |local - ref| <= (4 + 1) base + floor.
    EXPECT_TRUE(expect_within(name(c) + " y vs fp64", run.out[0], ref[0], (kErrFactor + 1) * base + floor, d.hidden,
                              "5 x |local - fp64| + floor"));
  }
}

// The check above has power: swapping the wq rows of two query heads that belong to different KV
// groups (what a mispairing amounts to) moves y by far more than the tolerance.
TEST(AttentionWeights, MispairedHeadsWouldBeCaught) {
  const WeightCase c = cases()[0];
  const BlockDims d = dims_for(c);
  const BlockInputs in = checkpoint_like(d);
  BlockInputs swapped = in;
  const int64_t D = d.head_dim, E = d.hidden, a = 0, b = d.heads / d.kv_heads;  // heads 0 and g: KV 0 and 1
  for (int64_t i = 0; i < D * E; ++i) std::swap(swapped.wq[a * D * E + i], swapped.wq[b * D * E + i]);
  const Outputs ref = reference_outputs(in, true), wrong = reference_outputs(swapped, true);
  const BlockRun local = run_block(in, RunSpec{.strategy = Strategy::kLocal});
  const double tol = kErrFactor * max_abs_error(local.out[0], ref[0]) + kFloorUlps * FLT_EPSILON * max_abs(ref[0]);
  const double moved = max_abs_error(wrong[0], ref[0]);
  std::printf("  swapping query heads %lld and %lld moves y by %.3e; tolerance %.3e (ratio %.1e)\n",
              static_cast<long long>(a), static_cast<long long>(b), moved, tol, moved / tol);
  EXPECT_GT(moved, 1000 * tol);
}

TEST(AttentionWeights, QueryHeadReadsOnlyItsOwnKvHead) {
  for (const WeightCase& c : cases()) {
    const BlockDims d = dims_for(c);
    const int64_t H = d.heads, G = d.kv_heads, D = d.head_dim, E = d.hidden, g = H / G;
    const BlockInputs full = random_inputs(d, 5, DType::kF32);
    int64_t bitwise_same = 0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t own = h / g;
      // Only query head h: its wq rows and its wo columns; everything else zero.
      BlockInputs in = full;
      for (int64_t r = 0; r < H * D; ++r)
        if (r / D != h)
          for (int64_t e = 0; e < E; ++e) {
            in.wq[r * E + e] = 0;
            in.wo[e * H * D + r] = 0;
          }
      auto zero_kv = [&](BlockInputs& x, auto pred) {
        for (int64_t r = 0; r < G * D; ++r)
          if (pred(r / D))
            for (int64_t e = 0; e < E; ++e) x.wk[r * E + e] = x.wv[r * E + e] = 0;
      };
      BlockInputs others_zero = in, own_zero = in;
      zero_kv(others_zero, [&](int64_t k) { return k != own; });
      zero_kv(own_zero, [&](int64_t k) { return k == own; });

      const RunSpec spec{.strategy = c.strategy, .ranks = c.C, .upipe_heads = c.U};
      const BlockRun base = run_block(in, spec);
      const BlockRun without_others = run_block(others_zero, spec);
      const BlockRun without_own = run_block(own_zero, spec);
      const std::string what = name(c) + " query head " + std::to_string(h) + " (KV head " + std::to_string(own) + ")";

      // The output is head h's alone: it equals local and the fp64 reference of this weight set.
      const Outputs ref = reference_outputs(in, true);
      const BlockRun local = run_block(in, RunSpec{.strategy = Strategy::kLocal});
      const double tol = kErrFactor * max_abs_error(local.out[0], ref[0]) + kFloorUlps * FLT_EPSILON * max_abs(ref[0]);
      EXPECT_TRUE(expect_within(what + " y vs local", base.out[0], local.out[0], tol, E, "4 x |local - fp64| + floor"));
      // Other KV heads do not matter. Their contribution is multiplied by exact zeros in wo, so
      // y is expected bitwise unchanged; require it within four roundings of max|y|.
      const double scale = max_abs(base.out[0]);
      EXPECT_TRUE(expect_within(what + " y without other KV heads", without_others.out[0], base.out[0],
                                kFloorUlps * FLT_EPSILON * scale, E, "2 FLT_EPSILON max|y|"));
      bitwise_same += bitwise_equal(without_others.out[0], base.out[0]);
      // Its own KV head does: with k = v = 0 the head's output is exactly zero.
      const double moved = max_abs_error(without_own.out[0], base.out[0]);
      EXPECT_GT(moved, 0.5 * scale) << what << ": zeroing its own KV head moved y by only " << moved
                                    << " (max|y| " << scale << "): the head does not read KV head " << own;
    }
    std::printf("  %s: y bitwise unchanged without the other KV heads for %lld / %lld query heads\n",
                name(c).c_str(), static_cast<long long>(bitwise_same), static_cast<long long>(H));
  }
}

}  // namespace
}  // namespace untied::attntest
