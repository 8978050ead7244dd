// AMX (Intel's tile instructions, Sapphire Rapids and later) on the CPU: whether it can run, a
// thread's tile configuration, and the attention's tile products on it.
//
// Tile products, the contract of tile_gemm (tile_gemm.h) with bf16 operands:
//
//   C (m, n) fp32 = alpha * op(A) B + beta * C        beta 0 or 1; beta = 0 never reads C
//
//   op(A) = A, (m, k), row stride lda; or with trans_a, A^T where A is (k, m). B is (k, n),
//   row stride ldb. A and B are fp32, rounded to bf16 (to nearest even) as they are packed:
//   exact for values that were bf16 (the attention's q, k, v and dO on bf16 storage), and for
//   P and dS the rounding that FlashAttention and this project's GPU kernels make before their
//   products. Products of two bf16 are exact and are summed in fp32, each 32 k by the tile
//   instruction (in its own order), then in increasing k.
//
// Packed layouts (elements are bf16, the pads zero):
//   A: tiles of 16 rows x 32 k, [16-row tile][32-k chunk][16][32], rows rounded up to 32;
//   B: [32-k chunk][16 pairs of k][n rounded up to 32][2].
// Each thread that runs tile products holds an AmxTiles for the time it does.
#pragma once

#include <cstdint>

namespace untied::cpu {

// The CPU has AMX-BF16 (whatever the build).
bool cpu_has_amx();
// The CPU is Intel's (its CPUID vendor string, as GCC's __builtin_cpu_is reads it).
bool cpu_is_intel();
// Compiled in (a build for a CPU with AMX-BF16, on Linux).
bool amx_compiled();
// Compiled in, on a CPU with AMX-BF16, and tile data granted by Linux (asked once per process).
bool amx_usable();

// The calling thread's tiles configured (8 tiles of 16 rows x 64 bytes) while it lives, released
// after. Requires amx_usable().
class AmxTiles {
 public:
  AmxTiles();
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// bf16 elements of a packed A (m, k) and B (k, n).
int64_t amx_packed_a_elems(int64_t m, int64_t k);
int64_t amx_packed_b_elems(int64_t k, int64_t n);
void amx_pack_a(uint16_t* dst, bool trans_a, const float* a, int64_t lda, int64_t m, int64_t k);
void amx_pack_b(uint16_t* dst, const float* b, int64_t ldb, int64_t k, int64_t n);
// The same from bf16 (copied, no rounding): A (m, k); B (k, n); and B given as its transpose bt
// (n, k), row stride ldbt (rows of q, k or v as B of a product with k = D).
void amx_pack_a(uint16_t* dst, const uint16_t* a, int64_t lda, int64_t m, int64_t k);
void amx_pack_b(uint16_t* dst, const uint16_t* b, int64_t ldb, int64_t k, int64_t n);
void amx_pack_bt(uint16_t* dst, const uint16_t* bt, int64_t ldbt, int64_t k, int64_t n);
// C = alpha * A B + beta * C on packed operands of this m, n, k.
void amx_tile_product(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a_packed,
                      const uint16_t* b_packed, float beta, float* c, int64_t ldc);
// The same with A (m, k) read in place from bf16 rows lda apart, where amx_rows_in_place: whole
// tiles of rows and of k (m and k multiples of 32), and rows that do not share one set of the L1
// cache (lda * 2 bytes not a multiple of 4 KiB). The same arithmetic as on the packed A.
bool amx_rows_in_place(int64_t m, int64_t k, int64_t lda);
void amx_tile_product_rows(int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a, int64_t lda,
                           const uint16_t* b_packed, float beta, float* c, int64_t ldc);

}  // namespace untied::cpu
