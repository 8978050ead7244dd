// A run's shapes (run_geometry.h).
#include "untied/model/run_geometry.h"

#include "untied/core/check.h"

namespace untied {

RunGeometry run_geometry(const ModelConfig& m, const DecoderOptions& o, int ranks, bool offload) {
  UNTIED_CHECK(o.recompute != Recompute::kAuto,
               "run_geometry: recompute auto is resolved before a run's shapes are (choose_recompute, trainer.h)");
  RunGeometry g;
  g.attention = padded_config(attention_config(m, o), ranks);
  g.layout = token_layout(g.attention, ranks);
  g.P = ranks;
  g.R = g.layout.ring();
  g.C = g.layout.group();
  g.S = o.seq;
  g.Sp = g.attention.seq;
  g.L = g.layout.local_tokens();
  g.Sg = g.layout.group_tokens();
  g.E = m.hidden, g.H = m.heads, g.G = m.kv_heads, g.D = m.head_dim, g.F = m.ffn, g.V = m.vocab, g.N = m.layers;
  g.dtype = o.dtype;
  g.es = dtype_size(o.dtype);
  auto sched = make_head_schedule(g.H, g.G, g.C, stage_heads_of(g.attention, ranks));
  UNTIED_CHECK(sched.ok(), "run_geometry: ", sched.status().message());
  g.sched = sched.value();
  const DecoderTiles tiles = decoder_tiles(m, o, g.L);
  g.mlp_tile = tiles.mlp;
  g.attn_tile = tiles.attn;
  g.offload = offload;
  g.offloaded_blocks = offload ? offloaded_inputs(m, o) : 0;
  g.host = host_parts(m, o, g.L, offload);
  g.selective = o.recompute == Recompute::kSelective;
  g.keep_last = o.strategy == Strategy::kUPipe && o.keep_last_stage != KeepLastStage::kOff && !g.selective;
  g.experts_parallel = experts_parallel(m, o, ranks);
  return g;
}

}  // namespace untied
