// AdamW and the clipping helpers (include/untied/kernels/adamw.h) on the GPU.
//
//   adamw_step:       element-wise, grid-stride; 4 elements per thread per step (16-byte loads
//                     and stores of p, m, v, g) when all four pointers are 16-byte aligned, else
//                     one. The bias corrections are computed on the host in fp64 exactly as the
//                     CPU does, and the element update is the CPU's expression evaluated one IEEE
//                     fp32 operation at a time (__fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn:
//                     nothing is contracted into an FMA), so it matches the CPU to fp32 rounding
//                     (bit for bit where the host compiler does not contract either).
//   grad_sum_squares: one 256-thread block per fixed block of 65536 elements (adamw.h); each
//                     thread sums its elements' squares in fp64, then a fixed-order block sum
//                     (cuda_util.cuh) adds the block's 256 partials; the ceil(n / 65536) block
//                     sums (Tag::kOther scratch, as the header says) are copied back and added on
//                     the host in block order. Deterministic; it synchronizes the stream.
//   scale_in_place:   element-wise like adamw_step.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"

namespace untied::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlock = 65536;  // elements per fp64 partial sum (adamw.h)

// ---- adamw_step ----------------------------------------------------------------------------

struct AdamWCoeffs {
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // 1 - lr * weight_decay, or 1
  float b1, b2, omb1, omb2, eps;
};

// One element, as the CPU writes it (adamw.cc), one rounding per operation.
__device__ __forceinline__ void adamw_element(const AdamWCoeffs& a, float& p, float& m, float& v, float g) {
  const float mi = __fadd_rn(__fmul_rn(a.b1, m), __fmul_rn(a.omb1, g));
  const float vi = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(a.omb2, __fmul_rn(g, g)));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), a.inv_sqrt_bc2), a.eps);
  p = __fsub_rn(__fmul_rn(p, a.decay), __fmul_rn(a.step_size, __fdiv_rn(mi, denom)));
}

// VEC == 4: elements [0, n / 4 * 4) as float4 (all pointers 16-byte aligned), the rest one by one.
template <int VEC>
__global__ void __launch_bounds__(kThreads) adamw_kernel(float* p, float* m, float* v, const float* g, int64_t n,
                                                         AdamWCoeffs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if constexpr (VEC == 4) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 pp = reinterpret_cast<const float4*>(p)[i];
      float4 mm = reinterpret_cast<const float4*>(m)[i];
      float4 vv = reinterpret_cast<const float4*>(v)[i];
      const float4 gg = reinterpret_cast<const float4*>(g)[i];
      adamw_element(a, pp.x, mm.x, vv.x, gg.x);
      adamw_element(a, pp.y, mm.y, vv.y, gg.y);
      adamw_element(a, pp.z, mm.z, vv.z, gg.z);
      adamw_element(a, pp.w, mm.w, vv.w, gg.w);
      reinterpret_cast<float4*>(p)[i] = pp;
      reinterpret_cast<float4*>(m)[i] = mm;
      reinterpret_cast<float4*>(v)[i] = vv;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_element(a, pi, mi, vi, g[i]);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// ---- grad_sum_squares ----------------------------------------------------------------------

// part[b] = sum of g[i]^2 over block b's elements [b * kBlock, min(n, (b + 1) * kBlock)), fp64.
// VEC == 4 requires g 16-byte aligned (then every block start is too).
template <int VEC>
__global__ void __launch_bounds__(kThreads) sum_squares_kernel(const float* g, int64_t n, double* part) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  const int64_t i1 = min(n, i0 + kBlock);
  double acc = 0.0;
  int64_t rest = i0;
  if constexpr (VEC == 4) {
    const int64_t groups = (i1 - i0) / 4;
    const float4* g4 = reinterpret_cast<const float4*>(g + i0);
    for (int64_t k = threadIdx.x; k < groups; k += kThreads) {
      const float4 x = g4[k];
      acc += static_cast<double>(x.x) * x.x;
      acc += static_cast<double>(x.y) * x.y;
      acc += static_cast<double>(x.z) * x.z;
      acc += static_cast<double>(x.w) * x.w;
    }
    rest = i0 + groups * 4;
  }
  for (int64_t i = rest + threadIdx.x; i < i1; i += kThreads) acc += static_cast<double>(g[i]) * g[i];

  // Fixed order: butterfly within each warp, then the warps' sums in warp order.
  __shared__ double warp_sums[kThreads / 32];
  const double s = block_sum<kThreads>(acc, warp_sums);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// ---- scale_in_place ------------------------------------------------------------------------

template <int VEC>
__global__ void __launch_bounds__(kThreads) scale_kernel(float* x, int64_t n, float scale) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if constexpr (VEC == 4) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 v = reinterpret_cast<const float4*>(x)[i];
      v.x *= scale;
      v.y *= scale;
      v.z *= scale;
      v.w *= scale;
      reinterpret_cast<float4*>(x)[i] = v;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) x[i] *= scale;
}

}  // namespace

void adamw_step(Device& dev, const AdamWCall& call, const Scratch&) {
  const auto& [p, m, v, g, n, a] = call;
  if (n == 0) return;
  // The coefficients exactly as the CPU computes them (adamw.cc).
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  AdamWCoeffs c{};
  c.step_size = static_cast<float>(static_cast<double>(a.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = a.decay ? static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay) : 1.0f;
  c.b1 = a.beta1;
  c.b2 = a.beta2;
  c.omb1 = 1.0f - a.beta1;
  c.omb2 = 1.0f - a.beta2;
  c.eps = a.eps;

  const cudaStream_t st = stream_of(dev);
  if (aligned({p, m, v, g}, 16))
    adamw_kernel<4><<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, st>>>(p, m, v, g, n, c);
  else
    adamw_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, st>>>(p, m, v, g, n, c);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

namespace {
enum SumSquaresScratch { kBlockSums };
int64_t sum_blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }
}  // namespace

Status grad_sum_squares_supports(const SumSquaresCall& c) {
  if (sum_blocks(c.n) <= INT32_MAX) return Status::ok_status();
  return Status::unsupported(str_cat("n = ", c.n, " (too large for one grid)"));
}

ScratchRequest grad_sum_squares_scratch(const Device&, const SumSquaresCall& c) {
  ScratchRequest r;
  r.set(kBlockSums, sum_blocks(c.n) * 8, Tag::kOther, "grad sum of squares blocks");
  return r;
}

void grad_sum_squares(Device& dev, const SumSquaresCall& c, const Scratch& scratch) {
  const auto& [g, n, result] = c;
  *result = 0.0;
  if (n == 0) return;
  const int64_t blocks = sum_blocks(n);
  const cudaStream_t st = stream_of(dev);
  double* part = scratch.as<double>(kBlockSums);
  if (aligned(g, 16))
    sum_squares_kernel<4><<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(g, n, part);
  else
    sum_squares_kernel<1><<<static_cast<unsigned>(blocks), kThreads, 0, st>>>(g, n, part);
  UNTIED_CUDA_CHECK(cudaGetLastError());
  std::vector<double> host(static_cast<size_t>(blocks));
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(host.data(), part, static_cast<size_t>(blocks) * 8, cudaMemcpyDeviceToHost, st));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(st));
  double total = 0;
  for (const double s : host) total += s;  // block order: deterministic
  *result = total;
}

void scale_in_place(Device& dev, const ScaleCall& c, const Scratch&) {
  const auto& [x, n, scale] = c;
  if (n == 0) return;
  const cudaStream_t st = stream_of(dev);
  if (aligned(x, 16))
    scale_kernel<4><<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, st>>>(x, n, scale);
  else
    scale_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, st>>>(x, n, scale);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace untied::cuda
