// CUDA implementations of the kernels in include/untied/kernels/*.h (built with the CUDA
// backend; a build without it has only no_cuda_kernels.cc, unreachable because no CUDA Device
// can be made there). The public entry points dispatch here on Device::kind() == kCuda.
#pragma once

#include "untied/kernels/gemm.h"

namespace untied::cuda {

void gemm(Device& dev, const GemmParams& p);

}  // namespace untied::cuda
