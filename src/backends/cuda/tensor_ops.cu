// The tensor ops (include/untied/kernels/tensor_ops.h) on the GPU.
//
//   row_dot:  one warp per row (8 rows per 256-thread block, grid-stride over rows); each lane
//             sums its strided slice of the row in fp32 (16-byte loads where the strides and
//             pointers allow), then a butterfly shuffle adds the 32 lane sums.
//   add_into: element-wise, 4 elements per thread per step (a 16- or 8-byte load of acc and of
//             x) where both pointers are aligned, else one element per step.
//   convert:  element-wise like add_into; the same type both ways is a stream-ordered
//             device-to-device memcpy (bit-exact, as the CPU's load/store round trip is for
//             every non-NaN value).
//   add_bias: element-wise over (rows, n), grid-stride.
//   bias_grad: one thread per column and chunk of kBiasRows rows, adding the chunk's rows in
//             order into an fp32 partial sum (scratch), then one thread per column adding the
//             chunks' sums in order: the columns are few (a projection's H*D), the rows many; the
//             CPU's order exactly, whatever the launch.
// Every op is element-independent or row-independent, so results do not depend on the launch
// shape. Nothing is allocated.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"
#include "untied/kernels/tensor_ops.h"

namespace untied::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBiasRows = kBiasGradRows;  // bias_grad: rows per chunk (tensor_ops.h)

// ---- row_dot -------------------------------------------------------------------------------

constexpr int kRowsPerBlock = kThreads / 32;

// out[r * out_stride] = sum_d a[r * lda + d] * b[r * ldb + d]. VEC > 1 requires dim, lda and ldb
// to be multiples of VEC and a, b aligned to VEC elements' bytes.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) row_dot_kernel(int64_t rows, int64_t dim, const T* a, int64_t lda,
                                                           const T* b, int64_t ldb, float* out, int64_t out_stride) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    const T* ar = a + r * lda;
    const T* br = b + r * ldb;
    float acc = 0.0f;
    for (int64_t d = static_cast<int64_t>(lane) * VEC; d < dim; d += 32 * VEC) {
      const Pack<T, VEC> pa = load<T, VEC>(ar + d);
      const Pack<T, VEC> pb = load<T, VEC>(br + d);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc = fmaf(to_f32(pa.v[k]), to_f32(pb.v[k]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[r * out_stride] = acc;
  }
}

template <typename T>
void launch_row_dot(cudaStream_t st, int64_t rows, int64_t dim, const void* a, int64_t lda, const void* b,
                    int64_t ldb, float* out, int64_t out_stride) {
  constexpr int kVec = 16 / sizeof(T);
  const unsigned grid = blocks_for(rows, kRowsPerBlock);
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  if (multiples_of(kVec, {dim, lda, ldb}) && aligned({a, b}, 16))
    row_dot_kernel<T, kVec><<<grid, kThreads, 0, st>>>(rows, dim, ta, lda, tb, ldb, out, out_stride);
  else
    row_dot_kernel<T, 1><<<grid, kThreads, 0, st>>>(rows, dim, ta, lda, tb, ldb, out, out_stride);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// ---- add_into ------------------------------------------------------------------------------

// acc[i] = acc[i] + x[i] for i < n, added in fp32 and rounded to A: VEC elements per step over
// the first n / VEC * VEC elements (acc and x aligned to their VEC-element vectors), then the
// tail one element per thread.
template <typename A, typename X, int VEC>
__global__ void __launch_bounds__(kThreads) add_into_kernel(A* acc, const X* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = n / VEC;
  for (int64_t g = tid; g < groups; g += stride) {
    Pack<A, VEC> pa = load<A, VEC>(acc + g * VEC);
    const Pack<X, VEC> px = load<X, VEC>(x + g * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) pa.v[k] = from_f32<A>(to_f32(pa.v[k]) + to_f32(px.v[k]));
    store<A, VEC>(acc + g * VEC, pa);
  }
  const int64_t i = groups * VEC + tid;  // the tail: fewer than VEC elements
  if (i < n) acc[i] = from_f32<A>(to_f32(acc[i]) + to_f32(x[i]));
}

template <typename A, typename X>
void launch_add_into(cudaStream_t st, void* acc, const void* x, int64_t n) {
  A* ta = static_cast<A*>(acc);
  const X* tx = static_cast<const X*>(x);
  if (aligned(acc, 4 * sizeof(A)) && aligned(x, 4 * sizeof(X))) {
    add_into_kernel<A, X, 4><<<blocks_for(n / 4 + 1, kThreads), kThreads, 0, st>>>(ta, tx, n);
  } else {
    add_into_kernel<A, X, 1><<<blocks_for(n, kThreads), kThreads, 0, st>>>(ta, tx, n);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// ---- convert -------------------------------------------------------------------------------

// dst[i] = src[i] for i < n, S -> D through fp32; VEC as in add_into_kernel.
template <typename D, typename S, int VEC>
__global__ void __launch_bounds__(kThreads) convert_kernel(D* dst, const S* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = n / VEC;
  for (int64_t g = tid; g < groups; g += stride) {
    const Pack<S, VEC> ps = load<S, VEC>(src + g * VEC);
    Pack<D, VEC> pd;
#pragma unroll
    for (int k = 0; k < VEC; ++k) pd.v[k] = from_f32<D>(to_f32(ps.v[k]));
    store<D, VEC>(dst + g * VEC, pd);
  }
  const int64_t i = groups * VEC + tid;
  if (i < n) dst[i] = from_f32<D>(to_f32(src[i]));
}

template <typename D, typename S>
void launch_convert(cudaStream_t st, void* dst, const void* src, int64_t n) {
  D* td = static_cast<D*>(dst);
  const S* ts = static_cast<const S*>(src);
  if (aligned(dst, 4 * sizeof(D)) && aligned(src, 4 * sizeof(S))) {
    convert_kernel<D, S, 4><<<blocks_for(n / 4 + 1, kThreads), kThreads, 0, st>>>(td, ts, n);
  } else {
    convert_kernel<D, S, 1><<<blocks_for(n, kThreads), kThreads, 0, st>>>(td, ts, n);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// ---- add_bias, bias_grad ---------------------------------------------------------------------

template <typename O, typename B>
__global__ void __launch_bounds__(kThreads) add_bias_kernel(O* out, int64_t ld, int64_t rows, int64_t n,
                                                            const B* bias) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * n; i += stride) {
    const int64_t r = i / n, c = i % n;
    out[r * ld + c] = from_f32<O>(to_f32(out[r * ld + c]) + to_f32(bias[c]));
  }
}

template <typename O, typename B>
void launch_add_bias(cudaStream_t st, void* out, int64_t ld, int64_t rows, int64_t n, const void* bias) {
  add_bias_kernel<O, B><<<blocks_for(rows * n, kThreads), kThreads, 0, st>>>(static_cast<O*>(out), ld, rows, n,
                                                                             static_cast<const B*>(bias));
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// partial[chunk * n + c] = sum of g[r, c] over the chunk's rows, in order.
template <typename G>
__global__ void __launch_bounds__(kThreads) bias_grad_chunks_kernel(float* partial, const G* g, int64_t ld,
                                                                    int64_t rows, int64_t n) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (c >= n) return;
  const int64_t end = (chunk + 1) * kBiasRows, r1 = end < rows ? end : rows;
  float sum = 0.0f;
  for (int64_t r = chunk * kBiasRows; r < r1; ++r) sum = __fadd_rn(sum, to_f32(g[r * ld + c]));
  partial[chunk * n + c] = sum;
}

// db[c] = (accumulate ? db[c] : 0) + the chunks' sums in order.
template <typename D>
__global__ void __launch_bounds__(kThreads) bias_grad_sum_kernel(D* db, const float* partial, int64_t chunks,
                                                                 int64_t n, bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float sum = accumulate ? to_f32(db[c]) : 0.0f;
  for (int64_t j = 0; j < chunks; ++j) sum = __fadd_rn(sum, partial[j * n + c]);
  db[c] = from_f32<D>(sum);
}

template <typename D, typename G>
void launch_bias_grad(cudaStream_t st, void* db, const void* g, int64_t ld, int64_t rows, int64_t n, bool accumulate,
                      float* partial) {
  const auto columns = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  const int64_t chunks = (rows + kBiasRows - 1) / kBiasRows;
  if (chunks > 0)
    bias_grad_chunks_kernel<G><<<dim3(columns, static_cast<unsigned>(chunks)), kThreads, 0, st>>>(
        partial, static_cast<const G*>(g), ld, rows, n);
  bias_grad_sum_kernel<D><<<columns, kThreads, 0, st>>>(static_cast<D*>(db), partial, chunks, n, accumulate);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void row_dot(Device& dev, const RowDotCall& c, const Scratch&) {
  const auto& [rows, dim, t, a, lda, b, ldb, out, out_stride] = c;
  if (rows == 0) return;
  const cudaStream_t st = stream_of(dev);
  if (t == DType::kBF16)
    launch_row_dot<bf16_t>(st, rows, dim, a, lda, b, ldb, out, out_stride);
  else
    launch_row_dot<float>(st, rows, dim, a, lda, b, ldb, out, out_stride);
}

void add_into(Device& dev, const AddIntoCall& c, const Scratch&) {
  const auto& [acc, acc_t, x, x_t, n] = c;
  if (n == 0) return;
  const cudaStream_t st = stream_of(dev);
  const bool acc_bf16 = acc_t == DType::kBF16, x_bf16 = x_t == DType::kBF16;
  if (acc_bf16 && x_bf16) launch_add_into<bf16_t, bf16_t>(st, acc, x, n);
  else if (acc_bf16) launch_add_into<bf16_t, float>(st, acc, x, n);
  else if (x_bf16) launch_add_into<float, bf16_t>(st, acc, x, n);
  else launch_add_into<float, float>(st, acc, x, n);
}

void convert(Device& dev, const ConvertCall& c, const Scratch&) {
  const auto& [dst, dst_t, src, src_t, n] = c;
  if (n == 0) return;
  const cudaStream_t st = stream_of(dev);
  if (dst_t == src_t) {
    const auto bytes = static_cast<size_t>(n * dtype_size(dst_t));
    UNTIED_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  } else if (dst_t == DType::kBF16) {
    launch_convert<bf16_t, float>(st, dst, src, n);
  } else {
    launch_convert<float, bf16_t>(st, dst, src, n);
  }
}

void add_bias(Device& dev, const AddBiasCall& c, const Scratch&) {
  const auto& [out, out_t, ld, rows, n, bias, bias_t] = c;
  const cudaStream_t st = stream_of(dev);
  const bool o16 = out_t == DType::kBF16, b16 = bias_t == DType::kBF16;
  if (o16 && b16) launch_add_bias<bf16_t, bf16_t>(st, out, ld, rows, n, bias);
  else if (o16) launch_add_bias<bf16_t, float>(st, out, ld, rows, n, bias);
  else if (b16) launch_add_bias<float, bf16_t>(st, out, ld, rows, n, bias);
  else launch_add_bias<float, float>(st, out, ld, rows, n, bias);
}

ScratchRequest bias_grad_scratch(const Device&, const BiasGradCall& c) {
  ScratchRequest r;
  r.set(0, std::max<int64_t>(1, (c.rows + kBiasRows - 1) / kBiasRows) * c.n * 4, Tag::kOther, "bias_grad chunk sums");
  return r;
}

void bias_grad(Device& dev, const BiasGradCall& c, const Scratch& scratch) {
  const auto& [db, db_t, g, g_t, ld, rows, n, accumulate] = c;
  const cudaStream_t st = stream_of(dev);
  float* partial = scratch.as<float>(0);
  const bool d16 = db_t == DType::kBF16, g16 = g_t == DType::kBF16;
  if (d16 && g16) launch_bias_grad<bf16_t, bf16_t>(st, db, g, ld, rows, n, accumulate, partial);
  else if (d16) launch_bias_grad<bf16_t, float>(st, db, g, ld, rows, n, accumulate, partial);
  else if (g16) launch_bias_grad<float, bf16_t>(st, db, g, ld, rows, n, accumulate, partial);
  else launch_bias_grad<float, float>(st, db, g, ld, rows, n, accumulate, partial);
}

}  // namespace untied::cuda
