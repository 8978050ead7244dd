// Closed forms of an attention block's work per rank (block_work.h).
#include "untied/attention/block_work.h"

#include "untied/attention/head_schedule.h"
#include "untied/attention/token_layout.h"

namespace untied {

BlockWork block_work(const AttentionConfig& cfg, int ranks, bool keep_last_stage) {
  const TokenLayout layout = token_layout(cfg, ranks);
  const HeadSchedule sched =
      make_head_schedule(cfg.heads, cfg.kv_heads, layout.group(), stage_heads_of(cfg, ranks)).value();
  const double P = ranks, C = static_cast<double>(layout.group()), L = static_cast<double>(layout.local_tokens());
  const double S = L * P, E = static_cast<double>(cfg.hidden), H = static_cast<double>(cfg.heads);
  const double D = static_cast<double>(cfg.head_dim), Geff = static_cast<double>(sched.kv_eff);
  const double es = static_cast<double>(dtype_size(cfg.dtype)), a2a = (C - 1) / C;
  BlockWork w;
  w.projections = 2 * L * E * D * (H + 2 * Geff);
  w.output = 2 * L * H * D * E;
  w.attention = 2 * S * S * D * H / P;
  w.qkv_bytes = L * D * (H + 2 * Geff) * es * a2a;
  w.o_bytes = L * H * D * es * a2a;
  if (cfg.strategy == Strategy::kUPipe) {
    w.recomputed = 1.0;
    if (keep_last_stage) {
      const double stages = static_cast<double>(sched.stages);
      const double rounds = stages / static_cast<double>(sched.stages_per_round);
      w.recomputed = (H - static_cast<double>(sched.stage_heads) + 2 * Geff * (1 - 1 / rounds)) / (H + 2 * Geff);
    }
  }
  return w;
}

}  // namespace untied
