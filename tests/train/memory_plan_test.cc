// The memory plan against the schedule it describes, buffer by buffer: every buffer a rehearsed
// training step allocates (the decoder, the head pipeline, the ring, the kernels' scratch) is one
// the plan counts, and every buffer the plan counts is one some step allocates. The schedule
// (decoder.cc, head_pipeline.cc, ring_attention.cc, block_ops.cc) and the plan (memory_plan.cc)
// name each buffer alike (the allocator's name, which `train --rehearsal` lists); a buffer added
// to one and not the other fails here, at whatever moment it lives, not only at the peak the
// trainer tests compare.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "train/train_runs.h"
#include "untied/comm/inproc.h"
#include "untied/train/memory_plan.h"

namespace untied {
namespace {

using testing::kv_train_data;
using testing::small_train_options;

// A buffer's name without what varies from one buffer of its kind to the next: a parameter's name
// ("layers.3.wq (grad shard recv)" -> "<parameter> (grad shard recv)", as the plan names the
// largest of them).
std::string base_name(const std::string& what) {
  static const std::regex parameter("^(embed|final_norm|lm_head|layers\\.[0-9]+\\.[a-z_]+) \\(");
  return std::regex_replace(what, parameter, "<parameter> (");
}

// The attention block's buffers (and the collectives' next to them): the tags the plan's
// attention moments are made of.
bool attention_tag(Tag t) { return t == Tag::kAttnWorkspace || t == Tag::kCommunication; }

// Buffers of those tags that the plan counts at none of its moments, and why: each is made and
// freed between the moments the plan weighs (inside a kernel's or a projection's call, or after a
// stage's kernel and before the next stage's buffers come), so it is never beside the buffers of
// a peak. A buffer added to the schedule is either counted by the plan or named here, with its
// reason.
const std::map<std::string, std::string> kBetweenMoments = {
    {"block input (tile)", "a tile of the block's input, made and freed inside one projection (InputRows)"},
    {"rope cos/sin table", "the RoPE kernel's table, inside one rope_blocks call"},
    {"dk all-to-all send", "return_round_dkv: after the round's last kernel, before the next round's buffers"},
    {"dv all-to-all send", "return_round_dkv: after the round's last kernel, before the next round's buffers"},
    {"weight gradient fp32 sums", "the projections' weight gradients by tiles: inside finish_dq / return_round_dkv"},
    {"<parameter> (gather send)", "ZeRO-3's all-gather of a group's weights: before the group is used"},
};

// Every (name) rank 0's device allocator saw in one rehearsed step of o on `ranks` ranks.
std::set<std::string> rehearsed_buffers(TrainOptions o, int ranks) {
  o.rehearsal = true;
  o.steps = 1, o.warmup = 0;
  auto data = kv_train_data();
  std::set<std::string> out;
  std::mutex mu;
  run_in_process(ranks, [&](Communicator& comm) {
    auto dev = make_cpu_device(CpuDeviceOptions{.threads = o.threads, .rehearsal = true});
    auto r = train(*dev, comm, comm, *data, o);
    UNTIED_CHECK(r.ok(), r.status().message());
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0)
      for (const LiveBuffers& b : dev->allocator().buffers_seen())
        if (attention_tag(b.tag) && b.bytes > 0) out.insert(base_name(b.what));
  });
  return out;
}

// Every buffer the plan's moments for o count (counted_buffers), of the attention's tags.
std::set<std::string> planned_buffers(const TrainOptions& o, int ranks) {
  std::set<std::string> out;
  for (const PlanMoment& m : plan_memory(o, ranks).moments)
    for (const PlanItem& i : m.items)
      if (attention_tag(i.tag) && i.bytes > 0)
        for (const std::string& b : counted_buffers(i)) out.insert(b);
  return out;
}

}  // namespace

TEST(MemoryPlan, NamesEveryBufferOfTheSchedule) {
  struct Case {
    std::string name;
    TrainOptions o;
    int ranks;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& name, Strategy st, int ranks, auto&& edit) {
    TrainOptions o = small_train_options(st);
    o.decoder.seq = 1 << 12;
    edit(o);
    cases.push_back({name, o, ranks});
  };
  add("upipe", Strategy::kUPipe, 2, [](TrainOptions& o) { o.decoder.upipe_heads = 2; });
  add("upipe overlap kept qk", Strategy::kUPipe, 2, [](TrainOptions& o) {
    o.decoder.upipe_heads = 2, o.decoder.overlap = true, o.decoder.keep_last_stage = KeepLastStage::kOn;
    o.model.qk_norm = true;
  });
  add("upipe offload bf16", Strategy::kUPipe, 2, [](TrainOptions& o) {
    o.offload_inputs = true, o.decoder.dtype = DType::kBF16;
  });
  add("upipe whole", Strategy::kUPipe, 2, [](TrainOptions& o) {
    o.decoder.tiled_dx = false, o.decoder.early_delta = false, o.decoder.attn_tile = -1;
  });
  add("upipe selective", Strategy::kUPipe, 2, [](TrainOptions& o) { o.decoder.recompute = Recompute::kSelective; });
  add("ulysses", Strategy::kUlysses, 2, [](TrainOptions& o) { o.model.qk_norm = true; });
  add("ulysses selective", Strategy::kUlysses, 2, [](TrainOptions& o) { o.decoder.recompute = Recompute::kSelective; });
  add("ring", Strategy::kRing, 2, [](TrainOptions&) {});
  add("upipe x ring", Strategy::kUPipe, 4, [](TrainOptions& o) { o.decoder.ring = 2; });
  std::set<std::string> rehearsed, planned;
  for (const Case& c : cases) {
    ASSERT_TRUE(validate_plan(c.o, c.ranks).ok()) << c.name;
    const std::set<std::string> r = rehearsed_buffers(c.o, c.ranks), p = planned_buffers(c.o, c.ranks);
    rehearsed.insert(r.begin(), r.end());
    planned.insert(p.begin(), p.end());
  }
  for (const std::string& r : rehearsed)
    EXPECT_TRUE(planned.count(r) || kBetweenMoments.count(r))
        << "the schedule allocates \"" << r << "\", which no plan item counts (memory_plan.cc: count it, or "
        << "name it in kBetweenMoments with the reason it is never at a moment the plan weighs)";
  for (const std::string& p : planned)
    EXPECT_TRUE(rehearsed.count(p)) << "the plan counts \"" << p << "\", which no rehearsed step allocates "
                                    << "(a buffer renamed or gone from the schedule, or a case missing here)";
  for (const auto& [name, why] : kBetweenMoments)
    EXPECT_TRUE(rehearsed.count(name) && !planned.count(name)) << name << ": listed as between moments (" << why
                                                               << ") but " << (planned.count(name) ? "planned" : "never allocated");
  std::printf("  %zu buffers of the attention's tags allocated over %zu cases, %zu counted by the plan, %zu between "
              "its moments\n", rehearsed.size(), cases.size(), planned.size(), kBetweenMoments.size());
}

}  // namespace untied
