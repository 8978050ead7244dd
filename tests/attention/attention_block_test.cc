// Every strategy of the attention block against `local` on one rank, and `local` against a naive
// fp64 implementation of the whole block (block_reference.h). STYLE.md habits 7-8.
//
// What is compared: y, dx and the four weight gradients (dwq, dwk, dwv, dwo summed over ranks,
// since each rank returns its local partial sum).
//
// Tolerances (constants and their reasons in block_harness.h):
//   * local (fp32) vs fp64:    err <= 4 x err(naive fp32 loop vs fp64) + 2 FLT_EPSILON max|ref|.
//   * strategy vs local (fp32): |s - l| <= 4 x err(local vs fp64) + 2 FLT_EPSILON max|l|
//                               (+ for weight gradients, what storing each rank's partial sum in
//                               fp32 can cost: partial_sum_floor).
//   * bf16 storage, inputs exact in bf16:  |s_bf16 - l_fp32| <= 4 x |l_bf16 - l_fp32| + the same
//     floors with bf16's unit roundoff for the partial sums: a strategy stores the same
//     intermediates in bf16 as `local` does (q, k, v, attention output, dq), so its error from
//     the fp32 result is of the same size as local's own.
// Bit identity: not required between local and the head pipeline (OpenBLAS's GEMM summation
// order depends on the matrix shape: per-rank rows, per-head columns), whose difference is bounded
// instead by what a different summation order can cost (DiffersFromLocalOnlyInSummationOrder);
// required where it must hold: upipe at U = H vs ulysses (the same single stage of the same head
// blocks), and two runs of the same strategy (determinism).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attention/block_harness.h"
#include "common/random_inputs.h"
#include "untied/attention/attention_block.h"
#include "untied/attention/head_schedule.h"

namespace untied::attntest {
namespace {

constexpr uint64_t kSeed = 20240611;

BlockDims dims(int64_t S, int64_t E, int64_t H, int64_t G, int64_t D) {
  return BlockDims{.seq = S, .hidden = E, .heads = H, .kv_heads = G, .head_dim = D, .theta = 10000.0};
}

std::string dims_name(const BlockDims& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "S%lld_E%lld_H%lld_G%lld_D%lld", static_cast<long long>(d.seq),
                static_cast<long long>(d.hidden), static_cast<long long>(d.heads), static_cast<long long>(d.kv_heads),
                static_cast<long long>(d.head_dim));
  std::string s = buf;
  if (!d.doc_lens.empty()) {
    s += "_docs";
    for (const int64_t n : d.doc_lens) s += "_" + std::to_string(n);
    if (d.doc_lens.size() > 8) s = std::string(buf) + "_docs" + std::to_string(d.doc_lens.size());
  }
  if (d.window > 0) s += "_W" + std::to_string(d.window);
  return s;
}

BlockDims with_docs(BlockDims d, std::vector<int64_t> lens, int64_t window = 0) {
  d.doc_lens = std::move(lens);
  d.window = window;
  return d;
}

// One problem's inputs and the results every strategy is compared with, computed once.
struct Problem {
  BlockInputs in;
  Outputs ref64, naive32;  // fp32-exact inputs
  BlockRun local32;
  double local_tol[kNumOutputs] = {};  // strategy-vs-local tolerance per output, w/o partial floor
  // bf16-exact inputs: local in fp32 storage (the target) and in bf16 storage (the baseline).
  BlockInputs in_bf16;
  BlockRun local_on_bf16_inputs, local_bf16;
};

Problem& problem(const BlockDims& d) {
  static std::map<std::string, Problem> cache;
  const std::string key = dims_name(d);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Problem p;
  p.in = random_inputs(d, kSeed, DType::kF32);
  p.ref64 = reference_outputs(p.in, /*fp64=*/true);
  p.naive32 = reference_outputs(p.in, /*fp64=*/false);
  p.local32 = run_block(p.in, RunSpec{.strategy = Strategy::kLocal});
  p.in_bf16 = random_inputs(d, kSeed + 1, DType::kBF16);
  p.local_on_bf16_inputs = run_block(p.in_bf16, RunSpec{.strategy = Strategy::kLocal});
  p.local_bf16 = run_block(p.in_bf16, RunSpec{.strategy = Strategy::kLocal, .dtype = DType::kBF16});
  return cache.emplace(key, std::move(p)).first->second;
}

// ---- the fp64 reference checks itself -----------------------------------------------------------

// The analytic backward of the reference against central differences of f = sum(dy * y) along a
// random direction of one input at a time. Central differences err by c h^2 (truncation) plus
// ~eps |f| / h (rounding); with steps h and h/2 the truncation error of the h/2 estimate is
// |fd(h) - fd(h/2)| / 3, so |fd(h/2) - analytic| <= |fd(h) - fd(h/2)| + 64 eps_64 sum|terms| / h
// holds with a 3x margin when the analytic gradient is right, and fails by O(1) when it is not.
TEST(BlockReference, BackwardMatchesFiniteDifferences) {
  for (const BlockDims& d : {dims(12, 8, 4, 2, 4), dims(10, 6, 4, 1, 6), dims(9, 8, 3, 3, 2)}) {
    BlockInputs in = random_inputs(d, 7, DType::kF32);
    const Outputs g = reference_outputs(in, true);
    test::Rng rng(11);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double>* targets[] = {&in.x, &in.wq, &in.wk, &in.wv, &in.wo};
    const int grad_of[] = {1, 2, 3, 4, 5};
    const char* names[] = {"x", "wq", "wk", "wv", "wo"};
    for (int t = 0; t < 5; ++t) {
      std::vector<double>& v = *targets[t];
      std::vector<double> dir(v.size());
      for (double& a : dir) a = nd(rng);
      double analytic = 0;
      for (size_t i = 0; i < v.size(); ++i) analytic += g[grad_of[t]][i] * dir[i];
      const std::vector<double> base = v;
      auto f = [&](double h) {
        for (size_t i = 0; i < v.size(); ++i) v[i] = base[i] + h * dir[i];
        blockref::BlockWeights<double> w{in.wq, in.wk, in.wv, in.wo};
        const std::vector<double> y = blockref::block_forward(d, in.x, w);
        double s = 0, mag = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          s += in.dy[i] * y[i];
          mag += std::fabs(in.dy[i] * y[i]);
        }
        v = base;
        return std::pair{s, mag};
      };
      const double h = 1e-4;
      auto [fp1, mag] = f(h);
      auto [fm1, m2] = f(-h);
      auto [fp2, m3] = f(h / 2);
      auto [fm2, m4] = f(-h / 2);
      const double fd1 = (fp1 - fm1) / (2 * h), fd2 = (fp2 - fm2) / h;
      const double tol = std::fabs(fd1 - fd2) + 64 * DBL_EPSILON * mag / h;
      std::printf("  %-22s d/d%-2s analytic %+.12e  fd %+.12e  err %.2e  tol %.2e\n", dims_name(d).c_str(), names[t],
                  analytic, fd2, std::fabs(fd2 - analytic), tol);
      EXPECT_LE(std::fabs(fd2 - analytic), tol) << dims_name(d) << " gradient wrt " << names[t];
      (void)m2, (void)m3, (void)m4;
    }
  }
}

// ---- local against the fp64 reference -----------------------------------------------------------

const std::vector<BlockDims>& all_problems() {
  static const std::vector<BlockDims> p = {
      dims(48, 32, 8, 8, 16), dims(48, 32, 8, 4, 16), dims(48, 32, 8, 2, 16), dims(48, 32, 8, 1, 16),
      dims(48, 32, 6, 6, 16), dims(48, 32, 6, 3, 16), dims(48, 32, 6, 1, 16),
      dims(64, 32, 16, 4, 16), dims(64, 32, 16, 2, 16),
      dims(96, 64, 8, 2, 32),
  };
  return p;
}

// Packed documents and windows, S = 48 (divisible by C in {1, 2, 3, 4, 8} and by 2RC for every ring
// below): boundaries inside a shard and exactly at shard boundaries (12, 24 and 36 for C = 4 and 8;
// 24 for C = 2; 16 and 32 for C = 3), a one-token document, documents longer than a shard, many tiny
// documents; GQA (g = 4) and replicated KV (G = 1 < C); a window alone and with documents.
const std::vector<BlockDims>& masked_problems() {
  std::vector<int64_t> tiny;
  for (int i = 0; i < 24; ++i) tiny.push_back(1 + i % 3);  // 1, 2, 3, ... = 48 tokens
  static const std::vector<BlockDims> p = {
      with_docs(dims(48, 32, 8, 2, 16), {5, 7, 12, 1, 7, 4, 12}),  // starts 0 5 12 24 25 32 36
      with_docs(dims(48, 32, 8, 1, 16), {30, 1, 1, 16}),
      with_docs(dims(48, 32, 8, 2, 16), tiny),
      with_docs(dims(48, 32, 6, 3, 16), {16, 16, 3, 13}),
      with_docs(dims(48, 32, 8, 2, 16), {}, 7),
      with_docs(dims(48, 32, 8, 2, 16), {5, 7, 12, 1, 7, 4, 12}, 5),
  };
  return p;
}

TEST(AttentionBlock, LocalMatchesFp64Reference) {
  std::vector<BlockDims> problems = all_problems();
  problems.insert(problems.end(), masked_problems().begin(), masked_problems().end());
  for (const BlockDims& d : problems) {
    Problem& p = problem(d);
    for (int i = 0; i < kNumOutputs; ++i) {
      const double base = max_abs_error(p.naive32[i], p.ref64[i]);
      const double tol = kErrFactor * base + kFloorUlps * FLT_EPSILON * max_abs(p.ref64[i]);
      char how[64];
      std::snprintf(how, sizeof how, "4 x |naive f32 - fp64| %.2e + floor", base);
      EXPECT_TRUE(expect_within("local f32 vs fp64 " + dims_name(d) + " " + kOutputNames[i], p.local32.out[i],
                                p.ref64[i], tol, output_cols(d, i), how));
    }
  }
}

// ---- every strategy against local --------------------------------------------------------------

struct StrategyCase {
  BlockDims d;
  RunSpec spec;
};

std::string case_name(const StrategyCase& c) {
  std::string s = dims_name(c.d) + "_C" + std::to_string(c.spec.ranks) + "_" +
                  std::string(strategy_name(c.spec.strategy));
  if (c.spec.strategy == Strategy::kUPipe)
    s += "_U" + std::to_string(c.spec.upipe_heads > 0 ? c.spec.upipe_heads : c.spec.ranks / c.spec.ring);
  if (c.spec.ring > 1) s += "_R" + std::to_string(c.spec.ring);
  return s + "_" + std::string(dtype_name(c.spec.dtype));
}

bool valid(const BlockDims& d, const RunSpec& s) {
  const AttentionConfig cfg{.seq = d.seq, .hidden = d.hidden, .heads = d.heads, .kv_heads = d.kv_heads,
                            .head_dim = d.head_dim, .dtype = s.dtype, .strategy = s.strategy,
                            .upipe_heads = s.upipe_heads, .ring = s.ring};
  return validate(cfg, s.ranks).ok();
}

// For each problem and C in {1, 2, 3, 4, 8} that the heads allow: ulysses, and upipe at
// U = C, 2C, 4C where valid.
std::vector<StrategyCase> strategy_cases(DType t, const std::vector<BlockDims>& problems) {
  std::vector<StrategyCase> out;
  for (const BlockDims& d : problems)
    for (int C : {1, 2, 3, 4, 8}) {
      if (d.seq % C != 0) continue;
      if (t == DType::kBF16 && (C == 1 || d.heads == 16)) continue;  // bf16: a representative subset
      RunSpec ul{.strategy = Strategy::kUlysses, .ranks = C, .dtype = t};
      if (valid(d, ul)) out.push_back({d, ul});
      for (int64_t U : {C, 2 * C, 4 * C}) {
        if (t == DType::kBF16 && U == 4 * C) continue;
        RunSpec up{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = U, .dtype = t};
        if (valid(d, up)) out.push_back({d, up});
      }
    }
  // Ring and the Ulysses x ring hybrid: R in {2, 3, 4} ring groups of C in {1, 2, 4} ranks, up to 8
  // ranks (odd R included); ring (C = 1), and ulysses / upipe (U = C) across the groups.
  for (const BlockDims& d : problems)
    for (int R : {2, 3, 4})
      for (int C : {1, 2, 4}) {
        if (R * C > 8) continue;
        if (t == DType::kBF16 && (d.heads == 16 || d.kv_heads == 1)) continue;  // bf16: a representative subset
        if (C == 1) {
          RunSpec ring{.strategy = Strategy::kRing, .ranks = R, .dtype = t};
          if (valid(d, ring)) out.push_back({d, ring});
        }
        RunSpec ul{.strategy = Strategy::kUlysses, .ranks = R * C, .ring = R, .dtype = t};
        if (C > 1 && valid(d, ul)) out.push_back({d, ul});
        RunSpec up{.strategy = Strategy::kUPipe, .ranks = R * C, .upipe_heads = C, .ring = R, .dtype = t};
        if (valid(d, up)) out.push_back({d, up});
      }
  return out;
}

class StrategyVsLocal : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(StrategyVsLocal, MatchesLocal) {
  const StrategyCase& c = GetParam();
  Problem& p = problem(c.d);
  const bool bf16 = c.spec.dtype == DType::kBF16;
  const BlockRun run = run_block(bf16 ? p.in_bf16 : p.in, c.spec);
  // The target is local in fp32; the baseline is local's own error at the strategy's precision.
  const Outputs& target = bf16 ? p.local_on_bf16_inputs.out : p.local32.out;
  const Outputs& baseline_of = bf16 ? p.local_bf16.out : p.local32.out;
  const Outputs& baseline_vs = bf16 ? p.local_on_bf16_inputs.out : p.ref64;
  for (int i = 0; i < kNumOutputs; ++i) {
    const double base = max_abs_error(baseline_of[i], baseline_vs[i]);
    const double floor = kFloorUlps * FLT_EPSILON * max_abs(target[i]);
    const double part = i >= 2 ? partial_sum_floor(run.abs_partials[i], c.spec.dtype, stored_adds(c.d, c.spec.group(), i))
                               : 0.0;
    const double tol = kErrFactor * base + floor + part;
    if (bf16)  // the figures of "bf16 error no worse than local's": both against local in f32
      std::printf("  bf16 drift %-6s %s: |strategy - f32| %.3e, |local bf16 - f32| %.3e, ratio %.3f\n",
                  kOutputNames[i], c.spec.name().c_str(), max_abs_error(run.out[i], target[i]), base,
                  base > 0 ? max_abs_error(run.out[i], target[i]) / base : 0.0);
    char how[96];
    std::snprintf(how, sizeof how, "4 x %s %.2e + floor", bf16 ? "|local bf16 - f32|" : "|local - fp64|", base);
    EXPECT_TRUE(expect_within(dims_name(c.d) + " " + c.spec.name() + " " + kOutputNames[i], run.out[i], target[i], tol,
                              output_cols(c.d, i), how));
  }
  if (!bf16) {
    const int64_t same = count_identical(run.out[0], p.local32.out[0]);
    std::printf("  y bitwise identical to local: %lld / %zu\n", static_cast<long long>(same), run.out[0].size());
  }
}

INSTANTIATE_TEST_SUITE_P(F32, StrategyVsLocal, ::testing::ValuesIn(strategy_cases(DType::kF32, all_problems())),
                         [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(BF16, StrategyVsLocal, ::testing::ValuesIn(strategy_cases(DType::kBF16, all_problems())),
                         [](const auto& info) { return case_name(info.param); });
// Packed documents and windows: every strategy against local with the same mask (and local
// against the dense masked fp64 reference above).
INSTANTIATE_TEST_SUITE_P(MaskedF32, StrategyVsLocal,
                         ::testing::ValuesIn(strategy_cases(DType::kF32, masked_problems())),
                         [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(MaskedBF16, StrategyVsLocal,
                         ::testing::ValuesIn(strategy_cases(DType::kBF16, masked_problems())),
                         [](const auto& info) { return case_name(info.param); });

// The families the brief names must all be present (a guard against the case generator
// silently skipping them).
TEST(AttentionBlock, CaseListCoversTheFamilies) {
  const std::vector<StrategyCase> f32 = strategy_cases(DType::kF32, all_problems());
  auto has = [&](int64_t H, int64_t G, int C, Strategy s, int64_t U) {
    for (const StrategyCase& c : f32)
      if (c.d.heads == H && c.d.kv_heads == G && c.spec.ranks == C && c.spec.strategy == s &&
          (s != Strategy::kUPipe || c.spec.upipe_heads == U))
        return true;
    return false;
  };
  for (int C : {1, 2, 4, 8}) EXPECT_TRUE(has(8, 8, C, Strategy::kUlysses, 0)) << "C=" << C;
  EXPECT_TRUE(has(6, 6, 3, Strategy::kUlysses, 0));
  EXPECT_TRUE(has(6, 3, 3, Strategy::kUPipe, 3));
  EXPECT_TRUE(has(6, 1, 3, Strategy::kUPipe, 6));                                    // G < C, g = 6
  for (int64_t G : {8, 4, 2, 1}) EXPECT_TRUE(has(8, G, 2, Strategy::kUPipe, 2)) << "g=" << 8 / G;
  EXPECT_TRUE(has(8, 2, 4, Strategy::kUPipe, 4));                                    // replicated KV
  EXPECT_TRUE(has(8, 1, 8, Strategy::kUPipe, 8));                                    // replicated KV x8
  EXPECT_TRUE(has(16, 4, 4, Strategy::kUPipe, 4));
  EXPECT_TRUE(has(16, 4, 4, Strategy::kUPipe, 8));
  EXPECT_TRUE(has(16, 4, 4, Strategy::kUPipe, 16));                                  // U = 4C
  std::printf("  %zu f32 and %zu bf16 strategy cases\n", f32.size(), strategy_cases(DType::kBF16, all_problems()).size());
}

// ---- bit identity ------------------------------------------------------------------------------
//
// Two runs are asserted to give the same bits only where they run the same arithmetic in the same
// order: the same GEMMs (same shapes), our own kernels, copies. Where they make the same products
// but some in BLAS GEMMs of another shape, they are compared within the summation-order bound:
// OpenBLAS's AVX2 and AVX-512 kernels (Haswell, Zen, SkylakeX) order a dot product's terms by the
// matrix shape, its generic ones do not, so bit identity there would hold on some CPUs only.

// The summation-order bound of an output whose reference is `ref`. Every output is the end of a
// chain of at most 8 sums (the q/k/v projections, the attention's two key sums, P V, the output
// projection; in backward the same sums' gradients and the weight gradients over S tokens), each
// reordered sum costing at most a couple of roundings of its magnitude, which these weights
// (N(0, 1/E)) keep O(max |output|): so, f32, |a - b| <= 16 FLT_EPSILON max |ref| (measured against
// local, DiffersFromLocalOnlyInSummationOrder: <= 6.3; a wrong head, position or lost replica errs
// by O(max |ref|), 10^6 times more). bf16: four bf16 roundings of max |ref| (a sum that rounds to
// the neighbouring bf16 value, then carried through the attention).
inline constexpr double kSummationOrderUlps = 16.0;
std::string as_g(double x) {  // (%g: a difference of 1e-9 is not "0.000000")
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}
double summation_order_tol(DType t, const std::vector<double>& ref) {
  const double m = max_abs(ref);
  return t == DType::kF32 ? kSummationOrderUlps * FLT_EPSILON * m : 4.0 * kBf16UnitRoundoff * m;
}

bool all_bitwise_equal(const BlockRun& a, const BlockRun& b, std::string* which) {
  for (size_t r = 0; r < a.per_rank.size(); ++r)
    for (int i = 0; i < kNumOutputs; ++i)
      if (!bitwise_equal(a.per_rank[r][i], b.per_rank[r][i])) {
        *which = "rank " + std::to_string(r) + " " + kOutputNames[i] + " (" +
                 std::to_string(count_identical(a.per_rank[r][i], b.per_rank[r][i])) + " / " +
                 std::to_string(a.per_rank[r][i].size()) + " identical, max diff " +
                 as_g(max_abs_error(a.per_rank[r][i], b.per_rank[r][i])) + ")";
        return false;
      }
  return true;
}

// U = H is one stage of the same head blocks as ulysses: the same GEMMs, exchanges and kernel
// calls in the same order, so forward must be bitwise identical; and since upipe's recompute
// repeats the forward's arithmetic exactly, so must backward.
TEST(AttentionBlockBits, UPipeAtUEqualsHIsUlyssesBitwise) {
  for (auto [d, C] : {std::pair{dims(48, 32, 8, 2, 16), 4}, {dims(48, 32, 8, 8, 16), 2}, {dims(48, 32, 6, 1, 16), 3},
                      {dims(48, 32, 8, 1, 16), 8}, {dims(64, 32, 16, 4, 16), 4}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(d, kSeed, t);
      const BlockRun ul = run_block(in, RunSpec{.strategy = Strategy::kUlysses, .ranks = C, .dtype = t});
      const BlockRun up =
          run_block(in, RunSpec{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = d.heads, .dtype = t});
      EXPECT_TRUE(bitwise_equal(ul.out[0], up.out[0]))
          << dims_name(d) << " C=" << C << " " << dtype_name(t) << ": y differs, "
          << count_identical(ul.out[0], up.out[0]) << " / " << ul.out[0].size() << " identical";
      std::string which;
      EXPECT_TRUE(all_bitwise_equal(ul, up, &which))
          << dims_name(d) << " C=" << C << " " << dtype_name(t) << ": " << which;
    }
  }
}

TEST(AttentionBlockBits, RunsAreDeterministic) {
  for (auto [d, C, U] : {std::tuple{dims(48, 32, 8, 2, 16), 4, int64_t{4}}, {dims(48, 32, 8, 2, 16), 4, int64_t{8}},
                         {dims(48, 32, 8, 1, 16), 8, int64_t{8}}, {dims(48, 32, 6, 3, 16), 3, int64_t{3}},
                         {dims(64, 32, 16, 4, 16), 4, int64_t{8}}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(d, kSeed, t);
      const RunSpec spec{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = U, .dtype = t};
      const BlockRun a = run_block(in, spec), b = run_block(in, spec);
      std::string which;
      EXPECT_TRUE(all_bitwise_equal(a, b, &which)) << dims_name(d) << " " << spec.name() << ": " << which;
    }
  }
}

// UPipe layouts with several stages (C ranks, U heads per stage, R ring groups): odd ranks,
// several rounds of KV heads, a ring.
struct StagedCase {
  BlockDims d;
  int C;
  int64_t U, R;
};

// --overlap changes when each stage's projections and exchanges run, never what they compute,
// nor the order in which stages' gradients add into dx and the weight gradients: the same bits,
// forward and backward, on every rank (with a ring too: its exchanges run beside the stage's).
TEST(AttentionBlockBits, OverlapIsBitwiseTheSame) {
  for (const StagedCase& c :
       {StagedCase{dims(48, 32, 8, 2, 16), 2, 2, 1}, StagedCase{dims(48, 32, 8, 2, 16), 4, 4, 1},
        StagedCase{dims(48, 32, 8, 1, 16), 8, 8, 1}, StagedCase{dims(48, 32, 6, 3, 16), 3, 3, 1},
        StagedCase{dims(64, 32, 16, 4, 16), 4, 8, 1}, StagedCase{dims(48, 32, 8, 8, 16), 2, 2, 1},
        StagedCase{dims(48, 32, 8, 2, 16), 4, 2, 2}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = Strategy::kUPipe, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t};
      const BlockRun plain = run_block(in, spec);
      spec.overlap = true;
      const BlockRun overlapped = run_block(in, spec);
      ASSERT_GT(overlapped.stage_heads, 0);
      std::string which;
      EXPECT_TRUE(all_bitwise_equal(plain, overlapped, &which)) << dims_name(c.d) << " " << spec.name() << ": " << which;
    }
  }
}

// upipe's forward keeping its last stage's q, k and v for the backward (which starts with that
// stage) gives the bits of recomputing them there, forward and backward, on every rank: with
// overlap, a ring, several rounds of KV heads, dx by tiles with its gradients kept on the host, and
// x by tiles. What it keeps stays until the backward: never less memory.
TEST(AttentionBlockBits, KeptLastStageIsBitwiseTheSame) {
  for (const StagedCase& c :
       {StagedCase{dims(48, 32, 8, 2, 16), 2, 2, 1}, StagedCase{dims(48, 32, 6, 3, 16), 3, 3, 1},
        StagedCase{dims(64, 32, 16, 4, 16), 4, 8, 1}, StagedCase{dims(48, 32, 8, 8, 16), 2, 2, 1},
        StagedCase{dims(48, 32, 8, 2, 16), 4, 2, 2}}) {
    for (DType t : {DType::kF32, DType::kBF16})
      for (bool overlap : {false, true})
        for (int64_t tile : {int64_t{0}, int64_t{5}}) {
          const BlockInputs in = random_inputs(c.d, kSeed, t);
          RunSpec spec{.strategy = Strategy::kUPipe, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t,
                       .overlap = overlap, .input_tile = tile, .grad_tile = tile, .grads_on_host = tile > 0};
          const BlockRun recomputed = run_block(in, spec);
          spec.keep_last = true;
          const BlockRun kept = run_block(in, spec);
          ASSERT_GT(kept.stage_heads, 0);
          std::string which;
          EXPECT_TRUE(all_bitwise_equal(recomputed, kept, &which)) << dims_name(c.d) << " " << spec.name() << ": " << which;
          for (size_t r = 0; r < kept.stats.size(); ++r)
            EXPECT_GE(kept.stats[r].peak_total, recomputed.stats[r].peak_total) << dims_name(c.d) << " " << spec.name();
        }
  }
}

// D = rowsum(dO * O) of every head before the stages (the saved output then freed) or per stage:
// the same products (Ulysses and UPipe, with a ring too). y is the same bits (the forward does not
// change). The early D's dO comes from a projection of U heads' columns over the rank's rows, the
// per-stage D's from the stage's projection of every rank's block at once (project_blocks): GEMMs
// of other shapes, so with UPipe the gradients agree to the summation-order bound (Ulysses' one
// stage projects the same columns either way: the same bits, but not asserted).
TEST(AttentionBlockBits, EarlyDeltaMatchesLateDelta) {
  struct Case {
    BlockDims d;
    Strategy st;
    int C;
    int64_t U, R;
  };
  for (const Case& c : {Case{dims(48, 32, 8, 2, 16), Strategy::kUPipe, 4, 4, 1},
                        Case{dims(48, 32, 6, 3, 16), Strategy::kUPipe, 3, 3, 1},
                        Case{dims(48, 32, 8, 2, 16), Strategy::kUlysses, 2, 0, 1},
                        Case{dims(48, 32, 8, 2, 16), Strategy::kUPipe, 4, 2, 2}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t};
      const BlockRun early = run_block(in, spec);
      spec.early_delta = false;
      const BlockRun late = run_block(in, spec);
      for (int i = 0; i < kNumOutputs; ++i) {
        const bool y = std::string(kOutputNames[i]) == "y";
        EXPECT_TRUE(expect_within(dims_name(c.d) + " " + spec.name() + " " + kOutputNames[i], early.out[i], late.out[i],
                                  y ? 0.0 : summation_order_tol(t, late.out[i]), output_cols(c.d, i),
                                  "early D against per stage"));
      }
    }
  }
}

// The layouts the tile tests run: every strategy (local last), UPipe with and without overlap and
// over a ring, and tiles that do not divide L, one row, and L itself (UPipe on 2 ranks: L = 24).
struct TileCase {
  BlockDims d;
  Strategy st;
  int C;
  int64_t U, R, tile;
  bool overlap;
};
std::vector<TileCase> tile_cases(bool with_local = true) {
  std::vector<TileCase> c = {{dims(48, 32, 8, 2, 16), Strategy::kUPipe, 4, 4, 1, 5, false},
                             {dims(48, 32, 6, 3, 16), Strategy::kUPipe, 3, 3, 1, 1, true},
                             {dims(48, 32, 8, 2, 16), Strategy::kUlysses, 2, 0, 1, 7, false},
                             {dims(48, 32, 8, 2, 16), Strategy::kUPipe, 4, 2, 2, 12, true},
                             {dims(48, 32, 8, 8, 16), Strategy::kUPipe, 2, 2, 1, 24, true},
                             {dims(48, 32, 8, 2, 16), Strategy::kRing, 3, 0, 1, 4, false}};
  if (with_local) c.push_back({dims(48, 32, 8, 2, 16), Strategy::kLocal, 1, 0, 1, 10, false});
  return c;
}

// dx handed out by tiles (TiledGrad, the decoder's 2-D chunking of dx) against dx whole: the same
// sums in the same order of heads, a tile of rows at a time. y and the weight gradients are the
// same bits; dx's GEMMs run over fewer rows, and OpenBLAS orders a dot product's terms by the
// matrix shape, so dx agrees to the summation-order bound (f32: 16 FLT_EPSILON max |dx|; bf16:
// four bf16 roundings, a sum that rounds to the neighbouring value). Every strategy (local makes dx
// whole first: the same bits), with and without overlap and x by tiles; tiles that do not divide
// L, one row, and L itself. (Its memory is the decoder's tests': these heads are wider than E.)
TEST(AttentionBlockTiles, TiledGradMatchesWhole) {
  for (const TileCase& c : tile_cases()) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (int64_t input_tile : {int64_t{0}, int64_t{5}}) {
        const BlockInputs in = random_inputs(c.d, kSeed, t);
        RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t, .overlap = c.overlap,
                     .input_tile = input_tile};
        const BlockRun whole = run_block(in, spec);
        spec.grad_tile = c.tile;
        const BlockRun tiles = run_block(in, spec);
        for (int i = 0; i < kNumOutputs; ++i) {
          const bool dx = std::string(kOutputNames[i]) == "dx" && c.st != Strategy::kLocal;
          const double tol = !dx ? 0.0 : summation_order_tol(t, whole.out[i]);
          EXPECT_TRUE(expect_within(dims_name(c.d) + " " + spec.name() + " tile " + std::to_string(c.tile) + " " +
                                        kOutputNames[i],
                                    tiles.out[i], whole.out[i], tol, output_cols(c.d, i), "dx by tiles against whole"));
        }
      }
    }
  }
}

// The kept gradients dx is formed from in host memory (TiledGrad::host) or on the device: copies
// there and back, the same bits (every strategy that keeps them, overlap, uneven tiles, a ring).
TEST(AttentionBlockTiles, GradsOnHostAreBitwiseTheSame) {
  for (const TileCase& c : tile_cases(/*with_local=*/false)) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t, .overlap = c.overlap,
                   .input_tile = 5, .grad_tile = c.tile};
      const BlockRun device = run_block(in, spec);
      spec.grads_on_host = true;
      const BlockRun host = run_block(in, spec);
      std::string which;
      EXPECT_TRUE(all_bitwise_equal(device, host, &which)) << dims_name(c.d) << " " << spec.name() << ": " << which;
      // Never more on the device; UPipe with more than one stage holds less at its peak (with
      // overlap at these sizes the peak may fall where nothing is kept yet).
      EXPECT_LE(host.stats[0].peak_total, device.stats[0].peak_total) << spec.name();
      if (c.st == Strategy::kUPipe && c.d.heads / c.U > 1 && !c.overlap) {
        EXPECT_LT(host.stats[0].peak_total, device.stats[0].peak_total) << spec.name();
      }
    }
  }
}

// y handed out by tiles (TiledOutput: the output projection a tile of rows at a time) against y
// whole, both with x by tiles: the backward reads nothing of y, so dx and the weight gradients
// are the same bits; y's GEMM runs over fewer rows, so it agrees to the summation-order bound of
// TiledInputMatchesWhole (local makes y whole: the same bits). Tiles that do not divide L, one
// row, and L itself.
TEST(AttentionBlockTiles, TiledOutputMatchesWhole) {
  for (const TileCase& c : tile_cases()) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t, .overlap = c.overlap,
                   .input_tile = 5};
      const BlockRun whole = run_block(in, spec);
      spec.output_tile = c.tile;
      const BlockRun tiles = run_block(in, spec);
      for (int i = 0; i < kNumOutputs; ++i) {
        const bool y = std::string(kOutputNames[i]) == "y" && c.st != Strategy::kLocal;
        const double tol = !y ? 0.0 : summation_order_tol(t, whole.out[i]);
        EXPECT_TRUE(expect_within(dims_name(c.d) + " " + spec.name() + " " + kOutputNames[i], tiles.out[i],
                                  whole.out[i], tol, output_cols(c.d, i), "y by tiles against whole"));
      }
    }
  }
}

// dy given by tiles (a TiledInput of its rows: the decoder's dhm read from host memory) against dy
// whole: dwo's sums over tiles in fp32 and the dO projections over fewer rows, so dwo and what D
// reaches agree to the summation-order bound of TiledInputMatchesWhole (local makes dy whole: the
// same bits); y is untouched. And the saved attention output in host memory (TiledOutput::host)
// against on the device, with dy's tiles of the same rows: copies there and back, the same bits.
TEST(AttentionBlockTiles, TiledDyAndHostOutputMatch) {
  for (const TileCase& c : tile_cases()) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t, .overlap = c.overlap,
                   .input_tile = 5, .grad_tile = 6, .output_tile = c.tile};
      const BlockRun whole = run_block(in, spec);
      spec.dy_tile = c.tile;
      const BlockRun tiles = run_block(in, spec);
      for (int i = 0; i < kNumOutputs; ++i) {
        const double tol = c.st == Strategy::kLocal ? 0.0 : summation_order_tol(t, whole.out[i]);
        EXPECT_TRUE(expect_within(dims_name(c.d) + " " + spec.name() + " " + kOutputNames[i], tiles.out[i],
                                  whole.out[i], tol, output_cols(c.d, i), "dy by tiles against whole"));
      }
      spec.out_on_host = true;
      const BlockRun host = run_block(in, spec);
      std::string which;
      EXPECT_TRUE(all_bitwise_equal(tiles, host, &which)) << dims_name(c.d) << " " << spec.name() << ": " << which;
    }
  }
}

// x given by tiles (TiledInput, the decoder's 2-D chunking) against x whole: the projections and
// weight gradients run tile by tile, so the weight gradients' fp32 sums over rows change order:
// f32 within the summation-order bound below (16 FLT_EPSILON max |whole|), bf16 within four bf16
// roundings of max |whole| (a sum that rounds to the neighbouring bf16 value, then carried
// through the attention). Tiles that do not divide L, one row, and L itself; every strategy that
// tiles, and local (which makes x whole first: the same bits).
TEST(AttentionBlockTiles, TiledInputMatchesWhole) {
  for (const TileCase& c : tile_cases()) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const BlockInputs in = random_inputs(c.d, kSeed, t);
      RunSpec spec{.strategy = c.st, .ranks = c.C, .upipe_heads = c.U, .ring = c.R, .dtype = t};
      const BlockRun whole = run_block(in, spec);
      spec.input_tile = c.tile;
      const BlockRun tiled = run_block(in, spec);
      for (int i = 0; i < kNumOutputs; ++i) {
        const double tol = summation_order_tol(t, whole.out[i]);
        EXPECT_TRUE(expect_within(dims_name(c.d) + " " + spec.name() + " " + kOutputNames[i], tiled.out[i],
                                  whole.out[i], tol, output_cols(c.d, i), "tiles against whole"));
      }
      if (c.st == Strategy::kLocal) {
        std::string which;
        EXPECT_TRUE(all_bitwise_equal(whole, tiled, &which)) << which;
      }
    }
  }
}

// Reported, not required: OpenBLAS's summation order depends on the GEMM shape.
// The head pipeline against local, bit by bit: not identical (OpenBLAS's GEMM summation order
// depends on the matrix shape: per-rank rows, per-head columns), so most elements differ in their
// last bits (the table: elements bitwise identical to local's). What must hold is that they differ
// only by the order of fp32 sums (the bound of summation_order_tol).
TEST(AttentionBlockBits, DiffersFromLocalOnlyInSummationOrder) {
  std::printf("  %-40s %12s %12s %12s   max |s - l| / (FLT_EPSILON max |l|) per output\n", "case", "y same",
              "dx same", "dwq same");
  for (auto [d, C] : {std::pair{dims(48, 32, 8, 2, 16), 1}, {dims(48, 32, 8, 2, 16), 2}, {dims(48, 32, 8, 2, 16), 4},
                      {dims(48, 32, 8, 8, 16), 8}, {dims(48, 32, 6, 3, 16), 3}}) {
    Problem& p = problem(d);
    for (RunSpec s : {RunSpec{.strategy = Strategy::kUlysses, .ranks = C},
                      RunSpec{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = C}}) {
      const BlockRun r = run_block(p.in, s);
      auto frac = [&](int i) {
        return std::to_string(count_identical(r.out[i], p.local32.out[i])) + "/" + std::to_string(r.out[i].size());
      };
      std::string ulps;
      for (int i = 0; i < kNumOutputs; ++i) {
        const double bound = FLT_EPSILON * max_abs(p.local32.out[i]);
        const double diff = max_abs_error(r.out[i], p.local32.out[i]);  // a NaN gives +inf
        char buf[16];
        std::snprintf(buf, sizeof buf, " %.2f", diff / bound);
        ulps += buf;
        EXPECT_LE(diff, kSummationOrderUlps * bound)
            << dims_name(d) << " " << s.name() << " " << kOutputNames[i] << ": max |s - local| " << diff << " is "
            << diff / bound << " FLT_EPSILON x max |local|";
      }
      std::printf("  %-40s %12s %12s %12s  %s\n", (dims_name(d) + " " + s.name()).c_str(), frac(0).c_str(),
                  frac(1).c_str(), frac(2).c_str(), ulps.c_str());
    }
  }
}

}  // namespace
}  // namespace untied::attntest
