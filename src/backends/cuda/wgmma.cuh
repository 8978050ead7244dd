// Private pieces of the Hopper kernels (*_sm90.cu, built for sm_90a): the 128-byte swizzled
// shared-memory tiles that the warpgroup tensor-core instructions (wgmma) read through matrix
// descriptors, and those instructions. Shapes: m64nNk16, bf16 x bf16 -> fp32.
//
// Tiles: rows of 64 bf16 (128 bytes) in column blocks of 64 elements; block b of a (rows x cols)
// tile at b * rows * 128 bytes, row r of a block at r * 128; within a row, the 16-byte chunk c
// lives at chunk c ^ (r % 8) (the 128-byte swizzle: byte address bits [4, 7) XOR bits [7, 10),
// on 1024-byte aligned tiles). wgmma reads such a tile as
//   K-major (the rows are the M or N index, the columns the reduction k): start at row r0 of
//     block b plus 32 bytes per 16-element k step; 1024 bytes (8 rows) between 8-row groups
//     (SBO); LBO unused (16);
//   MN-major (the rows are the reduction index k, the columns M or N): start at row 16 kk; 1024
//     bytes between 8-row groups of k (SBO), rows * 128 bytes between the 64-column blocks (LBO).
// Accumulators: per warp of the warpgroup 16 rows (warp % 4), each 8-column block laid out as
// mma.sync's C fragment (d[4 nt + e]: row g + 8 (e / 2), column 8 nt + 2 (lane % 4) + e % 2).
// A from registers: per warp, the m16n8k16 A fragment of its 16 rows.
#pragma once

#include <cstdio>
#include <mutex>

#include "backends/cuda/attention_tiles.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace untied::cuda::attn {

// Whether the Hopper kernels may run: UNTIED_CUDA_ATTENTION=wgmma (attention_wgmma_requested;
// unset, empty or "mma" keeps the mma.sync kernels, the default until a GPU run has checked the
// Hopper ones: docs/gpu.md). Read once.
inline bool wgmma_wanted() {
  static const bool wanted = [] {
    const StatusOr<bool> r = attention_wgmma_requested();
    UNTIED_CHECK_KIND(ErrorKind::kInvalidArgument, r.ok(), r.status().message());
    return r.value();
  }();
  return wanted;
}

// Whether the current GPU runs sm_90a code: compute capability 9.0 exactly.
inline bool sm90a_device() {
  const DeviceCaps c = device_caps();
  return c.major == 9 && c.minor == 0;
}

// Says once, on stderr, that UNTIED_CUDA_ATTENTION=wgmma was asked for where the Hopper kernels
// cannot run (`why`), and that the mma.sync kernels run instead.
inline void wgmma_unavailable(const char* why) {
  static std::once_flag once;
  std::call_once(once, [why] {
    std::fprintf(stderr, "untied: UNTIED_CUDA_ATTENTION=wgmma: %s; the mma.sync attention kernels run instead\n", why);
  });
}

__host__ __device__ constexpr int swizzled_offset(int rows, int r, int chunk) {
  return (chunk / 8) * rows * 128 + r * 128 + (((chunk % 8) ^ (r % 8)) * 16);
}

// Copies rows [row0, row0 + kRows) (kCols elements from column col0) of a bf16 tensor with row
// stride rs into a swizzled tile with cp.async; rows >= nrows are zero-filled.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_swizzled_async(unsigned char* dst, const bf16* src, int64_t row0, int64_t nrows,
                                                    int64_t rs, int64_t col0, int tid) {
  constexpr int kChunks = kCols / 8;
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

// The first 1024-byte aligned byte of dynamic shared memory (the kernels ask for 1 KiB more).
__device__ __forceinline__ unsigned char* aligned_smem() {
  unsigned char* raw = dynamic_smem();
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
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
// Makes this thread's completed generic-proxy writes to shared memory (cp.async, st.shared)
// visible to the async proxy that wgmma reads through; a barrier must follow.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pins registers that an in-flight wgmma reads or writes (accumulators, A fragments): an empty asm
// that the compiler must assume reads and writes each of them, so that it neither moves their
// initialization past a wgmma_fence nor their use before a wgmma_wait_all. Called on every such
// array just before the fence and just after the wait.
template <int kN>
__device__ __forceinline__ void wgmma_hold(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void wgmma_hold(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// The wgmma forms the kernels use (the accumulator is the asm's operand list, hence one function
// per shape).
// d (64 x 128) = A (64 x 16) B (16 x 128) (+ d when accumulate), both from shared memory: A
// K-major (kTransA 0) or M-major (1), B K-major (kTransB 0) or N-major (1).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (64 x 64) = A (64 x 16) B (16 x 64) (+ d when accumulate), both from shared memory: A
// K-major (kTransA 0) or M-major (1), B K-major (kTransB 0) or N-major (1).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (64 x 128) += A (64 x 16 in registers: per warp, the m16n8k16 A fragment of its 16 rows)
// B (16 x 128, shared, N-major).
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// d (64 x 64) += A (64 x 16 in registers: per warp, the m16n8k16 A fragment of its 16 rows)
// B (16 x 64, shared, N-major).
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

}  // namespace untied::cuda::attn
