// The CUDA Device: a caching cudaMalloc memory source under the tagged allocator, one stream,
// and the cuBLAS handle its GEMMs use. See include/untied/device/cuda.h.
#include "device/cuda/cuda_device.h"

#include <map>
#include <mutex>
#include <vector>

#include "untied/device/cuda.h"

namespace untied {
namespace {

// Blocks freed by the allocator are kept by size and handed out again; all are returned to the
// driver when the source is destroyed, or when a cudaMalloc fails (then it is tried once more).
class CudaMemory final : public MemorySource {
 public:
  explicit CudaMemory(int index) : index_(index) {}
  ~CudaMemory() override {
    cudaSetDevice(index_);
    for (auto& [bytes, list] : free_)
      for (void* p : list) cudaFree(p);
  }
  std::string_view name() const override { return "cuda"; }
  void* allocate(int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = free_[bytes];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e == cudaErrorMemoryAllocation && !free_.empty()) {
      // Cached blocks of other sizes may be what is missing: give them back and try once more.
      cudaGetLastError();
      cudaDeviceSynchronize();  // a cached block may still be read by queued work of this rank
      for (auto& [b, l] : free_)
        for (void* q : l) cudaFree(q);
      free_.clear();
      e = cudaMalloc(&p, static_cast<size_t>(bytes));
    }
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      fail(ErrorKind::kOutOfBudget, error_prefix(__FILE__, __LINE__) + "cudaMalloc of " + format_bytes(bytes) +
                                        " failed: " + cudaGetErrorString(e) +
                                        "; the GPU is out of memory: lower --seq or choose a smaller configuration");
    }
    return p;
  }
  void release(void* ptr, int64_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    free_[bytes].push_back(ptr);
  }
  bool backed() const override { return true; }

 private:
  int index_;
  std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;
};

}  // namespace

CudaDevice::CudaDevice(int index, int64_t budget, std::string gpu_name)
    : index_(index), name_(std::move(gpu_name)),
      alloc_(std::make_unique<CudaMemory>(index), Allocator::Options{.budget_bytes = budget, .name = "cuda"}) {
  UNTIED_CUDA_CHECK(cudaSetDevice(index_));
  UNTIED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  UNTIED_CUBLAS_CHECK(cublasCreate(&cublas_));
  UNTIED_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  cudaStreamSynchronize(stream_);
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

std::string CudaDevice::name() const { return "cuda:" + std::to_string(index_) + " (" + name_ + ")"; }

void CudaDevice::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
                         int64_t rows) {
  if (row_bytes <= 0 || rows <= 0) return;
  UNTIED_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                      static_cast<size_t>(row_bytes), static_cast<size_t>(rows),
                                      cudaMemcpyDeviceToDevice, stream_));
}

void CudaDevice::fill_zero(void* dst, int64_t bytes) {
  if (bytes <= 0) return;
  UNTIED_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_));
}

void CudaDevice::synchronize() { UNTIED_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

StatusOr<CudaMemoryInfo> cuda_memory_info(int index) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status::unsupported("no CUDA GPU is visible: run on a machine with an NVIDIA GPU and driver");
  }
  if (index < 0 || index >= n)
    return Status::invalid_argument("GPU index " + std::to_string(index) + " is out of range: " + std::to_string(n) +
                                    " GPU(s) visible");
  int current = 0;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(index) != cudaSuccess ||
      cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported("cannot query the memory of GPU " + std::to_string(index));
  }
  cudaSetDevice(current);
  return CudaMemoryInfo{static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

StatusOr<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& opts) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status::unsupported(std::string("no CUDA GPU is visible (") + (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
                               "): run on a machine with an NVIDIA GPU and driver, or use the CPU backend");
  }
  if (opts.index < 0 || opts.index >= n)
    return Status::invalid_argument("GPU index " + std::to_string(opts.index) + " is out of range: " + std::to_string(n) +
                                    " GPU(s) visible; with NCCL run at most one rank per GPU");
  if (cudaSetDevice(opts.index) != cudaSuccess) return Status::unsupported("cannot use GPU " + std::to_string(opts.index));
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return Status::unsupported("cannot query GPU memory");
  if (opts.budget_bytes > static_cast<int64_t>(free_b))
    return Status::invalid_argument("--mem-budget " + format_bytes(opts.budget_bytes) + " exceeds the " +
                                    format_bytes(static_cast<int64_t>(free_b)) + " free on GPU " +
                                    std::to_string(opts.index) + " (of " + format_bytes(static_cast<int64_t>(total_b)) +
                                    "): lower the budget");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, opts.index);
  return std::unique_ptr<Device>(new CudaDevice(opts.index, opts.budget_bytes, prop.name));
}

}  // namespace untied
