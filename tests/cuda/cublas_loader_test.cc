// cuBLAS is opened at its first call, not linked (src/backends/cuda/cublas_loader.cc): a process
// that makes no cuBLAS call does not hold libcublas and libcublasLt (about 210 MiB resident), and
// the first call opens it and answers as cuBLAS does. Needs no GPU (cublasGetStatusString does
// not touch one).
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace {

bool mapped(const std::string& what) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(what) != std::string::npos) return true;
  return false;
}

TEST(CublasLoader, OpensTheLibraryAtTheFirstCall) {
  ASSERT_FALSE(mapped("libcublas")) << "libcublas is loaded before any cuBLAS call";
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_SUCCESS), "success");
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)).find("unsupported value"),
            std::string::npos);
  EXPECT_TRUE(mapped("libcublas.so"));
}

}  // namespace
