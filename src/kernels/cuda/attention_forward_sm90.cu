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
// Q, K and V live in shared memory as 128-byte swizzled tiles (swizzled_tile below), the layout
// wgmma's descriptors name; K and V are double-buffered with cp.async: tile kb+1 is copied while
// tile kb is computed.
//
// Built for sm_90a only (its own library, CMakeLists.txt: UNTIED_SM90A_KERNELS); elsewhere
// (other architectures) attention_forward_sm90 answers false and the mma.sync kernel runs.
// Opt-in for now: it runs only with UNTIED_CUDA_ATTENTION=wgmma, until a GPU run has checked it
// against the CPU (docs/gpu.md); unset or "mma", the mma.sync kernel runs.
//
// Workspace: none.
#include <cstdlib>
#include <cstring>

#include "device/cuda/cuda_device.h"
#include "kernels/cuda/attention_tiles.cuh"

namespace untied::cuda::attn {
namespace {

// The shared-memory tiles: rows of 64 bf16 (128 bytes) in column blocks of 64 elements, block b
// of a (rows x D) tile at b * rows * 128 bytes, row r of a block at r * 128; within a row, the
// 16-byte chunk c lives at chunk c ^ (r % 8) (the 128-byte swizzle: byte address bits [4, 7)
// XOR bits [7, 10), on 1024-byte aligned tiles). wgmma reads such a tile as
//   K-major (the rows are the M or N index, D the reduction): start at row r0 of block b plus
//     32 bytes per 16-element k step, 1024 bytes (8 rows) between 8-row groups;
//   MN-major (the rows are the reduction index, D the N index): start at row 16 kk, 1024 bytes
//     between 8-row groups of the reduction, rows * 128 bytes between the 64-column blocks.
__host__ __device__ constexpr int swizzled_offset(int rows, int r, int chunk) {
  return (chunk / 8) * rows * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) * 16);
}

template <int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_swizzled_async(unsigned char* dst, const bf16* src, int64_t row0, int64_t nrows,
                                                    int64_t rs, int64_t col0, int tid) {
  constexpr int kChunks = kD / 8;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < kTotal / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    const int r = idx / kChunks;
    const int c = idx % kChunks;
    const int64_t row = row0 + r;
    const bool valid = row < nrows;
    cp_async_16(dst + swizzled_offset(kRows, r, c), valid ? src + row * rs + col0 + c * 8 : src, valid);
  }
}

// ---- wgmma primitives (sm_90a) ----
// UNTIED_WGMMA: 1 where the wgmma instructions exist (device code for sm_90a), else 0.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define UNTIED_WGMMA 1
// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (each >> 4), 128-byte swizzle.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Makes this thread's completed generic-proxy writes to shared memory (cp.async) visible to the
// async proxy that wgmma reads through; a barrier must follow.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The wgmma forms this kernel uses (the accumulator is the asm's operand list, hence one function
// per shape).
// d (64 x 128, fp32 fragments) = A (64 x 16, shared, K-major) * B (16 x 128, shared, K-major)
// (+ d when accumulate).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// d (64 x 128) += A (64 x 16 in registers: per warp, the m16n8k16 A fragment of its 16 rows) *
// B (16 x 128, shared, MN-major).
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d (64 x 64) += A (64 x 16 in registers: per warp, the m16n8k16 A fragment of its 16 rows) *
// B (16 x 64, shared, MN-major).
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#else
#define UNTIED_WGMMA 0
#endif
// ---- end wgmma primitives ----

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
  unsigned char* raw = dynamic_smem();
  unsigned char* qs = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
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
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t da = smem_desc(qs + (kk / 4) * kBr * 128 + wg * 64 * 128 + (kk % 4) * 32, 16, 1024);
      const uint64_t db = smem_desc(kst + (kk / 4) * kBc * 128 + (kk % 4) * 32, 16, 1024);
      wgmma_ss_n128(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait_all();

    // Online softmax, one row half (g or g+8) at a time; the 4 lanes of a quad share a row.
    const bool masked = k0 + kBc > vis_first || lo_last > k0;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int lo = 0, lim = kBc;  // keys [k0 + lo, k0 + lim) of this tile are visible to the row
      if (masked) {
        lo = clamp_to(row_lo[hf] - k0, kBc);
        lim = clamp_to(visible_keys(a, q0 + wrow + g + hf * 8) - k0, kBc);
      }
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = nt * 8 + t2 + e;
          if (col >= lim || col < lo) s[nt * 4 + hf * 2 + e] = -INFINITY;
          mx = fmaxf(mx, s[nt * 4 + hf * 2 + e]);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx * a.scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: p = 0, not NaN
      const float alpha = exp2_ftz(m[hf] - m_use);
      m[hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_ftz(fmaf(s[nt * 4 + hf * 2 + e], a.scale_log2, -m_use));
          s[nt * 4 + hf * 2 + e] = pv;
          sum += pv;
        }
      }
      l[hf] = l[hf] * alpha + sum;  // this lane's partial row sum
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
  }

  // out = O / l (0 for rows that saw no key), lse = (m + log2 l) ln 2 (-inf for those rows).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int64_t i = q0 + wrow + g + hf * 8;
    if (i >= a.sq) continue;
    // lt = 0: a row that sees no key (output 0); lt NaN: NaN scores, carried.
    const float inv = lt > 0.0f ? 1.0f / lt : lt == 0.0f ? 0.0f : lt;
    if (p.out_f32) {
      float* orow = static_cast<float*>(p.out) + i * a.q_rs + q_col + t2;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<float2*>(orow + dt * 8) = make_float2(o[dt * 4 + hf * 2] * inv, o[dt * 4 + hf * 2 + 1] * inv);
    } else {
      bf16* orow = static_cast<bf16*>(p.out) + i * a.q_rs + q_col + t2;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<uint32_t*>(orow + dt * 8) = pack_bf16(o[dt * 4 + hf * 2] * inv, o[dt * 4 + hf * 2 + 1] * inv);
    }
    if ((lane & 3) == 0) p.lse[h * a.sq + i] = lt > 0.0f ? (m[hf] + log2f(lt)) * kLn2 : lt == 0.0f ? -INFINITY : lt;
  }
#endif  // UNTIED_WGMMA
}

#if defined(UNTIED_SM90A_KERNELS)
// Whether the wgmma kernels may run: UNTIED_CUDA_ATTENTION=wgmma; unset, empty or "mma" keeps the
// mma.sync kernels; anything else is refused.
bool wgmma_wanted() {
  static const bool wanted = [] {
    const char* e = std::getenv("UNTIED_CUDA_ATTENTION");
    if (e == nullptr || *e == '\0' || std::strcmp(e, "mma") == 0) return false;
    UNTIED_CHECK_KIND(ErrorKind::kInvalidArgument, std::strcmp(e, "wgmma") == 0, "UNTIED_CUDA_ATTENTION='", e,
                      "': use mma (the default) or wgmma");
    return true;
  }();
  return wanted;
}

template <int kD>
void launch_fwd_wgmma(const FwdParams& p, cudaStream_t stream) {
  using Cfg = Sm90FwdConfig<kD>;
  launch_tiled(fwd_wgmma_kernel<kD>, Cfg::kThreads, Cfg::kSmemBytes, p.a.sq, Cfg::kBr, p.a.h, p, stream,
               "attention forward (sm_90a)");
}
#endif

}  // namespace

bool attention_forward_sm90(const FwdParams& p, cudaStream_t stream) {
#if defined(UNTIED_SM90A_KERNELS)
  if (!wgmma_wanted()) return false;
  const DeviceCaps c = device_caps();
  if (c.major != 9 || c.minor != 0) return false;  // sm_90a code runs on compute capability 9.0 only
  if (p.a.d == 128) return launch_fwd_wgmma<128>(p, stream), true;
  if (p.a.d == 64) return launch_fwd_wgmma<64>(p, stream), true;
#else
  (void)p;
  (void)stream;
#endif
  return false;
}

}  // namespace untied::cuda::attn
