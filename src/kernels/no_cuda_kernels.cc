// A build without the CUDA backend: no CUDA Device can be made (make_cuda_device says so), so
// these are never reached; they exist so the dispatch in src/kernels/*.cc links.
#include "kernels/cuda/cuda_kernels.h"

namespace untied::cuda {

void gemm(Device& dev, const GemmParams&) { unsupported(dev, "gemm (this build has no CUDA backend)"); }

}  // namespace untied::cuda
