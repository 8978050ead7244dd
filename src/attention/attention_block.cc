// Strategy names, configuration checks and the factory for the attention block.
#include "untied/attention/attention_block.h"

#include "attention/head_pipeline.h"
#include "attention/local_attention.h"
#include "untied/attention/head_schedule.h"

namespace untied {

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kLocal: return "local";
    case Strategy::kUlysses: return "ulysses";
    case Strategy::kUPipe: return "upipe";
    case Strategy::kRing: return "ring";
  }
  return "?";
}

StatusOr<Strategy> parse_strategy(std::string_view s) {
  if (s == "local") return Strategy::kLocal;
  if (s == "ulysses") return Strategy::kUlysses;
  if (s == "upipe") return Strategy::kUPipe;
  if (s == "ring") return Strategy::kRing;
  return Status::invalid_argument("unknown strategy '" + std::string(s) + "': use local, ulysses, upipe or ring");
}

Status validate(const AttentionConfig& c, int ranks) {
  auto bad = [](std::string m) { return Status::invalid_argument(std::move(m)); };
  if (ranks < 1) return bad("the number of ranks must be >= 1");
  if (c.seq < 1) return bad("sequence length must be >= 1, got " + std::to_string(c.seq));
  // The longest S and the widest heads whose every buffer, and every plan's sum of them, fits a
  // 64-bit byte count with room to spare (2^36 tokens x 2^17 head columns x 4 bytes = 2^55).
  if (c.seq > kMaxSeq)
    return bad("sequence length " + std::to_string(c.seq) + " is longer than untied takes (2^36 = " +
               std::to_string(kMaxSeq) + " tokens, so that every buffer's size fits a 64-bit count)");
  if (c.hidden < 1) return bad("hidden size E must be >= 1, got " + std::to_string(c.hidden));
  if (c.heads < 1 || c.kv_heads < 1) return bad("heads and kv_heads must be >= 1");
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > 1024)
    return bad("head_dim must be even and in [2, 1024] (RoPE rotates pairs), got " + std::to_string(c.head_dim));
  if (c.heads % c.kv_heads != 0)
    return bad("heads (" + std::to_string(c.heads) + ") must be a multiple of kv_heads (" +
               std::to_string(c.kv_heads) + ")");
  if (c.hidden > kMaxWidth || c.heads > kMaxWidth / c.head_dim)
    return bad("hidden size E (" + std::to_string(c.hidden) + ") and heads x head_dim (" +
               std::to_string(c.heads * c.head_dim) + ") must each be at most 2^17 = " + std::to_string(kMaxWidth));
  if (!(c.rope_theta > 0)) return bad("rope_theta must be > 0");
  if (c.dtype != DType::kF32 && c.dtype != DType::kBF16) return bad("dtype must be f32 or bf16");
  if (c.ring < 1) return bad("the ring degree (--ring) must be >= 1, got " + std::to_string(c.ring));
  if (c.strategy == Strategy::kLocal && c.ring != 1)
    return bad("strategy local has no ring: drop --ring, or use ulysses/upipe with --ring");
  if (c.strategy == Strategy::kRing && c.ring != 1 && c.ring != ranks)
    return bad("strategy ring runs one ring over all " + std::to_string(ranks) + " ranks: drop --ring " +
               std::to_string(c.ring) + ", or use ulysses/upipe --ring " + std::to_string(c.ring) +
               " for a hybrid");
  const int R = ring_degree(c, ranks);
  if (ranks % R != 0)
    return bad("--ring " + std::to_string(R) + " must divide the number of ranks (" + std::to_string(ranks) +
               "): the ranks form R ring groups of ranks / R");
  const int C = ranks / R;
  if (R == 1 && c.seq % ranks != 0)
    return bad("sequence length " + std::to_string(c.seq) + " must be divisible by the number of ranks (" +
               std::to_string(ranks) + "): each rank holds S/C tokens; e.g. use --seq " +
               std::to_string((c.seq / ranks + 1) * ranks));
  const int64_t unit = 2 * int64_t{R} * C;
  if (R > 1 && c.seq % unit != 0)
    return bad("sequence length " + std::to_string(c.seq) + " must be divisible by 2 * R * C = " +
               std::to_string(unit) + " (ring " + std::to_string(R) + ", " + std::to_string(C) +
               " ranks per group): the zig-zag ring cuts S into 2R chunks, each split over the group; e.g. use "
               "--seq " + std::to_string((c.seq / unit + 1) * unit));
  if (c.upipe_heads < 0) return bad("upipe_heads must be >= 0 (0 = the number of ranks)");
  if (c.qk_norm && !(c.norm_eps > 0)) return bad("norm_eps must be > 0 with qk_norm");
  switch (c.strategy) {
    case Strategy::kLocal:
      if (ranks != 1)
        return bad("strategy local runs on one rank, not " + std::to_string(ranks) +
                   ": use ulysses or upipe to spread the sequence over ranks");
      return Status::ok_status();
    case Strategy::kUlysses:
    case Strategy::kUPipe:
    case Strategy::kRing: {
      auto s = make_head_schedule(c.heads, c.kv_heads, C, stage_heads_of(c, ranks));
      if (s.ok()) return Status::ok_status();
      const std::string where = R > 1 ? " with ring " + std::to_string(R) + " (the Ulysses degree C is the " +
                                            std::to_string(C) + " ranks of a ring group)"
                                      : "";
      return bad(std::string(strategy_name(c.strategy)) + where + ": " + s.status().message());
    }
  }
  return bad("unknown strategy");
}

int ring_degree(const AttentionConfig& c, int ranks) {
  if (c.strategy == Strategy::kRing) return ranks;
  return static_cast<int>(c.ring);
}

int ulysses_degree(const AttentionConfig& c, int ranks) { return ranks / ring_degree(c, ranks); }

int64_t stage_heads_of(const AttentionConfig& c, int ranks) {
  if (c.strategy != Strategy::kUPipe) return c.heads;
  return c.upipe_heads > 0 ? c.upipe_heads : ulysses_degree(c, ranks);
}

TokenLayout token_layout(const AttentionConfig& c, int ranks) {
  return TokenLayout(c.seq, ring_degree(c, ranks), ulysses_degree(c, ranks), c.ring_order);
}

AttentionConfig padded_config(const AttentionConfig& c, int ranks) {
  AttentionConfig out = c;
  const int R = ranks >= 1 ? ring_degree(c, ranks) : 1;
  if (ranks >= 1 && R >= 1 && ranks % R == 0 && c.seq >= 1) out.seq = padded_seq(c.seq, ranks, R);
  return out;
}

std::unique_ptr<AttentionBlock> make_attention_block(Device& dev, Communicator& comm, const AttentionConfig& cfg) {
  Status st = validate(cfg, comm.size());
  UNTIED_CHECK(st.ok(), st.message());
  switch (cfg.strategy) {
    case Strategy::kLocal: return std::make_unique<attn::LocalAttention>(dev, cfg);
    case Strategy::kUlysses: return std::make_unique<attn::HeadPipeline>(dev, comm, cfg, attn::Saving::kKeepStages);
    case Strategy::kUPipe: return std::make_unique<attn::HeadPipeline>(dev, comm, cfg, attn::Saving::kRecompute);
    case Strategy::kRing: return std::make_unique<attn::HeadPipeline>(dev, comm, cfg, attn::Saving::kKeepStages);
  }
  return nullptr;
}

}  // namespace untied
