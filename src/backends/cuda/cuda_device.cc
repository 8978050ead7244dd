// The CUDA Device: a caching cudaMalloc memory source under the tagged allocator, one stream,
// and the cuBLAS handle its GEMMs use. See include/untied/device/cuda.h.
#include "backends/cuda/cuda_device.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/backend.h"
#include "backends/cuda/cuda_kernels.h"
#include "untied/device/cuda.h"

namespace untied {
namespace {

class CudaMemory;

// Every caching source of this process. The in-process ranks that share a GPU each have one, so
// a cudaMalloc that fails in one rank may be short of blocks another rank holds in its cache:
// the retry empties the caches of every source on that GPU, not just its own.
struct CacheRegistry {
  std::mutex mu;  // held by one flush at a time; taken before any source's own mutex
  std::vector<CudaMemory*> sources;
};
CacheRegistry& cache_registry() {
  static CacheRegistry r;
  return r;
}

// Blocks freed by the allocator are kept by size and handed out again; all are returned to the
// driver when the source is destroyed, or when a cudaMalloc fails (then it is tried once more).
//
// A block is released (Buffer destroyed) while work queued on the device's stream may still use
// it. Handing it out again is safe because the only later users are work issued after that
// (on the same stream, or on a stream made to wait for it, as the NCCL communicator does);
// giving it back to the driver is safe only after the device has finished that work, so the
// flush synchronizes the device first.
class CudaMemory final : public MemorySource {
 public:
  explicit CudaMemory(int index) : index_(index) {
    CacheRegistry& reg = cache_registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.sources.push_back(this);
  }
  ~CudaMemory() override {
    {
      CacheRegistry& reg = cache_registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      std::erase(reg.sources, this);
    }
    cudaSetDevice(index_);
    free_cached_locked();  // no other thread can reach this source any more
  }
  std::string_view name() const override { return "cuda"; }
  void* allocate(int64_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= 1;
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the failed allocation's error
      if (flush_all_caches(index_) > 0) e = cudaMalloc(&p, static_cast<size_t>(bytes));
    }
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error state of a failed allocation
      fail(ErrorKind::kOutOfBudget, error_prefix(__FILE__, __LINE__) + "cudaMalloc of " + format_bytes(bytes) +
                                        " failed: " + cudaGetErrorString(e) +
                                        "; the GPU is out of memory: lower --seq or choose a smaller configuration");
    }
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ += bytes;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    return p;
  }
  void release(void* ptr, int64_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    free_[bytes].push_back(ptr);
    cached_ += 1;
  }
  bool backed() const override { return true; }
  int64_t reserved_peak_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_reserved_;
  }

 private:
  // Gives every cached block of every source on GPU `index` back to the driver; returns how many.
  // Locks the registry, then each source (a releasing or allocating thread holds only its own
  // source's lock, briefly, and never waits for another lock meanwhile: no deadlock). With every
  // cache locked no block can enter one, and each cached block's last use was queued before its
  // release, so after the device synchronization no queued work can touch it.
  // The calling thread's current device is `index` (its allocations are made there).
  static int64_t flush_all_caches(int index) {
    CacheRegistry& reg = cache_registry();
    std::lock_guard<std::mutex> reg_lock(reg.mu);
    std::vector<std::unique_lock<std::mutex>> locks;
    std::vector<CudaMemory*> same_gpu;
    int64_t blocks = 0;
    for (CudaMemory* m : reg.sources)
      if (m->index_ == index) {
        locks.emplace_back(m->mu_);
        same_gpu.push_back(m);
        blocks += m->cached_;
      }
    if (blocks == 0) return 0;
    cudaDeviceSynchronize();  // errors of earlier work surface at their own checks
    cudaGetLastError();
    for (CudaMemory* m : same_gpu) m->free_cached_locked();
    return blocks;
  }

  // cudaFree of every cached block. REQUIRES: mu_ held, or no other thread can reach this.
  void free_cached_locked() {
    for (auto& [b, list] : free_)
      for (void* q : list) {
        cudaFree(q);
        reserved_ -= b;
      }
    free_.clear();
    cached_ = 0;
  }

  const int index_;
  mutable std::mutex mu_;
  std::map<int64_t, std::vector<void*>> free_;  // cached blocks by size
  int64_t cached_ = 0;                          // blocks in free_
  int64_t reserved_ = 0;                        // bytes cudaMalloc'd and not freed (live + cached)
  int64_t peak_reserved_ = 0;
};

// Page-locked host memory (cudaHostAlloc) for the buffers copy() moves to and from the GPU.
// Pinning is slow (it maps the pages for the GPU), so freed blocks are kept by size and handed out
// again, as the device cache does; all are unpinned when the source is destroyed. copy() waits for
// its transfer, so a released block has no transfer in flight.
class PinnedHostMemory final : public MemorySource {
 public:
  ~PinnedHostMemory() override {
    for (auto& [b, list] : free_)
      for (void* p : list) cudaFreeHost(p);
  }
  std::string_view name() const override { return "cuda pinned host"; }
  void* allocate(int64_t bytes) override {
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kOutOfBudget, error_prefix(__FILE__, __LINE__) + "cudaHostAlloc of " + format_bytes(bytes) +
                                        " failed: " + cudaGetErrorString(e) +
                                        "; the host cannot pin that much memory: turn off input offloading or "
                                        "lower --seq");
    }
    return p;
  }
  void release(void* ptr, int64_t bytes) noexcept override { free_[bytes].push_back(ptr); }
  bool backed() const override { return true; }

 private:
  std::map<int64_t, std::vector<void*>> free_;  // used by the one thread of its rank
};

}  // namespace

std::unique_ptr<MemorySource> CudaDevice::host_memory() {
  UNTIED_CUDA_CHECK(cudaSetDevice(index_));
  return std::make_unique<PinnedHostMemory>();
}

CudaDevice::CudaDevice(int index, int64_t budget, std::string gpu_name)
    : index_(index), name_(std::move(gpu_name)),
      alloc_(std::make_unique<CudaMemory>(index), Allocator::Options{.budget_bytes = budget, .name = "cuda"}) {
  UNTIED_CUDA_CHECK(cudaSetDevice(index_));
  int max_pitch = 0;
  UNTIED_CUDA_CHECK(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, index_));
  max_pitch_ = max_pitch;
  UNTIED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    UNTIED_CUBLAS_CHECK(cublasCreate(&cublas_));
    UNTIED_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  } catch (...) {  // the destructor does not run for a constructor that throws
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    cudaStreamDestroy(stream_);
    cudaGetLastError();
    throw;
  }
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  cudaStreamSynchronize(stream_);
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

const KernelTable* CudaDevice::kernels() const { return &cuda::kernel_table(); }

std::string CudaDevice::name() const { return "cuda:" + std::to_string(index_) + " (" + name_ + ")"; }

void CudaDevice::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_));
  UNTIED_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaDevice::copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
                         int64_t rows) {
  if (row_bytes <= 0 || rows <= 0) return;
  // cudaMemcpy2DAsync takes pitches in [row_bytes, the device's maximum pitch] only. Any other
  // layout the CPU device copies (one row with any pitch, a source row read more than once,
  // overlapping destination rows, a pitch over the maximum) goes row by row, in row order as on
  // the CPU, still asynchronous on the stream.
  const auto fits = [&](int64_t pitch) { return pitch >= row_bytes && pitch <= max_pitch_; };
  if (rows > 1 && fits(dst_pitch) && fits(src_pitch)) {
    UNTIED_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                        static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudaMemcpyDefault,
                                        stream_));
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    UNTIED_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + r * dst_pitch,
                                      static_cast<const char*>(src) + r * src_pitch, static_cast<size_t>(row_bytes),
                                      cudaMemcpyDefault, stream_));
}

void CudaDevice::fill_zero(void* dst, int64_t bytes) {
  if (bytes <= 0) return;
  UNTIED_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), stream_));
}

void CudaDevice::synchronize() { UNTIED_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool cuda_built() { return true; }

std::string cuda_attention_description() { return cuda::attention_description(); }

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
  int current = -1;
  size_t free_b = 0, total_b = 0;
  // The calling thread's current device is restored on every path: its later allocations and
  // launches must stay on the GPU it had selected.
  const bool ok = cudaGetDevice(&current) == cudaSuccess && cudaSetDevice(index) == cudaSuccess &&
                  cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
  if (current >= 0) cudaSetDevice(current);
  if (!ok) {
    cudaGetLastError();
    return Status::unsupported("cannot query the memory of GPU " + std::to_string(index) +
                               ": check that the GPU is healthy (nvidia-smi)");
  }
  return CudaMemoryInfo{static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

StatusOr<std::unique_ptr<Device>> make_cuda_device(const CudaDeviceOptions& opts) {
  if (const StatusOr<bool> wgmma = cuda::attention_wgmma_requested(); !wgmma.ok()) return wgmma.status();
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
  // A failed call's error is cleared (cudaGetLastError) so that no later launch check reports it.
  if (cudaSetDevice(opts.index) != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported("cannot use GPU " + std::to_string(opts.index) +
                               ": check that the GPU is healthy (nvidia-smi) and not in use by a process that holds it "
                               "exclusively");
  }
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported("cannot query the memory of GPU " + std::to_string(opts.index) +
                               ": check that the GPU is healthy (nvidia-smi)");
  }
  if (opts.budget_bytes > static_cast<int64_t>(free_b))
    return Status::invalid_argument("--mem-budget " + format_bytes(opts.budget_bytes) + " exceeds the " +
                                    format_bytes(static_cast<int64_t>(free_b)) + " free on GPU " +
                                    std::to_string(opts.index) + " (of " + format_bytes(static_cast<int64_t>(total_b)) +
                                    "): lower the budget");
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, opts.index) != cudaSuccess) {
    cudaGetLastError();  // the name is only for messages
    std::snprintf(prop.name, sizeof prop.name, "unknown GPU");
  }
  return std::unique_ptr<Device>(new CudaDevice(opts.index, opts.budget_bytes, prop.name));
}

}  // namespace untied
