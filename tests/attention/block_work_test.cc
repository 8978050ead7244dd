// The closed forms of an attention block's work (block_work.h) against counts made here: the
// FLOPs written out by hand for Llama3-8B's heads on 8 ranks, and what UPipe's backward projects
// again counted head by head from the head schedule (every stage's q heads and every round's
// effective KV heads, less the last stage's and its round's when they are kept).
#include <gtest/gtest.h>

#include "untied/attention/attention_block.h"
#include "untied/attention/block_work.h"
#include "untied/attention/head_schedule.h"

namespace untied {
namespace {

AttentionConfig heads_config(int64_t S, int64_t E, int64_t H, int64_t G, int64_t D, Strategy st, int64_t U) {
  AttentionConfig c;
  c.seq = S;
  c.hidden = E;
  c.heads = H;
  c.kv_heads = G;
  c.head_dim = D;
  c.dtype = DType::kBF16;
  c.strategy = st;
  c.upipe_heads = U;
  return c;
}

TEST(BlockWork, Llama3HeadsOnEightRanksByHand) {
  // S 8K on 8 ranks: L = 1024 rows; H 32, G 8, D 128, E 4096; U = 8 (4 stages, one KV round).
  const int P = 8;
  const double L = 1024, E = 4096, D = 128;
  const BlockWork uly = block_work(heads_config(8192, 4096, 32, 8, 128, Strategy::kUlysses, 0), P, false);
  EXPECT_DOUBLE_EQ(uly.projections, 2 * L * E * D * (32 + 16));
  EXPECT_DOUBLE_EQ(uly.output, 2 * L * 32 * D * E);
  EXPECT_DOUBLE_EQ(uly.attention, 2.0 * 8192 * 8192 * D * 32 / P);
  EXPECT_DOUBLE_EQ(uly.qkv_bytes, L * D * 48 * 2 * 7 / 8);
  EXPECT_DOUBLE_EQ(uly.o_bytes, L * D * 32 * 2 * 7 / 8);
  EXPECT_EQ(uly.recomputed, 0.0);
  const BlockWork up = block_work(heads_config(8192, 4096, 32, 8, 128, Strategy::kUPipe, 8), P, false);
  EXPECT_EQ(up.recomputed, 1.0);
  EXPECT_DOUBLE_EQ(up.forward_flops(), uly.forward_flops());
  EXPECT_DOUBLE_EQ(up.backward_flops() - uly.backward_flops(), uly.projections);
  // Kept: the last stage's 8 q heads and the one round's 16 k and v heads: 24 of 48 are redone.
  const BlockWork kept = block_work(heads_config(8192, 4096, 32, 8, 128, Strategy::kUPipe, 8), P, true);
  EXPECT_DOUBLE_EQ(kept.recomputed, 0.5);
}

// The part of q, k and v UPipe's backward projects again, counted from the schedule.
double counted_recompute(const HeadSchedule& s, bool keep_last) {
  double q = 0, kv = 0;
  const int64_t last = s.stages - 1;
  for (int64_t st = 0; st < s.stages; ++st) {
    const bool kept = keep_last && st == last;
    if (!kept) q += static_cast<double>(s.q_per_rank * s.ranks);
    // A round's k and v are projected at its first stage in the forward and needed by all of its
    // stages; the backward redoes them unless it is the kept stage's round.
    if (s.first_of_round(st) && !(keep_last && s.round(st) == s.round(last)))
      kv += 2.0 * static_cast<double>(s.kv_per_rank * s.ranks);
  }
  return (q + kv) / static_cast<double>(s.heads + 2 * s.kv_eff);
}

TEST(BlockWork, RecomputedPartMatchesTheSchedule) {
  struct Case {
    int64_t H, G, C, U;
  };
  // One round and several; KV heads replicated (G < C); U = H (one stage: nothing redone when kept).
  const Case cases[] = {{32, 8, 8, 8}, {32, 8, 4, 4}, {32, 8, 4, 8}, {16, 2, 4, 4}, {12, 3, 3, 3}, {12, 3, 3, 6}, {8, 8, 2, 8},
                        {32, 8, 8, 32}};
  for (const Case& c : cases) {
    const AttentionConfig cfg = heads_config(c.C * 64, 64, c.H, c.G, 8, Strategy::kUPipe, c.U);
    ASSERT_TRUE(validate(cfg, static_cast<int>(c.C)).ok()) << c.H << " " << c.G << " " << c.C << " " << c.U;
    const HeadSchedule s = make_head_schedule(c.H, c.G, c.C, c.U).value();
    for (bool keep : {false, true}) {
      const BlockWork w = block_work(cfg, static_cast<int>(c.C), keep);
      EXPECT_NEAR(w.recomputed, counted_recompute(s, keep), 1e-12)
          << "H=" << c.H << " G=" << c.G << " C=" << c.C << " U=" << c.U << " keep=" << keep;
      EXPECT_DOUBLE_EQ(w.projections, 2.0 * 64 * 64 * 8 * static_cast<double>(c.H + 2 * s.kv_eff));
    }
  }
}

}  // namespace
}  // namespace untied
