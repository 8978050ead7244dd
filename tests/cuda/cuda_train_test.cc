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
#include <mutex>
#include <optional>

#include "gpu_test_util.h"
#include "untied/comm/inproc.h"
#include "untied/device/cuda.h"
#include "untied/train/trainer.h"

namespace untied {
namespace {

namespace fs = std::filesystem;

TrainOptions small_run(Strategy st, DType dtype) {
  TrainOptions o;
  o.model.name = "test";
  o.model.vocab = 35, o.model.hidden = 32, o.model.layers = 2, o.model.heads = 4, o.model.kv_heads = 2;
  o.model.head_dim = 8, o.model.ffn = 48, o.model.rope_theta = 10000.0;
  o.decoder = DecoderOptions{.seq = 64, .strategy = st, .dtype = dtype};
  o.steps = 6;
  o.warmup = 2;
  o.lr = 1e-2f;
  o.progress = false;
  return o;
}

std::unique_ptr<DataSource> kv_data() {
  DataOptions d;
  d.kv.num_keys = 16, d.kv.num_values = 16;
  return std::move(make_data_source("kv", "", d)).value();
}

// train() on `ranks` in-process ranks, on the CPU or on GPU 0 (each rank its own CUDA device and
// a split of the world bound to it for the device buffers; host figures over the world).
StatusOr<TrainSummary> run(const TrainOptions& o, int ranks, bool gpu) {
  auto data = kv_data();
  std::mutex mu;
  std::optional<StatusOr<TrainSummary>> out;
  run_in_process(ranks, [&](Communicator& world) {
    std::optional<StatusOr<TrainSummary>> r;
    if (gpu) {
      auto dev = std::move(make_cuda_device({})).value();
      auto dcomm = world.split(0, world.rank());
      dcomm->bind_device(*dev);
      r.emplace(train(*dev, *dcomm, world, *data, o));
    } else {
      r.emplace(train(world, *data, o));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) out.emplace(std::move(*r));
  });
  return std::move(*out);
}

void expect_close_losses(const TrainSummary& got, const TrainSummary& want, double rel, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], rel * want.losses[i]) << what << ", step " << i + 1;
}

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
  fs::remove_all(dir);
  TrainOptions o = small_run(Strategy::kUPipe, DType::kF32);
  auto full = run(o, 2, true);
  ASSERT_TRUE(full.ok()) << full.status().message();
  o.checkpoint_dir = dir.string();
  o.stop_after = 3;
  auto first = run(o, 2, true);
  ASSERT_TRUE(first.ok()) << first.status().message();
  o.stop_after = 0;
  o.resume = true;
  auto rest = run(o, 2, true);
  ASSERT_TRUE(rest.ok()) << rest.status().message();
  ASSERT_EQ(rest.value().first_step, 3);
  ASSERT_EQ(rest.value().losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(rest.value().losses[i], full.value().losses[3 + i], 1e-4 * full.value().losses[3 + i])
        << "step " << 4 + i;
  // A GPU checkpoint is an ordinary one: the CPU resumes it too.
  auto on_cpu = run(o, 2, false);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status().message();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(on_cpu.value().losses[i], full.value().losses[3 + i], 1e-4 * full.value().losses[3 + i])
        << "CPU resume, step " << 4 + i;
  fs::remove_all(dir);
}

TEST(CudaTrain, PinnedHostMemoryRoundTripsThroughTheGpu) {
  REQUIRE_GPU();
  auto gpu = gputest::gpu_device();
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
