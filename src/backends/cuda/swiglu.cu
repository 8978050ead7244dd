// SwiGLU on the GPU (include/untied/kernels/swiglu.h): element-wise over the (rows, F) grid;
// each thread takes VEC consecutive elements of one row per step (16-byte loads where F, both
// row strides and every pointer allow, else one element). Blocks of (tx, 256 / tx) threads:
// x over a row's vectors, y over rows, grid-stride in both.
//
// In place: a thread reads all of its inputs (gate, up, dout) before it writes its outputs,
// and the outputs it writes are exactly the elements it read, so out may alias gate or up and
// dgate/dup may alias gate/up as the header allows. For that reason no pointer is __restrict__
// and no input goes through the read-only (non-coherent) cache path.
//
// The fp32 arithmetic is the CPU's, in its order, with explicit round-to-nearest operations
// (no fused multiply-add); only expf differs from the host's exp (within 2 ulp).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"

namespace untied::cuda {
namespace {

constexpr int kThreads = 256;

// 1 / (1 + exp(-g)); __frcp_rn is the correctly rounded reciprocal, the same value as the host's
// 1.0f / x (and, unlike a division, needs no out-of-line slow path).
__device__ __forceinline__ float sigmoid(float g) { return __frcp_rn(__fadd_rn(1.0f, expf(-g))); }

struct SwigluParams {
  int64_t rows;
  int64_t dim;         // F
  int64_t in_stride;   // gate, up, dgate, dup
  int64_t out_stride;  // out, dout
};

// VEC > 1 requires F and both strides to be multiples of VEC and every pointer aligned to 16
// bytes.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) forward_kernel(SwigluParams p, T* out, const T* gate, const T* up) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  const int64_t c_step = static_cast<int64_t>(gridDim.x) * blockDim.x * VEC;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    for (int64_t c = c0; c < p.dim; c += c_step) {
      const Pack<T, VEC> g = load<T, VEC>(gate + r * p.in_stride + c);
      const Pack<T, VEC> u = load<T, VEC>(up + r * p.in_stride + c);
      Pack<T, VEC> o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float gf = to_f32(g.v[k]);
        o.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(gf, sigmoid(gf)), to_f32(u.v[k])));
      }
      store<T, VEC>(out + r * p.out_stride + c, o);
    }
  }
}

// dgate = dout * up * s * (1 + g (1 - s)), dup = dout * silu(g); layout as forward_kernel.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(SwigluParams p, T* dgate, T* dup, const T* gate, const T* up, const T* dout) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  const int64_t c_step = static_cast<int64_t>(gridDim.x) * blockDim.x * VEC;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows;
       r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
    for (int64_t c = c0; c < p.dim; c += c_step) {
      const int64_t in = r * p.in_stride + c;
      const Pack<T, VEC> g = load<T, VEC>(gate + in);
      const Pack<T, VEC> u = load<T, VEC>(up + in);
      const Pack<T, VEC> d = load<T, VEC>(dout + r * p.out_stride + c);
      Pack<T, VEC> dg, du;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float gf = to_f32(g.v[k]), uf = to_f32(u.v[k]), df = to_f32(d.v[k]);
        const float sg = sigmoid(gf);
        const float silu = __fmul_rn(gf, sg);
        du.v[k] = from_f32<T>(__fmul_rn(df, silu));
        dg.v[k] = from_f32<T>(
            __fmul_rn(__fmul_rn(df, uf), __fmul_rn(sg, __fadd_rn(1.0f, __fmul_rn(gf, __fsub_rn(1.0f, sg))))));
      }
      store<T, VEC>(dgate + in, dg);
      store<T, VEC>(dup + in, du);
    }
  }
}

SwigluParams params(const SwigluShape& s) {
  return SwigluParams{.rows = s.rows,
                      .dim = s.dim,
                      .in_stride = s.in_row_stride > 0 ? s.in_row_stride : s.dim,
                      .out_stride = s.out_row_stride > 0 ? s.out_row_stride : s.dim};
}

template <typename T>
bool use_vec(const SwigluParams& p, std::initializer_list<const void*> ps) {
  constexpr int kVec = 16 / sizeof(T);
  return multiples_of(kVec, {p.dim, p.in_stride, p.out_stride}) && aligned(ps, 16);
}

// The launch shape for vectors of VEC elements: a block of (tx, 256 / tx) threads, tx covering
// a row's vectors (a multiple of 32, at most 256), the rest of the block further rows; the grid
// covers the row's vectors in x and the rows in y (at most 65535, grid-stride beyond).
struct Launch {
  dim3 grid, block;
};
Launch launch_shape(const SwigluParams& p, int vec) {
  const int64_t per_row = p.dim / vec;
  const int tx = static_cast<int>(std::min<int64_t>(kThreads, (per_row + 31) / 32 * 32));
  const int ty = kThreads / tx;
  return Launch{dim3(blocks_for(per_row, tx), blocks_for(p.rows, ty, kMaxGridYZ)), dim3(tx, ty)};
}

template <typename T>
void forward_typed(cudaStream_t st, const SwigluParams& p, void* out, const void* gate, const void* up) {
  constexpr int kVec = 16 / sizeof(T);
  T* o = static_cast<T*>(out);
  const T* g = static_cast<const T*>(gate);
  const T* u = static_cast<const T*>(up);
  if (use_vec<T>(p, {out, gate, up})) {
    const Launch l = launch_shape(p, kVec);
    forward_kernel<T, kVec><<<l.grid, l.block, 0, st>>>(p, o, g, u);
  } else {
    const Launch l = launch_shape(p, 1);
    forward_kernel<T, 1><<<l.grid, l.block, 0, st>>>(p, o, g, u);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void backward_typed(cudaStream_t st, const SwigluParams& p, void* dgate, void* dup, const void* gate, const void* up,
                    const void* dout) {
  constexpr int kVec = 16 / sizeof(T);
  T* dg = static_cast<T*>(dgate);
  T* du = static_cast<T*>(dup);
  const T* g = static_cast<const T*>(gate);
  const T* u = static_cast<const T*>(up);
  const T* d = static_cast<const T*>(dout);
  if (use_vec<T>(p, {dgate, dup, gate, up, dout})) {
    const Launch l = launch_shape(p, kVec);
    backward_kernel<T, kVec><<<l.grid, l.block, 0, st>>>(p, dg, du, g, u, d);
  } else {
    const Launch l = launch_shape(p, 1);
    backward_kernel<T, 1><<<l.grid, l.block, 0, st>>>(p, dg, du, g, u, d);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void swiglu_forward(Device& dev, const SwigluForwardCall& c, const Scratch&) {
  const auto& [s, out, gate, up] = c;
  if (s.rows == 0) return;
  const cudaStream_t st = stream_of(dev);
  if (s.dtype == DType::kBF16)
    forward_typed<bf16_t>(st, params(s), out, gate, up);
  else
    forward_typed<float>(st, params(s), out, gate, up);
}

void swiglu_backward(Device& dev, const SwigluBackwardCall& c, const Scratch&) {
  const auto& [s, dgate, dup, gate, up, dout] = c;
  if (s.rows == 0) return;
  const cudaStream_t st = stream_of(dev);
  if (s.dtype == DType::kBF16)
    backward_typed<bf16_t>(st, params(s), dgate, dup, gate, up, dout);
  else
    backward_typed<float>(st, params(s), dgate, dup, gate, up, dout);
}

}  // namespace untied::cuda
