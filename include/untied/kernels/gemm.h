// GEMM: C = alpha * op(A) * op(B) + beta * C, row-major, through BLAS on the CPU.
//
// op(A) is (m, k), op(B) is (k, n), C is (m, n). lda/ldb/ldc are row strides in elements of
// the stored matrices (A stored (m, k), or (k, m) when trans_a). beta = 0 overwrites C (its old
// contents are ignored, NaN included); beta = 1 accumulates.
// A and B may be f32 or bf16; C may be f32 or bf16 (bf16 C is computed in f32 and rounded once).
// On the CPU, when both operands are bf16, our own packed kernels multiply them where the CPU has
// AVX-512 (AMX tiles, else the AVX512-BF16 dot products where they run at full rate, else fp32
// FMAs on operands widened as they are packed: bf16_gemm.h; UNTIED_BF16_GEMM chooses; scratch:
// the packing space, and bf16 C's rows in fp32); otherwise bf16 operands are widened to f32 for
// BLAS in scratch from the device allocator (tag `scratch_tag`).
// REQUIRES: m, n, k >= 0; ld* >= the stored row length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "untied/core/allocator.h"
#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct GemmParams {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0;
  DType a_dtype = DType::kF32;
  const void* b = nullptr;
  int64_t ldb = 0;
  DType b_dtype = DType::kF32;
  void* c = nullptr;
  int64_t ldc = 0;
  DType c_dtype = DType::kF32;
  Tag scratch_tag = Tag::kOther;
  // Optional, without trans_a: op(B)'s columns gathered in groups of b_group (a multiple of 32)
  // columns, group g's first column at element offset b_group_offsets[g] of b (with trans_b, the
  // first of its rows of B, ldb apart; else the first of its columns, each ldb apart along k):
  // the heads of a projection read from the weights as they are packed, without a copy of them.
  const int64_t* b_group_offsets = nullptr;
  int64_t b_group = 0;
};

void gemm(Device& dev, const GemmParams& p);

// The products of `groups`, each as gemm() takes it (the experts of a mixture, each over its own
// rows): in one call where the backend has one (on a GPU cuBLAS's grouped batched GEMM, one launch
// for them all, when every group's A, B and C share one dtype and none gathers B), else one
// after another. Each C is gemm()'s result for its group; groups' C must not overlap.
void gemm_grouped(Device& dev, const std::vector<GemmParams>& groups);

// The scratch bytes (all tag p.scratch_tag) the CPU backend's gemm takes for p with `threads`
// threads: for plans made without a device (memory_plan.h). The pointers in p are not read.
int64_t cpu_gemm_scratch_bytes(const GemmParams& p, int threads);

}  // namespace untied
