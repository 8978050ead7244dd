// The decoder's options and the rules over them (decoder_options.h).
#include "untied/model/decoder_options.h"

#include <cmath>

#include <algorithm>
#include <string>

namespace untied {

AttentionConfig attention_config(const ModelConfig& m, const DecoderOptions& o) {
  return AttentionConfig{.seq = o.seq, .hidden = m.hidden, .heads = m.heads, .kv_heads = m.kv_heads,
                         .head_dim = m.head_dim, .rope_theta = m.rope_theta, .rope_scaling = m.rope_scaling,
                         .dtype = o.dtype,
                         .strategy = o.strategy, .upipe_heads = o.upipe_heads, .ring = o.ring,
                         .overlap = o.overlap, .early_delta = o.early_delta, .qk_norm = m.qk_norm, .norm_eps = m.norm_eps,
                         .qkv_bias = m.qkv_bias};
}

int64_t moe_skewed(int64_t rows, double skew) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(rows) * skew - 1e-9));
}

bool experts_parallel(const ModelConfig& m, const DecoderOptions& o, int ranks) {
  return o.expert_parallel && m.experts > 0 && ranks > 1 && m.experts % ranks == 0;
}

int64_t moe_balanced_share(int64_t rows, int64_t experts, int64_t e) {
  return rows / experts + (e < rows % experts ? 1 : 0);
}

int64_t moe_skewed_total(int64_t rows, int64_t experts, double skew) {
  int64_t total = 0;
  for (int64_t e = 0; e < experts; ++e) total += moe_skewed(moe_balanced_share(rows, experts, e), skew);
  return total;
}

int64_t moe_planned_rows(const ModelConfig& m, const DecoderOptions& o, int ranks, int64_t tile) {
  const int64_t rows = tile * m.experts_per_token;
  return experts_parallel(m, o, ranks) ? moe_skewed_total(rows, m.experts, o.moe_skew) : rows;
}

Status validate(const ModelConfig& m, const DecoderOptions& o, int ranks) {
  Status s = validate(m);
  if (!s.ok()) return s;
  s = validate(padded_config(attention_config(m, o), ranks), ranks);
  if (!s.ok()) return s;
  if (o.mlp_tile < 0 || o.loss_chunk < 0) return Status::invalid_argument("mlp_tile and loss_chunk must be >= 0");
  if (o.recompute == Recompute::kAuto)
    return Status::invalid_argument(
        "recompute auto is chosen before a Decoder is built (choose_recompute, trainer.h): pass full or selective");
  if (o.recompute == Recompute::kSelective && o.keep_last_stage == KeepLastStage::kOn)
    return Status::invalid_argument(
        "--upipe-keep-last on keeps a stage that upipe's recompute projects, and --recompute selective projects "
        "none: drop one of the two");
  if (o.attn_tile < -1) return Status::invalid_argument("attn_tile (--attn-tile) must be >= 0, or -1 (off: attn_norm(x) made whole)");
  if (o.offload_keep_first < 0 || o.offload_keep_first > m.layers || o.offload_every < 1)
    return Status::invalid_argument("--keep-inputs must be in [0, " + std::to_string(m.layers) +
                                    "] (the model's layers) and --offload-every >= 1");
  if (m.experts > 0) {
    if (!(o.moe_skew >= 1 && o.moe_skew <= 1024)) return Status::invalid_argument("--moe-skew must be in [1, 1024]");
    // A MoE tile's rows at the experts, times their widest buffer: far inside int64.
    const int64_t rows = padded_config(attention_config(m, o), ranks).seq / ranks;
    const int64_t tile = decoder_tiles(m, o, rows).mlp;
    const double bytes = static_cast<double>(tile) * static_cast<double>(m.experts_per_token) * o.moe_skew *
                         static_cast<double>(std::max(m.hidden, m.expert_ffn)) * 16.0;
    if (bytes > 0x1p50 || static_cast<double>(tile) * static_cast<double>(m.experts_per_token) * o.moe_skew *
                              static_cast<double>(ranks) >= 0x1p31)
      return Status::invalid_argument("a mixture of experts' tile of " + std::to_string(tile) + " rows with " +
                                      std::to_string(m.experts_per_token) +
                                      " experts a token is too large: lower --mlp-tile");
  }
  return Status::ok_status();
}

DecoderTiles decoder_tiles(const ModelConfig& m, const DecoderOptions& o, int64_t rows) {
  DecoderTiles t;
  t.mlp = o.mlp_tile > 0 ? std::min(o.mlp_tile, rows) : std::min(rows, std::max<int64_t>(m.hidden, 256));
  t.attn = o.attn_tile < 0 ? 0 : o.attn_tile > 0 ? std::min(o.attn_tile, rows) : t.mlp;
  return t;
}

HostParts host_parts(const ModelConfig& m, const DecoderOptions& o, int64_t rows, bool host) {
  const bool tiles = decoder_tiles(m, o, rows).attn > 0;
  return HostParts{.grads = host && o.tiled_dx && o.grads_on_host,
                   .dh = host && o.tiled_dx && tiles && o.dh_on_host,
                   .attn_out = host && o.early_delta && tiles && o.attn_out_on_host};
}

bool input_offloaded(const DecoderOptions& o, int64_t layer) {
  return layer >= o.offload_keep_first && (layer - o.offload_keep_first) % o.offload_every == 0;
}

int64_t offloaded_inputs(const ModelConfig& m, const DecoderOptions& o) {
  int64_t n = 0;
  for (int64_t l = 0; l < m.layers; ++l) n += input_offloaded(o, l);
  return n;
}

}  // namespace untied
