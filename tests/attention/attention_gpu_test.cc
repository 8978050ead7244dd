// The attention block on a GPU: local, ulysses and upipe with their ranks in one process sharing
// GPU 0 (the in-process communicator bound to each rank's CUDA device, the exchange a
// device-to-device copy), against the same block on the CPU and against the fp64 reference.
// Skips, with a message, where the build has no CUDA backend or no GPU is visible.
//
// Tolerances (constants and reasons in block_harness.h):
//   * f32 storage: err(gpu local vs fp64) <= 4 x err(naive fp32 loop vs fp64) + floor; the GPU's
//     f32 kernels are true fp32 (cuBLAS without TF32, the portable attention path), blocked
//     differently from the CPU: the same argument as for the CPU.
//   * every GPU strategy vs GPU local: the same bound as the CPU tests use (4 x local's own error
//     + floor + the partial-sum floor).
//   * bf16 storage, inputs exact in bf16: |gpu s_bf16 - cpu l_fp32| <= 4 x |cpu l_bf16 - l_fp32|
//     + floors: the GPU stores the same intermediates in bf16 as the CPU does; its fp32
//     accumulations are ordered differently, which is well inside one bf16 rounding.
#include <gtest/gtest.h>

#include <cfloat>
#include <cstdio>
#include <vector>

#include "attention/block_harness.h"
#include "common/gpu.h"

namespace untied::attntest {
namespace {

constexpr uint64_t kSeed = 20251201;

void compare(const std::string& name, const BlockDims& d, const BlockRun& run, const Outputs& target,
             const Outputs& baseline_of, const Outputs& baseline_vs, DType t, int C) {
  for (int i = 0; i < kNumOutputs; ++i) {
    const double base = max_abs_error(baseline_of[i], baseline_vs[i]);
    const double floor = kFloorUlps * FLT_EPSILON * max_abs(target[i]);
    const double part = i >= 2 ? partial_sum_floor(run.abs_partials[i], t, stored_adds(d, C, i)) : 0.0;
    char how[96];
    std::snprintf(how, sizeof how, "4 x baseline %.2e + floor", base);
    EXPECT_TRUE(expect_within(name + " " + kOutputNames[i], run.out[i], target[i], kErrFactor * base + floor + part,
                              output_cols(d, i), how));
  }
}

struct GpuCase {
  BlockDims d;
  int ranks;
};

class AttentionGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(AttentionGpu, EveryStrategyMatchesLocalAndTheCpu) {
  REQUIRE_GPU();
  const GpuCase& c = GetParam();
  const BlockDims& d = c.d;
  const int C = c.ranks;
  // f32: GPU local against fp64, then every GPU strategy against GPU local.
  {
    const BlockInputs in = random_inputs(d, kSeed, DType::kF32);
    const Outputs ref64 = reference_outputs(in, true), naive32 = reference_outputs(in, false);
    const BlockRun local = run_block(in, RunSpec{.strategy = Strategy::kLocal, .gpu = true});
    compare("gpu local f32 vs fp64", d, local, ref64, naive32, ref64, DType::kF32, 1);
    std::vector<RunSpec> specs = {RunSpec{.strategy = Strategy::kUlysses, .ranks = C, .gpu = true},
                                  RunSpec{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = C, .gpu = true},
                                  RunSpec{.strategy = Strategy::kRing, .ranks = C, .gpu = true}};
    if (C % 2 == 0)  // the hybrid: C/2 ranks per Ulysses group x a 2-ring
      specs.push_back(RunSpec{.strategy = Strategy::kUPipe, .ranks = C, .ring = 2, .gpu = true});
    for (const RunSpec& s : specs) {
      const BlockRun run = run_block(in, s);
      compare(s.name() + " vs gpu local", d, run, local.out, local.out, ref64, DType::kF32, s.group());
    }
  }
  // bf16: every GPU strategy against the CPU's fp32 local on the same bf16-exact inputs.
  {
    const BlockInputs in = random_inputs(d, kSeed + 1, DType::kBF16);
    const BlockRun target = run_block(in, RunSpec{.strategy = Strategy::kLocal});
    const BlockRun cpu_bf16 = run_block(in, RunSpec{.strategy = Strategy::kLocal, .dtype = DType::kBF16});
    for (RunSpec s : {RunSpec{.strategy = Strategy::kLocal, .dtype = DType::kBF16, .gpu = true},
                      RunSpec{.strategy = Strategy::kUlysses, .ranks = C, .dtype = DType::kBF16, .gpu = true},
                      RunSpec{.strategy = Strategy::kUPipe, .ranks = C, .upipe_heads = C, .dtype = DType::kBF16,
                              .gpu = true},
                      RunSpec{.strategy = Strategy::kRing, .ranks = C, .dtype = DType::kBF16, .gpu = true}}) {
      const BlockRun run = run_block(in, s);
      compare(s.name() + " vs cpu local f32", d, run, target.out, cpu_bf16.out, target.out, DType::kBF16,
              s.group());
    }
  }
}

// Shapes the tensor-core attention path takes (D = 64, 128) and one it does not (D = 32), MHA
// and GQA, 8 ranks sharing the GPU (and 3, an odd count).
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGpu,
    ::testing::Values(GpuCase{BlockDims{.seq = 512, .hidden = 256, .heads = 8, .kv_heads = 8, .head_dim = 64}, 8},
                      GpuCase{BlockDims{.seq = 1024, .hidden = 512, .heads = 8, .kv_heads = 2, .head_dim = 128}, 8},
                      GpuCase{BlockDims{.seq = 384, .hidden = 192, .heads = 6, .kv_heads = 3, .head_dim = 32}, 3}),
    [](const auto& info) {
      const BlockDims& d = info.param.d;
      return "S" + std::to_string(d.seq) + "_H" + std::to_string(d.heads) + "_G" + std::to_string(d.kv_heads) + "_D" +
             std::to_string(d.head_dim) + "_C" + std::to_string(info.param.ranks);
    });

}  // namespace
}  // namespace untied::attntest
