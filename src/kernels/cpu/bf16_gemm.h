// GEMM of bf16 operands, our own kernels: Debian's OpenBLAS is built without sbgemm, and
// widening both operands to fp32 for sgemm costs a copy of each. Three kernels: AMX tile
// instructions (TDPBF16PS) where the CPU has them; the AVX512-BF16 dot-product instruction
// (VDPBF16PS) on CPUs that run it at full rate (AMD's); fp32 FMAs on operands widened as they
// are packed on those that do not (Intel's without usable AMX) and on AVX-512 CPUs without it
// (Skylake-SP to Ice Lake). Which runs, and why: bf16_gemm_available.
//
//   C (m, n) fp32 (or bf16: bf16_gemm_bf16c) = alpha * op(A) op(B) + beta * C        row-major
//
//   op(A) = A, (m, k), row stride lda; or with trans_a, A^T where A is (k, m).
//   op(B) = B, (k, n), row stride ldb; or with trans_b, B^T where B is (n, k).
//   A and B hold bf16 (the upper 16 bits of an fp32). beta = 0 never reads C.
//
// Numerics: every product of two bf16 is exact in fp32, and products are summed in fp32, in
// blocks along k (512 for the dot-product and fp32 kernels, 256 for AMX) added into C
// in increasing k: the same contract as sgemm on the widened operands (fp32 compute), with a
// summation order that depends on neither m, n nor the thread count. Within a block, the
// dot-product kernel sums pairs of k in increasing k, the fp32 kernel each k in increasing k;
// AMX sums each 32 k in an order and with an internal rounding of the instruction's own, then
// those in increasing k. Both bf16 instructions treat subnormal inputs (below 1.2e-38) as zero.
//
// Cache blocking as in BLIS: a (kc, nc) block of op(B) (nc 2048; 1024 for the fp32 kernel) is
// packed into panels of 32 columns with the k pairs interleaved (shared by the threads; the fp32
// kernel widens each panel in place, one row per k), and a block of rows of op(A) per thread
// (144 rows in panels of 12 for the dot-product and fp32 kernels; 256 rows in 16 x 32 tiles for
// AMX). A 12 x 32 block of C stays in registers (dot products or FMAs), or a 32 x 32 block in
// four tiles (AMX). Threads (OpenMP, `threads` of them) split C into equal parts: groups of rows,
// and when the rows are few, groups of columns within them. Packing space comes from the caller
// (bf16_gemm_pack_bytes).
#pragma once

#include <cstdint>
#include <string>

namespace untied::cpu {

// Whether this build has the packed kernels (compiled for a CPU with AVX-512 F and BW: the fp32
// kernel; with AVX512-BF16, the dot-product kernel too).
bool bf16_gemm_compiled();
// Whether this build has the dot-product kernel and the tile products below (AVX512-BF16).
bool bf16_dot_compiled();
// Whether bf16_gemm runs for bf16 operands on this CPU (the GEMM dispatch asks this; otherwise
// bf16 operands are widened whole for sgemm). Which code runs it (bf16_path_for below):
//   - AMX tile instructions where the CPU has AMX (Intel Sapphire Rapids and later), the build
//     has them (-march=native there) and Linux grants tile data;
//   - else, on an Intel CPU, fp32 FMAs on operands widened as they are packed: Intel's cores
//     retire the dot-product instruction at half their fp32 FMAs' rate (2 threads of a Xeon
//     whose hypervisor hides AMX: the dot-product kernel 128 GFLOP/s at 2048^3, sgemm 264-310),
//     and those before Cooper Lake have no such instruction;
//   - else the AVX512-BF16 dot-product kernel (AMD's Zen 4 retires it at the FMA's rate, twice
//     the FLOPs).
// UNTIED_BF16_GEMM=amx, =kernel, =fma or =widen chooses (checked by bf16_gemm_choice_error).
// Decided once per process, from the CPU alone: every run on one machine takes the same path,
// so results repeat bit for bit.
bool bf16_gemm_available();
// Whether the attention's tile products below run (the dot-product kernel is the path; on the
// fma path the attention widens its tiles for its fp32 kernel, tile_gemm.h). They
// then round P and dS to bf16 for their products too, as on AMX.
bool bf16_tile_products_available();
// Whether the attention's tile products on bf16 storage run on AMX (amx.h): AMX is the path. They
// then round P and dS to bf16 for their products, as the GPU kernels do.
bool bf16_tile_products_on_amx();
// A message when UNTIED_BF16_GEMM holds anything but amx, kernel, fma, widen or nothing, or amx or
// kernel where it cannot run; else "".
std::string bf16_gemm_choice_error();

// Bytes of packing space bf16_gemm needs for this shape with `threads` threads, on the path that
// runs: at most 2 MiB and 144 KiB per thread (dot-product kernel), 2 MiB and 288 KiB (fp32
// kernel) or 512 KiB and 128 KiB (AMX), less for small shapes; with c_bf16 (bf16_gemm_bf16c),
// m * bf16_gemm_c_block_cols(n) fp32 more.
int64_t bf16_gemm_pack_bytes(int64_t m, int64_t n, int64_t k, int threads, bool c_bf16 = false);
// The width of a block of columns of C (at most 2048 dot-product, 1024 fp32 or AMX).
int64_t bf16_gemm_c_block_cols(int64_t n);

// Requires bf16_gemm_compiled(). `pack`: bf16_gemm_pack_bytes(m, n, k, threads) bytes, 64-byte
// aligned.
// With b_group_offsets, op(B)'s columns are gathered in groups of b_group (a multiple of 32), as
// GemmParams (gemm.h) says.
void bf16_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads,
               void* pack, const int64_t* b_group_offsets = nullptr, int64_t b_group = 0);
// The same with C stored in bf16: each value is the fp32 result bf16_gemm gives, rounded once
// (float_to_bf16: to nearest even); beta applies to C widened. The sums of a block of columns of
// C are kept in fp32 in the packing space while the k blocks add to them, so op(B) is packed once,
// as for fp32 C. `pack`: bf16_gemm_pack_bytes(m, n, k, threads, true) bytes, 64-byte aligned.
void bf16_gemm_bf16c(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                     int64_t lda, const uint16_t* b, int64_t ldb, float beta, uint16_t* c, int64_t ldc, int threads,
                     void* pack, const int64_t* b_group_offsets = nullptr, int64_t b_group = 0);

// ---- the attention's tile products on the same kernel ----
// A tile product C (m, n) fp32 = alpha A B^T (+ C with accumulate) of two bf16 tiles stored with
// k along their rows (A (m, k), B (n, k): q against k, dO against v), each packed once and used
// for many products. Single-threaded (the attention's threads each run their own); no
// allocation: packs live in the caller's scratch, sizes in 32-bit words below.
int64_t bf16_packed_a_words(int64_t m, int64_t k);  // ceil(m / 12) * 12 * ceil(k / 2)
int64_t bf16_packed_b_words(int64_t n, int64_t k);  // ceil(n / 32) * 32 * ceil(k / 2)
void bf16_pack_a(uint32_t* dst, const uint16_t* a, int64_t lda, int64_t m, int64_t k);
void bf16_pack_b(uint32_t* dst, const uint16_t* b, int64_t ldb, int64_t n, int64_t k);
// A (m, k) from fp32, each value rounded to bf16 (to nearest even; subnormals to zero, as the
// instruction does): from A's rows (lda apart), or with trans_a from A^T (k, m) given (rows of
// P^T or dS^T as A of a product over queries, of P or dS over keys).
void bf16_pack_a_f32(uint32_t* dst, bool trans_a, const float* a, int64_t lda, int64_t m, int64_t k);
// B (n, k) given as its transpose bt (k, n), rows ldbt apart (V, dO, Q or K as the second
// factor of a product summed over keys or queries).
void bf16_pack_bt(uint32_t* dst, const uint16_t* bt, int64_t ldbt, int64_t n, int64_t k);
void bf16_tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const uint32_t* a_packed, const uint32_t* b_packed,
                    bool accumulate, float* c, int64_t ldc);

// The rule behind bf16_gemm_available, from what it depends on: the kernels compiled in, AMX
// usable (CPU, build and OS), AMX in the CPU's feature bits, an Intel CPU, and UNTIED_BF16_GEMM
// ("" when unset; a value bf16_gemm_choice_error refuses is never passed on).
enum class Bf16Path { kWiden, kFma, kDot, kAmx };
struct Bf16Facts {
  bool compiled = false;      // the packed kernels (AVX-512 F and BW)
  bool dot_compiled = false;  // the dot-product kernel too (AVX512-BF16)
  bool amx_usable = false;
  bool amx_cpu = false;
  bool intel = false;
  const char* choice = "";
};
Bf16Path bf16_path_for(const Bf16Facts& f);

// The kernel that runs, e.g. "amx 32x32", "avx512-bf16 12x32", or "none" (widened for sgemm).
std::string bf16_gemm_description();
// Why the kernel that runs is not the CPU's bf16 instruction, e.g. "an Intel CPU without AMX: ...",
// or "" (it is, or none is built).
std::string bf16_gemm_not_chosen_reason();

}  // namespace untied::cpu
