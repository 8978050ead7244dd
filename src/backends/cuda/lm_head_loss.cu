// The fused, chunked LM head + cross-entropy (include/untied/kernels/lm_head_loss.h) on the GPU.
//
// The CPU kernel's algorithm (src/kernels/cpu/lm_head_loss.cc), with cuBLAS for the GEMMs:
//   labels:  checked first, on the device (one thread per token, the first bad position by
//            atomicMin into the row-loss scratch); the host reads it back (synchronizing the
//            stream) and throws the CPU's message before anything is written.
//   per chunk of n rows:
//     logits (n, V) fp32 = h_c w^T: one cuBLAS GEMM straight from the stored operands when h
//            and w have the same dtype (bf16 x bf16 with fp32 accumulation: the products are
//            exact, so this is the CPU's widen-then-fp32 GEMM up to summation order); with
//            mixed dtypes the bf16 side is widened first (h_c once, or w one block at a time,
//            by cuda::convert of tensor_ops.cu).
//     rows:  softmax_rows_kernel, one 512-thread block per row (grid-stride over rows): max and
//            argmax (the first index of the largest), then for labelled rows the fp64 sum of
//            fp32 expf(logit - max) in a fixed order, lse = max + log(sum) in fp64, the row's
//            loss, and for the backward G = grad_scale * (softmax - onehot) in place (0 on
//            ignored rows). 16-byte loads and stores where V % 4 == 0.
//     dh_c (n, E) = G w;  dw (V, E) fp32 += G^T h_c  (fp32 GEMMs: G is fp32, and cuBLAS takes
//            A and B of one dtype, so a bf16 w is widened one vocab block at a time and a bf16
//            h_c once per chunk, and a bf16 dh is accumulated in fp32 and rounded once (to
//            nearest even, cuda::convert), exactly as on the CPU; dw is one GEMM over all of V).
//     sums:  the chunk's per-row losses are copied back and added on the host in row order
//            (deterministic), which synchronizes the stream once per chunk.
//   The labels are copied to the host once (after the check), so that a chunk without any label
//   (and no argmax asked for) skips its GEMMs and only zeroes its dh rows, as on the CPU.
// The workspace is the header's, buffer for buffer (lm_head_loss_workspace_bytes is exact here
// too): logits, row losses, and h32 / dh32 / w32 under the same conditions. In a forward-only
// call with h and w both bf16 the h32 and w32 buffers are allocated but not used, so that the
// memory figures do not depend on the backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"
#include "untied/kernels/gemm.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::cuda {
namespace {

constexpr int kRowThreads = 512;  // softmax_rows_kernel: one block per row
constexpr int kRowWarps = kRowThreads / 32;

// ---- label check ---------------------------------------------------------------------------

// Throws Error(kInvalidArgument) naming the first bad label, as the CPU does. `scratch` holds at
// least 8 bytes of device memory. Synchronizes the stream.
void check_labels(cudaStream_t st, const LmHeadLossShape& s, const int32_t* labels, void* scratch) {
  int32_t l = 0;
  const int64_t t = first_out_of_range(st, labels, s.tokens, s.vocab, s.ignore_index, scratch, &l);
  if (t < 0) return;
  UNTIED_CHECK(l == s.ignore_index || (l >= 0 && l < s.vocab), "lm_head_loss: labels[", t, "] = ", l,
               " is neither ignore_index (", s.ignore_index, ") nor in [0, vocab = ", s.vocab, ")");
  UNTIED_ASSERT(false, "lm_head_loss: the GPU flagged labels[", t, "] = ", l, " as invalid");
}

// ---- rows: softmax, loss, argmax, G --------------------------------------------------------

struct RowParams {
  float* logits;          // (rows, vocab): logits in, G out (backward)
  int64_t rows;
  int64_t vocab;
  const int32_t* labels;  // (rows), already checked
  int32_t ignore_index;
  int32_t* argmax;        // (rows) or null
  double* losses;         // (rows): the row's loss, 0 for ignored rows
  float grad_scale;
  bool grad;              // write G over the logits
};

// A running (value, index) maximum; index == none means empty. The order: larger value first,
// then smaller index, so combining in any tree keeps the first index of the largest value.
struct ArgMax {
  float v;
  int64_t i;
};

__device__ __forceinline__ bool better(float v, int64_t i, const ArgMax& a, int64_t none) {
  return i != none && (a.i == none || v > a.v || (v == a.v && i < a.i));
}

// The block's (max, first argmax); every thread gets the result. Uses red_v/red_i/out_*.
__device__ ArgMax block_argmax(ArgMax a, int64_t none, float* red_v, int64_t* red_i, ArgMax* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, a.v, o);
    const int64_t i = __shfl_xor_sync(0xffffffffu, a.i, o);
    if (better(v, i, a, none)) a = ArgMax{v, i};
  }
  if (lane == 0) {
    red_v[warp] = a.v;
    red_i[warp] = a.i;
  }
  __syncthreads();
  if (warp == 0) {
    ArgMax b = lane < kRowWarps ? ArgMax{red_v[lane], red_i[lane]} : ArgMax{0.0f, none};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, b.v, o);
      const int64_t i = __shfl_xor_sync(0xffffffffu, b.i, o);
      if (better(v, i, b, none)) b = ArgMax{v, i};
    }
    if (lane == 0) *out = b;
  }
  __syncthreads();
  return *out;
}

// One block per row (grid-stride over rows). VEC == 4 requires vocab % 4 == 0 and logits
// 16-byte aligned (then every row is). Thread k owns the elements j = VEC * (k + m * blockDim)
// + 0..VEC-1 in increasing order, so its running argmax keeps its first maximum.
template <int VEC>
__global__ void __launch_bounds__(kRowThreads) softmax_rows_kernel(RowParams p) {
  __shared__ float red_v[kRowWarps];
  __shared__ int64_t red_i[kRowWarps];
  __shared__ double red_d[kRowWarps];
  __shared__ ArgMax out_a;

  const int64_t V = p.vocab;
  const int64_t groups = V / VEC;  // VEC-wide groups; VEC == 1: all elements
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    float* row = p.logits + r * V;
    const int32_t label = p.labels[r];
    const bool labelled = label != p.ignore_index;

    // Max and first argmax. `none` = V: no element yet.
    ArgMax a{-INFINITY, V};
    for (int64_t k = threadIdx.x; k < groups; k += kRowThreads) {
      if constexpr (VEC == 4) {
        const float4 x = reinterpret_cast<const float4*>(row)[k];
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (a.i == V || xs[u] > a.v) a = ArgMax{xs[u], 4 * k + u};
      } else {
        const float x = row[k];
        if (a.i == V || x > a.v) a = ArgMax{x, k};
      }
    }
    a = block_argmax(a, V, red_v, red_i, &out_a);
    const float mx = a.v;
    if (p.argmax != nullptr && threadIdx.x == 0) p.argmax[r] = static_cast<int32_t>(a.i);

    if (!labelled) {
      if (threadIdx.x == 0) p.losses[r] = 0.0;
      if (p.grad)
        for (int64_t k = threadIdx.x; k < groups; k += kRowThreads) {
          if constexpr (VEC == 4)
            reinterpret_cast<float4*>(row)[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          else
            row[k] = 0.0f;
        }
      continue;  // no block-wide reduction follows in this row
    }

    // Read before anything of this row is written (the writes below follow block_sum's barriers).
    const float target = row[label];

    // sum_j exp(logit_j - max): each exponential in fp32, as the CPU, summed in fp64.
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < groups; k += kRowThreads) {
      if constexpr (VEC == 4) {
        const float4 x = reinterpret_cast<const float4*>(row)[k];
        acc += static_cast<double>(expf(x.x - mx));
        acc += static_cast<double>(expf(x.y - mx));
        acc += static_cast<double>(expf(x.z - mx));
        acc += static_cast<double>(expf(x.w - mx));
      } else {
        acc += static_cast<double>(expf(row[k] - mx));
      }
    }
    const double sum = block_sum<kRowThreads>(acc, red_d);
    if (threadIdx.x == 0) {
      const double lse = static_cast<double>(mx) + log(sum);
      p.losses[r] = lse - static_cast<double>(target);
    }
    if (!p.grad) continue;

    // G = grad_scale * softmax - grad_scale * onehot(label), in the CPU's fp32 operations:
    // exp * (grad_scale / sum), then minus grad_scale at the label.
    const float scale = static_cast<float>(static_cast<double>(p.grad_scale) / sum);
    const float gs = p.grad_scale;
    for (int64_t k = threadIdx.x; k < groups; k += kRowThreads) {
      if constexpr (VEC == 4) {
        float4 x = reinterpret_cast<const float4*>(row)[k];
        const int64_t j = 4 * k;
        x.x = __fmul_rn(expf(x.x - mx), scale);
        x.y = __fmul_rn(expf(x.y - mx), scale);
        x.z = __fmul_rn(expf(x.z - mx), scale);
        x.w = __fmul_rn(expf(x.w - mx), scale);
        if (j == label) x.x -= gs;
        if (j + 1 == label) x.y -= gs;
        if (j + 2 == label) x.z -= gs;
        if (j + 3 == label) x.w -= gs;
        reinterpret_cast<float4*>(row)[k] = x;
      } else {
        float x = __fmul_rn(expf(row[k] - mx), scale);
        if (k == label) x -= gs;
        row[k] = x;
      }
    }
  }
}

void softmax_rows(cudaStream_t st, const RowParams& p) {
  const unsigned grid = blocks_for(p.rows, 1);
  if (multiples_of(4, {p.vocab}) && aligned(p.logits, 16))
    softmax_rows_kernel<4><<<grid, kRowThreads, 0, st>>>(p);
  else
    softmax_rows_kernel<1><<<grid, kRowThreads, 0, st>>>(p);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void lm_head_loss(Device& dev, const LmHeadLossCall& c, const Scratch& ws) {
  const auto& [s, pass, sums, argmax, dh, dw, h, labels, w, row_losses] = c;
  const bool backward = pass == LossPass::kForwardBackward;
  const int64_t chunk = lm_head_loss_chunk(s);
  if (chunk == 0) return;  // no tokens
  const int64_t V = s.vocab, E = s.dim;
  const bool h_bf16 = s.dtype != DType::kF32, w_bf16 = s.weight_dtype != DType::kF32;
  const int64_t w_rows = w_bf16 ? lm_head_loss_weight_block(s) : V;  // vocab rows per widened block

  const cudaStream_t st = stream_of(dev);
  check_labels(st, s, labels, ws.data(kLossRowLosses));  // the row losses are not in use yet

  // The workspace as lm_head_loss_scratch lays it out (the header's sizes).
  float* logits = ws.as<float>(kLossLogits);
  double* losses = ws.as<double>(kLossRowLosses);
  float* h32 = ws.as<float>(kLossH32);
  float* w32 = ws.as<float>(kLossW32);
  const int64_t es = dtype_size(s.dtype);
  const char* hb = static_cast<const char*>(h);
  const char* wbytes = static_cast<const char*>(w);
  std::vector<double> host_losses(static_cast<size_t>(chunk));
  // The labels on the host, so that each chunk's labelled rows are counted before its work is
  // issued: a chunk without any label (and no argmax asked for) skips its GEMMs and just zeroes
  // its dh rows, as on the CPU (dw and dh are then exactly the CPU's, whatever h and w hold).
  std::vector<int32_t> host_labels(static_cast<size_t>(s.tokens));
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(host_labels.data(), labels, static_cast<size_t>(s.tokens) * 4,
                                    cudaMemcpyDeviceToHost, st));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(st));

  for (int64_t t0 = 0; t0 < s.tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, s.tokens - t0);
    const int64_t labelled = std::count_if(host_labels.begin() + t0, host_labels.begin() + t0 + n,
                                           [&](int32_t l) { return l != s.ignore_index; });
    if (labelled == 0 && argmax == nullptr) {  // nothing to compute: G = 0
      if (backward) dev.fill_zero(static_cast<char*>(dh) + t0 * E * es, n * E * es);
      if (row_losses != nullptr) std::fill(row_losses + t0, row_losses + t0 + n, 0.0);
      continue;
    }
    const void* h_c = hb + t0 * E * es;
    bool h_widened = false;

    // logits (n, V) = h_c w^T.
    if (s.dtype == s.weight_dtype) {
      untied::gemm(dev, GemmParams{.trans_b = true, .m = n, .n = V, .k = E, .a = h_c, .lda = E, .a_dtype = s.dtype,
                                   .b = w, .ldb = E, .b_dtype = s.weight_dtype, .c = logits, .ldc = V});
    } else if (h_bf16) {  // w is f32
      untied::convert(dev, h32, DType::kF32, h_c, DType::kBF16, n * E);
      h_widened = true;
      untied::gemm(dev, GemmParams{.trans_b = true, .m = n, .n = V, .k = E, .a = h32, .lda = E, .b = w, .ldb = E,
                                   .c = logits, .ldc = V});
    } else {  // h f32, w bf16: one widened vocab block at a time
      for (int64_t v0 = 0; v0 < V; v0 += w_rows) {
        const int64_t nb = std::min(w_rows, V - v0);
        untied::convert(dev, w32, DType::kF32, wbytes + v0 * E * 2, DType::kBF16, nb * E);
        untied::gemm(dev, GemmParams{.trans_b = true, .m = n, .n = nb, .k = E, .a = h_c, .lda = E, .b = w32,
                                     .ldb = E, .c = logits + v0, .ldc = V});
      }
    }

    // Row statistics, losses, argmax, and G in place.
    softmax_rows(st, RowParams{.logits = logits, .rows = n, .vocab = V, .labels = labels + t0,
                               .ignore_index = s.ignore_index, .argmax = argmax != nullptr ? argmax + t0 : nullptr,
                               .losses = losses, .grad_scale = s.grad_scale, .grad = backward});

    if (backward) {
      // dh_c (n, E) = G w;  dw (V, E) += G^T h_c. All fp32 (G is fp32).
      const float* hc32 = static_cast<const float*>(h_c);
      if (h_bf16) {
        if (!h_widened) untied::convert(dev, h32, DType::kF32, h_c, DType::kBF16, n * E);
        hc32 = h32;
      }
      float* dhc = h_bf16 ? ws.as<float>(kLossDh32) : reinterpret_cast<float*>(static_cast<char*>(dh) + t0 * E * es);
      if (!w_bf16) {
        untied::gemm(dev, GemmParams{.m = n, .n = E, .k = V, .a = logits, .lda = V, .b = w, .ldb = E, .c = dhc,
                                     .ldc = E});
      } else {
        for (int64_t v0 = 0; v0 < V; v0 += w_rows) {
          const int64_t nb = std::min(w_rows, V - v0);
          untied::convert(dev, w32, DType::kF32, wbytes + v0 * E * 2, DType::kBF16, nb * E);
          untied::gemm(dev, GemmParams{.m = n, .n = E, .k = nb, .beta = v0 == 0 ? 0.0f : 1.0f, .a = logits + v0,
                                       .lda = V, .b = w32, .ldb = E, .c = dhc, .ldc = E});
        }
      }
      untied::gemm(dev, GemmParams{.trans_a = true, .m = V, .n = E, .k = n, .beta = 1.0f, .a = logits, .lda = V,
                                   .b = hc32, .ldb = E, .c = dw, .ldc = E});
      if (h_bf16) untied::convert(dev, static_cast<char*>(dh) + t0 * E * es, DType::kBF16, dhc, DType::kF32, n * E);
    }

    // The chunk's losses, added on the host in row order. After the chunk's GEMMs, so the GPU
    // has the next chunk's work soon after.
    UNTIED_CUDA_CHECK(cudaMemcpyAsync(host_losses.data(), losses, static_cast<size_t>(n) * 8,
                                      cudaMemcpyDeviceToHost, st));
    UNTIED_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int64_t i = 0; i < n; ++i) sums->loss_sum += host_losses[static_cast<size_t>(i)];  // 0 for ignored rows
    if (row_losses != nullptr) std::copy(host_losses.begin(), host_losses.begin() + n, row_losses + t0);
    sums->count += labelled;
  }
}

}  // namespace untied::cuda
