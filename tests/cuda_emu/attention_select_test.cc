// The CUDA attention's kernel choice (src/backends/cuda/attention_select.h), on the CPU: the
// values of UNTIED_CUDA_ATTENTION; what cuDNN's fused attention takes and the reason for each case
// it does not; the choice with cuDNN ready or not (the emulator cannot run cuDNN, so here `auto`
// and `cudnn` run our kernels and say why); the graph cache's keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include "backends/cuda/attention_select.h"
#include "backends/cuda/cudnn_attention.h"

namespace untied::cuda {
namespace {

AttentionShape causal_bf16(int64_t seq = 8192, int64_t d = 128) {
  AttentionShape s;
  s.seq_q = s.seq_k = seq;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim = d;
  s.causal = true;
  s.dtype = DType::kBF16;
  return s;
}

TEST(AttentionSelect, EnvironmentValues) {
  for (const auto& [v, k] : {std::pair{"", AttentionKernel::kAuto}, {"auto", AttentionKernel::kAuto},
                             {"cudnn", AttentionKernel::kCudnn}, {"mma", AttentionKernel::kMma},
                             {"wgmma", AttentionKernel::kWgmma}}) {
    auto got = parse_attention_kernel(v);
    ASSERT_TRUE(got.ok()) << v;
    EXPECT_EQ(got.value(), k) << v;
  }
  auto bad = parse_attention_kernel("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("use auto (the default), cudnn, mma or wgmma"), std::string::npos);
  ::setenv("UNTIED_CUDA_ATTENTION", "cudnn", 1);
  EXPECT_EQ(attention_kernel_requested().value(), AttentionKernel::kCudnn);
  ::unsetenv("UNTIED_CUDA_ATTENTION");
  EXPECT_EQ(attention_kernel_requested().value(), AttentionKernel::kAuto);
}

TEST(AttentionSelect, WhatCudnnTakesAndWhyNot) {
  EXPECT_TRUE(cudnn_supports(causal_bf16(), false).ok());
  EXPECT_TRUE(cudnn_supports(causal_bf16(32768, 64), true).ok());
  AttentionShape full = causal_bf16();
  full.causal = false;
  EXPECT_TRUE(cudnn_supports(full, false).ok());
  const auto why = [](AttentionShape s, bool backward = false, DeltaSource d = DeltaSource::kFromOut) {
    const Status st = cudnn_supports(s, backward, d);
    EXPECT_FALSE(st.ok());
    return st.message();
  };
  AttentionShape s = causal_bf16();
  s.dtype = DType::kF32;
  EXPECT_NE(why(s).find("f32 storage"), std::string::npos);
  s = causal_bf16(8192, 96);
  EXPECT_NE(why(s).find("head_dim 96"), std::string::npos);
  s = causal_bf16();
  s.f32_results = true;
  EXPECT_NE(why(s).find("fp32 partial results"), std::string::npos);
  s = causal_bf16();
  s.q_offset = 8192;  // a ring block
  EXPECT_NE(why(s).find("a block of a longer sequence"), std::string::npos);
  s = causal_bf16();
  static const int64_t starts[3] = {0, 100, 200};
  s.doc_starts = starts;
  s.num_docs = 3;
  EXPECT_NE(why(s).find("packed documents"), std::string::npos);
  s = causal_bf16();
  s.window = 4096;
  EXPECT_NE(why(s).find("sliding window"), std::string::npos);
  s = causal_bf16();
  s.q_row_stride = 32 * 128 + 4;
  EXPECT_NE(why(s).find("row strides"), std::string::npos);
  EXPECT_NE(why(causal_bf16(), true, DeltaSource::kGiven).find("D is given"), std::string::npos);
}

TEST(AttentionSelect, ChoiceFallsBackWithTheReason) {
  const Status ready = Status::ok_status();
  const Status absent = Status::unsupported("cuDNN attention: not here");
  std::string why;
  // auto takes cuDNN once a GPU run has checked it (kAutoTakesCudnn), ours until then.
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kAuto, ready, causal_bf16(), false, DeltaSource::kFromOut, &why),
            kAutoTakesCudnn ? AttentionKernel::kCudnn : AttentionKernel::kMma);
  EXPECT_EQ(why.empty(), kAutoTakesCudnn);
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kCudnn, ready, causal_bf16(), false, DeltaSource::kFromOut, &why),
            AttentionKernel::kCudnn);
  EXPECT_EQ(why, "");
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kCudnn, ready, causal_bf16(), true, DeltaSource::kFromOut, &why),
            AttentionKernel::kCudnn);
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kCudnn, absent, causal_bf16(), false, DeltaSource::kFromOut, &why),
            AttentionKernel::kMma);
  EXPECT_EQ(why, "cuDNN attention: not here");
  AttentionShape ring = causal_bf16();
  ring.f32_results = true;
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kCudnn, ready, ring, false, DeltaSource::kFromOut, &why),
            AttentionKernel::kMma);
  EXPECT_NE(why.find("fp32 partial results"), std::string::npos);
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kWgmma, ready, causal_bf16(), false, DeltaSource::kFromOut, &why),
            AttentionKernel::kWgmma);
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kMma, ready, causal_bf16(), false, DeltaSource::kFromOut, &why),
            AttentionKernel::kMma);
}

TEST(AttentionSelect, TheEmulatorRunsOurKernels) {
  const Status ready = cudnn_attention_ready();
  ASSERT_FALSE(ready.ok());
  EXPECT_NE(ready.message().find("emulator cannot run cuDNN"), std::string::npos) << ready.message();
  EXPECT_EQ(choose_attention_kernel(AttentionKernel::kAuto, ready, causal_bf16(), false, DeltaSource::kFromOut),
            AttentionKernel::kMma);
}

TEST(AttentionSelect, GraphKeys) {
  const CudnnGraphKey a = cudnn_graph_key(causal_bf16(), false, 0);
  EXPECT_EQ(a, cudnn_graph_key(causal_bf16(), false, 0));
  EXPECT_EQ(a.q_row_stride, 32 * 128);
  EXPECT_EQ(a.kv_row_stride, 8 * 128);
  EXPECT_EQ(a.describe().rfind("fwd S=8192/8192 H=32 G=8 D=128 causal strides 4096/1024 scale 0.0883883", 0), 0u)
      << a.describe();
  std::unordered_set<CudnnGraphKey, CudnnGraphKeyHash> keys = {a};
  AttentionShape s = causal_bf16();
  const auto differs = [&](const AttentionShape& t, bool backward = false, int device = 0) {
    return keys.insert(cudnn_graph_key(t, backward, device)).second;
  };
  EXPECT_TRUE(differs(causal_bf16(), true));
  EXPECT_TRUE(differs(causal_bf16(), false, 1));
  EXPECT_TRUE(differs(causal_bf16(16384)));
  EXPECT_TRUE(differs(causal_bf16(8192, 64)));
  s.causal = false;
  EXPECT_TRUE(differs(s));
  s = causal_bf16();
  s.scale = 0.5f;
  EXPECT_TRUE(differs(s));
  s = causal_bf16();
  s.q_row_stride = 3 * 32 * 128;  // q inside a fused QKV buffer
  EXPECT_TRUE(differs(s));
  s = causal_bf16();
  s.scale = 1.0f / std::sqrt(128.0f);  // the default, given explicitly: the same graph
  EXPECT_FALSE(differs(s));
  EXPECT_EQ(keys.size(), 8u);
}

}  // namespace
}  // namespace untied::cuda
