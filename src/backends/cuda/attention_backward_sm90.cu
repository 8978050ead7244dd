// Flash attention backward on Hopper (compute capability 9.0, D = 128): the FlashAttention-2
// schedule of attention_backward.cu's tensor-core kernel with its five matrix products on the
// warpgroup tensor-core instructions (wgmma.cuh). Semantics: include/untied/kernels/attention.h;
// the same masks, roundings (P and dS rounded to bf16 as product operands) and outputs as that
// kernel: dK and dV in registers for the whole loop and written once (deterministic), dQ added
// with fp32 atomics into the accumulator that attention_backward() zeroes and converts.
//
// One block of 2 warpgroups (256 threads) per (128-key tile, KV head); warpgroup w owns keys
// [64 w, 64 w + 64) of the tile. It loops over the query heads of its GQA group and, for each,
// over the 64-row query tiles that can see the key tile; per step, for its 64 keys:
//   S^T = K Q^T and dP^T = V dO^T (64 x 64, fp32 registers): wgmma m64n64k16, both operands from
//     shared memory (K-major);
//   P^T = exp2(scale log2(e) S^T - log2(e) lse), zero where masked; dS^T = P^T (dP^T - delta);
//   dV += P^T dO and dK += dS^T Q (64 x 128, fp32 registers): wgmma m64n128k16, A from registers
//     (the S^T / dP^T fragments rounded to bf16), B = dO / Q read N-major;
//   dS^T (bf16) into shared memory; after a barrier, warpgroup w computes dQ's columns
//     [64 w, 64 w + 64) for the 64 query rows, dS K: wgmma m64n64k16 with A = the dS^T tile read
//     M-major and B = K's column block w read N-major, and adds them (times the scale) to the
//     accumulator with fp32 atomics.
// K and V stay in shared memory; Q, dO, lse, delta and the rows' first visible keys of the next
// step are copied with cp.async while the current step is computed.
//
// Built for sm_90a only (CMakeLists.txt: UNTIED_SM90A_KERNELS); elsewhere attention_backward_sm90
// answers false and the mma.sync kernel runs. Opt-in: UNTIED_CUDA_ATTENTION=wgmma (wgmma.cuh).
//
// Workspace: none beyond attention_backward()'s (delta, the dQ accumulator).
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/wgmma.cuh"

namespace untied::cuda::attn {
namespace {

// The causal limit for key row j against a step's kBr query columns from q0: columns
// [0, returned) do not see it (all of them past the keys' end). `masked`: the key tile crosses the
// causal diagonal or the keys' end (else 0).
template <int kBr>
__device__ __forceinline__ int first_query_seeing(const AttnGeom& a, int64_t j, int64_t q0, bool masked) {
  if (!masked) return 0;
  return j >= a.sk ? kBr : (a.causal ? clamp_to(j - a.diff - q0, kBr) : 0);
}

// P^T of key row j and query column qc from its score s, the step's per-row lse and first visible
// keys, and the key's first_query_seeing: exp2(s scale log2(e) - lse log2(e)), 0 where the query
// does not see the key (a row with lse = -inf sees none: +inf makes its p exactly 0). `docs`: some
// row of the step starts after the tile's first key (documents, window).
__device__ __forceinline__ float backward_p(const AttnGeom& a, float s, int64_t j, int qc, int first_query, bool docs,
                                            const float* lse, const int* row_lo) {
  const float lv = lse[qc];
  const float l2 = lv == -INFINITY ? INFINITY : lv * kLog2e;
  const float pv = exp2_ftz(s * a.scale_log2 - l2);
  return qc < first_query || (docs && j < row_lo[qc]) ? 0.0f : pv;
}

// (The mma.sync kernel computes the same inline: with these functions ptxas spilled 52 bytes of its
// registers there against 36 inline, and here none against 16.)

struct Sm90BwdConfig {
  static constexpr int kD = 128;
  static constexpr int kThreads = 256;           // 2 warpgroups
  static constexpr int kBc = 128;                // keys per block, 64 per warpgroup
  static constexpr int kBr = 64;                 // query rows per step
  static constexpr int kKvBytes = kBc * kD * 2;  // K or V
  static constexpr int kQBytes = kBr * kD * 2;   // Q or dO, one stage
  static constexpr int kDsBytes = kBc * kBr * 2; // dS^T: key rows of the step's 64 queries
  // K, V; 2 stages of Q and dO; dS^T; 2 stages of lse and delta (fp32) and of the rows' first
  // visible keys (int32); the slack that aligns the tiles to 1024 bytes.
  static constexpr int64_t kSmemBytes = 2LL * kKvBytes + 4LL * kQBytes + kDsBytes + 3LL * 2 * 4 * kBr + 1024;
};

__global__ void __launch_bounds__(256, 1) bwd_wgmma_kernel(const BwdParams p) {
#if UNTIED_WGMMA
  using Cfg = Sm90BwdConfig;
  constexpr int kD = Cfg::kD;
  constexpr int kBc = Cfg::kBc;
  constexpr int kBr = Cfg::kBr;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kQT = kBr / 8;  // 8-query n-tiles of S^T and dP^T
  constexpr int kDT = kD / 8;   // 8-column n-tiles of dK and dV

  const AttnGeom& a = p.a;
  unsigned char* ks = aligned_smem();
  unsigned char* vs = ks + Cfg::kKvBytes;
  unsigned char* qs = vs + Cfg::kKvBytes;       // 2 stages
  unsigned char* dos = qs + 2 * Cfg::kQBytes;   // 2 stages
  unsigned char* dss = dos + 2 * Cfg::kQBytes;  // dS^T: kBc rows of kBr queries (one 64-column block)
  float* lse_s = reinterpret_cast<float*>(dss + Cfg::kDsBytes);  // 2 stages
  float* delta_s = lse_s + 2 * kBr;                              // 2 stages
  int* lo_s = reinterpret_cast<int*>(delta_s + 2 * kBr);         // 2 stages

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wg = warp / 4;         // warpgroup: keys [64 wg, 64 wg + 64) of the tile
  const int krow = warp * 16;      // this warp's first key row of the tile
  const int qrow = (warp % 4) * 16;  // this warp's first query row of dQ's 64
  const int g = lane >> 2;
  const int t2 = (lane & 3) * 2;
  const BwdTile tile = bwd_tile<kBr, kBc>(a);
  const int kvh = tile.kvh;
  const int64_t k0 = tile.k0, steps = tile.steps;
  const int64_t kv_col = static_cast<int64_t>(kvh) * kD;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const bf16* dout = static_cast<const bf16*>(p.dout);

  float dk[kD / 2];
  float dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.0f;

  // Q, dO, lse, delta and first visible keys of step t (query head, query tile) into stage st.
  auto load_step = [&](int64_t t, int st) {
    const int hq = tile.head(t);
    const int64_t q0 = tile.q_tile(t) * kBr;
    const int64_t q_col = static_cast<int64_t>(hq) * kD;
    load_swizzled_async<kBr, kD, kThreads>(qs + st * Cfg::kQBytes, q, q0, a.sq, a.q_rs, q_col, tid);
    load_swizzled_async<kBr, kD, kThreads>(dos + st * Cfg::kQBytes, dout, q0, a.sq, a.q_rs, q_col, tid);
    load_row_values_async<kBr>(p, hq, q0, lse_s + st * kBr, delta_s + st * kBr, lo_s + st * kBr, tid);
  };

  if (steps > 0) {
    load_swizzled_async<kBc, kD, kThreads>(ks, k, k0, a.sk, a.kv_rs, kv_col, tid);
    load_swizzled_async<kBc, kD, kThreads>(vs, v, k0, a.sk, a.kv_rs, kv_col, tid);
    load_step(0, 0);
    cp_async_commit();
  }

  for (int64_t t = 0; t < steps; ++t) {
    const int st = static_cast<int>(t & 1);
    const int hq = tile.head(t);
    const int64_t q0 = tile.q_tile(t) * kBr;
    // Step t has landed and is visible (to wgmma too); every thread is done with step t-1 (its
    // wgmma groups completed): its stage and dS^T may be refilled.
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    if (t + 1 < steps) load_step(t + 1, st ^ 1);
    cp_async_commit();
    const unsigned char* qst = qs + st * Cfg::kQBytes;
    const unsigned char* dost = dos + st * Cfg::kQBytes;
    const float* lst = lse_s + st * kBr;
    const float* dlt = delta_s + st * kBr;
    const int* lost = lo_s + st * kBr;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys.
    float sacc[kBr / 2];
    float dpacc[kBr / 2];
#pragma unroll
    for (int i = 0; i < kBr / 2; ++i) sacc[i] = dpacc[i] = 0.0f;
    wgmma_hold(sacc);
    wgmma_hold(dpacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int a_off = (kk / 4) * kBc * 128 + wg * 64 * 128 + (kk % 4) * 32;
      const int b_off = (kk / 4) * kBr * 128 + (kk % 4) * 32;
      wgmma_ss_n64<0, 0>(sacc, smem_desc(ks + a_off, 16, 1024), smem_desc(qst + b_off, 16, 1024), kk > 0 ? 1 : 0);
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int a_off = (kk / 4) * kBc * 128 + wg * 64 * 128 + (kk % 4) * 32;
      const int b_off = (kk / 4) * kBr * 128 + (kk % 4) * 32;
      wgmma_ss_n64<0, 0>(dpacc, smem_desc(vs + a_off, 16, 1024), smem_desc(dost + b_off, 16, 1024), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_hold(sacc);
    wgmma_hold(dpacc);

    // P^T = exp2(S^T scale log2(e) - lse log2(e)), zero where the query row does not see the key
    // (rows with lse = -inf see no key at all: +inf makes their p exactly 0); documents and
    // window: a query whose first visible key is after key row j does not see it.
    // dS^T = P^T (dP^T - delta), in dpacc.
    const bool lo_masked = a.has_lo && lost[kBr - 1] > k0;
    const bool masked = k0 + kBc > a.sk || (a.causal && k0 + kBc - 1 - q0 > a.diff);
    const int fq[2] = {first_query_seeing<kBr>(a, k0 + krow + g, q0, masked),
                       first_query_seeing<kBr>(a, k0 + krow + g + 8, q0, masked)};
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qc = nt * 8 + t2 + (e & 1);
        const float pm =
            backward_p(a, sacc[nt * 4 + e], k0 + krow + g + (e >> 1) * 8, qc, fq[e >> 1], lo_masked, lst, lost);
        sacc[nt * 4 + e] = pm;
        dpacc[nt * 4 + e] = pm * (dpacc[nt * 4 + e] - dlt[qc]);
      }
    }

    // dS^T (bf16) into shared memory for dQ: key row krow + g + 8 hf, query columns of n-tile nt.
#pragma unroll
    for (int nt = 0; nt < kQT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        st_shared_u32(dss + swizzled_offset(kBc, krow + g + hf * 8, nt) + t2 * 2,
                      pack_bf16(dpacc[nt * 4 + 2 * hf], dpacc[nt * 4 + 2 * hf + 1]));

    // dV += P^T dO and dK += dS^T Q: the fragments of query n-tiles 2kk, 2kk+1, rounded to bf16,
    // are the A fragment of query slice kk; dO and Q are read N-major (rows: the 16 queries).
    uint32_t pa[kBr / 16][4];
    uint32_t da[kBr / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pa[kk][j] = pack_bf16(sacc[8 * kk + 2 * j], sacc[8 * kk + 2 * j + 1]);
        da[kk][j] = pack_bf16(dpacc[8 * kk + 2 * j], dpacc[8 * kk + 2 * j + 1]);
      }
    }
    wgmma_hold(dv);
    wgmma_hold(dk);
    wgmma_hold(pa);
    wgmma_hold(da);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) wgmma_rs_n128(dv, pa[kk], smem_desc(dost + kk * 16 * 128, kBr * 128, 1024));
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) wgmma_rs_n128(dk, da[kk], smem_desc(qst + kk * 16 * 128, kBr * 128, 1024));
    wgmma_commit();

    // Every warp's dS^T is in shared memory (and visible to wgmma) before dQ reads it.
    fence_proxy_async();
    __syncthreads();

    // dQ's columns [64 wg, 64 wg + 64) = dS K: A = dS^T read M-major (its rows are the keys, the
    // reduction), B = K's column block wg read N-major.
    float dqa[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dqa[i] = 0.0f;
    wgmma_hold(dqa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      wgmma_ss_n64<1, 1>(dqa, smem_desc(dss + kk * 16 * 128, kBc * 128, 1024),
                         smem_desc(ks + wg * kBc * 128 + kk * 16 * 128, kBc * 128, 1024), kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait_all();  // dV, dK and dQ of this step
    wgmma_hold(dv);
    wgmma_hold(dk);
    wgmma_hold(pa);
    wgmma_hold(da);
    wgmma_hold(dqa);

#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int64_t i = q0 + qrow + g + hf * 8;
      if (i < a.sq) {
        float* dst = p.dq_acc + i * p.dq_acc_rs + static_cast<int64_t>(hq) * kD + wg * 64 + t2;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          atomic_add_f32x2(dst + nt * 8, dqa[nt * 4 + 2 * hf] * a.scale, dqa[nt * 4 + 2 * hf + 1] * a.scale);
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
      store_dkv_pair(p, j, kv_col + dt * 8 + t2, dk[dt * 4 + 2 * hf] * a.scale, dk[dt * 4 + 2 * hf + 1] * a.scale,
                     dv[dt * 4 + 2 * hf], dv[dt * 4 + 2 * hf + 1]);
  }
#endif  // UNTIED_WGMMA
}

}  // namespace

bool attention_backward_sm90(const BwdParams& p, cudaStream_t stream) {
  if (!wgmma_wanted()) return false;
#if defined(UNTIED_SM90A_KERNELS)
  if (!sm90a_device()) return wgmma_unavailable("this GPU's compute capability is not 9.0"), false;
  if (p.a.d != Sm90BwdConfig::kD) return false;  // the mma.sync backward at D = 64
  launch_tiled(bwd_wgmma_kernel, Sm90BwdConfig::kThreads, Sm90BwdConfig::kSmemBytes, p.a.sk, Sm90BwdConfig::kBc,
               p.a.g, p, stream, "attention backward (sm_90a)");
  return true;
#else
  (void)p;
  (void)stream;
  wgmma_unavailable("this build has no sm_90a code (its CUDA architectures do not include 90)");
  return false;
#endif
}

}  // namespace untied::cuda::attn
