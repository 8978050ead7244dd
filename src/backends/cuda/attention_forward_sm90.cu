// Flash attention forward on Hopper (compute capability 9.0): the FlashAttention-2 schedule of
// attention_forward.cu with its two matrix products on the warpgroup tensor-core instructions
// (wgmma, sm_90a), which run at about 1.5x the rate of mma.sync on these GPUs. Semantics:
// include/untied/kernels/attention.h; the same tiles, masks, online softmax in base 2 and
// roundings as attention_forward.cu's tensor-core kernel (P rounded to bf16 for P V).
//
// One block of 2 warpgroups (256 threads) per (128-row query tile, query head), numbered as
// fwd_tile says. Warpgroup w owns rows [64 w, 64 w + 64) of the tile. Per key tile of 128 keys:
//   S (64 x 128, fp32 registers) = Q K^T: 8 (D = 128) or 4 (D = 64) wgmma m64n128k16, both
//     operands from shared memory;
//   the online softmax on S in registers (each warp's 16 rows laid out as mma.sync's C
//     fragments, so the masking and softmax code is that of the mma.sync kernel);
//   O (64 x D, fp32 registers) += P V: 8 wgmma m64nDk16 with P from registers (the C fragments
//     of S rounded to bf16 are the A fragments) and V from shared memory, transposed (MN-major).
// Q, K and V live in shared memory as 128-byte swizzled tiles (wgmma.cuh), the layout wgmma's
// descriptors name; K and V are double-buffered with cp.async: tile kb+1 is copied while
// tile kb is computed.
//
// Built for sm_90a only (its own library, CMakeLists.txt: UNTIED_SM90A_KERNELS); elsewhere
// (other architectures) attention_forward_sm90 answers false and the mma.sync kernel runs.
// Opt-in for now: it runs only with UNTIED_CUDA_ATTENTION=wgmma, until a GPU run has checked it
// against the CPU (docs/gpu.md); unset or "mma", the mma.sync kernel runs.
//
// Workspace: none.
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/wgmma.cuh"

namespace untied::cuda::attn {
namespace {

template <int kD>
struct Sm90FwdConfig {
  static constexpr int kWarpgroups = 2;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kBr = kWarpgroups * 64;  // query rows per block
  static constexpr int kBc = 128;               // keys per tile
  static constexpr int kQBytes = kBr * kD * 2;
  static constexpr int kKvBytes = kBc * kD * 2;
  // Q, 2 stages of K and V, and the slack that aligns them to 1024 bytes.
  static constexpr int64_t kSmemBytes = kQBytes + 4LL * kKvBytes + 1024;
};

template <int kD>
__global__ void __launch_bounds__(256, 1) fwd_wgmma_kernel(const FwdParams p) {
#if UNTIED_WGMMA
  using Cfg = Sm90FwdConfig<kD>;
  constexpr int kBr = Cfg::kBr;
  constexpr int kBc = Cfg::kBc;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kNT = kBc / 8;  // 8-key n-tiles of S
  constexpr int kDT = kD / 8;   // 8-column n-tiles of O

  const AttnGeom& a = p.a;
  unsigned char* qs = aligned_smem();
  unsigned char* ks = qs + Cfg::kQBytes;        // 2 stages
  unsigned char* vs = ks + 2 * Cfg::kKvBytes;   // 2 stages

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wg = warp / 4;           // warpgroup: rows [64 wg, 64 wg + 64) of the tile
  const int wrow = warp * 16;        // this warp's first row of the tile
  const int g = lane >> 2;           // fragment row within the warp's 16 rows
  const int t2 = (lane & 3) * 2;     // fragment column pair
  const FwdTile tile = fwd_tile<kBr, kBc>(a);
  const int h = tile.h, kvh = tile.kvh;
  const int64_t q0 = tile.q0, kb0 = tile.kb0, nkb = tile.nkb;
  const int64_t vis_first = visible_keys(a, q0);  // key tiles below this need no causal mask
  const int64_t q_last_row = (q0 + kBr < a.sq ? q0 + kBr : a.sq) - 1;
  const int64_t lo_last = first_visible_key(a, q_last_row);  // documents, window

  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const int64_t q_col = static_cast<int64_t>(h) * kD;
  const int64_t kv_col = static_cast<int64_t>(kvh) * kD;

  float o[kD / 2];  // O of rows wrow + g (o[4 dt + 0, 1]) and wrow + g + 8 (o[4 dt + 2, 3])
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  int64_t row_lo[2];  // each row's first visible key (documents and window; 0 without)
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) row_lo[hf] = first_visible_key(a, q0 + wrow + g + hf * 8);

  if (nkb > kb0) {
    const int st0 = static_cast<int>(kb0 & 1);
    load_swizzled_async<kBr, kD, kThreads>(qs, q, q0, a.sq, a.q_rs, q_col, tid);
    load_swizzled_async<kBc, kD, kThreads>(ks + st0 * Cfg::kKvBytes, k, kb0 * kBc, a.sk, a.kv_rs, kv_col, tid);
    load_swizzled_async<kBc, kD, kThreads>(vs + st0 * Cfg::kKvBytes, v, kb0 * kBc, a.sk, a.kv_rs, kv_col, tid);
    cp_async_commit();
  }

  for (int64_t kb = kb0; kb < nkb; ++kb) {
    // Tile kb has landed and is visible to wgmma; both warpgroups are done with tile kb-1 (their
    // wgmma groups completed), so its stage may be refilled with tile kb+1.
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    if (kb + 1 < nkb) {
      const int st = static_cast<int>((kb + 1) & 1);
      load_swizzled_async<kBc, kD, kThreads>(ks + st * Cfg::kKvBytes, k, (kb + 1) * kBc, a.sk, a.kv_rs, kv_col, tid);
      load_swizzled_async<kBc, kD, kThreads>(vs + st * Cfg::kKvBytes, v, (kb + 1) * kBc, a.sk, a.kv_rs, kv_col, tid);
    }
    cp_async_commit();
    const unsigned char* kst = ks + static_cast<int>(kb & 1) * Cfg::kKvBytes;
    const unsigned char* vst = vs + static_cast<int>(kb & 1) * Cfg::kKvBytes;
    const int64_t k0 = kb * kBc;

    // S (this warpgroup's 64 rows x 128 keys) = Q K^T.
    float s[kBc / 2];
#pragma unroll
    for (int i = 0; i < kBc / 2; ++i) s[i] = 0.0f;
    wgmma_hold(s);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da = smem_desc(qs + (kk / 4) * kBr * 128 + wg * 64 * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = smem_desc(kst + (kk / 4) * kBc * 128 + (kk % 4) * 32, 16, 1024);
      wgmma_ss_n128<0, 0>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_hold(s);

    // Online softmax, one row half (g or g+8) at a time; the 4 lanes of a quad share a row.
    const bool masked = k0 + kBc > vis_first || lo_last > k0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float alpha = online_softmax_row<kNT>([&](int nt, int e) -> float& { return s[nt * 4 + hf * 2 + e]; }, a,
                                                  masked, k0, q0 + wrow + g + hf * 8, row_lo[hf], t2, m[hf], l[hf]);
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[dt * 4 + hf * 2] *= alpha;
        o[dt * 4 + hf * 2 + 1] *= alpha;
      }
    }

    // O += P V: the S fragments of key n-tiles 2kk, 2kk+1, rounded to bf16, are the A fragment of
    // key slice kk.
    uint32_t pa[kBc / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_hold(o);
    wgmma_hold(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint64_t db = smem_desc(vst + kk * 16 * 128, kBc * 128, 1024);
      if constexpr (kD == 128)
        wgmma_rs_n128(o, pa[kk], db);
      else
        wgmma_rs_n64(o, pa[kk], db);
    }
    wgmma_commit();
    wgmma_wait_all();
    wgmma_hold(o);
    wgmma_hold(pa);
  }

  // out = O / l (0 for rows that saw no key), lse = (m + log2 l) ln 2 (-inf for those rows).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
    store_out_row<kDT>(p, q0 + wrow + g + hf * 8, h, t2, lane, [&](int dt, int e) { return o[dt * 4 + hf * 2 + e]; },
                       m[hf], l[hf]);
#endif  // UNTIED_WGMMA
}

#if defined(UNTIED_SM90A_KERNELS)
template <int kD>
void launch_fwd_wgmma(const FwdParams& p, cudaStream_t stream) {
  using Cfg = Sm90FwdConfig<kD>;
  launch_tiled(fwd_wgmma_kernel<kD>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sq, Cfg::kBr, p.a.h, p, stream,
               "attention forward (sm_90a)");
}
#endif

}  // namespace

bool attention_forward_sm90(const FwdParams& p, cudaStream_t stream) {
  if (!wgmma_wanted()) return false;
#if defined(UNTIED_SM90A_KERNELS)
  if (!sm90a_device()) return wgmma_unavailable("this GPU's compute capability is not 9.0"), false;
  if (p.a.d == 128) return launch_fwd_wgmma<128>(p, stream), true;
  if (p.a.d == 64) return launch_fwd_wgmma<64>(p, stream), true;
#else
  (void)p;
  (void)stream;
  wgmma_unavailable("this build has no sm_90a code (its CUDA architectures do not include 90)");
#endif
  return false;
}

}  // namespace untied::cuda::attn
