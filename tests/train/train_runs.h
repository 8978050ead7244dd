// What the training tests share: a small model on the built-in kv task, and train() on C
// in-process ranks, on the CPU or on GPU 0 (each rank its own CudaDevice and a split of the world
// bound to it for the device buffers; host figures over the world). Include where gtest is.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "untied/comm/inproc.h"
#include "untied/device/cuda.h"
#include "untied/train/trainer.h"

namespace untied::testing {

// E 32, 2 layers, H 4, G 2, D 8, F 48, vocab 35; S = 64 (divisible by 1, 2 and 4 ranks); six
// steps after a two-step warm-up at lr 1e-2.
inline TrainOptions small_train_options(Strategy st, DType dtype = DType::kF32) {
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

inline std::unique_ptr<DataSource> kv_train_data() {
  DataOptions d;
  d.kv.num_keys = 16, d.kv.num_values = 16;
  return std::move(make_data_source("kv", "", d)).value();
}

// train() on `ranks` in-process ranks; rank 0's result.
inline StatusOr<TrainSummary> run_training(const TrainOptions& o, int ranks, bool gpu = false) {
  auto data = kv_train_data();
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

// Every step's loss finite and within rel of `want`'s.
inline void expect_close_losses(const TrainSummary& got, const TrainSummary& want, double rel,
                                const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got.losses[i])) << what << ", step " << i + 1;
    EXPECT_NEAR(got.losses[i], want.losses[i], rel * std::abs(want.losses[i])) << what << ", step " << i + 1;
  }
}

}  // namespace untied::testing
