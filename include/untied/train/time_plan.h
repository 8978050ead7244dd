// A training step's work per rank, per phase, from closed forms over the shapes: the FLOPs of its
// GEMMs and of its attention, and the bytes each rank sends in its collectives; and a time for
// each phase from rates the caller gives (DeviceRates), as if nothing overlapped:
//   ms = (gemm FLOPs / gemm rate + attention FLOPs / attention rate + bytes sent / link rate) 1e3.
// The phases of one sequence (batch 1):
//   "forward"             every block: q/k/v projections 2 L E D (H + 2 G_eff), causal attention
//                         2 S^2 D H / P, output projection 2 L H D E, SwiGLU MLP 6 L E F; the
//                         all-to-alls of q, k, v and the output; the weights' all-gathers.
//   "loss"                the LM head forward and backward, 6 L E V.
//   "backward"            every block's recompute (the forward again) and its backward: twice the
//                         GEMMs, 2.5 times the attention (five matmuls for two), upipe's second
//                         recompute of q/k/v, the early-delta dO projection; the all-to-alls of q,
//                         k, v (upipe), dO, dq, dk, dv; the ring's K/V blocks and dk/dv sums; the
//                         weights' second all-gather and the gradients' reduce-scatter. With
//                         --recompute selective the recompute runs no attention and no output
//                         exchange, and projects q, k, v only where the strategy keeps them
//                         (ulysses, ring: upipe's backward projects its own).
// (P ranks, L = S / P rows, G_eff the KV heads as the head schedule replicates them.) Norms, RoPE,
// softmax's exponentials, copies and the optimizer are left out: on GPUs they are a small part of
// a long-context step; on CPUs they are not (docs/plan.md measures it).
#pragma once

#include <string>
#include <vector>

#include "untied/train/trainer.h"

namespace untied {

struct DeviceRates {
  double gemm_flops = 0;       // dense GEMM FLOP/s achieved, in the block dtype
  double attention_flops = 0;  // flash attention FLOP/s achieved (forward; backward at the same rate)
  double link_bytes = 0;       // bytes/s a rank sends in an all-to-all or collective
  std::string source;          // where the figures come from
};

// The rates untied assumes for an NVIDIA H100 SXM in bf16 when none are given: GEMMs at 60% of
// the 989 TFLOP/s dense peak (NVIDIA's datasheet), attention at 600 TFLOP/s (FlashAttention-3
// reports 740 forward), NVLink 4 at 350 GB/s per direction of its 450. Not measured by untied.
DeviceRates assumed_h100_rates();

struct PhaseWork {
  std::string name;
  double gemm_flops = 0, attention_flops = 0, bytes_sent = 0;
  double ms = 0;  // at the rates given
};

// REQUIRES: validate(o, ranks).ok(), and upipe's keep_last_stage resolved (resolve_run: kAuto
// is read as the Decoder reads it, kept). One sequence's step, per rank.
std::vector<PhaseWork> plan_time(const TrainOptions& o, int ranks, const DeviceRates& rates);

}  // namespace untied
