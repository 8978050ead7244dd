// The FLOPs behind the metrics' model TFLOP/s and MFU (flops.h), against the formula worked out by
// hand from Llama3-8B's published shapes, and the known peaks.
#include <gtest/gtest.h>

#include "untied/train/flops.h"

namespace untied {
namespace {

TEST(Flops, Llama3_8bByHand) {
  auto m = model_preset("llama3-8b");
  ASSERT_TRUE(m.ok());
  ModelConfig c = m.value();
  c.vocab = 128256;
  // By hand: per layer q 4096x4096, k and v 1024x4096, o 4096x4096, gate/up/down 3 x 14336x4096,
  // two norms of 4096; 32 layers; the LM head 128256x4096; the final norm 4096. The input
  // embedding (128256x4096) does not multiply.
  const double layer = 4096.0 * 4096 * 2 + 1024.0 * 4096 * 2 + 3 * 14336.0 * 4096 + 2 * 4096.0;
  const double n = 32 * layer + 128256.0 * 4096 + 4096;
  const int64_t S = 131072;
  const TokenFlops full = flops_per_token(c, S, Recompute::kFull);
  const double attention = 32.0 * 4096 * S;
  EXPECT_DOUBLE_EQ(full.model, 6 * n + 6 * attention);
  EXPECT_DOUBLE_EQ(full.hardware, full.model + 2 * 32 * layer + 2 * attention);
  const TokenFlops sel = flops_per_token(c, S, Recompute::kSelective);
  EXPECT_DOUBLE_EQ(sel.model, full.model);
  EXPECT_DOUBLE_EQ(sel.hardware, sel.model + 2 * 32 * layer);
  // About 7.5e9 matmul parameters: 45 GFLOP per token from them, 100 GFLOP from attention at 128K.
  EXPECT_NEAR(6 * n / 1e9, 45.1, 0.2);
  EXPECT_NEAR(6 * attention / 1e9, 103.1, 0.2);
}

TEST(Flops, TiedHeadCountsOnce) {
  auto m = model_preset("tiny");
  ASSERT_TRUE(m.ok());
  ModelConfig untied_head = m.value(), tied = m.value();
  tied.tied_embeddings = true;
  // The tied model has no lm_head tensor but still multiplies by V x E: the same model FLOPs.
  EXPECT_DOUBLE_EQ(flops_per_token(tied, 256, Recompute::kFull).model,
                   flops_per_token(untied_head, 256, Recompute::kFull).model);
  EXPECT_LT(parameter_count(tied), parameter_count(untied_head));
}

TEST(Flops, KnownPeaks) {
  EXPECT_EQ(known_peak_tflops("NVIDIA H100 80GB HBM3", DType::kBF16).value_or(0), 989.0);
  EXPECT_EQ(known_peak_tflops("NVIDIA H100 PCIe", DType::kBF16).value_or(0), 756.0);
  EXPECT_EQ(known_peak_tflops("NVIDIA H200", DType::kF32).value_or(0), 494.0);
  EXPECT_FALSE(known_peak_tflops("cpu (2 threads)", DType::kF32).has_value());
}

}  // namespace
}  // namespace untied
