// Which CPU kernels run, and the choice of OpenBLAS's kernels before anything uses them.
//
// OpenBLAS picks its kernels from the CPU's model number when it loads. A CPU newer than the
// library (Debian 12's 0.3.21 predates Sapphire Rapids' successors, for one) gets its generic
// SSE3 "Prescott" kernels, three to four times slower, without a word. untied checks what
// OpenBLAS chose against the vector instructions the CPU has and, where OpenBLAS fell back to
// SSE kernels on a CPU with AVX, starts itself again with OPENBLAS_CORETYPE naming the kernels
// the CPU can run. The result is verified against a plain loop before any work.
#pragma once

#include <string>

namespace untied {

struct CpuKernelsInfo {
  std::string blas;            // "OpenBLAS 0.3.21"
  std::string blas_core;       // the kernels OpenBLAS runs: "SkylakeX", "Haswell", "Prescott", ...
  std::string blas_threading;  // "OpenMP threads", "pthreads" or "one thread"
  std::string chosen_by;       // "OpenBLAS", "OPENBLAS_CORETYPE", or "untied (OpenBLAS detected Prescott)"
  std::string cpu_isa;         // the widest vector instructions of this CPU: "avx512", "avx2", "avx", "sse", "neon"
  std::string tile_gemm;       // the attention's own tile kernel: "avx512 12x32"
  std::string bf16_gemm;       // the bf16 operands' GEMM kernel: "avx512-bf16 12x32", or "none" (widened for BLAS)
  std::string warning;         // non-empty: the kernels are slower than this CPU allows, and what to do
};

// Reads the state above (cheap; after choose_cpu_kernels, or without it in tests).
CpuKernelsInfo cpu_kernels_info();

// One line for banners: "OpenBLAS 0.3.21 SkylakeX kernels (OpenMP threads), attention tiles
// avx512 12x32".
std::string cpu_kernels_description(const CpuKernelsInfo& info = cpu_kernels_info());

// Called first thing in main(), before threads or MPI exist. If OpenBLAS fell back to SSE
// kernels on a CPU with AVX or wider, sets OPENBLAS_CORETYPE and re-executes the program
// (same pid, same arguments), so that the library loads again with the right kernels; then,
// in every process, checks one sgemm against a plain loop and exits with a message if it is
// wrong. OPENBLAS_CORETYPE set by the user is respected (a slow choice is only warned of).
// Test hook: UNTIED_BLAS_PRETEND_CORE=<name> makes the check believe OpenBLAS chose <name>.
void choose_cpu_kernels(char** argv);

// What choose_cpu_kernels would ask for: the OpenBLAS core for this CPU's vector ISA when
// `core` is a generic fallback ("SkylakeX" for "Prescott" on an AVX-512 CPU), else "".
std::string better_openblas_core(const std::string& core, const std::string& cpu_isa);

}  // namespace untied
