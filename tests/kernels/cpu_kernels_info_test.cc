// The choice of OpenBLAS kernels (cpu_kernels_info.h): which detected cores count as a fallback
// and what replaces them, and that the description names what runs.
#include <gtest/gtest.h>

#include "untied/kernels/cpu_kernels_info.h"

namespace untied {
namespace {

TEST(CpuKernelsInfo, GenericCoresAreReplacedByTheCpusWidestKernels) {
  EXPECT_EQ(better_openblas_core("Prescott", "avx512"), "SkylakeX");
  EXPECT_EQ(better_openblas_core("Prescott", "avx2"), "Haswell");
  EXPECT_EQ(better_openblas_core("Nehalem", "avx"), "Sandybridge");
  EXPECT_EQ(better_openblas_core("core2", "avx2"), "Haswell");
  EXPECT_EQ(better_openblas_core("armv8", "neon"), "NEOVERSEN1");
}

TEST(CpuKernelsInfo, KnownCoresAndPlainCpusAreLeftAlone) {
  EXPECT_EQ(better_openblas_core("SkylakeX", "avx512"), "");
  EXPECT_EQ(better_openblas_core("Haswell", "avx512"), "");  // OpenBLAS knows the CPU: its choice stands
  EXPECT_EQ(better_openblas_core("Zen", "avx2"), "");
  EXPECT_EQ(better_openblas_core("Prescott", "sse"), "");  // nothing better to run
  EXPECT_EQ(better_openblas_core("NEOVERSEN1", "neon"), "");
}

TEST(CpuKernelsInfo, DescriptionNamesBlasCoreAndTiles) {
  const CpuKernelsInfo i = cpu_kernels_info();
  EXPECT_FALSE(i.blas_core.empty());
  EXPECT_FALSE(i.cpu_isa.empty());
  const std::string d = cpu_kernels_description();
  EXPECT_NE(d.find(i.blas_core + " kernels"), std::string::npos) << d;
  EXPECT_NE(d.find("attention tiles " + i.tile_gemm), std::string::npos) << d;
  EXPECT_NE(d.find("bf16 GEMMs"), std::string::npos) << d;
}

}  // namespace
}  // namespace untied
