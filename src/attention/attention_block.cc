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
  }
  return "?";
}

StatusOr<Strategy> parse_strategy(std::string_view s) {
  if (s == "local") return Strategy::kLocal;
  if (s == "ulysses") return Strategy::kUlysses;
  if (s == "upipe") return Strategy::kUPipe;
  return Status::invalid_argument("unknown strategy '" + std::string(s) + "': use local, ulysses or upipe");
}

Status validate(const AttentionConfig& c, int ranks) {
  auto bad = [](std::string m) { return Status::invalid_argument(std::move(m)); };
  if (ranks < 1) return bad("the number of ranks must be >= 1");
  if (c.seq < 1) return bad("sequence length must be >= 1, got " + std::to_string(c.seq));
  if (c.hidden < 1) return bad("hidden size E must be >= 1, got " + std::to_string(c.hidden));
  if (c.heads < 1 || c.kv_heads < 1) return bad("heads and kv_heads must be >= 1");
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > 1024)
    return bad("head_dim must be even and in [2, 1024] (RoPE rotates pairs), got " + std::to_string(c.head_dim));
  if (c.heads % c.kv_heads != 0)
    return bad("heads (" + std::to_string(c.heads) + ") must be a multiple of kv_heads (" +
               std::to_string(c.kv_heads) + ")");
  if (!(c.rope_theta > 0)) return bad("rope_theta must be > 0");
  if (c.dtype != DType::kF32 && c.dtype != DType::kBF16) return bad("dtype must be f32 or bf16");
  if (c.seq % ranks != 0)
    return bad("sequence length " + std::to_string(c.seq) + " must be divisible by the number of ranks (" +
               std::to_string(ranks) + "): each rank holds S/C tokens; e.g. use --seq " +
               std::to_string((c.seq / ranks + 1) * ranks));
  if (c.upipe_heads < 0) return bad("upipe_heads must be >= 0 (0 = the number of ranks)");
  if (c.qk_norm && !(c.norm_eps > 0)) return bad("norm_eps must be > 0 with qk_norm");
  switch (c.strategy) {
    case Strategy::kLocal:
      if (ranks != 1)
        return bad("strategy local runs on one rank, not " + std::to_string(ranks) +
                   ": use ulysses or upipe to spread the sequence over ranks");
      return Status::ok_status();
    case Strategy::kUlysses:
    case Strategy::kUPipe: {
      auto s = make_head_schedule(c.heads, c.kv_heads, ranks, stage_heads_of(c, ranks));
      return s.ok() ? Status::ok_status() : bad(std::string(strategy_name(c.strategy)) + ": " + s.status().message());
    }
  }
  return bad("unknown strategy");
}

int64_t stage_heads_of(const AttentionConfig& c, int ranks) {
  if (c.strategy != Strategy::kUPipe) return c.heads;
  return c.upipe_heads > 0 ? c.upipe_heads : ranks;
}

std::unique_ptr<AttentionBlock> make_attention_block(Device& dev, Communicator& comm, const AttentionConfig& cfg) {
  Status st = validate(cfg, comm.size());
  UNTIED_CHECK(st.ok(), st.message());
  switch (cfg.strategy) {
    case Strategy::kLocal: return std::make_unique<attn::LocalAttention>(dev, cfg);
    case Strategy::kUlysses: return std::make_unique<attn::HeadPipeline>(dev, comm, cfg, attn::Saving::kKeepStages);
    case Strategy::kUPipe: return std::make_unique<attn::HeadPipeline>(dev, comm, cfg, attn::Saving::kRecompute);
  }
  return nullptr;
}

}  // namespace untied
