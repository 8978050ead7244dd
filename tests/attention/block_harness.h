// Test harness for the attention block: global inputs of one problem, a runner that drives the
// block on C in-process ranks (one thread, one CPU device of 1 thread each) and gathers what
// every rank produced, the fp64 reference of the same problem, and the one comparison every
// attention test uses (STYLE.md habit 7: a failure prints the max error and the first
// mismatching elements; the exit code tells the truth).
//
// Gathering: y and dx are (S, E) with rank r's (L, E) rows at its positions (token_layout.h:
// r*L.. without a ring; with one, the zig-zag segments), and x, dy are handed out the same way. The weight gradients are
// local partial sums per rank (attention_block.h); the harness sums them over ranks in fp64, in
// rank order, and also keeps sum_r |partial_r| per element, which bounds what rounding each
// partial to its storage type can cost (see partial_sum_floor).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention/block_reference.h"
#include "common/compare.h"
#include "untied/attention/attention_block.h"
#include "untied/core/allocator.h"
#include "untied/core/dtype.h"

namespace untied::attntest {

using blockref::BlockDims;

// ---- tolerances (STYLE.md habit 8) ---------------------------------------------------------
//
// Every comparison has the form  err(candidate) <= kErrFactor * baseline + floor, where the
// baseline is an error measured on this very problem at the candidate's precision (which
// baseline, and why, is written at each use). kErrFactor = 4:
//   * For a strategy against `local`:  |s - l| <= |s - exact| + |l - exact|. A strategy runs the
//     same kernels as `local` in the same precision; it differs only in how sums are blocked
//     (per-head GEMMs instead of one GEMM over all heads, a sum over L rows per rank instead of
//     S, KV-replica gradients accumulated in fp32, dx accumulated head by head), each of which
//     costs about one extra rounding per element, not a different error growth. So
//     |s - exact| <= ~3 |l - exact| and |s - l| <= 4 |l - exact|.
//   * For `local` against the fp64 reference, with the naive fp32 loop as the baseline: the
//     same argument as the kernel tests (tests/kernels/test_util.h): blocked GEMMs and an online
//     softmax cost about one extra rounding per element each.
// A wrong head pairing, a wrong position or a lost replica gradient errs by O(magnitude), which
// is 10^3..10^6 times these tolerances.
inline constexpr double kErrFactor = 4.0;
// Floor in units of FLT_EPSILON x max|expected|: covers a baseline that is ~0 by luck; four
// roundings of the largest value (2 FLT_EPSILON), far below any real error.
inline constexpr double kFloorUlps = 2.0;
// Unit roundoff of bf16 storage (8 significant bits): storing x costs at most 2^-8 |x|.
inline constexpr double kBf16UnitRoundoff = 1.0 / 256.0;
// Unit roundoff of f32 storage.
inline constexpr double kF32UnitRoundoff = 1.0 / 16777216.0;

// The comparisons are the shared ones (tests/common/compare.h: one rule for NaN and infinities).
using test::bitwise_equal;
using test::count_identical;
using test::max_abs;
using test::max_abs_error;

// Checks max |actual - expected| <= tol (test::expect_close); `cols` is the row length (prints
// (row, col) of mismatches), `how_tol` how tol was derived. Prints one line with the measured error
// and tolerance either way (the numbers quoted in reports).
inline ::testing::AssertionResult expect_within(const std::string& what, const std::vector<double>& actual,
                                                const std::vector<double>& expected, double tol, int64_t cols,
                                                const std::string& how_tol) {
  const int64_t rows = cols > 0 ? static_cast<int64_t>(expected.size()) / cols : 0;
  return test::expect_close(what, actual, expected, tol, test::CheckOptions{.dims = {rows, cols}, .note = how_tol});
}

// ---- the problem -----------------------------------------------------------------------------

// The six tensors the tests compare, in a fixed order, with their names and row lengths.
inline constexpr int kNumOutputs = 6;
inline constexpr std::array<const char*, kNumOutputs> kOutputNames = {"y", "dx", "dwq", "dwk", "dwv", "dwo"};
int64_t output_cols(const BlockDims& d, int i);  // E for y, dx, dwq, dwk, dwv; H*D for dwo
using Outputs = std::array<std::vector<double>, kNumOutputs>;

// Global inputs of one problem. Values are exactly representable in the storage type they were
// made for (random_inputs), so f32 and bf16 runs see the same numbers when made for bf16.
struct BlockInputs {
  BlockDims dims;
  std::vector<double> x, dy;          // (S, E)
  std::vector<double> wq, wk, wv, wo;  // the standard layout (attention_block.h)
};

// x, dy ~ N(0, 1); wq, wk, wv ~ N(0, 1/E) and wo ~ N(0, 1/(H*D)), so q, k, v, attention scores
// and y are O(1): softmax neither uniform nor one-hot. Each value rounded through `exact_in`.
BlockInputs random_inputs(const BlockDims& d, uint64_t seed, DType exact_in);

// The fp64 reference (T = double) or the naive fp32 loop (T = float) on these inputs.
Outputs reference_outputs(const BlockInputs& in, bool fp64);

struct RunSpec {
  Strategy strategy = Strategy::kLocal;
  int ranks = 1;
  int64_t upipe_heads = 0;  // U; 0 = C
  int64_t ring = 1;         // R: ulysses/upipe across R ring groups (strategy kRing: R = ranks)
  DType dtype = DType::kF32;
  bool overlap = false;     // AttentionConfig::overlap (upipe: the next stage in flight)
  bool keep_last = false;   // AttentionSaved::keep_last_stage (upipe: the last stage's q, k, v kept)
  bool early_delta = true;  // AttentionConfig::early_delta (the saved output freed before the stages)
  int64_t input_tile = 0;   // > 0: x given as a TiledInput of this many rows (copied from x's rows)
  int64_t grad_tile = 0;    // > 0: dx handed out as a TiledGrad of this many rows (written into dx's rows)
  bool grads_on_host = false;  // with grad_tile: the kept gradients in host memory (TiledGrad::host)
  int64_t output_tile = 0;  // > 0 (with input_tile): y handed out as a TiledOutput of this many rows
  bool out_on_host = false;  // with output_tile: the saved attention output in host memory (TiledOutput::host)
  int64_t dy_tile = 0;      // > 0 (with grad_tile and input_tile): dy given as a TiledInput of this many rows
  bool rehearsal = false;   // counting devices; every tensor passed with nullptr data
  bool gpu = false;         // every rank on its own CUDA device on GPU 0 (the in-process ranks
                            // share it); inputs copied there, outputs copied back
  std::string name() const;  // "upipe C=4 U=8 f32 overlap gpu"
  // The ranks of one Ulysses group (1 for the ring strategy; ranks / ring otherwise).
  int group() const { return strategy == Strategy::kRing ? 1 : static_cast<int>(ranks / ring); }
};

struct BlockRun {
  Outputs out;                           // gathered; weight gradients summed over ranks (fp64)
  Outputs abs_partials;                  // y, dx: |value|; dw*: sum over ranks of |partial|
  std::vector<Outputs> per_rank;         // what each rank wrote, exactly (for bit identity)
  std::vector<MemoryStats> stats;        // per rank, after forward + backward
  std::vector<MemoryStats> stats_after_forward;
  int64_t stage_heads = 0;
};

// Runs forward then backward of `spec` on in-process ranks. Throws what the block throws.
BlockRun run_block(const BlockInputs& in, const RunSpec& spec);

// What rounding the per-rank partial sums of a weight gradient to `storage` can cost, fp64
// summed: each rank stores its partial once, and accumulates `stored_adds` more contributions
// into it in storage (KV replicas on one rank), each store rounding by at most u |partial|:
//   (1 + stored_adds) * u * max_i sum_r |partial_r,i|.
double partial_sum_floor(const std::vector<double>& abs_partials, DType storage, int64_t stored_adds);

// Stores of each rank's partial weight gradient beyond the first (KV replicas held by one rank
// accumulate into the same rows): kv_eff / G - 1 for dwk, dwv (outputs 3, 4); 0 otherwise.
int64_t stored_adds(const BlockDims& d, int C, int output);

}  // namespace untied::attntest
