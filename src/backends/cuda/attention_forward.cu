// Flash attention forward on the GPU (FlashAttention-2 schedule). Semantics:
// include/untied/kernels/attention.h; reference: src/kernels/cpu/attention_forward.cc.
//
// One block per (query tile, query head). Blocks are numbered so that the query tiles that see
// the most keys start first (the last tiles when causal), with the heads of one tile adjacent
// (GQA heads sharing a KV head read the same K/V tiles from L2 at about the same time). Each
// block keeps an fp32 accumulator for its tile and walks the key tiles its rows may see with an
// online softmax in base 2 (scores pre-multiplied by scale*log2(e), p = exp2(s - m)); key tiles
// wholly above the causal diagonal are never visited, and only tiles that cross it (or the end
// of the keys) are masked.
//
// Tensor-core kernel (bf16, D in {64, 128}; on compute capability 9.0 with
// UNTIED_CUDA_ATTENTION=wgmma, the wgmma kernel of attention_forward_sm90.cu instead): kWarps
// warps, each owning kMT 16-row slices of the query tile; S = Q K^T and O += P V with mma.sync
// m16n8k16 (bf16 in, fp32 accumulate), operands from shared memory through ldmatrix, P reused
// from the S accumulators as A fragments (rounded to bf16, as FlashAttention does; l is summed
// from the fp32 p). K and V tiles are double-buffered:
// tile kb+1 is copied with cp.async while tile kb is computed, one __syncthreads per tile.
//
// Portable kernel (f32, or bf16 with other D, or older GPUs; D <= 256): 4 warps x 4 query rows,
// 32-key tiles in shared memory as fp32; a lane owns one key for the scores and 1..8 columns of
// the output; exact fp32 arithmetic.
//
// Workspace: none (the forward allocates nothing; every intermediate is in registers or shared
// memory).
#include "backends/cuda/attention_select.h"
#include "backends/cuda/cudnn_attention.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/attention_tiles.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace untied::cuda {
namespace attn {
namespace {

// ---------------------------------------------------------------- tensor-core kernel

template <int kD, int kWarps, int kMT, int kBc>
struct FwdMmaConfig {
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBr = kWarps * kMT * 16;  // query rows per block
  static constexpr int kLd = kD + 8;             // shared row stride (elements)
  static constexpr int64_t kSmemBytes = static_cast<int64_t>(kBr + 4 * kBc) * kLd * 2;  // Q, 2 x (K, V)
};

template <int kD, int kWarps, int kMT, int kBc, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) fwd_mma_kernel(const FwdParams p) {
  using Cfg = FwdMmaConfig<kD, kWarps, kMT, kBc>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kBr = Cfg::kBr;
  constexpr int kLd = Cfg::kLd;
  constexpr int kNT = kBc / 8;  // 8-key n-tiles of S
  constexpr int kDT = kD / 8;   // 8-column n-tiles of O
  static_assert(kD % 16 == 0 && kBc % 16 == 0, "tile sizes");

  const AttnGeom& a = p.a;
  bf16* qs = reinterpret_cast<bf16*>(dynamic_smem());
  bf16* ks = qs + kBr * kLd;      // 2 stages of kBc x kLd
  bf16* vs = ks + 2 * kBc * kLd;  // 2 stages of kBc x kLd

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const FwdTile tile = fwd_tile<kBr, kBc>(a);
  const int h = tile.h, kvh = tile.kvh;
  const int64_t q0 = tile.q0, kb0 = tile.kb0, nkb = tile.nkb;
  const int64_t vis_first = visible_keys(a, q0);                  // tiles below this need no mask
  // Documents and window: tiles from this key on need the rows' first keys (lo_last: the most).
  const int64_t q_last_row = (q0 + kBr < a.sq ? q0 + kBr : a.sq) - 1;
  const int64_t lo_last = first_visible_key(a, q_last_row);

  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* k = static_cast<const bf16*>(p.k);
  const bf16* v = static_cast<const bf16*>(p.v);
  const int64_t q_col = static_cast<int64_t>(h) * kD;
  const int64_t kv_col = static_cast<int64_t>(kvh) * kD;
  const int wrow = warp * kMT * 16;  // first tile row of this warp
  const int g = lane >> 2;           // fragment row within a 16-row slice
  const int t2 = (lane & 3) * 2;     // fragment column pair

  float o[kMT][kDT][4];
  float m[kMT][2];
  float l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }

  // Each row's first visible key (documents and window; 0 without).
  int64_t row_lo[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) row_lo[mt][hf] = first_visible_key(a, q0 + wrow + mt * 16 + g + hf * 8);

  if (nkb > kb0) {
    const int st0 = static_cast<int>(kb0 & 1);
    load_tile_async<kBr, kD, kThreads>(qs, q, q0, a.sq, a.q_rs, q_col, tid);
    load_tile_async<kBc, kD, kThreads>(ks + st0 * kBc * kLd, k, kb0 * kBc, a.sk, a.kv_rs, kv_col, tid);
    load_tile_async<kBc, kD, kThreads>(vs + st0 * kBc * kLd, v, kb0 * kBc, a.sk, a.kv_rs, kv_col, tid);
    cp_async_commit();
  }

  for (int64_t kb = kb0; kb < nkb; ++kb) {
    // Tile kb has landed (this thread's copies) and is visible to all (the barrier); every warp
    // is done with tile kb-1, so its stage may be refilled with tile kb+1.
    cp_async_wait_all();
    __syncthreads();
    if (kb + 1 < nkb) {
      const int st = static_cast<int>((kb + 1) & 1);
      load_tile_async<kBc, kD, kThreads>(ks + st * kBc * kLd, k, (kb + 1) * kBc, a.sk, a.kv_rs, kv_col, tid);
      load_tile_async<kBc, kD, kThreads>(vs + st * kBc * kLd, v, (kb + 1) * kBc, a.sk, a.kv_rs, kv_col, tid);
    }
    cp_async_commit();
    const bf16* kst = ks + static_cast<int>(kb & 1) * kBc * kLd;
    const bf16* vst = vs + static_cast<int>(kb & 1) * kBc * kLd;
    const int64_t k0 = kb * kBc;

    // S (rows of this warp x kBc keys) = Q K^T.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldsm_x4(qa[mt], qs + (wrow + mt * 16 + (lane & 15)) * kLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t kf[4];  // b0, b1 of key n-tiles 2np and 2np+1
        ldsm_x4(kf, kst + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kLd + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16_16816(s[mt][2 * np], qa[mt], kf[0], kf[1]);
          mma_bf16_16816(s[mt][2 * np + 1], qa[mt], kf[2], kf[3]);
        }
      }
    }

    // Online softmax, one row half (g or g+8) at a time; the 4 lanes of a quad share a row.
    const bool masked = k0 + kBc > vis_first || lo_last > k0;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float alpha =
            online_softmax_row<kNT>([&](int nt, int e) -> float& { return s[mt][nt][hf * 2 + e]; }, a, masked, k0,
                                    q0 + wrow + mt * 16 + g + hf * 8, row_lo[mt][hf], t2, m[mt][hf], l[mt][hf]);
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][hf * 2] *= alpha;
          o[mt][dt][hf * 2 + 1] *= alpha;
        }
      }
    }

    // O += P V: the S accumulators of key n-tiles 2kk, 2kk+1 are the A fragment of key slice kk.
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t vf[4];  // b0, b1 of column n-tiles 2dp and 2dp+1
        ldsm_x4_t(vf, vst + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + dp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16_16816(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
        }
      }
    }
  }

  // out = O / l (0 for rows that saw no key), lse = (m + log2 l) ln 2 (-inf for those rows).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      store_out_row<kDT>(p, q0 + wrow + mt * 16 + g + hf * 8, h, t2, lane,
                         [&](int dt, int e) { return o[mt][dt][hf * 2 + e]; }, m[mt][hf], l[mt][hf]);
}

// ---------------------------------------------------------------- portable kernel

template <int kDMax>
struct FwdSimtConfig {
  static constexpr int kWarps = 4;
  static constexpr int kRows = 4;  // query rows per warp
  static constexpr int kBr = kWarps * kRows;
  static constexpr int kBc = 32;   // keys per tile (one per lane)
  static constexpr int kThreads = kWarps * 32;
  // Q (kBr x kDMax), K (kBc x (kDMax + 1): odd stride, a lane per key hits distinct banks),
  // V (kBc x kDMax), P (kBr x kBc); fp32.
  static constexpr int64_t kSmemBytes =
      4 * (static_cast<int64_t>(kBr) * kDMax + kBc * (kDMax + 1) + kBc * kDMax + kBr * kBc);
};

template <typename T, int kDMax>
__global__ void __launch_bounds__(128) fwd_simt_kernel(const FwdParams p) {
  using Cfg = FwdSimtConfig<kDMax>;
  constexpr int kRows = Cfg::kRows;
  constexpr int kBr = Cfg::kBr;
  constexpr int kBc = Cfg::kBc;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kCols = kDMax / 32;  // output columns per lane
  constexpr int kKs = kDMax + 1;

  const AttnGeom& a = p.a;
  float* qs = reinterpret_cast<float*>(dynamic_smem());
  float* ks = qs + kBr * kDMax;
  float* vs = ks + kBc * kKs;
  float* ps = vs + kBc * kDMax;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int d = a.d;
  const FwdTile tile = fwd_tile<kBr, kBc>(a);
  const int h = tile.h, kvh = tile.kvh;
  const int64_t q0 = tile.q0, kb0 = tile.kb0, nkb = tile.nkb;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const int64_t q_col = static_cast<int64_t>(h) * d;
  const int64_t kv_col = static_cast<int64_t>(kvh) * d;

  // Query tile, pre-scaled into base-2 units; zeros past D and past the last row.
  for (int idx = tid; idx < kBr * kDMax; idx += kThreads) {
    const int r = idx / kDMax;
    const int c = idx % kDMax;
    const int64_t i = q0 + r;
    qs[idx] = (i < a.sq && c < d) ? to_f32(q[i * a.q_rs + q_col + c]) * a.scale_log2 : 0.0f;
  }

  float acc[kRows][kCols];
  float m[kRows];
  float l[kRows];
  int64_t row_lo[kRows];  // each row's first visible key (documents and window)
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[rr][c] = 0.0f;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
    row_lo[rr] = first_visible_key(a, q0 + warp * kRows + rr);
  }

  for (int64_t kb = kb0; kb < nkb; ++kb) {
    const int64_t k0 = kb * kBc;
    __syncthreads();  // every warp is done with the previous K/V tile (and Q is written)
    for (int idx = tid; idx < kBc * kDMax; idx += kThreads) {
      const int r = idx / kDMax;
      const int c = idx % kDMax;
      const int64_t j = k0 + r;
      const bool in = j < a.sk && c < d;
      ks[r * kKs + c] = in ? to_f32(k[j * a.kv_rs + kv_col + c]) : 0.0f;
      vs[idx] = in ? to_f32(v[j * a.kv_rs + kv_col + c]) : 0.0f;
    }
    __syncthreads();

    const int64_t j = k0 + lane;  // this lane's key
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      const int r = warp * kRows + rr;
      const int64_t i = q0 + r;
      const float* qrow = qs + r * kDMax;
      const float* krow = ks + lane * kKs;
      float sc = 0.0f;
      for (int c = 0; c < d; ++c) sc += qrow[c] * krow[c];
      const bool visible = j < a.sk && (!a.causal || j - i <= a.diff) && j >= row_lo[rr];
      const float x = visible ? sc : -INFINITY;
      const float mx = fmaxf(m[rr], warp_max(x));
      const float m_use = mx == -INFINITY ? 0.0f : mx;
      const float alpha = exp2f(m[rr] - m_use);
      const float pv = exp2f(x - m_use);
      l[rr] = l[rr] * alpha + warp_sum(pv);
      m[rr] = mx;
      ps[r * kBc + lane] = pv;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[rr][c] *= alpha;
    }
    __syncwarp();  // this warp's P rows are complete
    for (int kc = 0; kc < kBc; ++kc) {
      float vv[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) vv[c] = vs[kc * kDMax + lane + 32 * c];
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const float pr = ps[(warp * kRows + rr) * kBc + kc];
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[rr][c] += pr * vv[c];
      }
    }
  }

  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int64_t i = q0 + warp * kRows + rr;
    if (i >= a.sq) continue;
    // l = 0: a row that sees no key (output 0); l NaN: NaN scores, carried (never read as masked).
    const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : l[rr] == 0.0f ? 0.0f : l[rr];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = lane + 32 * c;
      if (col >= d) continue;
      if (p.out_f32) static_cast<float*>(p.out)[i * a.q_rs + q_col + col] = acc[rr][c] * inv;
      else from_f32(out + i * a.q_rs + q_col + col, acc[rr][c] * inv);
    }
    if (lane == 0) p.lse[h * a.sq + i] = l[rr] > 0.0f ? (m[rr] + log2f(l[rr])) * kLn2 : l[rr] == 0.0f ? -INFINITY : l[rr];
  }
}

// ---------------------------------------------------------------- launchers

// Tensor-core tiles: 4 warps x 32 query rows (a 128-row tile), two blocks per SM; 64-key tiles
// at D = 64, 32-key tiles at D = 128 (64 would need more than 255 registers: the O accumulator
// alone is 128 per thread). ptxas: D = 64: 236 registers, D = 128: 243 (sm_90) / 252 (sm_80), no
// spills.
template <int kD>
void launch_fwd_mma(const FwdParams& p, cudaStream_t stream) {
  constexpr int kWarps = 4, kMT = 2, kBc = kD == 64 ? 64 : 32, kMinBlocks = 2;
  using Cfg = FwdMmaConfig<kD, kWarps, kMT, kBc>;
  launch_tiled(fwd_mma_kernel<kD, kWarps, kMT, kBc, kMinBlocks>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sq, Cfg::kBr,
               p.a.h, p, stream, "attention forward");
}

template <typename T, int kDMax>
void launch_fwd_simt(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdSimtConfig<kDMax>;
  launch_tiled(fwd_simt_kernel<T, kDMax>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sq, Cfg::kBr, p.a.h, p, stream,
               "attention forward");
}

template <typename T>
void launch_fwd_simt_any(const FwdParams& p, cudaStream_t stream) {
  if (p.a.d <= 32) return launch_fwd_simt<T, 32>(p, stream);
  if (p.a.d <= 64) return launch_fwd_simt<T, 64>(p, stream);
  if (p.a.d <= 128) return launch_fwd_simt<T, 128>(p, stream);
  return launch_fwd_simt<T, 256>(p, stream);
}

}  // namespace
}  // namespace attn

Status attention_forward_supports(const AttentionForwardCall& c) { return attn::portable_dim_supported(c.s.head_dim); }

namespace attn {
namespace {

// The log-sum-exp merge (attention.h): one thread per (row, head), grid-stride; the weights in
// double as on the CPU, so both give the same bits.
__global__ void merge_kernel(AttentionMergeShape s, float* acc, float* lse_acc, const float* part,
                             const float* lse_part) {
  const int64_t items = s.rows * s.heads;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = item / s.heads, h = item % s.heads;
    float* la = lse_acc + h * s.lse_acc_stride + i;
    const float lb = lse_part[h * s.lse_part_stride + i];
    if (lb == -INFINITY) continue;
    float* a = acc + i * s.acc_row_stride + h * s.head_dim;
    const float* b = part + i * s.part_row_stride + h * s.head_dim;
    if (*la == -INFINITY) {
      for (int64_t x = 0; x < s.head_dim; ++x) a[x] = b[x];
      *la = lb;
      continue;
    }
    const double m = fmax(static_cast<double>(*la), static_cast<double>(lb));
    const double ea = exp(static_cast<double>(*la) - m), eb = exp(static_cast<double>(lb) - m);
    const double sum = ea + eb;
    const float wa = static_cast<float>(ea / sum), wb = static_cast<float>(eb / sum);
    for (int64_t x = 0; x < s.head_dim; ++x) a[x] = __fadd_rn(__fmul_rn(wa, a[x]), __fmul_rn(wb, b[x]));
    *la = static_cast<float>(m + log(sum));
  }
}

}  // namespace
}  // namespace attn

void attention_merge(Device& dev, const AttentionMergeCall& c, const Scratch&) {
  const AttentionMergeShape& s = c.s;
  const AttentionMergeTensors& t = c.t;
  constexpr int kThreads = 256;
  const int64_t items = s.rows * s.heads;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, 65535));
  cudaStream_t stream = static_cast<CudaDevice&>(dev).stream();
  attn::merge_kernel<<<grid, kThreads, 0, stream>>>(s, t.acc, t.lse_acc, t.part, t.lse_part);
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

void attention_forward(Device& dev, const AttentionForwardCall& c, const Scratch&) {
  using namespace attn;
  const AttentionShape& s = c.s;
  // cuDNN's fused attention where it takes the case (attention_select.h).
  const StatusOr<AttentionKernel> asked = attention_kernel_requested();
  if (asked.ok() && choose_attention_kernel(asked.value(), cudnn_attention_ready(), s, false, DeltaSource::kFromOut) ==
                        AttentionKernel::kCudnn)
    return cudnn_attention_forward(dev, c);
  const AttentionForwardTensors& t = c.t;
  const AttnGeom a = make_attn_geom(s);
  const FwdParams p{.a = a, .q = t.q, .k = t.k, .v = t.v, .out = t.out, .lse = t.lse, .out_f32 = s.f32_results ? 1 : 0};
  cudaStream_t stream = static_cast<CudaDevice&>(dev).stream();
  if (use_tensor_cores(a, s.dtype, t.q, t.k, t.v, t.out)) {
    if (attention_forward_sm90(p, stream)) return;
    if (a.d == 64) return launch_fwd_mma<64>(p, stream);
    return launch_fwd_mma<128>(p, stream);
  }
  if (s.dtype == DType::kBF16) return launch_fwd_simt_any<bf16>(p, stream);
  return launch_fwd_simt_any<float>(p, stream);
}

}  // namespace untied::cuda
