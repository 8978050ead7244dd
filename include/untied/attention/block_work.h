// The work of one attention block on one rank, from closed forms over the shapes: the FLOPs of
// its GEMMs and of its attention, and the bytes it sends in its all-to-alls. For the phase-time
// plan (train/time_plan.h) and for reading a measured time against it (`bench attn`'s w/uly).
//
// Per rank (P ranks, C per all-to-all group, L = S / P rows, G_eff the KV heads as the head
// schedule replicates them, U heads per stage):
//   projections   q, k, v:           2 L E D (H + 2 G_eff)
//   output        the o projection:  2 L H D E
//   attention     causal, forward:   2 S^2 D H / P   (QK^T and PV over half the pairs)
//   qkv_bytes     q, k, v sent:      L D (H + 2 G_eff) es (C - 1) / C; o_bytes: L H D es (C - 1) / C
// The backward runs twice the GEMMs (input and weight gradients), 2.5 times the attention (five
// matmuls for two), and UPipe projects and exchanges q, k and v again: `recomputed` of them, all
// (1) or, with its last stage kept (AttentionSaved::keep_last_stage), all but that stage's U q
// heads and its round's k and v. Documents and windows are not counted (the causal mask alone);
// neither are norms, RoPE, softmax's exponentials and copies.
#pragma once

#include "untied/attention/attention_block.h"

namespace untied {

struct BlockWork {
  double projections = 0, output = 0, attention = 0;  // forward FLOPs
  double recomputed = 0;                             // the part of q/k/v the backward projects again
  double qkv_bytes = 0, o_bytes = 0;                 // forward all-to-all bytes sent
  double forward_gemm() const { return projections + output; }
  double backward_gemm() const { return 2 * (projections + output) + recomputed * projections; }
  double backward_attention() const { return 2.5 * attention; }
  double forward_flops() const { return forward_gemm() + attention; }
  double backward_flops() const { return backward_gemm() + backward_attention(); }
};

// REQUIRES: validate(cfg, ranks).ok(); cfg as padded_config gives it.
BlockWork block_work(const AttentionConfig& cfg, int ranks, bool keep_last_stage);

}  // namespace untied
