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
// driver when the source is destroyed.
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
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
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
