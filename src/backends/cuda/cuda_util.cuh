// Helpers shared by the CUDA kernels of this folder (included by .cu files only):
//   host:   the device's stream, alignment and vector-width tests, grid sizes;
//   device: bf16 <-> fp32 conversion, aligned vector loads and stores, warp and block sums in a
//           fixed order;
//   both:   the first id or label outside [0, limit), found on the device and read back.
//
// Vector paths: a kernel that moves VEC elements of T as one Pack<T, VEC> needs every pointer
// it is given aligned to VEC * sizeof(T) bytes (aligned()) AND every element offset it adds to
// them (row strides, row lengths, head dims) a multiple of VEC (multiples_of()); the callers
// test both before choosing VEC > 1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backends/cuda/cuda_device.h"

namespace untied::cuda {

using bf16_t = __nv_bfloat16;

inline constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // most blocks we launch in x (grid-stride loops do the rest)
inline constexpr int64_t kMaxGridYZ = 65535;              // the hardware limit of gridDim.y and gridDim.z

// ---- host ----------------------------------------------------------------------------------

// The stream every kernel of `dev` runs on.
inline cudaStream_t stream_of(Device& dev) { return static_cast<CudaDevice&>(dev).stream(); }

// True when p is a multiple of `bytes` (a power of two).
inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}
inline bool aligned(std::initializer_list<const void*> ps, int64_t bytes) {
  return std::all_of(ps.begin(), ps.end(), [bytes](const void* p) { return aligned(p, bytes); });
}

// True when every n is a multiple of k (row lengths and strides of a vector path).
inline bool multiples_of(int64_t k, std::initializer_list<int64_t> ns) {
  return std::all_of(ns.begin(), ns.end(), [k](int64_t n) { return n % k == 0; });
}

// Blocks for `work` items at `per_block` items per block: at least 1, at most max_blocks.
inline unsigned blocks_for(int64_t work, int64_t per_block, int64_t max_blocks = kMaxBlocks) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, max_blocks));
}

// ---- device --------------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return __bfloat162float(v); }

// fp32 to storage T; bf16 rounds to nearest even, as store_f32 does on the host.
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) { return __float2bfloat16_rn(v); }

// N elements of T moved as one aligned vector (N * sizeof(T) in {2, 4, 8, 16} bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// REQUIRES: p aligned to sizeof(Pack<T, N>).
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <typename T, int N>
__device__ __forceinline__ void store(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// The sum of v over the 32 lanes of a warp (butterfly: a fixed order); every lane gets it.
// REQUIRES: all 32 lanes call it together.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of v over a block of kThreads threads (a multiple of 32) in a fixed order: each warp's
// butterfly, then the warps' sums in warp order; every thread gets it. `smem` holds kThreads / 32
// doubles. Contains __syncthreads: every thread of the block calls it together; smem may be
// reused as soon as it returns.
template <int kThreads>
__device__ __forceinline__ double block_sum(double v, double* smem) {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024);
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
#pragma unroll
  for (int k = 0; k < kThreads / 32; ++k) total += smem[k];
  __syncthreads();
  return total;
}

// ---- ids and labels ------------------------------------------------------------------------

inline constexpr int64_t kNoException = INT64_MIN;  // first_out_of_range: no value is exempt

// *first = min(*first, t) for every t with v[t] outside [0, limit) and v[t] != except.
template <typename I>
__global__ void first_out_of_range_kernel(const I* v, int64_t n, int64_t limit, int64_t except,
                                          unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += stride) {
    const int64_t x = v[t];
    if (x != except && (x < 0 || x >= limit)) atomicMin(first, static_cast<unsigned long long>(t));
  }
}

// The first position t < n whose v[t] is outside [0, limit) and not `except`, or -1; its value
// goes to *value. `scratch` is 8 bytes of device memory. Synchronizes the stream.
// (A template so that only the files that use it compile its kernel.)
template <typename I>
int64_t first_out_of_range(cudaStream_t st, const I* v, int64_t n, int64_t limit, int64_t except, void* scratch,
                           I* value) {
  if (n <= 0) return -1;
  auto* first = static_cast<unsigned long long*>(scratch);
  UNTIED_CUDA_CHECK(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), st));  // ~0: none yet
  constexpr int kThreads = 256;
  first_out_of_range_kernel<I><<<blocks_for(n, kThreads, 4096), kThreads, 0, st>>>(v, n, limit, except, first);
  UNTIED_CUDA_CHECK(cudaGetLastError());
  unsigned long long pos = 0;
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(&pos, first, sizeof pos, cudaMemcpyDeviceToHost, st));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(st));
  if (pos == ~0ull) return -1;
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(value, v + pos, sizeof(I), cudaMemcpyDeviceToHost, st));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(st));
  return static_cast<int64_t>(pos);
}

}  // namespace untied::cuda
