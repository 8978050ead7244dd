// The emulated build's untied::cuda::gemm (in place of src/kernels/cuda/gemm.cc and cuBLAS): the
// CPU GEMM (src/kernels/cpu/gemm.cc, OpenBLAS) on the same memory, which is host memory in the
// emulator. So the GEMMs of a kernel that calls untied::gemm are not checked by the emulated
// tests, only what the kernel does around them (operands, strides, block loops, beta). One
// thread: OpenBLAS's own threads would find guarded device memory closed to them.
#include <omp.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "emu_device_memory.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace untied::cuda {

void gemm(Device& dev, const GemmParams& p) {
  emu::DeviceScope scope;  // a device operation: its operands are device memory
  // On this thread alone: guarded memory is open to the thread in the scope only. (The BLAS count
  // is process-wide; every rank of an emulated run is a GPU rank, so none needs more.)
  omp_set_num_threads(1);
  openblas_set_num_threads(1);
  cpu::gemm(dev, p);
}

}  // namespace untied::cuda
