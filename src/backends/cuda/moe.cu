// The mixture-of-experts row movements (include/untied/kernels/moe.h) on the GPU.
//
//   gather_rows:  one block per destination row, its threads over the row's elements.
//   combine_rows: one block per token row; each thread sums its elements over the k rows in the
//                 order j = 0..k-1 in fp32, as the CPU does, and rounds once.
//   combine_rows_backward: one block per token row and expert slot; the block writes w * dy into
//                 the slot's row and reduces dy . ys over its threads (a fixed tree: the sum does
//                 not depend on the launch, though its order differs from the CPU's sequential one).
// Nothing is allocated.
#include <cstdint>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"

namespace untied::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(T* dst, const T* src, const int32_t* idx, int64_t dim) {
  const int64_t i = blockIdx.x;
  const T* s = src + static_cast<int64_t>(idx[i]) * dim;
  T* d = dst + i * dim;
  for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) d[e] = s[e];
}

template <typename T>
__global__ void __launch_bounds__(kThreads) combine_rows_kernel(T* out, const T* ys, const int32_t* pos, const float* w,
                                                                int64_t k, int64_t dim, bool accumulate) {
  const int64_t r = blockIdx.x;
  for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) {
    float acc = accumulate ? to_f32(out[r * dim + e]) : 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const float wj = w == nullptr ? 1.0f : w[r * k + j];
      acc = __fadd_rn(acc, __fmul_rn(wj, to_f32(ys[static_cast<int64_t>(pos[r * k + j]) * dim + e])));
    }
    out[r * dim + e] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) combine_rows_backward_kernel(T* dys, float* dw, const T* dy, const T* ys,
                                                                         const int32_t* pos, const float* w, int64_t k,
                                                                         int64_t dim) {
  __shared__ float partial[kThreads];
  const int64_t r = blockIdx.x / k, j = blockIdx.x % k;
  const int64_t p = pos[r * k + j];
  const float wj = w[r * k + j];
  float dot = 0.0f;
  for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) {
    const float g = to_f32(dy[r * dim + e]);
    dot = __fadd_rn(dot, __fmul_rn(g, to_f32(ys[p * dim + e])));
    dys[p * dim + e] = from_f32<T>(__fmul_rn(wj, g));
  }
  partial[threadIdx.x] = dot;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] = __fadd_rn(partial[threadIdx.x], partial[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) dw[r * k + j] = partial[0];
}

}  // namespace

void gather_rows(Device& dev, const GatherRowsCall& c, const Scratch&) {
  const cudaStream_t st = stream_of(dev);
  const auto blocks = static_cast<unsigned>(c.s.m);
  if (c.s.dtype == DType::kBF16)
    gather_rows_kernel<bf16_t><<<blocks, kThreads, 0, st>>>(static_cast<bf16_t*>(c.dst),
                                                            static_cast<const bf16_t*>(c.src), c.idx, c.s.dim);
  else
    gather_rows_kernel<float><<<blocks, kThreads, 0, st>>>(static_cast<float*>(c.dst), static_cast<const float*>(c.src),
                                                           c.idx, c.s.dim);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

void combine_rows(Device& dev, const CombineRowsCall& c, const Scratch&) {
  const cudaStream_t st = stream_of(dev);
  const auto blocks = static_cast<unsigned>(c.s.n);
  if (c.s.dtype == DType::kBF16)
    combine_rows_kernel<bf16_t><<<blocks, kThreads, 0, st>>>(static_cast<bf16_t*>(c.out),
                                                             static_cast<const bf16_t*>(c.ys), c.pos, c.w, c.s.k,
                                                             c.s.dim, c.accumulate);
  else
    combine_rows_kernel<float><<<blocks, kThreads, 0, st>>>(static_cast<float*>(c.out), static_cast<const float*>(c.ys),
                                                            c.pos, c.w, c.s.k, c.s.dim, c.accumulate);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

void combine_rows_backward(Device& dev, const CombineRowsBackwardCall& c, const Scratch&) {
  const cudaStream_t st = stream_of(dev);
  const auto blocks = static_cast<unsigned>(c.s.n * c.s.k);
  if (c.s.dtype == DType::kBF16)
    combine_rows_backward_kernel<bf16_t><<<blocks, kThreads, 0, st>>>(
        static_cast<bf16_t*>(c.dys), c.dw, static_cast<const bf16_t*>(c.dy), static_cast<const bf16_t*>(c.ys), c.pos,
        c.w, c.s.k, c.s.dim);
  else
    combine_rows_backward_kernel<float><<<blocks, kThreads, 0, st>>>(
        static_cast<float*>(c.dys), c.dw, static_cast<const float*>(c.dy), static_cast<const float*>(c.ys), c.pos,
        c.w, c.s.k, c.s.dim);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace untied::cuda
