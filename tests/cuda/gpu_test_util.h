// Helpers of the CUDA tests: skip without a GPU, move tensors between a CPU and a GPU device,
// and compare results as fp32.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "untied/core/random.h"
#include "untied/core/tensor.h"
#include "untied/device/cuda.h"

namespace untied::gputest {

// Skips the test (with a message ctest shows) where the build has no CUDA backend or no GPU.
#define REQUIRE_GPU()                                                                  \
  do {                                                                                 \
    if (!::untied::cuda_built()) GTEST_SKIP() << "this build has no CUDA backend";     \
    if (::untied::cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible: GPU cases skipped"; \
  } while (0)

inline std::unique_ptr<Device> gpu_device() { return std::move(make_cuda_device({})).value(); }

// A host tensor of `shape` and `dtype` filled with uniform values in [-scale, scale).
inline TensorBuffer random_host(Device& cpu, DType dtype, const Shape& shape, uint64_t seed, float scale = 1.0f) {
  TensorBuffer t(cpu.allocator(), dtype, shape, Tag::kOther, "host input");
  fill_hash_uniform(t, seed, 1, 0, scale);
  return t;
}

// A copy of a host tensor on the GPU (same shape and dtype).
inline TensorBuffer to_gpu(Device& gpu, const Tensor& host) {
  TensorBuffer d(gpu.allocator(), host.dtype(), host.shape(), Tag::kOther, "gpu copy");
  gpu.copy(d.data(), host.data(), host.bytes());
  return d;
}

// A GPU tensor's contents as fp32 on the host (waits for the device's work first).
inline std::vector<float> to_host_f32(Device& gpu, const Tensor& dev_t) {
  gpu.synchronize();
  std::vector<char> raw(static_cast<size_t>(dev_t.bytes()));
  gpu.copy(raw.data(), dev_t.data(), dev_t.bytes());
  std::vector<float> out(static_cast<size_t>(dev_t.numel()));
  load_f32(out.data(), raw.data(), dev_t.dtype(), dev_t.numel());
  return out;
}

inline std::vector<float> host_f32(const Tensor& host) {
  std::vector<float> out(static_cast<size_t>(host.numel()));
  load_f32(out.data(), host.data(), host.dtype(), host.numel());
  return out;
}

// Max |a - b| over max(|a|) (or 1 if all zero), infinite if either holds a NaN where the other
// does not agree; the usual check is rel_err(...) <= tol.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, mx = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();  // a NaN on either side fails
    err = std::max(err, e);
    mx = std::max(mx, static_cast<double>(std::fabs(a[i])));
  }
  return err / (mx > 0 ? mx : 1.0);
}

}  // namespace untied::gputest
