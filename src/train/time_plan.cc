// A step's FLOPs and bytes per phase (time_plan.h).
#include "untied/train/time_plan.h"

#include "untied/train/trainer.h"

#include "untied/attention/attention_block.h"
#include "untied/attention/block_work.h"
#include "untied/attention/head_schedule.h"
#include "untied/attention/token_layout.h"

namespace untied {

DeviceRates assumed_h100_rates() {
  return DeviceRates{.gemm_flops = 0.6 * 989e12, .attention_flops = 600e12, .link_bytes = 350e9,
                     .source = "assumed H100 SXM bf16: GEMM 593 TFLOP/s (60% of 989), attention 600 TFLOP/s, "
                               "NVLink 350 GB/s per direction"};
}

std::vector<PhaseWork> plan_time(const TrainOptions& o, int ranks, const DeviceRates& rates) {
  const RunGeometry g = run_geometry(o, ranks);
  const HeadSchedule& sched = g.sched;
  const double P = ranks, C = g.C, R = g.R, L = g.L, Sg = g.Sg;
  const double E = g.E, H = g.H, D = g.D, F = g.F, V = g.V, N = g.N;
  const double Geff = sched.kv_eff, es = g.es, w = sched.kv_per_rank, stages = sched.stages;
  const bool upipe = o.decoder.strategy == Strategy::kUPipe;
  const double a2a = (C - 1) / C, shard = (P - 1) / P;  // the part of a buffer a rank sends

  double embed_params = 0, block_params = 0, final_params = 0;  // groups 0, 1 (every block alike), N + 1
  for (const ParamDesc& p : parameter_descriptors(o.model)) {
    const double n = static_cast<double>(p.shape.numel());
    if (p.group == 0) embed_params += n;
    else if (p.group == 1) block_params += n;
    else if (p.group == o.model.layers + 1) final_params += n;
  }
  const double head_params = o.model.tied_embeddings ? embed_params : final_params;

  // One block.
  const BlockWork blk = block_work(g.attention, ranks, g.keep_last);
  const double mlp = 6 * L * E * F;
  // The ring passes each stage's K/V block R - 1 times (and in backward the fp32 dk/dv sums).
  const double ring_kv = (R - 1) * stages * 2 * Sg * w * D * es, ring_dkv = (R - 1) * stages * 2 * Sg * w * D * 4;
  const double fwd_gemm = blk.forward_gemm() + mlp, fwd_bytes = blk.qkv_bytes + blk.o_bytes + ring_kv;

  std::vector<PhaseWork> phases(3);
  PhaseWork& f = phases[0];
  f.name = "forward";
  f.gemm_flops = N * fwd_gemm;
  f.attention_flops = N * blk.attention;
  f.bytes_sent = N * fwd_bytes + (N * block_params + embed_params) * es * shard;
  PhaseWork& l = phases[1];
  l.name = "loss";
  l.gemm_flops = 6 * L * E * V;
  l.bytes_sent = head_params * (es + 4) * shard;  // gathered, and its gradient reduce-scattered
  PhaseWork& b = phases[2];
  b.name = "backward";
  // The recompute, then the backward: the block's, with UPipe's second q/k/v projection and
  // exchange (block_work.h: `recomputed` of them), and the MLP's. The recompute is the forward
  // again (full), or (selective) all but the attention and its output exchange: the output
  // projection from the kept output, the MLP, and q, k and v projected and exchanged again where
  // the strategy keeps them for its backward (not UPipe: its backward projects them).
  const bool selective = g.selective;
  const double re_proj = selective && upipe ? 0 : 1;
  const double re_gemm = selective ? re_proj * blk.projections + blk.output + mlp : fwd_gemm;
  const double re_attention = selective ? 0 : blk.attention;
  const double re_bytes = selective ? re_proj * blk.qkv_bytes : fwd_bytes;
  b.gemm_flops =
      N * (re_gemm + blk.backward_gemm() + 2 * mlp + (o.decoder.early_delta ? 2 * L * E * H * D : 0));
  b.attention_flops = N * (re_attention + blk.backward_attention());
  b.bytes_sent = N * (re_bytes + blk.recomputed * blk.qkv_bytes + 2 * blk.o_bytes + L * 2 * Geff * D * es * a2a +
                      ring_kv + ring_dkv) +
                 (N * block_params + embed_params) * (es + 4) * shard;
  for (PhaseWork& p : phases)
    p.ms = 1e3 * (p.gemm_flops / rates.gemm_flops + p.attention_flops / rates.attention_flops +
                  p.bytes_sent / rates.link_bytes);
  return phases;
}

}  // namespace untied
