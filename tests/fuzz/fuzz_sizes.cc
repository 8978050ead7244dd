// Fuzz target: the size arithmetic. The input's bytes become a model's shapes, a sequence length,
// a rank count and the decoder's options, each from the whole of its type's range; what validate
// accepts is planned (the run's geometry, the memory plan, the host memory) and every buffer's
// size must come out non-negative; what it refuses is fine. Under UBSan a signed overflow anywhere
// on the way is a crash.
#include <cstdint>
#include <cstring>

#include "untied/core/check.h"
#include "untied/train/memory_plan.h"
#include "untied/train/time_plan.h"
#include "untied/train/trainer.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n;
  template <typename T>
  T take() {
    T v{};
    const size_t k = n < sizeof v ? n : sizeof v;
    std::memcpy(&v, p, k);
    p += k, n -= k;
    return v;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace untied;
  Bytes in{data, size};
  TrainOptions o;
  ModelConfig& m = o.model;
  m.vocab = in.take<int64_t>(), m.hidden = in.take<int64_t>(), m.layers = in.take<int32_t>();
  m.heads = in.take<int32_t>(), m.kv_heads = in.take<int32_t>(), m.head_dim = in.take<int16_t>();
  m.ffn = in.take<int64_t>();
  m.qk_norm = in.take<uint8_t>() & 1;
  const int ranks = 1 + (in.take<uint8_t>() % 16);
  o.decoder.seq = in.take<int64_t>();
  const uint8_t strategy = in.take<uint8_t>() % 4;
  o.decoder.strategy = strategy == 0 ? Strategy::kLocal : strategy == 1 ? Strategy::kUlysses
                       : strategy == 2 ? Strategy::kUPipe : Strategy::kRing;
  o.decoder.upipe_heads = in.take<int32_t>();
  o.decoder.ring = in.take<int16_t>();
  o.decoder.dtype = in.take<uint8_t>() & 1 ? DType::kBF16 : DType::kF32;
  o.decoder.mlp_tile = in.take<int64_t>();
  o.decoder.attn_tile = in.take<int64_t>();
  o.decoder.loss_chunk = in.take<int64_t>();
  o.offload_inputs = in.take<uint8_t>() & 1;
  o.decoder.recompute = in.take<uint8_t>() & 1 ? Recompute::kSelective : Recompute::kFull;
  o.decoder.keep_last_stage = in.take<uint8_t>() & 1 ? KeepLastStage::kOn : KeepLastStage::kOff;
  m.qkv_bias = in.take<uint8_t>() & 1;
  m.experts = in.take<int16_t>(), m.experts_per_token = in.take<int16_t>(), m.expert_ffn = in.take<int32_t>();
  m.moe_every = 1 + in.take<uint8_t>() % 4;
  o.decoder.expert_parallel = in.take<uint8_t>() & 1;
  o.decoder.moe_skew = 1.0 + in.take<uint8_t>() / 16.0;
  if (!validate(o, ranks).ok() || !validate_plan(o, ranks).ok()) return 0;
  // The plan and its figures from accepted options: every size a real, non-negative count.
  const RunGeometry g = run_geometry(o, ranks);
  UNTIED_CHECK(g.L >= 1 && g.Sp >= g.S, "geometry: L ", g.L, " Sp ", g.Sp);
  const MemoryPlan plan = plan_memory(o, ranks);
  for (const PlanMoment& moment : plan.moments)
    for (const PlanItem& item : moment.items) UNTIED_CHECK(item.bytes >= 0, "negative ", item.what);
  UNTIED_CHECK(plan.peak_total() >= 0 && host_memory(g).total() >= 0, "negative peak or host memory");
  (void)plan_time(o, ranks, assumed_h100_rates());
  return 0;
}
