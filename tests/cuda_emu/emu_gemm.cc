// The emulated build's untied::cuda::gemm (in place of src/kernels/cuda/gemm.cc and cuBLAS): the
// CPU GEMM (src/kernels/cpu/gemm.cc, OpenBLAS) on the same memory, which is host memory in the
// emulator. So the GEMMs of a kernel that calls untied::gemm are not checked by the emulated
// tests, only what the kernel does around them (operands, strides, block loops, beta).
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "emu_device_memory.h"

namespace untied::cuda {

void gemm(Device& dev, const GemmParams& p) {
  emu::DeviceScope scope;  // a device operation: its operands are device memory
  cpu::gemm(dev, p);
}

}  // namespace untied::cuda
