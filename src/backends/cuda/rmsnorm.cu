// RMSNorm on the GPU (include/untied/kernels/rmsnorm.h).
//
// Forward and dx: one row per warp for dim <= 1024 (8 rows per 256-thread block), else one row
// per block of 256 (dim <= 4096) or 512 threads; grid-stride over rows. Each thread sums its
// strided slice of the row in fp32 (16-byte loads where dim, row_stride and the pointers allow,
// else one element per step), the per-thread sums are added in fp64 (shuffles, then shared
// memory across the warps of a block, in a fixed order), and the row is read a second time
// (from L1/L2) to write y or dx. The outputs and the dw terms use the CPU's per-element
// arithmetic in its order, with explicit round-to-nearest operations (no fused multiply-add);
// only the row sums (fused multiply-adds into per-thread fp32 sums) are ordered differently.
//
// dw (accumulated, deterministic, no atomics), in two kernels over the fp64 scratch the header
// names (ceil(rows / 2048) * dim doubles, Tag::kOther):
//   1. block sums: a (32 columns x 8 row lanes) thread block per (32-column tile, 2048-row
//      block); row lane k sums rows k, k+8, ... of the block in fp64, and the 8 lane sums are
//      added in order into scratch[block][column];
//   2. one thread per column adds the block sums in order and adds the total to dw once.
// The summation order is fixed by the shape alone, so the result is the same on every run.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"

namespace untied::cuda {
namespace {

constexpr int64_t kRowBlock = 2048;  // rows per fp64 block sum of dw (rmsnorm.h)

// The sum of v over the TPR threads of a row group, in fp64, in a fixed order; every thread of
// the group gets it. TPR == 32: one warp. TPR > 32: the whole block is one row group, and
// `smem` holds TPR / 32 doubles; contains __syncthreads, so all threads of the block must call
// it together.
template <int TPR>
__device__ __forceinline__ double row_sum(double v, double* smem) {
  if constexpr (TPR == 32)
    return warp_sum(v);
  else
    return block_sum<TPR>(v, smem);
}

struct NormParams {
  int64_t rows;
  int64_t dim;
  int64_t row_stride;
  float eps;
};

// ---- forward -------------------------------------------------------------------------------

// TPR threads per row, max(TPR, 256) threads per block. VEC > 1 requires dim and row_stride to
// be multiples of VEC and x, y, w aligned to VEC elements' bytes.
template <typename T, typename W, int TPR, int VEC>
__global__ void __launch_bounds__(TPR > 256 ? TPR : 256)
    forward_kernel(NormParams p, T* y, float* rstd, const T* x, const W* w) {
  constexpr int kBlock = TPR > 256 ? TPR : 256;
  constexpr int kRowsPerBlock = kBlock / TPR;
  __shared__ double smem[TPR / 32];
  const int tid = threadIdx.x % TPR;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR; r < p.rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + r * p.row_stride;
    float ss = 0.0f;
    for (int64_t d = static_cast<int64_t>(tid) * VEC; d < p.dim; d += TPR * VEC) {
      const Pack<T, VEC> xv = load<T, VEC>(xr + d);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float xf = to_f32(xv.v[k]);
        ss = fmaf(xf, xf, ss);
      }
    }
    const double ms = row_sum<TPR>(static_cast<double>(ss), smem) / static_cast<double>(p.dim);
    const float rr = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(p.eps)));
    if (tid == 0) rstd[r] = rr;
    T* yr = y + r * p.row_stride;
    for (int64_t d = static_cast<int64_t>(tid) * VEC; d < p.dim; d += TPR * VEC) {
      const Pack<T, VEC> xv = load<T, VEC>(xr + d);
      const Pack<W, VEC> wv = load<W, VEC>(w + d);
      Pack<T, VEC> yv;
#pragma unroll
      for (int k = 0; k < VEC; ++k) yv.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(to_f32(xv.v[k]), rr), to_f32(wv.v[k])));
      store<T, VEC>(yr + d, yv);
    }
  }
}

// ---- backward: dx --------------------------------------------------------------------------

// dx = r * (w * dy) - (r^3 / dim * sum_j w_j dy_j x_j) * x; shapes and VEC as forward_kernel.
template <typename T, typename W, int TPR, int VEC>
__global__ void __launch_bounds__(TPR > 256 ? TPR : 256)
    dx_kernel(NormParams p, T* dx, const T* x, const float* rstd, const W* w, const T* dy) {
  constexpr int kBlock = TPR > 256 ? TPR : 256;
  constexpr int kRowsPerBlock = kBlock / TPR;
  __shared__ double smem[TPR / 32];
  const int tid = threadIdx.x % TPR;
  const double inv_dim = 1.0 / static_cast<double>(p.dim);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR; r < p.rows;
       r += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const T* xr = x + r * p.row_stride;
    const T* gr = dy + r * p.row_stride;
    float dot = 0.0f;
    // Not unrolled: unrolling these loops further makes ptxas spill (f32 variants, sm_80 and
    // sm_90); three independent 16-byte loads per step and many resident warps keep memory busy.
#pragma unroll 1
    for (int64_t d = static_cast<int64_t>(tid) * VEC; d < p.dim; d += TPR * VEC) {
      const Pack<T, VEC> xv = load<T, VEC>(xr + d);
      const Pack<T, VEC> gv = load<T, VEC>(gr + d);
      const Pack<W, VEC> wv = load<W, VEC>(w + d);
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        dot = fmaf(__fmul_rn(to_f32(wv.v[k]), to_f32(gv.v[k])), to_f32(xv.v[k]), dot);
    }
    const double sum = row_sum<TPR>(static_cast<double>(dot), smem);
    const float rr = rstd[r];
    const double rd = rr;
    const float c = static_cast<float>(rd * rd * rd * inv_dim * sum);
    T* dr = dx + r * p.row_stride;
#pragma unroll 2  // more unrolling spills (see above)
    for (int64_t d = static_cast<int64_t>(tid) * VEC; d < p.dim; d += TPR * VEC) {
      const Pack<T, VEC> xv = load<T, VEC>(xr + d);
      const Pack<T, VEC> gv = load<T, VEC>(gr + d);
      const Pack<W, VEC> wv = load<W, VEC>(w + d);
      Pack<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        out.v[k] = from_f32<T>(__fsub_rn(__fmul_rn(rr, __fmul_rn(to_f32(wv.v[k]), to_f32(gv.v[k]))),
                                         __fmul_rn(c, to_f32(xv.v[k]))));
      store<T, VEC>(dr + d, out);
    }
  }
}

// ---- backward: dw --------------------------------------------------------------------------

constexpr int kDwCols = 32;   // columns per thread block (threadIdx.x)
constexpr int kDwLanes = 8;   // row lanes per thread block (threadIdx.y)

// part[b * dim + c] = sum over rows r of block b of dy[r, c] * (x[r, c] * rstd[r]), fp64.
// Grid: (ceil(dim / 32), min(blocks, 65535)), grid-stride over the row blocks in y.
template <typename T>
__global__ void __launch_bounds__(kDwCols * kDwLanes)
    dw_block_kernel(NormParams p, double* part, const T* x, const float* rstd, const T* dy) {
  __shared__ double lanes[kDwLanes][kDwCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kDwCols + threadIdx.x;
  const int64_t nblocks = (p.rows + kRowBlock - 1) / kRowBlock;
  for (int64_t b = blockIdx.y; b < nblocks; b += gridDim.y) {
    const int64_t r1 = (b + 1) * kRowBlock < p.rows ? (b + 1) * kRowBlock : p.rows;
    double acc = 0.0;
    if (c < p.dim) {
#pragma unroll 4  // independent loads in flight; the fp64 adds stay in row order
      for (int64_t r = b * kRowBlock + threadIdx.y; r < r1; r += kDwLanes) {
        const float xf = to_f32(x[r * p.row_stride + c]);
        const float gf = to_f32(dy[r * p.row_stride + c]);
        acc += static_cast<double>(__fmul_rn(gf, __fmul_rn(xf, rstd[r])));
      }
    }
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < p.dim) {
      double total = 0.0;
#pragma unroll
      for (int k = 0; k < kDwLanes; ++k) total += lanes[k][threadIdx.x];
      part[b * p.dim + c] = total;
    }
    __syncthreads();  // lanes is rewritten for the next block
  }
}

// dw[c] += sum_b part[b * dim + c], blocks in order; one thread per column.
__global__ void __launch_bounds__(256) dw_final_kernel(int64_t dim, int64_t nblocks, float* dw, const double* part) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < dim;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int64_t b = 0; b < nblocks; ++b) acc += part[b * dim + c];
    dw[c] = static_cast<float>(static_cast<double>(dw[c]) + acc);
  }
}

// ---- launch --------------------------------------------------------------------------------

// A launch shape: TPR threads per row, VEC elements per load, kBlock threads per block.
template <typename T, typename W, int TPR, int VEC>
struct Config {
  static constexpr int kTpr = TPR;
  static constexpr int kVec = VEC;
  static constexpr int kBlock = TPR > 256 ? TPR : 256;
};

// Calls f(Config<...>{}) with the threads per row chosen by dim and the vector width the layout
// allows (vec_ok: the pointers are aligned).
template <typename T, typename W, typename F>
void with_config(const NormParams& p, bool vec_ok, F&& f) {
  // 16-byte vectors of the wider of the two storage types.
  constexpr int kVec = 16 / (sizeof(T) > sizeof(W) ? sizeof(T) : sizeof(W));
  const bool vec = vec_ok && multiples_of(kVec, {p.dim, p.row_stride});
  if (p.dim <= 1024) {
    vec ? f(Config<T, W, 32, kVec>{}) : f(Config<T, W, 32, 1>{});
  } else if (p.dim <= 4096) {
    vec ? f(Config<T, W, 256, kVec>{}) : f(Config<T, W, 256, 1>{});
  } else {
    vec ? f(Config<T, W, 512, kVec>{}) : f(Config<T, W, 512, 1>{});
  }
}

template <typename C>
unsigned row_blocks(int64_t rows) {
  constexpr int64_t kRowsPerBlock = C::kBlock / C::kTpr;
  return blocks_for(rows, kRowsPerBlock);
}

// True when the vectors with_config would use are aligned at every row tensor and at w.
template <typename T, typename W>
bool vec_aligned(std::initializer_list<const void*> tensors, const void* w) {
  constexpr int kVec = 16 / (sizeof(T) > sizeof(W) ? sizeof(T) : sizeof(W));
  return aligned(tensors, kVec * sizeof(T)) && aligned(w, kVec * sizeof(W));
}

template <typename T, typename W>
void forward_typed(cudaStream_t st, const NormParams& p, void* y, float* rstd, const void* x, const void* w) {
  with_config<T, W>(p, vec_aligned<T, W>({y, x}, w), [&](auto cfg) {
    using C = decltype(cfg);
    forward_kernel<T, W, C::kTpr, C::kVec><<<row_blocks<C>(p.rows), C::kBlock, 0, st>>>(
        p, static_cast<T*>(y), rstd, static_cast<const T*>(x), static_cast<const W*>(w));
    UNTIED_CUDA_CHECK(cudaGetLastError());
  });
}

template <typename T, typename W>
void dx_typed(cudaStream_t st, const NormParams& p, void* dx, const void* x, const float* rstd, const void* w,
              const void* dy) {
  with_config<T, W>(p, vec_aligned<T, W>({dx, x, dy}, w), [&](auto cfg) {
    using C = decltype(cfg);
    dx_kernel<T, W, C::kTpr, C::kVec><<<row_blocks<C>(p.rows), C::kBlock, 0, st>>>(
        p, static_cast<T*>(dx), static_cast<const T*>(x), rstd, static_cast<const W*>(w), static_cast<const T*>(dy));
    UNTIED_CUDA_CHECK(cudaGetLastError());
  });
}

template <typename T>
void dw_typed(cudaStream_t st, const NormParams& p, double* part, float* dw, const void* x, const float* rstd,
              const void* dy) {
  const int64_t nblocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const dim3 grid(static_cast<unsigned>((p.dim + kDwCols - 1) / kDwCols),
                  static_cast<unsigned>(std::min<int64_t>(nblocks, kMaxGridYZ)));
  dw_block_kernel<T><<<grid, dim3(kDwCols, kDwLanes), 0, st>>>(p, part, static_cast<const T*>(x), rstd,
                                                                static_cast<const T*>(dy));
  UNTIED_CUDA_CHECK(cudaGetLastError());
  const unsigned fgrid = blocks_for(p.dim, 256);
  dw_final_kernel<<<fgrid, 256, 0, st>>>(p.dim, nblocks, dw, part);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

NormParams params(const RmsNormShape& s) {
  return NormParams{.rows = s.rows, .dim = s.dim, .row_stride = s.row_stride > 0 ? s.row_stride : s.dim, .eps = s.eps};
}

}  // namespace

void rmsnorm_forward(Device& dev, const RmsNormForwardCall& c, const Scratch&) {
  const auto& [s, y, rstd, x, w] = c;
  if (s.rows == 0) return;
  const NormParams p = params(s);
  const cudaStream_t st = stream_of(dev);
  const bool xb = s.dtype == DType::kBF16, wb = s.weight_dtype == DType::kBF16;
  if (xb && wb) forward_typed<bf16_t, bf16_t>(st, p, y, rstd, x, w);
  else if (xb) forward_typed<bf16_t, float>(st, p, y, rstd, x, w);
  else if (wb) forward_typed<float, bf16_t>(st, p, y, rstd, x, w);
  else forward_typed<float, float>(st, p, y, rstd, x, w);
}

void rmsnorm_backward(Device& dev, const RmsNormBackwardCall& c, const Scratch& scratch) {
  const auto& [s, dx, dw, x, rstd, w, dy] = c;
  if (s.rows == 0) return;
  double* const part = scratch.as<double>(kRmsNormBlockSums);
  const NormParams p = params(s);
  const cudaStream_t st = stream_of(dev);
  const bool xb = s.dtype == DType::kBF16, wb = s.weight_dtype == DType::kBF16;
  if (xb && wb) dx_typed<bf16_t, bf16_t>(st, p, dx, x, rstd, w, dy);
  else if (xb) dx_typed<bf16_t, float>(st, p, dx, x, rstd, w, dy);
  else if (wb) dx_typed<float, bf16_t>(st, p, dx, x, rstd, w, dy);
  else dx_typed<float, float>(st, p, dx, x, rstd, w, dy);
  if (xb) dw_typed<bf16_t>(st, p, part, dw, x, rstd, dy);
  else dw_typed<float>(st, p, part, dw, x, rstd, dy);
  // The scratch `part` goes back to the allocator here with the kernels still queued: the caching source
  // hands it out again only to later work, which is ordered after them on the same stream.
}

}  // namespace untied::cuda
