// What the GPU tests share (tests/common): skip, with a message ctest shows, where the build has
// no CUDA backend or no GPU is visible; and GPU 0's device. scripts/gpu-check greps its log for
// "no GPU visible" to fail a GPU machine where the GPU cases were skipped: keep that phrase.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "untied/device/cuda.h"
#include "untied/device/device.h"

namespace untied::test {

// Empty when a GPU can run the test; else why not ("no GPU visible: ...").
inline std::string gpu_unavailable() {
  if (!cuda_built()) return "this build has no CUDA backend";
  if (cuda_device_count() == 0) return "no GPU visible: GPU cases skipped";
  return "";
}

// GPU 0 (the test must have checked gpu_unavailable() first).
inline std::unique_ptr<Device> gpu_device() { return std::move(make_cuda_device({})).value(); }

}  // namespace untied::test

#define REQUIRE_GPU()                                                        \
  do {                                                                       \
    const std::string untied_why_no_gpu = ::untied::test::gpu_unavailable(); \
    if (!untied_why_no_gpu.empty()) GTEST_SKIP() << untied_why_no_gpu;       \
  } while (0)
