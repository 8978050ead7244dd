#include "untied/train/kv_task.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "untied/core/random.h"

namespace untied {
namespace {

constexpr int64_t kMaxSymbols = int64_t{1} << 20;
constexpr int64_t kMaxSeqLen = int64_t{1} << 40;  // keeps j * P (j < 2^20) inside int64

enum Stream : uint64_t { kKeyPermutation = 0, kValues = 1, kQueryOrder = 2 };

uint64_t stream_of(int64_t sample_index, Stream s) { return 3 * static_cast<uint64_t>(sample_index) + s; }

// Uniform integer in [0, n) from hash_uniform's 24-bit value in [-1, 1).
int64_t uniform_index(uint64_t seed, uint64_t stream, uint64_t index, int64_t n) {
  const double u01 = (static_cast<double>(hash_uniform(seed, stream, index)) + 1.0) * 0.5;
  return std::min<int64_t>(n - 1, static_cast<int64_t>(u01 * static_cast<double>(n)));
}

// The first `take` entries of a Fisher-Yates shuffle of 0..n-1 drawn from (seed, stream).
std::vector<int64_t> permutation(uint64_t seed, uint64_t stream, int64_t n, int64_t take) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i >= 1; --i) std::swap(p[i], p[uniform_index(seed, stream, i, i + 1)]);
  p.resize(static_cast<size_t>(take));
  return p;
}

}  // namespace

int64_t KvLayout::slot_of(int64_t p) const {
  UNTIED_ASSERT(p >= 1 && p < query_begin, "position ", p, " is not in the pair section [1, ", query_begin, ")");
  int64_t j = (p - 1) * num_pairs / pair_span;  // slot_begin(j) <= p; at most one step short
  while (j + 1 < num_pairs && slot_begin(j + 1) <= p) ++j;
  return j;
}

StatusOr<KvTask> KvTask::create(const KvTaskOptions& o) {
  if (o.num_keys < 1 || o.num_keys > kMaxSymbols)
    return Status::invalid_argument("kv task: num_keys " + std::to_string(o.num_keys) + " is outside [1, 2^20]");
  if (o.num_values < 1 || o.num_values > kMaxSymbols)
    return Status::invalid_argument("kv task: num_values " + std::to_string(o.num_values) + " is outside [1, 2^20]");
  if (o.fused_pairs && o.num_keys * o.num_values > kMaxSymbols)
    return Status::invalid_argument("kv task: fused pairs need num_keys * num_values <= 2^20");
  if (o.num_docs < 1)
    return Status::invalid_argument("kv task: num_docs " + std::to_string(o.num_docs) + " must be >= 1");
  if (o.num_pairs < 0 || o.num_pairs > o.num_keys)
    return Status::invalid_argument("kv task: num_pairs " + std::to_string(o.num_pairs) +
                                    " must be 0 (as many as fit) or 1..num_keys (" + std::to_string(o.num_keys) +
                                    "), since keys within a sample are distinct");
  return KvTask(o);
}

StatusOr<KvLayout> KvTask::layout(int64_t seq_len) const {
  if (seq_len > kMaxSeqLen)
    return Status::invalid_argument("kv task: sequence length " + std::to_string(seq_len) + " exceeds 2^40");
  if (seq_len < 6)
    return Status::invalid_argument("kv task: sequence length " + std::to_string(seq_len) +
                                    " is too short; it needs at least 6 tokens (BOS, one key-value pair, one query)");
  KvLayout l;
  l.seq_len = seq_len;
  if (options_.num_pairs == 0) {
    l.num_pairs = std::min(options_.num_keys, (seq_len - 1) / 5);
  } else {
    if (5 * options_.num_pairs + 1 > seq_len)
      return Status::invalid_argument("kv task: " + std::to_string(options_.num_pairs) + " pairs need a sequence of " +
                                      std::to_string(5 * options_.num_pairs + 1) + " tokens, not " +
                                      std::to_string(seq_len) + ": lower num_pairs (0 fits as many as possible)");
    l.num_pairs = options_.num_pairs;
  }
  l.query_begin = seq_len - 3 * l.num_pairs;
  l.pair_span = l.query_begin - 1;
  return l;
}

StatusOr<std::vector<int64_t>> KvTask::document_starts(int64_t, int64_t seq_len) const {
  const int64_t docs = options_.num_docs, len = seq_len / docs;
  if (len < 1) return Status::invalid_argument("kv task: " + std::to_string(docs) + " documents do not fit " +
                                               std::to_string(seq_len) + " tokens");
  std::vector<int64_t> starts;
  for (int64_t d = 0; d < docs; ++d) starts.push_back(d * len);
  return starts;
}

Status KvTask::fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                    int32_t* labels, uint8_t* is_answer) const {
  const int64_t docs = options_.num_docs;
  if (docs == 1) return fill_one(sample_index, seq_len, start, count, tokens, labels, is_answer);
  const int64_t len = seq_len / docs;
  if (len < 1) return Status::invalid_argument("kv task: " + std::to_string(docs) + " documents do not fit " +
                                               std::to_string(seq_len) + " tokens: lower --kv-docs or raise --seq");
  for (int64_t p = start; p < start + count;) {
    const int64_t d = std::min(p / len, docs - 1), first = d * len, n_d = d + 1 < docs ? len : seq_len - first;
    const int64_t take = std::min(start + count, first + n_d) - p, at = p - start;
    Status s = fill_one(sample_index * docs + d, n_d, p - first, take, tokens + at, labels + at,
                        is_answer != nullptr ? is_answer + at : nullptr);
    if (!s.ok()) return s;
    p += take;
  }
  return Status::ok_status();
}

Status KvTask::fill_one(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                        int32_t* labels, uint8_t* is_answer) const {
  UNTIED_CHECK(sample_index >= 0 && seq_len >= 1 && start >= 0 && count >= 0 && start <= seq_len - count,
               "fill of positions [", start, ", ", start + count, ") of sample ", sample_index, " with seq_len ",
               seq_len);
  UNTIED_CHECK(count == 0 || (tokens != nullptr && labels != nullptr), "fill into null buffers");
  StatusOr<KvLayout> lo = layout(seq_len);
  if (!lo.ok()) return lo.status();
  const KvLayout& l = lo.value();
  const uint64_t seed = options_.seed;
  const std::vector<int64_t> keys =
      permutation(seed, stream_of(sample_index, kKeyPermutation), options_.num_keys, l.num_pairs);
  const std::vector<int64_t> order = permutation(seed, stream_of(sample_index, kQueryOrder), l.num_pairs, l.num_pairs);
  const uint64_t value_stream = stream_of(sample_index, kValues);
  auto value_of_pair = [&](int64_t j) { return uniform_index(seed, value_stream, j, options_.num_values); };

  auto token_at = [&](int64_t p) -> int32_t {
    if (p == 0) return kKvBos;
    if (p < l.query_begin) {
      const int64_t j = l.slot_of(p);
      const int64_t off = p - l.slot_begin(j);
      if (options_.fused_pairs) return off == 0 ? pair_token(keys[j], value_of_pair(j)) : kKvFill;
      if (off == 0) return key_token(keys[j]);
      if (off == 1) return value_token(value_of_pair(j));
      return kKvFill;
    }
    const int64_t i = (p - l.query_begin) / 3;
    const int64_t m = order[i];
    switch ((p - l.query_begin) % 3) {
      case 0: return kKvQuery;
      case 1: return key_token(keys[m]);
      default: return value_token(value_of_pair(m));
    }
  };

  for (int64_t k = 0; k < count; ++k) {
    const int64_t p = start + k;
    tokens[k] = token_at(p);
    int32_t label = kIgnoreIndex;
    bool answer = false;
    if (p + 1 < seq_len) {
      const bool next_is_value_of_query = p + 1 >= l.query_begin && (p + 1 - l.query_begin) % 3 == 2;
      const int32_t next = token_at(p + 1);
      if (next_is_value_of_query) {
        label = next;
        answer = true;
      } else if (options_.label_structure && (next == kKvFill || next == kKvQuery)) {
        label = next;
      }
    }
    labels[k] = label;
    if (is_answer != nullptr) is_answer[k] = answer ? 1 : 0;
  }
  return Status::ok_status();
}

StatusOr<std::vector<double>> KvTask::answer_depths(int64_t sample_index, int64_t seq_len) const {
  if (options_.num_docs != 1) return Status::invalid_argument("kv answer depths: one document per sample (--kv-docs 1)");
  StatusOr<KvLayout> lo = layout(seq_len);
  if (!lo.ok()) return lo.status();
  const KvLayout& l = lo.value();
  const std::vector<int64_t> order =
      permutation(options_.seed, stream_of(sample_index, kQueryOrder), l.num_pairs, l.num_pairs);
  std::vector<double> depth(static_cast<size_t>(l.num_pairs));
  for (int64_t i = 0; i < l.num_pairs; ++i)
    depth[static_cast<size_t>(i)] =
        static_cast<double>(l.slot_begin(order[static_cast<size_t>(i)]) - 1) / static_cast<double>(l.pair_span);
  return depth;
}

}  // namespace untied
