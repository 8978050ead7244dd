// RoPE on the GPU (include/untied/kernels/rope.h), in place.
//
// One block per token (grid-stride over tokens). The block first computes the token's D/2
// angles pos * theta^(-2i/D) in double and their cos/sin in double (sincos), rounded to fp32
// into shared memory, exactly as the CPU builds its table; then its threads rotate every head's
// pairs (i, i + D/2), VEC consecutive i per thread (16-byte loads of both halves where the head
// dim, row stride and pointer allow, else one pair per thread). Each element is read and
// written by the same thread, so the in-place update needs no ordering beyond that.
//
// Unlike the CPU, which fills a (tokens, D/2) cos/sin table from the allocator, this computes
// the angles on the fly and allocates nothing: shared memory holds one token's table at a time
// (so a GPU run uses less kAttnWorkspace than the CPU's figures, never more).
//
// Resources (ptxas, sm_90): <= 48 registers, 16 KiB static shared memory, a 40-byte stack frame
// that belongs to sincos's argument reduction for |angle| >= 2^31 only, never reached for
// positions below 2^31.
//
// The rotation is written with explicit round-to-nearest multiplies and adds (no fused
// multiply-add), the same operations in the same order as the CPU's, so the fp32 results agree
// with it up to the last-bit differences of the double-precision pow and sincos.
#include <algorithm>
#include <cstdint>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"
#include "kernels/rope_freq.h"

namespace untied::cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxHalf = 1024;  // D <= 2048 (rope.h)

struct RopeParams {
  void* x;
  const int64_t* positions;  // GPU memory, or null: token t is at first_position + t
  int64_t tokens;
  int64_t row_stride;  // elements between tokens
  int64_t first_position;
  double theta;
  RopeScaling scaling;
  int heads;
  int head_dim;
  float sign;  // +1 forward, -1 inverse (backward)
};

// VEC > 1 requires D/2 and row_stride to be multiples of VEC and x aligned to 16 bytes.
template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads) rope_kernel(RopeParams p) {
  __shared__ double inv_freq[kMaxHalf];
  __shared__ float cos_t[kMaxHalf];
  __shared__ float sin_t[kMaxHalf];
  const int half = p.head_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    inv_freq[i] = rope_inv_freq(p.theta, i, p.head_dim, p.scaling);
  __syncthreads();

  const int per_head = half / VEC;       // vectors of pairs per head
  const int work = p.heads * per_head;   // < 2^31 (checked on the host)
  T* x = static_cast<T*>(p.x);
  for (int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int64_t pos = p.positions != nullptr ? p.positions[t] : p.first_position + t;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      double s, c;
      sincos(static_cast<double>(pos) * inv_freq[i], &s, &c);
      cos_t[i] = static_cast<float>(c);
      sin_t[i] = p.sign * static_cast<float>(s);
    }
    __syncthreads();
    T* xt = x + t * p.row_stride;
    for (int j = threadIdx.x; j < work; j += blockDim.x) {
      const int h = j / per_head;
      const int i0 = (j - h * per_head) * VEC;
      T* p1 = xt + static_cast<int64_t>(h) * p.head_dim + i0;
      T* p2 = p1 + half;
      const Pack<T, VEC> a = load<T, VEC>(p1);
      const Pack<T, VEC> b = load<T, VEC>(p2);
      Pack<T, VEC> ya, yb;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float c = cos_t[i0 + k], s = sin_t[i0 + k];
        const float x1 = to_f32(a.v[k]), x2 = to_f32(b.v[k]);
        ya.v[k] = from_f32<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
        yb.v[k] = from_f32<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
      }
      store<T, VEC>(p1, ya);
      store<T, VEC>(p2, yb);
    }
    __syncthreads();  // the next token overwrites cos_t / sin_t
  }
}

template <typename T>
void launch(cudaStream_t st, const RopeParams& p) {
  constexpr int kVec = 16 / sizeof(T);
  const int half = p.head_dim / 2;
  // Offsets added to x: t * row_stride, h * D (= 2 * half) and i0 (+ half): all multiples of kVec.
  const bool vec = multiples_of(kVec, {half, p.row_stride}) && aligned(p.x, 16);
  const int64_t work = p.heads * static_cast<int64_t>(vec ? half / kVec : half);
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (std::max<int64_t>(work, half) + 31) / 32 * 32));
  const unsigned grid = blocks_for(p.tokens, 1);
  if (vec)
    rope_kernel<T, kVec><<<grid, threads, 0, st>>>(p);
  else
    rope_kernel<T, 1><<<grid, threads, 0, st>>>(p);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

Status rope_supports(const RopeCall& c) {
  // The per-token work index j (and j + blockDim.x) is an int.
  if (c.s.heads * (c.s.head_dim / 2) <= INT32_MAX - kMaxThreads) return Status::ok_status();
  return Status::unsupported(str_cat("heads * head_dim/2 = ", c.s.heads * (c.s.head_dim / 2), " (over 2^31 - 257)"));
}

void rope(Device& dev, const RopeCall& c, const Scratch&) {
  const auto& [s, x, positions, dir] = c;
  if (s.tokens == 0) return;
  const RopeParams p{.x = x,
                     .positions = positions,
                     .tokens = s.tokens,
                     .row_stride = s.row_stride > 0 ? s.row_stride : s.heads * s.head_dim,
                     .first_position = s.first_position,
                     .theta = s.theta,
                     .scaling = s.scaling,
                     .heads = static_cast<int>(s.heads),
                     .head_dim = static_cast<int>(s.head_dim),
                     .sign = dir == Direction::kInverse ? -1.0f : 1.0f};
  const cudaStream_t st = stream_of(dev);
  if (s.dtype == DType::kBF16)
    launch<bf16_t>(st, p);
  else
    launch<float>(st, p);
}

}  // namespace untied::cuda
