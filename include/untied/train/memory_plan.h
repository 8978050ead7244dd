// Each rank's device memory for one training step, from closed forms over the shapes: no step is
// run or rehearsed. The step's peak is the largest of a few moments of the schedule (decoder.h,
// head_pipeline.cc), each the sum of the buffers live then, by name and tag:
//   "attention backward" - the last block's attention backward, inside a stage's attention kernel
//                          (the largest moment at long S: the fp32 dx accumulator, dhm, the
//                          stage's q/k/v/dO receives and gradients, the round's dk/dv sums);
//   "loss"               - the LM head's fused forward and backward (the largest at short S with a
//                          large vocabulary: the gathered head, its full fp32 gradient, a chunk of
//                          logits).
// Both hold the ZeRO-3 state (parameters, gradients and AdamW moments, 1/ranks of each), the
// device's saved block inputs (those not offloaded, decoder.offload_keep_first and offload_every)
// and the gathered weights and full gradients of the group in use.
//
// The kernels' scratch is that of the CPU kernels (src/kernels/cpu) with o.threads threads: the
// rehearsal counts the same (on CUDA ranks, with one thread).
//
// validate_plan() says which configurations the closed forms cover; for them, the rehearsal's
// total peak (train --rehearsal) and the plan's are meant to agree within 2% (untied plan --check
// measures it).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "untied/core/allocator.h"
#include "untied/train/trainer.h"

namespace untied {

struct PlanItem {
  std::string what;
  Tag tag = Tag::kOther;
  int64_t bytes = 0;
};

struct PlanMoment {
  std::string name;
  std::vector<PlanItem> items;
  int64_t total() const;
  std::array<int64_t, kNumTags> by_tag() const;
};

struct MemoryPlan {
  std::vector<PlanMoment> moments;  // the candidates
  size_t peak = 0;                  // the index of the largest
  int64_t host_per_rank = 0;        // offloaded block inputs (offloaded_input_bytes)
  int64_t rows = 0;                 // L, tokens per rank (S padded)
  int64_t peak_total() const { return moments.empty() ? 0 : moments[peak].total(); }
};

// ok() when the closed forms cover o on `ranks` ranks (and validate(o, ranks) holds); otherwise
// what they do not cover.
Status validate_plan(const TrainOptions& o, int ranks);
// REQUIRES: validate_plan(o, ranks).ok().
MemoryPlan plan_memory(const TrainOptions& o, int ranks);

}  // namespace untied
