// OpenBLAS's kernels checked against the CPU, and chosen again where it fell back
// (cpu_kernels_info.h).
#include "untied/kernels/cpu_kernels_info.h"

#include <cblas.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/tile_gemm.h"

namespace untied {

namespace {

// Set in the re-executed process: the core OpenBLAS had detected.
constexpr const char* kFallbackEnv = "UNTIED_BLAS_FALLBACK";
constexpr const char* kPretendEnv = "UNTIED_BLAS_PRETEND_CORE";

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// OpenBLAS's generic kernels for CPUs it does not know: SSE2/SSE3 on x86-64, plain ARMv8.
bool generic_core(const std::string& core) {
  static const char* kGeneric[] = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                   "katmai", "coppermine", "northwood", "banias", "generic", "armv8"};
  const std::string c = lower(core);
  for (const char* g : kGeneric)
    if (c == g) return true;
  return false;
}

std::string this_cpu_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  if (__builtin_cpu_supports("avx")) return "avx";
  return "sse";
#elif defined(__aarch64__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMD) ? "neon" : "armv8";
#else
  return "unknown";
#endif
}

std::string current_core() {
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr)
    if (const char* p = std::getenv(kPretendEnv); p != nullptr && *p != '\0') return p;
  const char* c = openblas_get_corename();
  return c != nullptr ? c : "unknown";
}

// C (m, n) = A (m, k) B (k, n) through cblas_sgemm, against a double loop: false, with the first
// element out of the fp32 dot-product bound in `detail`, when one is.
bool sgemm_self_check(std::string* detail) {
  const int m = 67, n = 45, k = 133;
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.0f);
  uint32_t s = 12345;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  };
  for (float& x : a) x = next();
  for (float& x : b) x = next();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
              c.data(), n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        want += static_cast<double>(a[i * k + p]) * b[p * n + j];
        mag += std::fabs(static_cast<double>(a[i * k + p]) * b[p * n + j]);
      }
      if (!(std::fabs(c[i * n + j] - want) <= 2.0 * k * 1.2e-7 * mag + 1e-30)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "C(%d, %d) = %.9g, want %.9g", i, j, c[i * n + j], want);
        *detail = buf;
        return false;
      }
    }
  return true;
}

}  // namespace

std::string better_openblas_core(const std::string& core, const std::string& cpu_isa) {
  if (!generic_core(core)) return "";
  if (cpu_isa == "avx512") return "SkylakeX";
  if (cpu_isa == "avx2") return "Haswell";
  if (cpu_isa == "avx") return "Sandybridge";
  if (cpu_isa == "neon" && lower(core) == "armv8") return "NEOVERSEN1";
  return "";
}

CpuKernelsInfo cpu_kernels_info() {
  CpuKernelsInfo info;
  const char* cfg = openblas_get_config();
  info.blas = "OpenBLAS";
  if (cfg != nullptr && std::strncmp(cfg, "OpenBLAS ", 9) == 0) {
    const char* end = std::strchr(cfg + 9, ' ');
    info.blas = end ? std::string(cfg, end - cfg) : std::string(cfg);
  }
  info.blas_core = current_core();
  const int par = openblas_get_parallel();
  info.blas_threading = par == 2 ? "OpenMP threads" : par == 1 ? "pthreads" : "one thread";
  info.cpu_isa = this_cpu_isa();
  info.tile_gemm = cpu::tile_gemm_description();
  info.bf16_gemm = cpu::bf16_gemm_description();
  if (const char* fb = std::getenv(kFallbackEnv); fb != nullptr && *fb != '\0')
    info.chosen_by = std::string("untied (OpenBLAS detected ") + fb + ")";
  else if (std::getenv("OPENBLAS_CORETYPE") != nullptr)
    info.chosen_by = "OPENBLAS_CORETYPE";
  else
    info.chosen_by = "OpenBLAS";
  const std::string better = better_openblas_core(info.blas_core, info.cpu_isa);
  if (!better.empty())
    info.warning = "OpenBLAS runs its generic " + info.blas_core + " kernels on a CPU with " + info.cpu_isa +
                   (info.chosen_by == "OPENBLAS_CORETYPE" ? " (OPENBLAS_CORETYPE says so)" : "") +
                   ": GEMMs are several times slower than they can be; unset OPENBLAS_CORETYPE or set it to " +
                   better;
  return info;
}

std::string cpu_kernels_description(const CpuKernelsInfo& i) {
  std::string s = i.blas + " " + i.blas_core + " kernels (" + i.blas_threading;
  if (i.chosen_by != "OpenBLAS") s += ", chosen by " + i.chosen_by;
  s += "), attention tiles " + i.tile_gemm;
  s += i.bf16_gemm == "none" ? ", bf16 GEMMs widened for BLAS" : ", bf16 GEMMs " + i.bf16_gemm;
  if (const std::string why = cpu::bf16_gemm_not_chosen_reason(); !why.empty()) s += " (" + why + ")";
  return s;
}

void choose_cpu_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string core = current_core();
    const std::string better = better_openblas_core(core, this_cpu_isa());
    if (!better.empty()) {
      setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
      setenv(kFallbackEnv, core.c_str(), 1);
      unsetenv(kPretendEnv);
      std::fflush(nullptr);
      execv("/proc/self/exe", argv);
      // Still here: carry on with the generic kernels; the banners show the warning.
      std::fprintf(stderr, "untied: warning: could not restart with OPENBLAS_CORETYPE=%s (%s)\n", better.c_str(),
                   std::strerror(errno));
      unsetenv("OPENBLAS_CORETYPE");
      unsetenv(kFallbackEnv);
    }
  }
  if (const std::string e = cpu::bf16_gemm_choice_error(); !e.empty()) {
    std::fprintf(stderr, "untied: error: %s\n", e.c_str());
    std::exit(2);
  }
  std::string detail;
  if (!sgemm_self_check(&detail)) {
    const CpuKernelsInfo i = cpu_kernels_info();
    std::fprintf(stderr,
                 "untied: error: %s's %s kernels give a wrong sgemm on this CPU (%s); set OPENBLAS_CORETYPE "
                 "to another core (e.g. Haswell) or install another BLAS\n",
                 i.blas.c_str(), i.blas_core.c_str(), detail.c_str());
    std::exit(1);
  }
}

}  // namespace untied
