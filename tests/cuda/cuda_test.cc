// The CUDA device against its contract: the refusal without a GPU, the budget check, cuBLAS's GEMM
// against the CPU's, and the caching allocator's counts. GPU cases skip where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/gpu.h"
#include "common/random_inputs.h"
#include "untied/core/tensor.h"
#include "untied/device/cuda.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"

namespace untied {
namespace {

TEST(Cuda, WithoutAGpuTheRefusalSaysWhatToDo) {
  if (cuda_built() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  auto d = make_cuda_device({});
  ASSERT_FALSE(d.ok());
  const std::string m = d.status().message();
  EXPECT_TRUE(m.find("no CUDA GPU is visible") != std::string::npos ||
              m.find("built without CUDA") != std::string::npos)
      << m;
}

TEST(Cuda, BudgetBeyondTheGpuIsRefused) {
  REQUIRE_GPU();
  auto d = make_cuda_device({.budget_bytes = int64_t{1} << 50});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("exceeds"), std::string::npos) << d.status().message();
  EXPECT_FALSE(make_cuda_device({.index = 1 << 20}).ok());
}

// cuBLAS against the CPU GEMM on the same inputs: fp32 (true fp32, no TF32) to 1e-5 of the
// largest |C|; bf16 output to one bf16 rounding (2^-8 relative) plus that.
TEST(Cuda, GemmMatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = std::move(make_cuda_device({})).value();
  auto cpu = make_cpu_device({.threads = 1});
  for (DType t : {DType::kF32, DType::kBF16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t m = 67, n = 45, k = 129;
        const int64_t es = dtype_size(t);
        TensorBuffer a(cpu->allocator(), t, {m * k}, Tag::kOther, "a"), b(cpu->allocator(), t, {k * n}, Tag::kOther, "b");
        TensorBuffer c(cpu->allocator(), t, {m * n}, Tag::kOther, "c"), c2(cpu->allocator(), t, {m * n}, Tag::kOther, "c2");
        test::Rng rng(1);
        const std::vector<float> av = test::to_float(test::uniform_values(rng, m * k, t));
        const std::vector<float> bv = test::to_float(test::uniform_values(rng, k * n, t));
        store_f32(a.data(), t, av.data(), m * k);
        store_f32(b.data(), t, bv.data(), k * n);
        GemmParams p{.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .a = a.data(), .lda = ta ? m : k,
                     .a_dtype = t, .b = b.data(), .ldb = tb ? k : n, .b_dtype = t, .c = c.data(), .ldc = n, .c_dtype = t};
        gemm(*cpu, p);
        Buffer da = gpu->allocator().allocate(m * k * es, Tag::kOther, "a"), db = gpu->allocator().allocate(k * n * es, Tag::kOther, "b");
        Buffer dc = gpu->allocator().allocate(m * n * es, Tag::kOther, "c");
        gpu->copy(da.data(), a.data(), m * k * es);
        gpu->copy(db.data(), b.data(), k * n * es);
        p.a = da.data(), p.b = db.data(), p.c = dc.data();
        gemm(*gpu, p);
        gpu->synchronize();
        gpu->copy(c2.data(), dc.data(), m * n * es);
        std::vector<float> x(m * n), y(m * n);
        load_f32(x.data(), c.data(), t, m * n);
        load_f32(y.data(), c2.data(), t, m * n);
        EXPECT_TRUE(test::expect_rel_close(std::string(dtype_name(t)) + " trans_a " + std::to_string(ta) + " trans_b " +
                                               std::to_string(tb),
                                           test::to_double(y), test::to_double(x), t == DType::kBF16 ? 1.0 / 128 : 1e-5));
      }
}

// gemm_grouped (the experts of a mixture, each over its own rows: one cublasGemmGroupedBatchedEx
// for groups whose A, B and C share a dtype, else one GEMM each) gives the CPU's gemm of each group:
// 4 groups of different rows (one empty) over one A and B, trans_b, beta 0 and 1, f32 and bf16,
// and bf16 into f32 (the one-by-one path).
TEST(Cuda, GroupedGemmMatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = std::move(make_cuda_device({})).value();
  auto cpu = make_cpu_device({.threads = 1});
  for (auto [t, ct] : {std::pair{DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}}) {
    const int64_t rows[] = {5, 0, 17, 9}, M = 31, n = 24, k = 40, es = dtype_size(t), cs = dtype_size(ct);
    test::Rng rng(21);
    std::vector<unsigned char> a(M * k * es), b(4 * n * k * es), c(M * n * cs), c2(M * n * cs);
    store_f32(a.data(), t, test::to_float(test::uniform_values(rng, M * k, t)).data(), M * k);
    store_f32(b.data(), t, test::to_float(test::uniform_values(rng, 4 * n * k, t)).data(), 4 * n * k);
    store_f32(c.data(), ct, test::to_float(test::uniform_values(rng, M * n, ct)).data(), M * n);
    c2 = c;
    Buffer da = gpu->allocator().allocate(M * k * es, Tag::kOther, "a"), db = gpu->allocator().allocate(4 * n * k * es, Tag::kOther, "b");
    Buffer dc = gpu->allocator().allocate(M * n * cs, Tag::kOther, "c");
    gpu->copy(da.data(), a.data(), M * k * es);
    gpu->copy(db.data(), b.data(), 4 * n * k * es);
    gpu->copy(dc.data(), c.data(), M * n * cs);
    auto groups = [&](const void* A, const void* B, void* C) {  // group g: its rows of A, its own B (n, k)
      std::vector<GemmParams> out;
      for (int64_t g = 0, r0 = 0; g < 4; r0 += rows[g], ++g)
        out.push_back(GemmParams{.trans_b = true, .m = rows[g], .n = n, .k = k, .beta = g % 2 == 0 ? 0.0f : 1.0f,
                                 .a = static_cast<const char*>(A) + r0 * k * es, .lda = k, .a_dtype = t,
                                 .b = static_cast<const char*>(B) + g * n * k * es, .ldb = k, .b_dtype = t,
                                 .c = static_cast<char*>(C) + r0 * n * cs, .ldc = n, .c_dtype = ct});
      return out;
    };
    for (const GemmParams& p : groups(a.data(), b.data(), c.data())) gemm(*cpu, p);
    gemm_grouped(*gpu, groups(da.data(), db.data(), dc.data()));
    gpu->synchronize();
    gpu->copy(c2.data(), dc.data(), M * n * cs);
    std::vector<float> x(M * n), y(M * n);
    load_f32(x.data(), c.data(), ct, M * n);
    load_f32(y.data(), c2.data(), ct, M * n);
    EXPECT_TRUE(test::expect_rel_close(std::string(dtype_name(t)) + " into " + std::string(dtype_name(ct)),
                                       test::to_double(y), test::to_double(x), ct == DType::kBF16 ? 1.0 / 128 : 1e-5));
  }
}

// A NaN in attention's input gives NaN where it reaches, never a finite output (the row maximum
// skips NaN scores; the row must not then read as one that sees no key), on both GPU paths: the
// tensor-core kernel (bf16, D = 64) and the portable one (f32).
TEST(Cuda, AttentionNanInputGivesNanOutput) {
  REQUIRE_GPU();
  auto gpu = std::move(make_cuda_device({})).value();
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t S = 80, H = 2, G = 1, D = 64, es = dtype_size(t);
    std::vector<float> q(S * H * D, 0.1f), k(S * G * D, 0.2f), v(S * G * D, 0.3f);
    for (int64_t i = 0; i < S; ++i) q[(i * H + 0) * D] = std::nanf("");  // head 0 only
    std::vector<char> qb(q.size() * es), kb(k.size() * es), vb(v.size() * es), ob(q.size() * es);
    store_f32(qb.data(), t, q.data(), static_cast<int64_t>(q.size()));
    store_f32(kb.data(), t, k.data(), static_cast<int64_t>(k.size()));
    store_f32(vb.data(), t, v.data(), static_cast<int64_t>(v.size()));
    Buffer dq = gpu->allocator().allocate(qb.size(), Tag::kOther, "q"), dk = gpu->allocator().allocate(kb.size(), Tag::kOther, "k");
    Buffer dv = gpu->allocator().allocate(vb.size(), Tag::kOther, "v"), dout = gpu->allocator().allocate(ob.size(), Tag::kOther, "out");
    Buffer dlse = gpu->allocator().allocate(H * S * 4, Tag::kOther, "lse");
    gpu->copy(dq.data(), qb.data(), qb.size());
    gpu->copy(dk.data(), kb.data(), kb.size());
    gpu->copy(dv.data(), vb.data(), vb.size());
    attention_forward(*gpu, AttentionShape{.seq_q = S, .seq_k = S, .heads = H, .kv_heads = G, .head_dim = D, .dtype = t},
                      {.out = dout.data(), .lse = static_cast<float*>(dlse.data()), .q = dq.data(), .k = dk.data(),
                       .v = dv.data()});
    gpu->synchronize();
    gpu->copy(ob.data(), dout.data(), ob.size());
    std::vector<float> out(q.size()), lse(H * S);
    gpu->copy(lse.data(), dlse.data(), H * S * 4);
    load_f32(out.data(), ob.data(), t, static_cast<int64_t>(out.size()));
    for (int64_t i = 0; i < S; ++i) {
      EXPECT_TRUE(std::isnan(out[(i * H + 0) * D])) << "row " << i << " of the NaN head";
      EXPECT_TRUE(std::isnan(lse[i])) << "lse of row " << i;
      EXPECT_NEAR(out[(i * H + 1) * D], 0.3f, 2e-3) << "row " << i << " of the clean head";
    }
  }
}

TEST(Cuda, AllocatorCountsGpuBuffersAndReusesThem) {
  REQUIRE_GPU();
  auto gpu = std::move(make_cuda_device({})).value();
  Allocator& alloc = gpu->allocator();
  void* first;
  {
    Buffer b = alloc.allocate(1 << 20, Tag::kAttnWorkspace, "one");
    first = b.data();
    EXPECT_EQ(alloc.stats().live[static_cast<int>(Tag::kAttnWorkspace)], 1 << 20);
  }
  Buffer again = alloc.allocate(1 << 20, Tag::kAttnWorkspace, "two");
  EXPECT_EQ(again.data(), first) << "a freed block of the same size is reused";
  EXPECT_EQ(alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)], 1 << 20);
  // What the cache holds from cudaMalloc: the reused block once, then a block of another size too.
  EXPECT_EQ(alloc.reserved_peak_bytes(), 1 << 20);
  again.reset();
  Buffer other = alloc.allocate(1 << 19, Tag::kAttnWorkspace, "three");
  EXPECT_EQ(alloc.stats().peak_total, 1 << 20) << "live bytes never exceeded 1 MiB";
  EXPECT_EQ(alloc.reserved_peak_bytes(), (1 << 20) + (1 << 19)) << "the cached 1 MiB block is still held";
}

}  // namespace
}  // namespace untied
