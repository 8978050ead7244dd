// The key-value retrieval task: determinism, distinct keys, every answer recoverable from an
// earlier pair, answers from the first half, labels exactly where kv_task.h says.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "train_data/data_test_util.h"
#include "untied/train/kv_task.h"

namespace untied {
namespace {

using Code = Status::Code;
using testing::fails_with;

struct Sample {
  std::vector<int32_t> tokens, labels;
  std::vector<uint8_t> answer;
};

Sample whole(const KvTask& task, int64_t index, int64_t seq_len) {
  Sample s;
  s.tokens.assign(static_cast<size_t>(seq_len), -1);
  s.labels.assign(static_cast<size_t>(seq_len), -1);
  s.answer.assign(static_cast<size_t>(seq_len), 7);
  const Status st = task.fill(index, seq_len, 0, seq_len, s.tokens.data(), s.labels.data(), s.answer.data());
  EXPECT_TRUE(st.ok()) << st.message();
  return s;
}

KvTask make(KvTaskOptions o) {
  StatusOr<KvTask> t = KvTask::create(o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(KvTask, VocabAndLayout) {
  const KvTask task = make({});
  EXPECT_EQ(task.vocab_size(), 3 + 64 + 64);
  EXPECT_EQ(task.key_token(0), 3);
  EXPECT_EQ(task.value_token(0), 67);
  StatusOr<KvLayout> l = task.layout(4096);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l.value().num_pairs, 64);
  EXPECT_EQ(l.value().query_begin, 4096 - 3 * 64);
  StatusOr<KvLayout> small = task.layout(100);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small.value().num_pairs, 19);  // (100 - 1) / 5
  // slot_of inverts slot_begin over the whole pair section.
  for (int64_t s : {6, 7, 11, 100, 1000, 4096}) {
    const KvLayout lo = task.layout(s).value();
    int64_t j = 0;
    for (int64_t p = 1; p < lo.query_begin; ++p) {
      if (j + 1 < lo.num_pairs && lo.slot_begin(j + 1) == p) ++j;
      ASSERT_EQ(lo.slot_of(p), j) << "S " << s << " p " << p;
    }
    EXPECT_EQ(j, lo.num_pairs - 1);
    for (int64_t k = 0; k < lo.num_pairs; ++k) {  // every slot holds at least its key and value
      const int64_t end = k + 1 < lo.num_pairs ? lo.slot_begin(k + 1) : lo.query_begin;
      ASSERT_GE(end - lo.slot_begin(k), 2) << "S " << s << " slot " << k;
    }
  }
}

TEST(KvTask, BadOptionsAndLengths) {
  EXPECT_TRUE(fails_with(KvTask::create({.num_keys = 0}).status(), Code::kInvalidArgument, {"num_keys 0"}));
  EXPECT_TRUE(fails_with(KvTask::create({.num_values = 0}).status(), Code::kInvalidArgument, {"num_values 0"}));
  EXPECT_TRUE(fails_with(KvTask::create({.num_keys = 8, .num_pairs = 9}).status(), Code::kInvalidArgument,
                         {"num_pairs 9", "distinct"}));
  const KvTask task = make({});
  std::vector<int32_t> t(5), l(5);
  EXPECT_TRUE(fails_with(task.fill(0, 5, 0, 5, t.data(), l.data(), nullptr), Code::kInvalidArgument,
                         {"sequence length 5", "at least 6"}));
  const KvTask fixed = make({.num_pairs = 10});
  EXPECT_TRUE(fails_with(fixed.layout(50).status(), Code::kInvalidArgument, {"10 pairs need a sequence of 51"}));
  EXPECT_TRUE(fixed.layout(51).ok());
}

TEST(KvTask, Deterministic) {
  const KvTask a = make({.seed = 7}), b = make({.seed = 7}), c = make({.seed = 8});
  const Sample s1 = whole(a, 3, 1000), s2 = whole(b, 3, 1000), s3 = whole(c, 3, 1000), s4 = whole(a, 4, 1000);
  EXPECT_EQ(s1.tokens, s2.tokens);
  EXPECT_EQ(s1.labels, s2.labels);
  EXPECT_EQ(s1.answer, s2.answer);
  EXPECT_NE(s1.tokens, s3.tokens) << "the seed does not change the sample";
  EXPECT_NE(s1.tokens, s4.tokens) << "the sample index does not change the sample";
}

// Parses a sample the way kv_task.h documents it and checks every rule.
void check_sample(const KvTask& task, const Sample& s, int64_t seq_len, int64_t* answers, int64_t* first_half) {
  const KvTaskOptions& o = task.options();
  const KvLayout l = task.layout(seq_len).value();
  auto is_key = [&](int32_t t) { return t >= kKvFirstKey && t < kKvFirstKey + o.num_keys; };
  auto is_value = [&](int32_t t) { return t >= kKvFirstKey + o.num_keys && t < task.vocab_size(); };

  ASSERT_EQ(s.tokens[0], kKvBos);
  // The pair section: key value FILL... per slot; keys distinct; remember where each key is.
  std::vector<int64_t> key_pos(static_cast<size_t>(o.num_keys), -1);
  for (int64_t p = 1; p < l.query_begin; ++p) {
    const int32_t t = s.tokens[p];
    ASSERT_TRUE(is_key(t) || is_value(t) || t == kKvFill) << "p " << p << " token " << t;
    if (is_key(t)) {
      ASSERT_EQ(key_pos[t - kKvFirstKey], -1) << "key " << t << " appears twice";
      key_pos[t - kKvFirstKey] = p;
      ASSERT_TRUE(is_value(s.tokens[p + 1])) << "key at " << p << " is not followed by a value";
    }
  }
  std::set<int64_t> queried;
  for (int64_t p = l.query_begin; p < seq_len; ++p) {
    const int64_t r = (p - l.query_begin) % 3;
    if (r == 0) {
      ASSERT_EQ(s.tokens[p], kKvQuery) << "p " << p;
    } else if (r == 1) {
      ASSERT_TRUE(is_key(s.tokens[p])) << "p " << p;
      // The answer: recoverable from the earlier pair with this key, which was never queried before.
      const int64_t at = key_pos[s.tokens[p] - kKvFirstKey];
      ASSERT_GE(at, 1) << "queried key " << s.tokens[p] << " has no pair";
      ASSERT_LT(at, l.query_begin);
      ASSERT_TRUE(queried.insert(at).second) << "a pair is queried twice";
      ASSERT_EQ(s.tokens[p + 1], s.tokens[at + 1]) << "query at " << p << " has the wrong value";
      ++*answers;
      if (at < seq_len / 2) ++*first_half;
    }
  }
  ASSERT_EQ(static_cast<int64_t>(queried.size()), l.num_pairs) << "not every pair is queried exactly once";

  // Labels and flags, from the parse above (not from the layout code).
  for (int64_t p = 0; p < seq_len; ++p) {
    const bool answer = p >= l.query_begin && (p - l.query_begin) % 3 == 1;
    ASSERT_EQ(s.answer[p], answer ? 1 : 0) << "p " << p;
    if (answer) {
      ASSERT_EQ(s.labels[p], s.tokens[p + 1]) << "p " << p;
    } else if (p + 1 < seq_len && o.label_structure &&
               (s.tokens[p + 1] == kKvFill || s.tokens[p + 1] == kKvQuery)) {
      ASSERT_EQ(s.labels[p], s.tokens[p + 1]) << "p " << p;
    } else {
      ASSERT_EQ(s.labels[p], kIgnoreIndex) << "p " << p << " next " << (p + 1 < seq_len ? s.tokens[p + 1] : -1);
    }
  }
}

TEST(KvTask, EveryAnswerIsRecoverableAndLabelsAreWhereDocumented) {
  struct Case {
    KvTaskOptions o;
    int64_t seq_len;
  };
  const std::vector<Case> cases = {
      {{}, 4096},
      {{.seed = 99, .num_keys = 16, .num_values = 5}, 1000},
      {{.num_keys = 200, .num_values = 300, .num_pairs = 50}, 777},
      {{.label_structure = true}, 2048},
      {{.num_keys = 3}, 6},  // the shortest sample: one pair, one query
      {{}, 101},
  };
  int64_t answers = 0, first_half = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("seq_len " + std::to_string(c.seq_len) + " keys " + std::to_string(c.o.num_keys));
    const KvTask task = make(c.o);
    for (int64_t index : {0, 1, 17, 123456789}) {
      const Sample s = whole(task, index, c.seq_len);
      int64_t a = 0, h = 0;
      check_sample(task, s, c.seq_len, &a, &h);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_EQ(a, task.layout(c.seq_len).value().num_pairs);
      answers += a;
      first_half += h;
    }
  }
  // With pairs spread over the whole pair section, about half (here more) come from the first half.
  EXPECT_GT(static_cast<double>(first_half), 0.3 * static_cast<double>(answers))
      << first_half << " of " << answers << " answers come from the first half";
}

TEST(KvTask, LongSequenceSendsHalfTheAnswersToTheFirstHalf) {
  const KvTask task = make({.num_keys = 256});
  int64_t answers = 0, first_half = 0;
  for (int64_t index = 0; index < 8; ++index) {
    const Sample s = whole(task, index, 16384);
    check_sample(task, s, 16384, &answers, &first_half);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const double share = static_cast<double>(first_half) / static_cast<double>(answers);
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.6);
}

TEST(KvTask, ValuesAreSpreadOverTheValueRange) {
  // Chance accuracy is 1/V only if values are uniform: check every value turns up, none dominates.
  const KvTask task = make({.num_keys = 64, .num_values = 8});
  std::vector<int64_t> hist(8, 0);
  int64_t total = 0;
  for (int64_t index = 0; index < 64; ++index) {
    const Sample s = whole(task, index, 400);
    for (int64_t p = 0; p < 400; ++p)
      if (s.answer[p]) {
        ++hist[s.labels[p] - task.value_token(0)];
        ++total;
      }
  }
  for (int64_t v = 0; v < 8; ++v) {
    EXPECT_GT(hist[v], total / 8 / 2) << "value " << v;
    EXPECT_LT(hist[v], total / 8 * 2) << "value " << v;
  }
}

}  // namespace
}  // namespace untied
