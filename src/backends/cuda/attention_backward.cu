// Flash attention backward on the GPU (FlashAttention-2 algorithm). Semantics:
// include/untied/kernels/attention.h; reference: src/kernels/cpu/attention_backward.cc.
//
// 1. delta (H, seq_q) = rowsum(dout * out) in fp32, one warp per (row, head), unless the caller
//    passes it. The fp32 dQ accumulator is zeroed.
// 2. One block per (key tile, KV head). It loops over the query heads of its GQA group and, for
//    each, over the query tiles that can see the key tile (from the causal start), recomputing
//    P = exp2(scale*log2(e) S - log2(e) lse) and accumulating
//        dV += P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  dK += dS^T Q,  dQ += dS K.
//    dK and dV stay in registers (fp32) for the whole loop and are written once, scaled: they are
//    deterministic (a fixed summation order, no atomics). dQ of each step is added with fp32
//    atomics into the accumulator, so dq is NOT bitwise reproducible run to run (the order of the
//    atomic additions varies; the differences are fp32 rounding).
// 3. When dq is bf16, the accumulator is converted into dq (row stride q_row_stride).
//
// Tensor-core kernel (bf16, D in {64, 128}; on compute capability 9.0 at D = 128 with
// UNTIED_CUDA_ATTENTION=wgmma, the wgmma kernel of attention_backward_sm90.cu instead): 8 warps,
// a 128-key tile (16 keys per warp), query tiles of kBr rows. The warp computes S^T and dP^T for
// its keys with mma.sync (K, V as A operands; Q, dO as B through ldmatrix), keeps P^T and dS^T in
// the accumulator registers and reuses them as A fragments for dV and dK. dS^T goes to shared
// memory (bf16) for dQ = dS K, which the 8 warps split by (16 query rows, D / (8 / (kBr / 16))
// columns). Q, dO, lse and delta of the next step are copied with cp.async while the current step
// is computed.
//
// Portable kernel (f32, or bf16 with other D, or older GPUs; D <= 256): 32-key tiles, 16 (8 when
// D > 128) query rows per step, fp32 shared tiles, exact fp32 arithmetic; a lane owns a key for
// the scores and columns lane + 32c of dK/dV/dQ.
//
// Workspace (allocator, Tag::kAttnWorkspace), linear in seq_q:
//   delta           H * seq_q * 4 bytes       only when the caller does not pass delta
//   dQ accumulator  seq_q * H * D * 4 bytes   only when dq is bf16 (f32 dq accumulates in place)
#include <algorithm>

#include "backends/cuda/attention_select.h"
#include "backends/cuda/cudnn_attention.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/attention_tiles.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace untied::cuda {
namespace attn {
namespace {

// ---------------------------------------------------------------- delta and dQ conversion

constexpr int kRowKernelThreads = 256;

// delta[h][i] = sum_c dout[i, h, c] * out[i, h, c] (fp32), one warp per (row, head).
template <typename T>
__global__ void __launch_bounds__(kRowKernelThreads) delta_kernel(const AttnGeom a, const T* out, const T* dout,
                                                                  float* delta) {
  constexpr int kWarps = kRowKernelThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t rows = a.sq * a.h;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += stride) {
    const int64_t i = r / a.h;
    const int hh = static_cast<int>(r % a.h);
    const int64_t off = i * a.q_rs + static_cast<int64_t>(hh) * a.d;
    float s = 0.0f;
    for (int c = lane; c < a.d; c += 32) s += to_f32(out[off + c]) * to_f32(dout[off + c]);
    s = warp_sum(s);
    if (lane == 0) delta[static_cast<int64_t>(hh) * a.sq + i] = s;
  }
}

// dq (rows, hd) with row stride rs = the fp32 accumulator (rows, hd), contiguous, rounded to bf16.
__global__ void __launch_bounds__(kRowKernelThreads) dq_convert_kernel(const float* acc, bf16* dq, int64_t rows,
                                                                       int64_t hd, int64_t rs) {
  const int64_t n = rows * hd;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t i = e / hd;
    dq[i * rs + (e - i * hd)] = __float2bfloat16_rn(acc[e]);
  }
}

// ---------------------------------------------------------------- tensor-core kernel

template <int kD, int kBr>
struct BwdMmaConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBc = kWarps * 16;  // keys per block
  static constexpr int kLd = kD + 8;       // shared row stride of K, V, Q, dO (elements)
  static constexpr int kLdS = kBr + 8;     // shared row stride of dS^T
  // K, V (kBc x kLd); 2 stages of Q, dO (kBr x kLd); dS^T (kBc x kLdS): bf16.
  // 2 stages of lse, delta (kBr): fp32; 2 stages of the rows' first visible keys (kBr): int32.
  static constexpr int64_t kSmemBytes =
      2 * (2LL * kBc * kLd + 4LL * kBr * kLd + static_cast<int64_t>(kBc) * kLdS) + 4 * 4LL * kBr + 2 * 4LL * kBr;
};

template <int kD, int kBr, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) bwd_mma_kernel(const BwdParams p) {
  using Cfg = BwdMmaConfig<kD, kBr>;
  constexpr int kWarps = Cfg::kWarps;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kBc = Cfg::kBc;
  constexpr int kLd = Cfg::kLd;
  constexpr int kLdS = Cfg::kLdS;
  constexpr int kQT = kBr / 8;           // 8-query n-tiles of S^T, dP^T
  constexpr int kDT = kD / 8;            // 8-column n-tiles of dK, dV
  constexpr int kMTq = kBr / 16;         // 16-row slices of dQ
  constexpr int kParts = kWarps / kMTq;  // column parts of dQ
  constexpr int kColsQ = kD / kParts;    // dQ columns per warp
  constexpr int kNTq = kColsQ / 8;
  static_assert(kBr % 16 == 0 && kWarps % kMTq == 0 && kNTq % 2 == 0 && 2 * kBr <= kThreads, "tile sizes");

  const AttnGeom& a = p.a;
  bf16* ks = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* vs = ks + kBc * kLd;
  bf16* qs = vs + kBc * kLd;       // 2 stages
  bf16* dos = qs + 2 * kBr * kLd;  // 2 stages
  bf16* dss = dos + 2 * kBr * kLd;
  float* lse_s = reinterpret_cast<float*>(dss + kBc * kLdS);  // 2 stages
  float* delta_s = lse_s + 2 * kBr;                           // 2 stages
  int* lo_s = reinterpret_cast<int*>(delta_s + 2 * kBr);      // 2 stages

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane >> 2;
  const int t2 = (lane & 3) * 2;
  const BwdTile tile = bwd_tile<kBr, kBc>(a);
  const int kvh = tile.kvh;
  const int64_t k0 = tile.k0, steps = tile.steps;
  const int krow = warp * 16;  // this warp's first key row in the tile
  const int64_t kv_col = static_cast<int64_t>(kvh) * kD;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const bf16* dout = static_cast<const bf16*>(p.dout);

  float dk[kDT][4];
  float dv[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  // Q, dO, lse, delta of step t (query head, query tile) into stage st.
  auto load_step = [&](int64_t t, int st) {
    const int hq = tile.head(t);
    const int64_t q0 = tile.q_tile(t) * kBr;
    const int64_t q_col = static_cast<int64_t>(hq) * kD;
    load_tile_async<kBr, kD, kThreads>(qs + st * kBr * kLd, q, q0, a.sq, a.q_rs, q_col, tid);
    load_tile_async<kBr, kD, kThreads>(dos + st * kBr * kLd, dout, q0, a.sq, a.q_rs, q_col, tid);
    load_row_values_async<kBr>(p, hq, q0, lse_s + st * kBr, delta_s + st * kBr, lo_s + st * kBr, tid);
  };

  if (steps > 0) {
    load_tile_async<kBc, kD, kThreads>(ks, k, k0, a.sk, a.kv_rs, kv_col, tid);
    load_tile_async<kBc, kD, kThreads>(vs, v, k0, a.sk, a.kv_rs, kv_col, tid);
    load_step(0, 0);
    cp_async_commit();
  }

  for (int64_t t = 0; t < steps; ++t) {
    const int st = static_cast<int>(t & 1);
    const int hq = tile.head(t);
    const int64_t q0 = tile.q_tile(t) * kBr;
    // Step t has landed and is visible; every warp is done with step t-1 (its stage and dS^T).
    cp_async_wait_all();
    __syncthreads();
    if (t + 1 < steps) load_step(t + 1, st ^ 1);
    cp_async_commit();
    const bf16* qst = qs + st * kBr * kLd;
    const bf16* dost = dos + st * kBr * kLd;
    const float* lst = lse_s + st * kBr;
    const float* dlt = delta_s + st * kBr;

    // S^T (this warp's 16 keys x kBr queries) = K Q^T.
    float sacc[kQT][4];
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ka[4];
      ldsm_x4(ka, ks + (krow + (lane & 15)) * kLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < kBr / 16; ++np) {
        uint32_t qf[4];
        ldsm_x4(qf, qst + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kLd + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16_16816(sacc[2 * np], ka, qf[0], qf[1]);
        mma_bf16_16816(sacc[2 * np + 1], ka, qf[2], qf[3]);
      }
    }

    // P^T = exp2(S^T scale log2(e) - lse log2(e)), zero where the query row does not see the key
    // (rows with lse = -inf see no key at all: +inf makes their p exactly 0).
    // Documents and window: a query column whose first visible key is after key row j does not
    // see it (lo_masked when some row of the tile starts after k0).
    const bool lo_masked = a.has_lo && lo_s[st * kBr + kBr - 1] > k0;
    const int* lost = lo_s + st * kBr;
    const bool masked = k0 + kBc > a.sk || (a.causal && k0 + kBc - 1 - q0 > a.diff);
    int fq[2] = {0, 0};  // query columns [0, fq[hf]) of the tile do not see key row g + 8 hf
    if (masked) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int64_t j = k0 + krow + g + hf * 8;
        fq[hf] = j >= a.sk ? kBr : (a.causal ? clamp_to(j - a.diff - q0, kBr) : 0);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + t2 + (e & 1);
        const float lv = lst[qc];
        const float l2 = lv == -INFINITY ? INFINITY : lv * kLog2e;
        const float pv = exp2_ftz(sacc[nt][e] * a.scale_log2 - l2);
        const bool before_doc = lo_masked && k0 + krow + g + (e >> 1) * 8 < lost[qc];
        sacc[nt][e] = qc < fq[e >> 1] || before_doc ? 0.0f : pv;
      }
    }

    // dV += P^T dO: the accumulators of query n-tiles 2kk, 2kk+1 are the A fragment of slice kk.
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sacc[2 * kk][0], sacc[2 * kk][1]), pack_bf16(sacc[2 * kk][2], sacc[2 * kk][3]),
                              pack_bf16(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]),
                              pack_bf16(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t of[4];
        ldsm_x4_t(of, dost + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + dp * 16 + (lane >> 4) * 8);
        mma_bf16_16816(dv[2 * dp], pa, of[0], of[1]);
        mma_bf16_16816(dv[2 * dp + 1], pa, of[2], of[3]);
      }
    }

    // dP^T = V dO^T.
    float dpacc[kQT][4];
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpacc[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t va[4];
      ldsm_x4(va, vs + (krow + (lane & 15)) * kLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < kBr / 16; ++np) {
        uint32_t of[4];
        ldsm_x4(of, dost + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kLd + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16_16816(dpacc[2 * np], va, of[0], of[1]);
        mma_bf16_16816(dpacc[2 * np + 1], va, of[2], of[3]);
      }
    }

    // dS^T = P^T (dP^T - delta); stored (bf16) for dQ.
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[nt][e] *= dpacc[nt][e] - dlt[nt * 8 + t2 + (e & 1)];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        st_shared_u32(dss + (krow + g + hf * 8) * kLdS + nt * 8 + t2, pack_bf16(sacc[nt][2 * hf], sacc[nt][2 * hf + 1]));
    }

    // dK += dS^T Q (scaled once at the end).
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t da[4] = {pack_bf16(sacc[2 * kk][0], sacc[2 * kk][1]), pack_bf16(sacc[2 * kk][2], sacc[2 * kk][3]),
                              pack_bf16(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]),
                              pack_bf16(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t qf[4];
        ldsm_x4_t(qf, qst + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + dp * 16 + (lane >> 4) * 8);
        mma_bf16_16816(dk[2 * dp], da, qf[0], qf[1]);
        mma_bf16_16816(dk[2 * dp + 1], da, qf[2], qf[3]);
      }
    }
    __syncthreads();  // dS^T of all warps is in shared memory

    // dQ (kBr x kD) += scale dS K: warp = (16-row slice mq, column part cp); A = dS through
    // ldmatrix.trans of the stored dS^T, B = K through ldmatrix.trans.
    const int mq = warp % kMTq;
    const int cp = warp / kMTq;
    float dqa[kNTq][4];
#pragma unroll
    for (int nt = 0; nt < kNTq; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dqa[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t sa[4];
      ldsm_x4_t(sa, dss + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * kLdS + mq * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int np = 0; np < kNTq / 2; ++np) {
        uint32_t kf[4];
        ldsm_x4_t(kf, ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + cp * kColsQ + np * 16 + (lane >> 4) * 8);
        mma_bf16_16816(dqa[2 * np], sa, kf[0], kf[1]);
        mma_bf16_16816(dqa[2 * np + 1], sa, kf[2], kf[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t i = q0 + mq * 16 + g + hf * 8;
      if (i < a.sq) {
        float* dst = p.dq_acc + i * p.dq_acc_rs + static_cast<int64_t>(hq) * kD + cp * kColsQ + t2;
#pragma unroll
        for (int nt = 0; nt < kNTq; ++nt)
          atomic_add_f32x2(dst + nt * 8, dqa[nt][2 * hf] * a.scale, dqa[nt][2 * hf + 1] * a.scale);
      }
    }
  }

  // dK = scale dS^T Q, dV (zeros for keys no query row sees).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int64_t j = k0 + krow + g + hf * 8;
    if (j >= a.sk) continue;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      store_dkv_pair(p, j, kv_col + dt * 8 + t2, dk[dt][2 * hf] * a.scale, dk[dt][2 * hf + 1] * a.scale,
                     dv[dt][2 * hf], dv[dt][2 * hf + 1]);
  }
}

// ---------------------------------------------------------------- portable kernel

template <int kDMax>
struct BwdSimtConfig {
  static constexpr int kWarps = kDMax > 128 ? 8 : 4;
  static constexpr int kRows = kDMax > 128 ? 1 : 4;  // query rows per warp in a step
  static constexpr int kBr = kWarps * kRows;
  static constexpr int kBc = 32;                     // keys per block (one per lane)
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kKeys = kBc / kWarps;         // dK/dV rows per warp
  static constexpr int kLdK = kDMax + 1;             // odd: a lane per key hits distinct banks
  // K, V (kBc x kLdK), Q, dO (kBr x kDMax), P, dS (kBr x kBc), lse, delta (kBr); fp32; the
  // rows' first visible keys (kBr): int32.
  static constexpr int64_t kSmemBytes =
      4 * (2LL * kBc * kLdK + 2LL * kBr * kDMax + 2LL * kBr * kBc + 3LL * kBr);
};

template <typename T, int kDMax>
__global__ void __launch_bounds__(BwdSimtConfig<kDMax>::kThreads) bwd_simt_kernel(const BwdParams p) {
  using Cfg = BwdSimtConfig<kDMax>;
  constexpr int kRows = Cfg::kRows;
  constexpr int kBr = Cfg::kBr;
  constexpr int kBc = Cfg::kBc;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kKeys = Cfg::kKeys;
  constexpr int kLdK = Cfg::kLdK;
  constexpr int kCols = kDMax / 32;

  const AttnGeom& a = p.a;
  float* ks = reinterpret_cast<float*>(dynamic_smem());
  float* vs = ks + kBc * kLdK;
  float* qs = vs + kBc * kLdK;
  float* dos = qs + kBr * kDMax;
  float* ps = dos + kBr * kDMax;
  float* dss = ps + kBr * kBc;
  float* lse2_s = dss + kBr * kBc;
  float* delta_s = lse2_s + kBr;
  int* lo_s = reinterpret_cast<int*>(delta_s + kBr);

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int d = a.d;
  const BwdTile tile = bwd_tile<kBr, kBc>(a);
  const int kvh = tile.kvh;
  const int64_t k0 = tile.k0, steps = tile.steps;
  const int64_t kv_col = static_cast<int64_t>(kvh) * d;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);

  for (int idx = tid; idx < kBc * kDMax; idx += kThreads) {
    const int r = idx / kDMax;
    const int c = idx % kDMax;
    const int64_t j = k0 + r;
    const bool in = j < a.sk && c < d;
    ks[r * kLdK + c] = in ? to_f32(k[j * a.kv_rs + kv_col + c]) : 0.0f;
    vs[r * kLdK + c] = in ? to_f32(v[j * a.kv_rs + kv_col + c]) : 0.0f;
  }

  float dk[kKeys][kCols];
  float dv[kKeys][kCols];
#pragma unroll
  for (int kk = 0; kk < kKeys; ++kk)
#pragma unroll
    for (int c = 0; c < kCols; ++c) dk[kk][c] = dv[kk][c] = 0.0f;

  const int64_t j = k0 + lane;  // this lane's key in the score phase
  for (int64_t t = 0; t < steps; ++t) {
    const int hq = tile.head(t);
    const int64_t q0 = tile.q_tile(t) * kBr;
    const int64_t q_col = static_cast<int64_t>(hq) * d;
    __syncthreads();  // the previous step's readers are done (K and V are written on the first)
    for (int idx = tid; idx < kBr * kDMax; idx += kThreads) {
      const int r = idx / kDMax;
      const int c = idx % kDMax;
      const int64_t i = q0 + r;
      const bool in = i < a.sq && c < d;
      qs[idx] = in ? to_f32(q[i * a.q_rs + q_col + c]) : 0.0f;
      dos[idx] = in ? to_f32(dout[i * a.q_rs + q_col + c]) : 0.0f;
    }
    if (tid < kBr) {
      const int64_t i = q0 + tid;
      const float lv = i < a.sq ? p.lse[static_cast<int64_t>(hq) * a.sq + i] : -INFINITY;
      lse2_s[tid] = lv == -INFINITY ? INFINITY : lv * kLog2e;
      delta_s[tid] = i < a.sq ? p.delta[static_cast<int64_t>(hq) * a.sq + i] : 0.0f;
      lo_s[tid] = static_cast<int>(first_visible_key(a, i));
    }
    __syncthreads();

    // P and dS for this warp's rows, a lane per key.
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int r = warp * kRows + rr;
      const int64_t i = q0 + r;
      const float* qrow = qs + r * kDMax;
      const float* dorow = dos + r * kDMax;
      const float* krow = ks + lane * kLdK;
      const float* vrow = vs + lane * kLdK;
      float sc = 0.0f, dp = 0.0f;
      for (int c = 0; c < d; ++c) {
        sc += qrow[c] * krow[c];
        dp += dorow[c] * vrow[c];
      }
      const bool visible = j < a.sk && i < a.sq && (!a.causal || j - i <= a.diff) && j >= lo_s[r];
      const float pv = visible ? exp2f(sc * a.scale_log2 - lse2_s[r]) : 0.0f;
      ps[r * kBc + lane] = pv;
      dss[r * kBc + lane] = pv * (dp - delta_s[r]);
    }
    __syncthreads();

    // dV += P^T dO, dK += dS^T Q for this warp's keys.
#pragma unroll
    for (int kk = 0; kk < kKeys; ++kk) {
      const int kc = warp * kKeys + kk;
      for (int r = 0; r < kBr; ++r) {
        const float pr = ps[r * kBc + kc];
        const float dsr = dss[r * kBc + kc];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          dv[kk][c] += pr * dos[r * kDMax + lane + 32 * c];
          dk[kk][c] += dsr * qs[r * kDMax + lane + 32 * c];
        }
      }
    }

    // dQ += scale dS K for this warp's rows.
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int r = warp * kRows + rr;
      const int64_t i = q0 + r;
      float acc[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] = 0.0f;
      for (int kc = 0; kc < kBc; ++kc) {
        const float dsr = dss[r * kBc + kc];
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[c] += dsr * ks[kc * kLdK + lane + 32 * c];
      }
      if (i < a.sq) {
        float* dst = p.dq_acc + i * p.dq_acc_rs + static_cast<int64_t>(hq) * d;
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (lane + 32 * c < d) atomicAdd(dst + lane + 32 * c, acc[c] * a.scale);
      }
    }
  }

  T* dkp = static_cast<T*>(p.dk);
  T* dvp = static_cast<T*>(p.dv);
#pragma unroll
  for (int kk = 0; kk < kKeys; ++kk) {
    const int64_t jj = k0 + warp * kKeys + kk;
    if (jj >= a.sk) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = lane + 32 * c;
      if (col >= d) continue;
      if (p.out_f32) {
        float* dkd = static_cast<float*>(p.dk) + jj * a.kv_rs + kv_col + col;
        float* dvd = static_cast<float*>(p.dv) + jj * a.kv_rs + kv_col + col;
        *dkd = p.acc_dkv ? __fadd_rn(*dkd, dk[kk][c] * a.scale) : dk[kk][c] * a.scale;
        *dvd = p.acc_dkv ? __fadd_rn(*dvd, dv[kk][c]) : dv[kk][c];
      } else {
        from_f32(dkp + jj * a.kv_rs + kv_col + col, dk[kk][c] * a.scale);
        from_f32(dvp + jj * a.kv_rs + kv_col + col, dv[kk][c]);
      }
    }
  }
}

// ---------------------------------------------------------------- launchers

unsigned row_kernel_blocks(int64_t work_items, int64_t per_block) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(device_caps().sms) * 16);
  return static_cast<unsigned>(std::clamp<int64_t>((work_items + per_block - 1) / per_block, 1, cap));
}

// Tensor-core tiles: 128 keys x 64 queries per step, one block (8 warps) per SM. ptxas (sm_90):
// 255 registers at D = 64, 254 at D = 128 (sm_80: 252, 253), no spills (dK and dV alone are
// 2 x D/2 registers per thread).
template <int kD>
void launch_bwd_mma(const BwdParams& p, cudaStream_t stream) {
  constexpr int kBr = 64, kMinBlocks = 1;
  using Cfg = BwdMmaConfig<kD, kBr>;
  launch_tiled(bwd_mma_kernel<kD, kBr, kMinBlocks>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sk, Cfg::kBc, p.a.g, p,
               stream, "attention backward");
}

template <typename T, int kDMax>
void launch_bwd_simt(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdSimtConfig<kDMax>;
  launch_tiled(bwd_simt_kernel<T, kDMax>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sk, Cfg::kBc, p.a.g, p, stream,
               "attention backward");
}

template <typename T>
void launch_bwd_simt_any(const BwdParams& p, cudaStream_t stream) {
  if (p.a.d <= 32) return launch_bwd_simt<T, 32>(p, stream);
  if (p.a.d <= 64) return launch_bwd_simt<T, 64>(p, stream);
  if (p.a.d <= 128) return launch_bwd_simt<T, 128>(p, stream);
  return launch_bwd_simt<T, 256>(p, stream);
}

template <typename T>
void launch_delta(const AttnGeom& a, const void* out, const void* dout, float* delta, cudaStream_t stream) {
  auto* kernel = delta_kernel<T>;
  const unsigned grid = row_kernel_blocks(a.sq * a.h, kRowKernelThreads / 32);
  kernel<<<grid, kRowKernelThreads, 0, stream>>>(a, static_cast<const T*>(out), static_cast<const T*>(dout), delta);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

}  // namespace
}  // namespace attn

namespace {
enum BackwardScratch { kDelta, kDqAcc };
}  // namespace

Status attention_backward_supports(const AttentionBackwardCall& c) { return attn::portable_dim_supported(c.s.head_dim); }

ScratchRequest attention_backward_scratch(const Device&, const AttentionBackwardCall& c) {
  const int64_t h = c.s.heads, sq = c.s.seq_q, d = c.s.head_dim;
  ScratchRequest r;
  if (c.delta_source == DeltaSource::kFromOut) r.set(kDelta, h * sq * 4, Tag::kAttnWorkspace, "attention backward D");
  if (c.s.dtype != DType::kF32 && !c.s.f32_results)  // f32 dq is its own accumulator
    r.set(kDqAcc, sq * h * d * 4, Tag::kAttnWorkspace, "attention backward dQ accumulator");
  return r;
}

void attention_backward(Device& dev, const AttentionBackwardCall& c, const Scratch& scratch) {
  using namespace attn;
  const AttentionShape& s = c.s;
  // cuDNN's fused attention where it takes the case (attention_select.h).
  const StatusOr<AttentionKernel> asked = attention_kernel_requested();
  if (asked.ok() && choose_attention_kernel(asked.value(), cudnn_attention_ready(), s, true, c.delta_source) ==
                        AttentionKernel::kCudnn)
    return cudnn_attention_backward(dev, c);
  const AttentionBackwardTensors& t = c.t;
  const AttnGeom a = make_attn_geom(s);
  const bool dq_direct = s.dtype == DType::kF32 || s.f32_results;
  const int64_t hd = static_cast<int64_t>(a.h) * a.d;
  float* const dq_buf = scratch.as<float>(kDqAcc);

  cudaStream_t stream = static_cast<CudaDevice&>(dev).stream();
  const float* delta = t.delta;
  if (c.delta_source == DeltaSource::kFromOut) {
    float* const delta_buf = scratch.as<float>(kDelta);
    if (s.dtype == DType::kBF16)
      launch_delta<bf16>(a, t.out, t.dout, delta_buf, stream);
    else
      launch_delta<float>(a, t.out, t.dout, delta_buf, stream);
    delta = delta_buf;
  }
  float* dq_acc = dq_direct ? static_cast<float*>(t.dq) : dq_buf;
  const int64_t dq_acc_rs = dq_direct ? a.q_rs : hd;
  UNTIED_CUDA_CHECK(cudaMemset2DAsync(dq_acc, static_cast<size_t>(dq_acc_rs) * 4, 0, static_cast<size_t>(hd) * 4,
                                      static_cast<size_t>(a.sq), stream));

  const BwdParams p{.a = a, .q = t.q, .k = t.k, .v = t.v, .dout = t.dout, .lse = t.lse, .delta = delta,
                    .dq_acc = dq_acc, .dq_acc_rs = dq_acc_rs, .dk = t.dk, .dv = t.dv, .out_f32 = s.f32_results ? 1 : 0,
                    .acc_dkv = s.accumulate_dkv ? 1 : 0};
  if (use_tensor_cores(a, s.dtype, t.q, t.k, t.v, t.dout, t.dk, t.dv)) {
    if (attention_backward_sm90(p, stream)) {
      // the Hopper kernel ran (UNTIED_CUDA_ATTENTION=wgmma on compute capability 9.0, D = 128)
    } else if (a.d == 64)
      launch_bwd_mma<64>(p, stream);
    else
      launch_bwd_mma<128>(p, stream);
  } else if (s.dtype == DType::kBF16) {
    launch_bwd_simt_any<bf16>(p, stream);
  } else {
    launch_bwd_simt_any<float>(p, stream);
  }

  if (!dq_direct) {
    auto* kernel = dq_convert_kernel;
    const unsigned grid = row_kernel_blocks(a.sq * hd, kRowKernelThreads * 4);
    kernel<<<grid, kRowKernelThreads, 0, stream>>>(dq_buf, static_cast<bf16*>(t.dq), a.sq, hd, a.q_rs);
    UNTIED_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace untied::cuda
