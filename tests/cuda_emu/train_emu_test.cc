// Whole training runs on an emulated GPU, against the same runs on the CPU: every CUDA kernel of
// the backend (rewritten into gen_all/, see rewrite_kernels.py "all") under the emulator, with
// the library's own trainer, decoder, sharded parameters, strategies and in-process communicator
// bound to the device, on the backend's own CudaDevice and GEMM (src/device/cuda/cuda_device.cc,
// src/kernels/cuda/gemm.cc) over the emulated runtime and cuBLAS (emu_cuda_api.cc,
// emu_cublas.cc): its copies are host copies, its GEMMs OpenBLAS.
//
// What this adds to the kernel tests: the GPU path of the engine runs end to end, and its
// device buffers (cudaMalloc) are guarded memory (emu_device_memory.h), inaccessible to host code outside the
// device's own operations. Any place where the engine reads or writes GPU memory from the host,
// which on a GPU is garbage or a crash, faults here at that access.
//
// Tolerances: the emulated kernels compute in fp32 in other orders than the CPU kernels (and
// the emulator's expf is the host's), the same size of difference as between the CPU
// strategies, which agree to 1e-4 of the loss over six steps (trainer_test). bf16 storage rounds
// activations and weights to 8 bits of mantissa, so a last-bit difference anywhere can move a
// later loss by ~1e-2 of itself.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <mutex>
#include <optional>

#include "untied/comm/inproc.h"
#include "untied/device/cuda.h"
#include "untied/train/trainer.h"

namespace untied {
namespace {

namespace fs = std::filesystem;

TrainOptions small_run(Strategy st, DType dtype, int64_t heads = 4, int64_t kv_heads = 2, bool qk_norm = false) {
  TrainOptions o;
  o.model.name = "test";
  o.model.vocab = 35, o.model.hidden = 32, o.model.layers = 2, o.model.heads = heads, o.model.kv_heads = kv_heads;
  o.model.head_dim = 8, o.model.ffn = 48, o.model.rope_theta = 10000.0, o.model.qk_norm = qk_norm;
  o.decoder = DecoderOptions{.seq = 48, .strategy = st, .dtype = dtype};
  o.steps = 4;
  o.warmup = 1;
  o.lr = 1e-2f;
  o.progress = false;
  return o;
}

std::unique_ptr<DataSource> kv_data() {
  DataOptions d;
  d.kv.num_keys = 16, d.kv.num_values = 16;
  return std::move(make_data_source("kv", "", d)).value();
}

// train() on `ranks` in-process ranks: on the CPU, or each rank with its own CudaDevice on the
// emulated GPU and a split of the world bound to it (host figures over the world).
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
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got.losses[i])) << what << ", step " << i + 1;
    EXPECT_NEAR(got.losses[i], want.losses[i], rel * want.losses[i]) << what << ", step " << i + 1;
  }
}

TEST(EmulatedGpuTraining, GuardedDeviceMemoryFaultsOnHostAccess) {
  // The guard itself: without it, the other tests would say nothing about host accesses.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto dev = std::move(make_cuda_device({})).value();
        Buffer b = dev->allocator().allocate(256, Tag::kOther, "guarded");
        static_cast<volatile char*>(b.data())[0] = 1;  // host code writing GPU memory
      },
      "host access to guarded GPU memory");
  // Through the device, the same memory is fine.
  auto dev = std::move(make_cuda_device({})).value();
  Buffer b = dev->allocator().allocate(256, Tag::kOther, "guarded");
  const char src[4] = {1, 2, 3, 4};
  char back[4] = {};
  dev->copy(b.data(), src, 4);
  dev->copy(back, b.data(), 4);
  EXPECT_EQ(std::memcmp(src, back, 4), 0);
}

TEST(EmulatedGpuTraining, MatchesTheCpuForEveryStrategy) {
  struct Case {
    Strategy st;
    int ranks;
    DType t;
    int64_t heads, kv_heads;
    bool qk_norm;
  };
  const DType kF = DType::kF32, kB = DType::kBF16;
  for (Case c : {Case{Strategy::kLocal, 1, kF, 4, 2, false}, Case{Strategy::kUlysses, 2, kF, 4, 2, false},
                 Case{Strategy::kUPipe, 2, kF, 4, 2, false}, Case{Strategy::kUPipe, 3, kF, 6, 3, true},
                 Case{Strategy::kLocal, 1, kB, 4, 2, true}, Case{Strategy::kUlysses, 2, kB, 4, 2, false},
                 Case{Strategy::kUPipe, 2, kB, 4, 2, true}, Case{Strategy::kUPipe, 4, kB, 4, 1, false}}) {
    const std::string what = std::string(strategy_name(c.st)) + " on " + std::to_string(c.ranks) + " ranks, " +
                             std::string(dtype_name(c.t)) + ", H=" + std::to_string(c.heads) +
                             " G=" + std::to_string(c.kv_heads) + (c.qk_norm ? ", qk-norm" : "");
    SCOPED_TRACE(what);
    const TrainOptions o = small_run(c.st, c.t, c.heads, c.kv_heads, c.qk_norm);
    auto cpu = run(o, c.ranks, false);
    auto gpu = run(o, c.ranks, true);
    ASSERT_TRUE(cpu.ok()) << cpu.status().message();
    ASSERT_TRUE(gpu.ok()) << gpu.status().message();
    expect_close_losses(gpu.value(), cpu.value(), c.t == kF ? 1e-4 : 1e-2, what);
    EXPECT_NE(gpu.value().losses.front(), gpu.value().losses.back()) << "the loss does not move";
  }
}

TEST(EmulatedGpuTraining, OffloadAndCheckpointsGoThroughTheDevice) {
  const fs::path dir = fs::temp_directory_path() / ("untied_train_emu_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TrainOptions o = small_run(Strategy::kUPipe, DType::kF32);
  o.offload_inputs = true;
  auto full = run(o, 2, true);
  ASSERT_TRUE(full.ok()) << full.status().message();
  EXPECT_GT(full.value().host_peak, 0);
  auto cpu = run(o, 2, false);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  expect_close_losses(full.value(), cpu.value(), 1e-4, "offloaded inputs");
  // Saved from the emulated GPU after two steps, resumed there for the rest.
  o.checkpoint_dir = dir.string();
  o.stop_after = 2;
  auto first = run(o, 2, true);
  ASSERT_TRUE(first.ok()) << first.status().message();
  o.stop_after = 0;
  o.resume = true;
  auto rest = run(o, 2, true);
  ASSERT_TRUE(rest.ok()) << rest.status().message();
  ASSERT_EQ(rest.value().first_step, 2);
  ASSERT_EQ(rest.value().losses.size(), full.value().losses.size() - 2);
  // The emulator runs blocks one at a time, so its atomics add in one order: runs repeat exactly.
  for (size_t i = 0; i < rest.value().losses.size(); ++i)
    EXPECT_EQ(rest.value().losses[i], full.value().losses[2 + i]) << "step " << 3 + i;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace untied
