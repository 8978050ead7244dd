// The CUDA flash attention against the CPU kernel on the same inputs: forward (out, lse) and
// backward (dq, dk, dv; through attention_backward and attention_backward_with_delta), f32 and
// bf16 storage, both GPU paths (tensor cores: bf16 with D in {64, 128}, aligned strides;
// portable: everything else), causal and not, seq_q != seq_k with offsets (including rows that
// see no key and keys no row sees), GQA and MHA, ragged lengths and padded row strides.
//
// Tolerances (relative to the largest |CPU value| of the tensor; lse absolute):
//   * f32 storage, 1e-4. Both sides compute in fp32 from the same fp32 inputs with the same
//     algorithm; they differ in summation order (tiles, warp reductions, the atomic order of dQ)
//     and in exp2 (a degree-7 polynomial on the CPU, the hardware ex2 on the GPU, each within a
//     few ulp). tests/kernels/attention_test.cc bounds the CPU kernel within ~4x the error of a
//     naive fp32 loop, ~1e-6 relative at these sizes; 1e-4 is that with 100x headroom.
//   * bf16 storage, 2e-2. Both sides round each output once to bf16 (2^-9 of the element), so
//     they may differ by 2^-8 ~ 4e-3 of max |ref|. The tensor-core path also rounds P and dS to
//     bf16 as matrix-product operands (as FlashAttention does): each term of a key sum carries
//     an independent relative error <= 2^-9, which over n terms adds ~2^-9 / sqrt(n) of the
//     sum's scale, below the output rounding. 2e-2 is 5x 2^-8; a wrong mask, head mapping or
//     tile edge errs by O(1).
//   * lse is fp32 for both dtypes and computed from the same stored values: 1e-4 absolute
//     (f32), 1e-3 (bf16: the tensor cores sum bf16 x bf16 products in fp32 in another order).
//   Rows that see no key must give out = 0, lse = -inf and dq = 0 exactly, and keys no row sees
//   dk = dv = 0 exactly (no NaN); elements between H*D and a padded row stride are never written.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "untied/core/check.h"
#include "untied/kernels/attention.h"

namespace untied {
namespace {

using gputest::gpu_device;
using gputest::host_f32;
using gputest::random_host;
using gputest::to_gpu;
using gputest::to_host_f32;

constexpr float kSentinel = 7.0f;  // exact in bf16; fills the stride gaps of GPU outputs

struct GpuAttnCase {
  std::string name;
  DType dtype;
  int64_t seq_q, seq_k, heads, kv_heads, head_dim;
  bool causal = true;
  int64_t q_offset = 0, k_offset = 0;
  int64_t q_pad = 0, kv_pad = 0;  // row stride = H*D + q_pad, G*D + kv_pad
};

std::ostream& operator<<(std::ostream& os, const GpuAttnCase& c) { return os << c.name; }

std::vector<GpuAttnCase> gpu_attention_cases() {
  const DType F = DType::kF32, B = DType::kBF16;
  return {
      {"f32_d64_causal_gqa", F, 1000, 1000, 8, 2, 64},
      {"bf16_d128_causal_gqa", B, 1000, 1000, 8, 2, 128},
      {"bf16_d64_mha_noncausal_ragged", B, 77, 1000, 4, 4, 64, false},
      {"bf16_d128_query_tail", B, 300, 1000, 8, 2, 128, true, 700, 0},
      // Rows 0..59 see no key; keys 140..149 are seen by no row.
      {"bf16_d128_rows_without_keys", B, 200, 150, 4, 2, 128, true, 0, 60},
      {"bf16_d64_rows_without_keys", B, 130, 200, 2, 1, 64, true, 0, 30},
      {"f32_d96_portable", F, 77, 77, 8, 2, 96},
      {"bf16_d40_portable_more_queries", B, 1000, 77, 4, 1, 40},
      {"bf16_d128_padded_strides", B, 500, 600, 8, 2, 128, true, 100, 0, 24, 8},
      // Odd strides: the tensor-core path needs 16-byte rows, so bf16 D=64 goes portable.
      {"bf16_d64_odd_strides_portable", B, 300, 300, 4, 2, 64, true, 0, 0, 3, 1},
      {"f32_d128_strided_offsets", F, 200, 333, 4, 2, 128, true, 133, 0, 5, 3},
      {"f32_d256", F, 100, 100, 2, 1, 256},
      {"bf16_d200_portable_noncausal", B, 64, 90, 2, 2, 200, false},
      {"f32_no_row_sees_a_key", F, 50, 50, 2, 1, 64, true, 0, 100},
  };
}

AttentionShape shape_of(const GpuAttnCase& c) {
  return AttentionShape{.seq_q = c.seq_q, .seq_k = c.seq_k, .heads = c.heads, .kv_heads = c.kv_heads,
                        .head_dim = c.head_dim, .q_offset = c.q_offset, .k_offset = c.k_offset,
                        .causal = c.causal, .q_row_stride = c.heads * c.head_dim + c.q_pad,
                        .kv_row_stride = c.kv_heads * c.head_dim + c.kv_pad, .dtype = c.dtype};
}

// A host tensor of `rows` x `cols` elements, all kSentinel.
TensorBuffer sentinel_host(Device& cpu, DType t, int64_t rows, int64_t cols) {
  TensorBuffer b(cpu.allocator(), t, {rows, cols}, Tag::kOther, "sentinel");
  std::vector<float> v(static_cast<size_t>(rows * cols), kSentinel);
  store_f32(b.data(), t, v.data(), rows * cols);
  return b;
}

// Compares the first `cols` elements of each of `rows` rows (row stride rs) of a GPU result with
// the CPU's: max |gpu - cpu| / max |cpu| <= tol, no NaN, and the stride gap still kSentinel.
void expect_rows_close(const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t rows,
                       int64_t cols, int64_t rs, double tol) {
  double err = 0, mx = 0;
  int64_t nan = 0, gap_written = 0, worst = -1;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      const float g = gpu[i * rs + c], r = cpu[i * rs + c];
      if (std::isnan(g) || std::isnan(r)) {
        ++nan;
        continue;
      }
      const double e = std::fabs(static_cast<double>(g) - r);
      if (e > err) err = e, worst = i * rs + c;
      mx = std::max(mx, static_cast<double>(std::fabs(r)));
    }
    for (int64_t c = cols; c < rs; ++c) gap_written += gpu[i * rs + c] != kSentinel;
  }
  const double rel = err / (mx > 0 ? mx : 1.0);
  EXPECT_EQ(nan, 0) << what << ": NaN elements";
  EXPECT_EQ(gap_written, 0) << what << ": elements between H*D and the row stride were written";
  EXPECT_LE(rel, tol) << what << ": max |gpu - cpu| = " << err << " at element " << worst << " (gpu "
                      << (worst >= 0 ? gpu[worst] : 0) << ", cpu " << (worst >= 0 ? cpu[worst] : 0)
                      << "), max |cpu| = " << mx;
}

void expect_lse_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol) {
  ASSERT_EQ(gpu.size(), cpu.size());
  int64_t bad_inf = 0, nan = 0;
  double err = 0;
  for (size_t x = 0; x < gpu.size(); ++x) {
    if (std::isnan(gpu[x])) ++nan;
    if (std::isinf(gpu[x]) || std::isinf(cpu[x])) {
      bad_inf += !(gpu[x] == cpu[x] && gpu[x] < 0);
      continue;
    }
    err = std::max(err, std::fabs(static_cast<double>(gpu[x]) - cpu[x]));
  }
  EXPECT_EQ(nan, 0) << "lse: NaN";
  EXPECT_EQ(bad_inf, 0) << "lse: -inf (row sees no key) on one side only";
  EXPECT_LE(err, tol) << "lse: max |gpu - cpu|";
}

// Rows that see no key: out = 0 and dq = 0 exactly; keys seen by no row: dk = dv = 0 exactly.
void expect_exact_zeros(const GpuAttnCase& c, const std::vector<float>& out, const std::vector<float>& dq,
                        const std::vector<float>& dk, const std::vector<float>& dv) {
  if (!c.causal) return;
  const int64_t q_rs = c.heads * c.head_dim + c.q_pad, kv_rs = c.kv_heads * c.head_dim + c.kv_pad;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < c.seq_q; ++i) {
    if (c.q_offset + i - c.k_offset >= 0) continue;  // row i sees key 0
    for (int64_t col = 0; col < c.heads * c.head_dim; ++col)
      nonzero += out[i * q_rs + col] != 0.0f || dq[i * q_rs + col] != 0.0f;
  }
  for (int64_t j = 0; j < c.seq_k; ++j) {
    if (c.k_offset + j <= c.q_offset + c.seq_q - 1) continue;  // the last row sees key j
    for (int64_t col = 0; col < c.kv_heads * c.head_dim; ++col)
      nonzero += dk[j * kv_rs + col] != 0.0f || dv[j * kv_rs + col] != 0.0f;
  }
  EXPECT_EQ(nonzero, 0) << "rows without keys / keys without rows must give exact zeros";
}

class CudaAttention : public ::testing::TestWithParam<GpuAttnCase> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
  const GpuAttnCase& c = GetParam();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  const AttentionShape s = shape_of(c);
  const DType t = c.dtype;
  const int64_t q_rs = s.q_row_stride, kv_rs = s.kv_row_stride;
  const int64_t q_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
  const double tol = t == DType::kF32 ? 1e-4 : 2e-2;
  const double lse_tol = t == DType::kF32 ? 1e-4 : 1e-3;

  TensorBuffer q = random_host(*cpu, t, {c.seq_q, q_rs}, 11);
  TensorBuffer k = random_host(*cpu, t, {c.seq_k, kv_rs}, 12);
  TensorBuffer v = random_host(*cpu, t, {c.seq_k, kv_rs}, 13);
  TensorBuffer dout = random_host(*cpu, t, {c.seq_q, q_rs}, 14);

  // CPU: forward, then backward from its own out and lse.
  TensorBuffer out_c(cpu->allocator(), t, {c.seq_q, q_rs}, Tag::kOther, "out");
  TensorBuffer lse_c(cpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "lse");
  TensorBuffer dq_c(cpu->allocator(), t, {c.seq_q, q_rs}, Tag::kOther, "dq");
  TensorBuffer dk_c(cpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dk");
  TensorBuffer dv_c(cpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dv");
  attention_forward(*cpu, s, out_c.data(), lse_c.as<float>(), q.data(), k.data(), v.data());
  attention_backward(*cpu, s, dq_c.data(), dk_c.data(), dv_c.data(), q.data(), k.data(), v.data(), out_c.data(),
                     lse_c.as<float>(), dout.data());

  // GPU forward.
  TensorBuffer gq = to_gpu(*gpu, q), gk = to_gpu(*gpu, k), gv = to_gpu(*gpu, v), gdout = to_gpu(*gpu, dout);
  TensorBuffer gout = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_q, q_rs));
  TensorBuffer glse(gpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "lse");
  attention_forward(*gpu, s, gout.data(), glse.as<float>(), gq.data(), gk.data(), gv.data());
  const std::vector<float> out_g = to_host_f32(*gpu, gout);
  expect_rows_close("out", out_g, host_f32(out_c), c.seq_q, q_cols, q_rs, tol);
  expect_lse_close(to_host_f32(*gpu, glse), host_f32(lse_c), lse_tol);

  // GPU backward on the CPU's out and lse (the same inputs as the CPU backward).
  TensorBuffer gout_c = to_gpu(*gpu, out_c), glse_c = to_gpu(*gpu, lse_c);
  TensorBuffer gdq = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_q, q_rs));
  TensorBuffer gdk = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_k, kv_rs));
  TensorBuffer gdv = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_k, kv_rs));
  attention_backward(*gpu, s, gdq.data(), gdk.data(), gdv.data(), gq.data(), gk.data(), gv.data(), gout_c.data(),
                     glse_c.as<float>(), gdout.data());
  const std::vector<float> dq_g = to_host_f32(*gpu, gdq), dk_g = to_host_f32(*gpu, gdk),
                           dv_g = to_host_f32(*gpu, gdv);
  expect_rows_close("dq", dq_g, host_f32(dq_c), c.seq_q, q_cols, q_rs, tol);
  expect_rows_close("dk", dk_g, host_f32(dk_c), c.seq_k, kv_cols, kv_rs, tol);
  expect_rows_close("dv", dv_g, host_f32(dv_c), c.seq_k, kv_cols, kv_rs, tol);
  expect_exact_zeros(c, out_g, dq_g, dk_g, dv_g);

  // With delta given (computed here in fp32 from the CPU's out): both backends on that delta.
  TensorBuffer delta(cpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "delta");
  {
    const std::vector<float> o = host_f32(out_c), d = host_f32(dout);
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        float acc = 0.0f;
        for (int64_t e = 0; e < c.head_dim; ++e)
          acc += o[i * q_rs + h * c.head_dim + e] * d[i * q_rs + h * c.head_dim + e];
        delta.as<float>()[h * c.seq_q + i] = acc;
      }
  }
  attention_backward_with_delta(*cpu, s, dq_c.data(), dk_c.data(), dv_c.data(), q.data(), k.data(), v.data(),
                                delta.as<float>(), lse_c.as<float>(), dout.data());
  TensorBuffer gdelta = to_gpu(*gpu, delta);
  TensorBuffer gdq2 = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_q, q_rs));
  TensorBuffer gdk2 = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_k, kv_rs));
  TensorBuffer gdv2 = to_gpu(*gpu, sentinel_host(*cpu, t, c.seq_k, kv_rs));
  attention_backward_with_delta(*gpu, s, gdq2.data(), gdk2.data(), gdv2.data(), gq.data(), gk.data(), gv.data(),
                                gdelta.as<float>(), glse_c.as<float>(), gdout.data());
  expect_rows_close("dq (delta given)", to_host_f32(*gpu, gdq2), host_f32(dq_c), c.seq_q, q_cols, q_rs, tol);
  expect_rows_close("dk (delta given)", to_host_f32(*gpu, gdk2), host_f32(dk_c), c.seq_k, kv_cols, kv_rs, tol);
  expect_rows_close("dv (delta given)", to_host_f32(*gpu, gdv2), host_f32(dv_c), c.seq_k, kv_cols, kv_rs, tol);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(gpu_attention_cases()),
                         [](const ::testing::TestParamInfo<GpuAttnCase>& i) { return i.param.name; });

// Many blocks of the tensor-core kernels (32 query tiles x 8 heads forward, 32 key tiles x 2 KV
// heads backward, each looping over 4 heads): seq 4096, H 8, G 2, D 128, bf16, causal.
TEST(CudaAttentionLarge, Seq4096Bf16MatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  const GpuAttnCase c{"large", DType::kBF16, 4096, 4096, 8, 2, 128};
  const AttentionShape s = shape_of(c);
  const DType t = c.dtype;
  const int64_t rs = c.heads * c.head_dim, kv_rs = c.kv_heads * c.head_dim;
  TensorBuffer q = random_host(*cpu, t, {c.seq_q, rs}, 21), k = random_host(*cpu, t, {c.seq_k, kv_rs}, 22);
  TensorBuffer v = random_host(*cpu, t, {c.seq_k, kv_rs}, 23), dout = random_host(*cpu, t, {c.seq_q, rs}, 24);
  TensorBuffer out_c(cpu->allocator(), t, {c.seq_q, rs}, Tag::kOther, "out");
  TensorBuffer lse_c(cpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "lse");
  TensorBuffer dq_c(cpu->allocator(), t, {c.seq_q, rs}, Tag::kOther, "dq");
  TensorBuffer dk_c(cpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dk");
  TensorBuffer dv_c(cpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dv");
  attention_forward(*cpu, s, out_c.data(), lse_c.as<float>(), q.data(), k.data(), v.data());
  attention_backward(*cpu, s, dq_c.data(), dk_c.data(), dv_c.data(), q.data(), k.data(), v.data(), out_c.data(),
                     lse_c.as<float>(), dout.data());

  TensorBuffer gq = to_gpu(*gpu, q), gk = to_gpu(*gpu, k), gv = to_gpu(*gpu, v), gdout = to_gpu(*gpu, dout);
  TensorBuffer gout(gpu->allocator(), t, {c.seq_q, rs}, Tag::kOther, "out");
  TensorBuffer glse(gpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "lse");
  attention_forward(*gpu, s, gout.data(), glse.as<float>(), gq.data(), gk.data(), gv.data());
  expect_rows_close("out", to_host_f32(*gpu, gout), host_f32(out_c), c.seq_q, rs, rs, 2e-2);
  expect_lse_close(to_host_f32(*gpu, glse), host_f32(lse_c), 1e-3);

  TensorBuffer gout_c = to_gpu(*gpu, out_c), glse_c = to_gpu(*gpu, lse_c);
  TensorBuffer gdq(gpu->allocator(), t, {c.seq_q, rs}, Tag::kOther, "dq");
  TensorBuffer gdk(gpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dk");
  TensorBuffer gdv(gpu->allocator(), t, {c.seq_k, kv_rs}, Tag::kOther, "dv");
  attention_backward(*gpu, s, gdq.data(), gdk.data(), gdv.data(), gq.data(), gk.data(), gv.data(), gout_c.data(),
                     glse_c.as<float>(), gdout.data());
  expect_rows_close("dq", to_host_f32(*gpu, gdq), host_f32(dq_c), c.seq_q, rs, rs, 2e-2);
  expect_rows_close("dk", to_host_f32(*gpu, gdk), host_f32(dk_c), c.seq_k, kv_rs, kv_rs, 2e-2);
  expect_rows_close("dv", to_host_f32(*gpu, gdv), host_f32(dv_c), c.seq_k, kv_rs, kv_rs, 2e-2);
}

// dk and dv are summed in a fixed order (no atomics): bitwise equal run to run. dq is summed
// with fp32 atomics, so only equal to rounding.
TEST(CudaAttentionDeterminism, DkDvAreBitwiseRepeatable) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  for (const GpuAttnCase& c : {GpuAttnCase{"tc", DType::kBF16, 700, 700, 8, 2, 128},
                               GpuAttnCase{"portable", DType::kF32, 300, 300, 4, 2, 96}}) {
    SCOPED_TRACE(c.name);
    const AttentionShape s = shape_of(c);
    const int64_t rs = c.heads * c.head_dim, kv_rs = c.kv_heads * c.head_dim;
    TensorBuffer gq = to_gpu(*gpu, random_host(*cpu, c.dtype, {c.seq_q, rs}, 31));
    TensorBuffer gk = to_gpu(*gpu, random_host(*cpu, c.dtype, {c.seq_k, kv_rs}, 32));
    TensorBuffer gv = to_gpu(*gpu, random_host(*cpu, c.dtype, {c.seq_k, kv_rs}, 33));
    TensorBuffer gdout = to_gpu(*gpu, random_host(*cpu, c.dtype, {c.seq_q, rs}, 34));
    TensorBuffer gout(gpu->allocator(), c.dtype, {c.seq_q, rs}, Tag::kOther, "out");
    TensorBuffer glse(gpu->allocator(), DType::kF32, {c.heads, c.seq_q}, Tag::kOther, "lse");
    attention_forward(*gpu, s, gout.data(), glse.as<float>(), gq.data(), gk.data(), gv.data());
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      TensorBuffer gdq(gpu->allocator(), c.dtype, {c.seq_q, rs}, Tag::kOther, "dq");
      TensorBuffer gdk(gpu->allocator(), c.dtype, {c.seq_k, kv_rs}, Tag::kOther, "dk");
      TensorBuffer gdv(gpu->allocator(), c.dtype, {c.seq_k, kv_rs}, Tag::kOther, "dv");
      attention_backward(*gpu, s, gdq.data(), gdk.data(), gdv.data(), gq.data(), gk.data(), gv.data(), gout.data(),
                         glse.as<float>(), gdout.data());
      std::vector<float> now[3] = {to_host_f32(*gpu, gdq), to_host_f32(*gpu, gdk), to_host_f32(*gpu, gdv)};
      if (run == 0) {
        for (int x = 0; x < 3; ++x) first[x] = now[x];
        continue;
      }
      EXPECT_EQ(now[1], first[1]) << "dk differs between two identical runs";
      EXPECT_EQ(now[2], first[2]) << "dv differs between two identical runs";
      EXPECT_LE(gputest::rel_err(now[0], first[0]), c.dtype == DType::kF32 ? 1e-5 : 1e-2);
    }
  }
}

// The CUDA kernels stop at D = 256 (the CPU goes to 1024): a clear kUnsupported, nothing written.
TEST(CudaAttentionChecks, HeadDimAbove256IsRefused) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  const GpuAttnCase c{"d300", DType::kF32, 8, 8, 1, 1, 300};
  const AttentionShape s = shape_of(c);
  TensorBuffer gq = to_gpu(*gpu, random_host(*cpu, c.dtype, {8, 300}, 41));
  TensorBuffer gout = to_gpu(*gpu, sentinel_host(*cpu, c.dtype, 8, 300));
  TensorBuffer glse(gpu->allocator(), DType::kF32, {1, 8}, Tag::kOther, "lse");
  try {
    attention_forward(*gpu, s, gout.data(), glse.as<float>(), gq.data(), gq.data(), gq.data());
    ADD_FAILURE() << "D = 300 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("head_dim"), std::string::npos) << e.what();
  }
  for (float x : to_host_f32(*gpu, gout)) ASSERT_EQ(x, kSentinel) << "written although refused";
  EXPECT_THROW(attention_backward(*gpu, s, gout.data(), gout.data(), gout.data(), gq.data(), gq.data(), gq.data(),
                                  gq.data(), glse.as<float>(), gq.data()),
               Error);
}

// The public entry validates the shape before dispatching to the GPU: bad shapes throw
// kInvalidArgument and nothing is written.
TEST(CudaAttentionChecks, BadShapesAreRefusedBeforeAnyWrite) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  GpuAttnCase c{"bad", DType::kBF16, 16, 16, 4, 2, 64};
  TensorBuffer gq = to_gpu(*gpu, random_host(*cpu, c.dtype, {16, 4 * 64}, 51));
  TensorBuffer gout = to_gpu(*gpu, sentinel_host(*cpu, c.dtype, 16, 4 * 64));
  TensorBuffer glse(gpu->allocator(), DType::kF32, {4, 16}, Tag::kOther, "lse");
  AttentionShape bad_group = shape_of(c);
  bad_group.kv_heads = 3;  // 4 % 3 != 0
  AttentionShape bad_stride = shape_of(c);
  bad_stride.q_row_stride = 100;  // < H*D
  for (const AttentionShape& s : {bad_group, bad_stride}) {
    try {
      attention_forward(*gpu, s, gout.data(), glse.as<float>(), gq.data(), gq.data(), gq.data());
      ADD_FAILURE() << "a bad shape was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  }
  for (float x : to_host_f32(*gpu, gout)) ASSERT_EQ(x, kSentinel) << "written although refused";
}

}  // namespace
}  // namespace untied
