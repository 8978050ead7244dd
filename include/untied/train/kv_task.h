// The built-in synthetic long-context task: key-value retrieval across the whole sequence.
//
// Vocabulary (K = num_keys, V = num_values):
//     0 BOS, 1 QUERY, 2 FILL, 3 .. 3+K-1 the keys, 3+K .. 3+K+V-1 the values;  vocab = 3 + K + V.
//
// Layout of a sample of S tokens, with n pairs (n = num_pairs, or min(K, (S-1)/5) when 0):
//     position 0                BOS
//     [1, q0)                   the pair section, q0 = S - 3n, P = q0 - 1 positions, split into
//                               n slots; slot j starts at s_j = 1 + floor(j*P/n) (slots are >= 2
//                               long) and holds  key_j value_j FILL FILL ... FILL
//                               (fused_pairs: pair(key_j, value_j) FILL ... FILL)
//     [q0, S)                   the query section: n queries of 3 tokens,
//                               query i = QUERY key_m value_m with m = order[i]
// key_0..key_{n-1} are distinct (the first n entries of a random permutation of the K keys);
// value_j is uniform over the V values, independently per pair; order is a random permutation of
// the n pairs, so every pair is queried exactly once and no answer can be copied from an earlier
// query. Pairs are spread evenly over [1, q0), so a query's pair is anywhere in the sequence:
// for S >> n about half of the answers sit in the first half of the sequence (on other ranks when
// it is sharded), and only a model that attends across the whole sequence can answer them.
// Every random draw is hash_uniform(seed, 3*sample_index + {0: key permutation, 1: values,
// 2: query order}, index), so any rank generates any range of any sample on its own.
//
// Labels (the next-token rule of DataSource, then masked):
//   - at a query's key (position q0 + 3i + 1) the label is the value (the next token) and
//     is_answer = 1: these are the answer positions, n per sample;
//   - with label_structure = true, positions whose next token is FILL or QUERY (fixed by the
//     layout, not random) are labelled with it too (is_answer = 0);
//   - every other position is kIgnoreIndex: its next token is a random key or value, or it is
//     the last position. (By default only answers are labelled, so the loss measures retrieval
//     alone instead of being dominated by thousands of trivially predictable FILL tokens.)
// Chance accuracy on the answer positions is 1/V (values are uniform and independent of
// everything a model can see without retrieving the pair); 1/64 = 1.6% with the defaults.
#pragma once

#include <cstdint>

#include "untied/core/status.h"
#include "untied/train/data_source.h"

namespace untied {

inline constexpr int32_t kKvBos = 0;
inline constexpr int32_t kKvQuery = 1;
inline constexpr int32_t kKvFill = 2;
inline constexpr int32_t kKvFirstKey = 3;

struct KvTaskOptions {
  uint64_t seed = 1234;
  int64_t num_keys = 64;    // K, 1 .. 2^20
  int64_t num_values = 64;  // V, 1 .. 2^20 (chance accuracy 1/V)
  int64_t num_pairs = 0;    // n: 0 = as many as fit, min(K, (S-1)/5); else 1..K and 5n + 1 <= S
  bool label_structure = false;
  // Each pair as ONE token pair(k, v) = 3 + K + V + k*V + v (then FILL) instead of key, value.
  // Retrieval then takes one attention hop (match the queried key inside a pair token, copy its
  // value) instead of the two-hop induction circuit key/value pairs need, so small models learn
  // it quickly; it still needs attention across the whole sequence. Vocabulary 3 + K + V + K*V.
  bool fused_pairs = false;
  // Packed documents: each sample of S tokens holds num_docs independent samples of the layout
  // above back to back (document d of sample i is sample i*num_docs + d of length S/num_docs, the
  // last one taking the remainder), each starting with BOS. The keys repeat across documents with
  // other values, so a query is answered only by its own document's pair: a model whose
  // attention crosses documents sees several candidates.
  int64_t num_docs = 1;
};

// Where things are in a sample of seq_len tokens.
struct KvLayout {
  int64_t seq_len = 0;      // S
  int64_t num_pairs = 0;    // n
  int64_t query_begin = 0;  // q0 = S - 3n
  int64_t pair_span = 0;    // P = q0 - 1

  int64_t slot_begin(int64_t j) const { return 1 + j * pair_span / num_pairs; }  // s_j
  // The slot holding position p, 1 <= p < q0.
  int64_t slot_of(int64_t p) const;
  // Position of query i's key, which is an answer position (its label is the value).
  int64_t answer_position(int64_t i) const { return query_begin + 3 * i + 1; }
};

class KvTask final : public DataSource {
 public:
  // Returns invalid_argument when num_keys or num_values is outside [1, 2^20] or num_pairs is
  // negative or greater than num_keys.
  static StatusOr<KvTask> create(const KvTaskOptions& options);

  const KvTaskOptions& options() const { return options_; }
  int32_t key_token(int64_t k) const { return static_cast<int32_t>(kKvFirstKey + k); }
  int32_t value_token(int64_t v) const { return static_cast<int32_t>(kKvFirstKey + options_.num_keys + v); }
  int32_t pair_token(int64_t k, int64_t v) const {
    return static_cast<int32_t>(kKvFirstKey + options_.num_keys + options_.num_values + k * options_.num_values + v);
  }

  // The layout for seq_len, or invalid_argument when seq_len is too short for one pair and its
  // query (6 tokens), or for the requested num_pairs (5n + 1 tokens).
  StatusOr<KvLayout> layout(int64_t seq_len) const;

  std::string_view kind() const override { return "kv"; }
  int64_t vocab_size() const override {
    return kKvFirstKey + options_.num_keys + options_.num_values +
           (options_.fused_pairs ? options_.num_keys * options_.num_values : 0);
  }
  // The layout and labels above. O(K + count) per call.
  Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens, int32_t* labels,
              uint8_t* is_answer) const override;
  // num_docs > 1: the documents' starts d * (S / num_docs).
  StatusOr<std::vector<int64_t>> document_starts(int64_t sample_index, int64_t seq_len) const override;

  // The depth of each answer of a sample (num_docs = 1): for query i, answered at position
  // answer_position(i) (its label sits at that position), how deep in the pair section its pair
  // lies, (slot_begin(m) - 1) / pair_span in [0, 1), m = order[i]; indexed by i. The kv task's
  // needle depth (eval --needle --data kv).
  StatusOr<std::vector<double>> answer_depths(int64_t sample_index, int64_t seq_len) const;

 private:
  // One document (a whole sample when num_docs = 1).
  Status fill_one(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                  int32_t* labels, uint8_t* is_answer) const;
  explicit KvTask(const KvTaskOptions& options) : options_(options) {}
  KvTaskOptions options_;
};

}  // namespace untied
