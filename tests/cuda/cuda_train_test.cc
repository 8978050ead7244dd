// Training on the GPU against training on the CPU: the same model, data and schedule, on one GPU
// rank and on in-process ranks sharing the GPU (each with its own device and a device-bound
// split of the world), for local, ulysses and upipe; offloaded block inputs in page-locked host
// memory; checkpoints written from the GPU and resumed on it. Skips without a GPU.
//
// Tolerances: f32 runs differ from the CPU only in summation order and in the GPU's expf (within
// 2 ulp), the same size of difference as between the CPU strategies (trainer_test: 1e-4 of the
// loss over six steps). The GPU's dq (fp32 atomics) makes two GPU runs equal only to that rounding,
// so GPU-against-GPU checks take the same bound. bf16 runs round activations and gathered weights
// to 8 bits of mantissa, so a different last bit anywhere can move the loss by ~1e-2 of itself.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "common/gpu.h"
#include "train/train_runs.h"

namespace untied {
namespace {

namespace fs = std::filesystem;

TrainOptions small_run(Strategy st, DType dtype) { return testing::small_train_options(st, dtype); }

StatusOr<TrainSummary> run(const TrainOptions& o, int ranks, bool gpu) { return testing::run_training(o, ranks, gpu); }

using testing::expect_close_losses;

TEST(CudaTrain, MatchesTheCpuForEveryStrategy) {
  REQUIRE_GPU();
  struct Case {
    Strategy st;
    int ranks;
  };
  for (DType t : {DType::kF32, DType::kBF16})
    for (Case c : {Case{Strategy::kLocal, 1}, Case{Strategy::kUlysses, 2}, Case{Strategy::kUPipe, 2},
                   Case{Strategy::kUPipe, 4}}) {
      const std::string what = std::string(strategy_name(c.st)) + " on " + std::to_string(c.ranks) + " ranks, " +
                               std::string(dtype_name(t));
      const TrainOptions o = small_run(c.st, t);
      auto cpu = run(o, c.ranks, false);
      auto gpu = run(o, c.ranks, true);
      ASSERT_TRUE(cpu.ok()) << what << ": " << cpu.status().message();
      ASSERT_TRUE(gpu.ok()) << what << ": " << gpu.status().message();
      expect_close_losses(gpu.value(), cpu.value(), t == DType::kF32 ? 1e-4 : 1e-2, what);
      EXPECT_NE(gpu.value().losses.front(), gpu.value().losses.back()) << what << ": the loss does not move";
      // The GPU's allocator counts what the CPU's counts, bar the CPU kernels' own scratch.
      EXPECT_GT(gpu.value().peak.peak_total, 0) << what;
    }
}

TEST(CudaTrain, OffloadedInputsLiveInPinnedHostMemoryAndChangeNothing) {
  REQUIRE_GPU();
  TrainOptions o = small_run(Strategy::kUPipe, DType::kF32);
  auto kept = run(o, 2, true);
  o.offload_inputs = true;
  auto off = run(o, 2, true);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  ASSERT_TRUE(off.ok()) << off.status().message();
  expect_close_losses(off.value(), kept.value(), 1e-4, "offloaded inputs");
  EXPECT_EQ(kept.value().host_peak, 0);
  EXPECT_GT(off.value().host_peak, 0);
  const int act = static_cast<int>(Tag::kActivations);
  EXPECT_LT(off.value().peak.peak[act], kept.value().peak.peak[act]);
}

TEST(CudaTrain, CheckpointFromTheGpuResumesOnIt) {
  REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("untied_cuda_train_test_" + std::to_string(::getpid()));
  const fs::path copy = dir.string() + "_copy";
  fs::remove_all(dir);
  fs::remove_all(copy);
  TrainOptions o = small_run(Strategy::kUPipe, DType::kF32);
  auto full = run(o, 2, true);
  ASSERT_TRUE(full.ok()) << full.status().message();
  o.checkpoint_dir = dir.string();
  o.stop_after = 3;
  auto first = run(o, 2, true);
  ASSERT_TRUE(first.ok()) << first.status().message();
  // Each resume saves at its end: the CPU resumes from a copy of the step-3 checkpoint.
  fs::copy(dir, copy, fs::copy_options::recursive);
  o.stop_after = 0;
  o.resume = true;
  for (bool gpu : {true, false}) {
    const std::string what = gpu ? "GPU resume" : "CPU resume of the GPU's checkpoint";
    o.checkpoint_dir = (gpu ? dir : copy).string();
    auto rest = run(o, 2, gpu);
    ASSERT_TRUE(rest.ok()) << what << ": " << rest.status().message();
    ASSERT_EQ(rest.value().first_step, 3) << what;
    ASSERT_EQ(rest.value().losses.size(), 3u) << what;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(rest.value().losses[i], full.value().losses[3 + i], 1e-4 * full.value().losses[3 + i])
          << what << ", step " << 4 + i;
  }
  fs::remove_all(dir);
  fs::remove_all(copy);
}

TEST(CudaTrain, PinnedHostMemoryRoundTripsThroughTheGpu) {
  REQUIRE_GPU();
  auto gpu = test::gpu_device();
  Allocator host(gpu->host_memory(), Allocator::Options{.name = "pinned"});
  const int64_t n = 1 << 20;
  Buffer a = host.allocate(n * 4, Tag::kActivations, "pinned a");
  Buffer b = host.allocate(n * 4, Tag::kActivations, "pinned b");
  Buffer d = gpu->allocator().allocate(n * 4, Tag::kActivations, "device copy");
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(a.data())[i] = static_cast<float>(i) * 0.5f;
  gpu->copy(d.data(), a.data(), n * 4);
  gpu->copy(b.data(), d.data(), n * 4);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0);
  // A released block is handed out again (pinning is slow): same size, same memory.
  void* pa = a.data();
  a.reset();
  Buffer again = host.allocate(n * 4, Tag::kActivations, "pinned again");
  EXPECT_EQ(again.data(), pa);
}

}  // namespace
}  // namespace untied
