// Each rank's device memory for one training step, from closed forms over the shapes: no step is
// run or rehearsed. The step's peak is the largest of a few moments of the schedule (decoder.h,
// head_pipeline.cc), each the sum of the buffers live then, by name and tag:
//   "attention backward"   - the last block's attention backward, inside its last stage's
//                            attention kernel (the largest moment at long S: dhm, the stage's
//                            q/k/v/dO receives and gradients, the round's fp32 dk/dv sums, the
//                            earlier stages' dq kept for dx, or the whole fp32 dx without tiles);
//   "dx by tiles"          - the same block's dx formed from the kept gradients, a tile at a time;
//   "attention forward"    - the block's recompute: inside the last stage's kernel, as its output
//                            is sent back (ulysses, ring), and at the output projection (with
//                            --recompute selective: no kernel, q, k and v projected again by
//                            ulysses and ring, and every block's kept attention output and LSE
//                            in every moment);
//   "dwo gemm", "MLP backward" - the largest only for small models;
//   "loss"                 - the LM head's kernel, and its gradient's reduce-scatter (the largest
//                            at short S with a large vocabulary).
// All hold the ZeRO-3 state (parameters, gradients and AdamW moments, 1/ranks of each), the
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
#include "untied/model/run_geometry.h"
#include "untied/train/trainer.h"

namespace untied {

struct PlanItem {
  std::string what;
  Tag tag = Tag::kOther;
  int64_t bytes = 0;
  // The allocator's names of the buffers the item counts, where they are not `what` itself (an
  // item that sums several buffers, or names one by its place in the schedule): the schedule
  // (head_pipeline.cc) and the plan name each buffer alike, and a test holds them to it
  // (tests/train/memory_plan_test.cc).
  std::vector<std::string> buffers = {};
};
// The allocator names a plan item counts: its `buffers`, or `what`.
std::vector<std::string> counted_buffers(const PlanItem& item);

struct PlanMoment {
  std::string name;
  std::vector<PlanItem> items;
  int64_t total() const;
  std::array<int64_t, kNumTags> by_tag() const;
};

// What one rank keeps in host memory at most, with offloaded block inputs (all 0 without): the
// decoder's host allocator holds these (decoder_options.h says when each applies).
struct HostMemory {
  int64_t inputs = 0;        // the offloaded block inputs: offloaded_blocks x (L, E) in the dtype
  int64_t grad_stash = 0;    // a block's q/k/v gradients kept for dx (grads_on_host): every stage's
                             // dq and every round's dk and dv, (Sg, stages u + 2 rounds w, D)
  int64_t dh = 0;            // a block's d residual after attention (dh_on_host): (L, E)
  int64_t attn_out = 0;      // a block's saved attention output (attn_out_on_host): (L, H*D)
  int64_t kept_outputs = 0;  // selective recompute: the other N - 1 blocks' attention outputs
  // inputs + dh + kept_outputs + the larger of grad_stash and attn_out (a block's saved output is
  // freed before its kept gradients come).
  int64_t total() const;
  // What is there beside the inputs: one block's gradients and output, the kept outputs.
  int64_t beside_inputs() const { return total() - inputs; }
};
HostMemory host_memory(const RunGeometry& g);
HostMemory host_memory(const TrainOptions& o, int ranks);  // of run_geometry(o, ranks)

struct MemoryPlan {
  std::vector<PlanMoment> moments;  // the candidates
  size_t peak = 0;                  // the index of the largest
  int64_t host_per_rank = 0;        // what waits in host memory (host_memory(...).total())
  int64_t rows = 0;                 // L, tokens per rank (S padded)
  // upipe: whether the plan's recompute keeps its last stage (DecoderOptions::keep_last_stage;
  // kAuto resolved: kept unless that raises the peak).
  bool keeps_last_stage = false;
  int64_t peak_total() const { return moments.empty() ? 0 : moments[peak].total(); }
};

// A GPU rank's fixed costs outside the allocator (and so outside --mem-budget), as assumed, not
// measured by untied: the CUDA context with its kernels (0.5 GiB, typical of CUDA 12 and 13 with
// lazy module loading), the cuBLAS workspace (32 MiB: the size the cuBLAS guide recommends on
// Hopper, cublasSetWorkspace), and NCCL's buffers: NCCL_BUFFSIZE (4 MiB by default) for sending and
// for receiving on each of 32 channels, per communicator (`communicators`: 1, or 3 with a ring:
// the world and the two groups the ring splits off). untied's caching allocator reuses blocks of
// the same size and gives every cached block back on a failed cudaMalloc before trying again, so
// it adds no rounding of its own.
std::vector<PlanItem> assumed_cuda_fixed_costs(int communicators);

// ok() when the closed forms cover o on `ranks` ranks (and validate(o, ranks) holds); otherwise
// what they do not cover.
Status validate_plan(const TrainOptions& o, int ranks);
// REQUIRES: validate_plan(o, ranks).ok().
MemoryPlan plan_memory(const TrainOptions& o, int ranks);

}  // namespace untied
