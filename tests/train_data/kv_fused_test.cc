// The kv task with fused pairs: one token per pair, the same queries and answers.
#include <gtest/gtest.h>

#include <set>

#include "untied/train/kv_task.h"

namespace untied {
namespace {

TEST(KvFused, OneTokenPerPairAndAnswersRecoverable) {
  KvTaskOptions o;
  o.num_keys = 16, o.num_values = 4, o.fused_pairs = true;
  auto task = KvTask::create(o);
  ASSERT_TRUE(task.ok());
  const KvTask& t = task.value();
  EXPECT_EQ(t.vocab_size(), 3 + 16 + 4 + 64);
  const int64_t S = 256;
  const KvLayout l = t.layout(S).value();
  std::vector<int32_t> tok(S), lab(S);
  std::vector<uint8_t> ans(S);
  ASSERT_TRUE(t.fill(7, S, 0, S, tok.data(), lab.data(), ans.data()).ok());
  // Pair section: slot starts hold pair tokens, everything else FILL; no bare key or value.
  std::set<int32_t> pairs;
  for (int64_t p = 1; p < l.query_begin; ++p) {
    if (p == l.slot_begin(l.slot_of(p))) {
      EXPECT_GE(tok[p], t.pair_token(0, 0)) << p;
      pairs.insert(tok[p]);
    } else {
      EXPECT_EQ(tok[p], kKvFill) << p;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(pairs.size()), l.num_pairs);
  // Every answer (the value after a queried key) is the value inside that key's pair token.
  int answers = 0;
  for (int64_t p = l.query_begin; p < S; ++p) {
    if (!ans[p]) continue;
    ++answers;
    const int64_t k = tok[p] - kKvFirstKey, v = lab[p] - t.value_token(0);
    EXPECT_TRUE(pairs.count(t.pair_token(k, v))) << "answer at " << p << " has no matching pair";
  }
  EXPECT_EQ(answers, l.num_pairs);
  // Too many symbols for fused pairs is refused.
  o.num_keys = 2048, o.num_values = 1024;
  EXPECT_FALSE(KvTask::create(o).ok());
}

}  // namespace
}  // namespace untied
