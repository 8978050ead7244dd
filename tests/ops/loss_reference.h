// The LM head loss cases of the cross-backend op test (cases_model.cc): the GPU suite's problems
// (quantized inputs whose logits are exact in fp32) and their fp64 reference, and the emulator
// test's labels. The buffers of a loss case are, in order: h, w, labels, argmax, sums (host
// LossSums), then dh, dw when it runs the backward (LossBuf in cases_model.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ops/op_case.h"
#include "untied/kernels/lm_head_loss.h"

namespace untied::ops {

inline constexpr int32_t kIgnoreIndex = -100;

struct LossCase {
  std::string name;
  int64_t tokens, dim, vocab;
  int64_t chunk = 0;      // chunk_tokens (0 = default)
  double ignored = 0.25;  // fraction of labels that are ignore_index (besides rows 10..14)
  DType dtype = DType::kF32, weight_dtype = DType::kF32;
  bool inf_rows_10_to_14 = false;                         // h rows 10..14 (ignored) are +inf
  std::vector<std::pair<int64_t, int32_t>> bad_labels{};  // (position, label) set after drawing them
};

// The GPU suite's twelve problems.
std::vector<LossCase> loss_cases();

// The labels of a problem (a fixed stream per name: the shape's grad_scale depends on them).
std::vector<int32_t> loss_labels(const LossCase& c);
// grad_scale = 1 / (2 x labelled rows) (1 when none).
LmHeadLossShape loss_shape(const LossCase& c);

// h = k / 16 (|k| <= 16) and w = m / 64 (|m| <= M <= 256): exact in bf16, and every product is an
// integer multiple of 2^-10 whose partial sums stay below 2^24 of those units (E <= 64), so the
// logits are exact in fp32 in any summation order, on tensor cores too. M = 9 x 64 / sqrt(E)
// gives logits of spread ~3: a softmax neither flat nor one-hot.
std::function<void(HostBuffer&, test::Rng&)> fill_loss_h(const LossCase& c);
std::function<void(HostBuffer&, test::Rng&)> fill_loss_w(const LossCase& c);
std::function<void(HostBuffer&, test::Rng&)> fill_loss_labels(const LossCase& c);

// The GPU suite's checks against the fp64 reference (loss_reference.cc says why each bound).
void check_loss_against_reference(const LossCase& c, const RunResult& init, const RunResult& cpu, const RunResult& dut,
                                  bool backward, bool with_argmax);

// The emulator test's labels: random, ~20% ignored, the vocabulary's edges at rows 1 and 2, and
// with `ignore_chunk` every row of the second chunk ignored.
std::vector<int32_t> emu_loss_labels(int64_t tokens, int64_t vocab, int64_t chunk, bool ignore_chunk);
// Ignored rows (label == ignore_index) of dh are exactly 0 on both devices.
void expect_ignored_rows_zero(const RunResult& init, const RunResult& cpu, const RunResult& dut, int64_t dim);

}  // namespace untied::ops
