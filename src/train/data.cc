#include "untied/train/data.h"

#include <glob.h>

#include <map>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace untied {
namespace {

// One stream of N tokens (a group of token files, or a text): what samples are cut from.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual int64_t size() const = 0;
  // Stream tokens [first, first + n), first + n <= size().
  virtual Status read(int64_t first, int64_t n, int32_t* out) const = 0;
  // Where documents start (increasing, the first 0); empty: one stream, no boundaries.
  virtual const std::vector<int64_t>& documents() const = 0;
  // A loss mask (token_file.h, version 3): out[i] = 1 when stream token first + i is a target.
  virtual bool has_targets() const { return false; }
  virtual Status read_targets(int64_t first, int64_t n, uint8_t* out) const {
    (void)first;
    std::fill_n(out, n, uint8_t{1});
    return Status::ok_status();
  }
  std::string name;  // for messages and passes(): the file, or "a.tok+2 more"
};

// Token files one after the other. A file's start is a document boundary when there are several.
class TokenFilesStream final : public Stream {
 public:
  explicit TokenFilesStream(std::vector<TokenFile> files) : files_(std::move(files)) {
    int64_t at = 0;
    for (const TokenFile& f : files_) {
      offsets_.push_back(at);
      if (files_.size() > 1 || f.version() >= 2) {
        if (f.document_starts().empty() || f.document_starts()[0] != 0) docs_.push_back(at);
        for (const int64_t d : f.document_starts()) docs_.push_back(at + d);
      }
      at += f.size();
    }
    size_ = at;
    has_targets_ = std::any_of(files_.begin(), files_.end(), [](const TokenFile& f) { return f.has_loss_mask(); });
    name = files_[0].path() + (files_.size() > 1 ? "+" + std::to_string(files_.size() - 1) + " more" : "");
  }
  int64_t size() const override { return size_; }
  Status read(int64_t first, int64_t n, int32_t* out) const override {
    return across_files(first, n, out, [](const TokenFile& f, int64_t at, int64_t k, int32_t* o) { return f.read(at, k, o); });
  }
  const std::vector<int64_t>& documents() const override { return docs_; }
  bool has_targets() const override { return has_targets_; }
  Status read_targets(int64_t first, int64_t n, uint8_t* out) const override {
    return across_files(first, n, out,
                        [](const TokenFile& f, int64_t at, int64_t k, uint8_t* o) { return f.read_targets(at, k, o); });
  }
  int64_t vocab_size() const {
    int64_t v = 0;
    for (const TokenFile& f : files_) v = std::max(v, f.vocab_size());
    return v;
  }

 private:
  // Stream items [first, first + n) (first + n <= size()) read file by file: read_one(file,
  // first item in it, count, out).
  template <typename T, typename ReadOne>
  Status across_files(int64_t first, int64_t n, T* out, ReadOne read_one) const {
    size_t f = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), first) - offsets_.begin()) - 1;
    while (n > 0) {
      const int64_t in_file = first - offsets_[f], take = std::min(n, files_[f].size() - in_file);
      if (take > 0) {
        if (Status s = read_one(files_[f], in_file, take, out); !s.ok()) return s;
      }
      out += take;
      first += take;
      n -= take;
      ++f;
    }
    return Status::ok_status();
  }

  std::vector<TokenFile> files_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> docs_;
  int64_t size_ = 0;
  bool has_targets_ = false;  // some file has a loss mask
};

// Text tokenized in memory; every document begins with BOS (tokenizer.h): that is where the
// documents start.
class TextStream final : public Stream {
 public:
  TextStream(std::vector<int32_t> ids, std::string source) : ids_(std::move(ids)) {
    for (size_t i = 0; i < ids_.size(); ++i)
      if (ids_[i] == kBos) docs_.push_back(static_cast<int64_t>(i));
    if (!docs_.empty() && docs_[0] != 0) docs_.insert(docs_.begin(), 0);
    name = std::move(source);
  }
  int64_t size() const override { return static_cast<int64_t>(ids_.size()); }
  Status read(int64_t first, int64_t n, int32_t* out) const override {
    std::memcpy(out, ids_.data() + first, static_cast<size_t>(n) * sizeof(int32_t));
    return Status::ok_status();
  }
  const std::vector<int64_t>& documents() const override { return docs_; }

 private:
  std::vector<int32_t> ids_;
  std::vector<int64_t> docs_;
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A seeded bijection of [0, n): a 4-round Feistel network on the smallest even number of bits
// that holds n, walked until the value falls inside [0, n) (fewer than 4 rounds of walking on
// average).
uint64_t permute(uint64_t j, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 64 - __builtin_clzll(n - 1);
  bits += bits & 1;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  do {
    uint64_t l = j >> half, r = j & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(r ^ splitmix64(key + round)) & mask;
      const uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    j = (l << half) | r;
  } while (j >= n);
  return j;
}

// Samples cut from one or more streams (data.h): which stream and which of its sequences sample
// i is, and where that sequence starts.
class SequenceSource final : public DataSource {
 public:
  SequenceSource(std::string_view kind, int64_t vocab, std::vector<std::unique_ptr<Stream>> streams,
                 std::vector<double> weights, bool shuffle, uint64_t seed)
      : kind_(kind), vocab_(vocab), streams_(std::move(streams)), shuffle_(shuffle), seed_(seed) {
    double total = 0;
    for (const double w : weights) total += w;
    double cum = 0;
    for (size_t g = 0; g + 1 < weights.size(); ++g) {
      cum += weights[g];
      thresholds_.push_back(static_cast<uint64_t>(std::ldexp(cum / total, 64) >= 0x1p64 ? ~uint64_t{0}
                                                                                        : std::ldexp(cum / total, 64)));
    }
  }

  std::string_view kind() const override { return kind_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t stream_tokens() const override {
    int64_t n = 0;
    for (const auto& st : streams_) n += st->size();
    return n;
  }

  int64_t samples_per_pass(int64_t seq_len) const override {
    int64_t n = 0;
    for (size_t g = 0; g < streams_.size(); ++g)
      n += streams_[g]->has_targets() ? static_cast<int64_t>(packing(g, seq_len).start.size())
                                      : streams_[g]->size() / seq_len;
    return n;
  }

  Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens, int32_t* labels,
              uint8_t* is_answer) const override {
    UNTIED_CHECK(sample_index >= 0 && seq_len >= 1 && start >= 0 && count >= 0 && start <= seq_len - count,
                 "fill of positions [", start, ", ", start + count, ") of sample ", sample_index, " with seq_len ",
                 seq_len);
    if (count == 0) return Status::ok_status();
    UNTIED_CHECK(tokens != nullptr && labels != nullptr, "fill into null buffers");
    if (streams_[stream_of(sample_index)]->has_targets())
      return fill_packed(sample_index, seq_len, start, count, tokens, labels, is_answer);
    const auto [g, base] = locate(sample_index, seq_len);
    const Stream& st = *streams_[g];
    const int64_t n = st.size();
    Status s = read_wrapped(st, (base + start % n) % n, count, tokens);
    if (!s.ok()) return s;
    // labels[k] = token start + k + 1: the tokens already read, then one more unless the range
    // ends the sequence.
    if (count > 1) std::memcpy(labels, tokens + 1, static_cast<size_t>(count - 1) * sizeof(int32_t));
    if (start + count < seq_len) {
      s = read_wrapped(st, (base + (start + count) % n) % n, 1, labels + count - 1);
      if (!s.ok()) return s;
    } else {
      labels[count - 1] = kIgnoreIndex;
    }
    // No label crosses a document: position p's next token starts one.
    for (const int64_t p : starts_in(st, base, start + 1, std::min(start + count + 1, seq_len)))
      labels[p - 1 - start] = kIgnoreIndex;
    // With a loss mask, a label that is not a target (a prompt's token) is not predicted.
    if (st.has_targets()) {
      const int64_t m = std::min(count, seq_len - 1 - start);  // the labelled positions [start, start + m)
      std::vector<uint8_t> targets(static_cast<size_t>(std::max<int64_t>(m, 0)));
      if (m > 0) {
        s = read_wrapped(st, (base + (start + 1) % n) % n, m, targets.data());
        if (!s.ok()) return s;
      }
      for (int64_t k = 0; k < m; ++k)
        if (targets[static_cast<size_t>(k)] == 0) labels[k] = kIgnoreIndex;
    }
    if (is_answer != nullptr)
      for (int64_t k = 0; k < count; ++k) is_answer[k] = labels[k] != kIgnoreIndex ? 1 : 0;
    return Status::ok_status();
  }

  StatusOr<std::vector<int64_t>> document_starts(int64_t sample_index, int64_t seq_len) const override {
    if (streams_[stream_of(sample_index)]->has_targets()) {
      const auto [g, bin] = locate_packed(sample_index, seq_len);
      const Packing& pk = packing(g, seq_len);
      const int64_t first = pk.start[static_cast<size_t>(bin)], len = pk.length[static_cast<size_t>(bin)];
      std::vector<int64_t> starts;
      const std::vector<int64_t>& docs = streams_[g]->documents();
      for (auto it = std::lower_bound(docs.begin(), docs.end(), first); it != docs.end() && *it < first + len; ++it)
        starts.push_back(*it - first);
      if (starts.empty() || starts[0] != 0) starts.insert(starts.begin(), 0);
      if (len < seq_len) starts.push_back(len);  // the padding, a document of its own
      return starts;
    }
    const auto [g, base] = locate(sample_index, seq_len);
    std::vector<int64_t> starts = starts_in(*streams_[g], base, 1, seq_len);
    starts.insert(starts.begin(), 0);
    return starts;
  }

  int64_t samples_cut(int64_t seq_len) const override {
    int64_t n = 0;
    for (size_t g = 0; g < streams_.size(); ++g) {
      if (!streams_[g]->has_targets()) continue;
      packing(g, seq_len);
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = truncated_.find({g, seq_len});
      n += it == truncated_.end() ? 0 : it->second;
    }
    return n;
  }

  bool has_documents() const override {
    for (const auto& st : streams_)
      if (!st->documents().empty() || st->has_targets()) return true;
    return false;
  }

  int64_t first_document_offset(int64_t sample_index, int64_t seq_len) const override {
    if (streams_[stream_of(sample_index)]->has_targets()) return 0;  // packed whole
    const auto [g, base] = locate(sample_index, seq_len);
    const std::vector<int64_t>& docs = streams_[g]->documents();
    if (docs.empty()) return base;  // one stream: positions count from its start
    const auto it = std::upper_bound(docs.begin(), docs.end(), base);
    return base - *(it - 1);
  }

  std::vector<Pass> passes(int64_t samples, int64_t seq_len) const override {
    std::vector<int64_t> drawn(streams_.size(), 0);
    if (streams_.size() == 1) drawn[0] = samples;
    else
      for (size_t g = 0; g < streams_.size(); ++g) drawn[g] = drawn_before(samples, g);
    std::vector<Pass> out;
    for (size_t g = 0; g < streams_.size(); ++g) {
      const double n = static_cast<double>(streams_[g]->size());
      const double p = streams_[g]->has_targets()
                           ? static_cast<double>(drawn[g]) / static_cast<double>(packing(g, seq_len).start.size())
                       : shuffle_ ? static_cast<double>(drawn[g]) / static_cast<double>(per_pass(g, seq_len))
                                  : static_cast<double>(drawn[g]) * static_cast<double>(seq_len) / n;
      out.push_back({streams_[g]->name, p});
    }
    return out;
  }

 private:
  // The stream sample i is drawn from: by the Weyl sequence u_i = frac(c + (i + 1) * phi) in
  // 64-bit fixed point, against the weights' cumulative thresholds.
  size_t stream_of(int64_t i) const {
    if (thresholds_.empty()) return 0;
    const uint64_t u = splitmix64(seed_ ^ 0x6d69782d6f666673ull) + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(std::upper_bound(thresholds_.begin(), thresholds_.end(), u) - thresholds_.begin());
  }
  // Samples of [0, i) drawn from stream g. Counts at every kBlock-th sample are kept (computed
  // once, under a lock: fill() is called from several threads), the rest counted from there.
  static constexpr int64_t kBlock = 4096;
  int64_t drawn_before(int64_t i, size_t g) const {
    const int64_t block = i / kBlock;
    std::vector<int64_t> at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (static_cast<int64_t>(block_counts_.size()) <= block) {
        std::vector<int64_t> next = block_counts_.empty() ? std::vector<int64_t>(streams_.size(), 0) : block_counts_.back();
        if (!block_counts_.empty()) {
          const int64_t from = (static_cast<int64_t>(block_counts_.size()) - 1) * kBlock;
          for (int64_t k = from; k < from + kBlock; ++k) ++next[stream_of(k)];
        }
        block_counts_.push_back(std::move(next));
      }
      at = block_counts_[static_cast<size_t>(block)];
    }
    int64_t count = at[g];
    for (int64_t k = block * kBlock; k < i; ++k) count += stream_of(k) == g ? 1 : 0;
    return count;
  }
  int64_t per_pass(size_t g, int64_t seq_len) const { return std::max<int64_t>(1, streams_[g]->size() / seq_len); }

  // A stream with a loss mask (supervised samples) is packed whole: its documents, in order, go
  // into sequences of at most seq_len tokens (a new sequence when the next one does not fit; a
  // document longer than seq_len alone, cut at seq_len), the rest of each sequence padding.
  struct Packing {
    std::vector<int64_t> start, length;  // each packed sequence's first stream token and its tokens
  };
  const Packing& packing(size_t g, int64_t seq_len) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(g, seq_len);
    auto it = packings_.find(key);
    if (it != packings_.end()) return it->second;
    Packing pk;
    const Stream& st = *streams_[g];
    std::vector<int64_t> docs = st.documents();
    if (docs.empty()) docs.push_back(0);
    for (size_t d = 0; d < docs.size(); ++d) {
      const int64_t begin = docs[d], end = d + 1 < docs.size() ? docs[d + 1] : st.size();
      const int64_t len = std::min(end - begin, seq_len);
      if (!pk.start.empty() && pk.start.back() + pk.length.back() == begin && pk.length.back() + len <= seq_len) {
        pk.length.back() += len;
      } else {
        pk.start.push_back(begin);
        pk.length.push_back(len);
      }
      if (end - begin > seq_len) ++truncated_[key];
    }
    return packings_.emplace(key, std::move(pk)).first->second;
  }
  // The seed of stream g's pass: its order of sequences (and, unpacked, its offset).
  uint64_t pass_key(size_t g, int64_t pass) const {
    return splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(g) * 0x100000001b3ull + static_cast<uint64_t>(pass)));
  }
  // Sample i of a packed stream: the stream and the packed sequence.
  std::pair<size_t, int64_t> locate_packed(int64_t i, int64_t seq_len) const {
    const size_t g = stream_of(i);
    const int64_t k = streams_.size() == 1 ? i : drawn_before(i, g);
    const auto p = static_cast<int64_t>(packing(g, seq_len).start.size()), pass = k / p;
    if (!shuffle_) return {g, k % p};
    const uint64_t key = pass_key(g, pass);
    return {g, static_cast<int64_t>(permute(static_cast<uint64_t>(k % p), static_cast<uint64_t>(p), key))};
  }
  Status fill_packed(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                     int32_t* labels, uint8_t* is_answer) const {
    const auto [g, bin] = locate_packed(sample_index, seq_len);
    const Stream& st = *streams_[g];
    const Packing& pk = packing(g, seq_len);
    const int64_t first = pk.start[static_cast<size_t>(bin)], len = pk.length[static_cast<size_t>(bin)];
    // Positions [start, start + count): real tokens below len, padding (token 0, no label) above.
    // The labels need the token after the range's last real position, and the targets of them.
    const int64_t real_end = std::min(start + count, len);
    const int64_t real = std::max<int64_t>(0, real_end - start);
    std::vector<int32_t> next(static_cast<size_t>(real) + 1, 0);
    std::vector<uint8_t> targets(static_cast<size_t>(real) + 1, 0);
    if (real > 0) {
      const int64_t read_n = std::min(real + 1, len - start);  // within the sequence's real tokens
      if (Status s = st.read(first + start, read_n, next.data()); !s.ok()) return s;
      if (Status s = st.read_targets(first + start, read_n, targets.data()); !s.ok()) return s;
      if (read_n <= real) targets[static_cast<size_t>(real)] = 0;  // the last real token has no next
    }
    const std::vector<int64_t>& docs = st.documents();
    for (int64_t k = 0; k < count; ++k) {
      const int64_t p = start + k;
      if (p >= len) {
        tokens[k] = 0;
        labels[k] = kIgnoreIndex;
        continue;
      }
      tokens[k] = next[static_cast<size_t>(k)];
      const bool has_next = p + 1 < len && targets[static_cast<size_t>(k) + 1] != 0 &&
                            !std::binary_search(docs.begin(), docs.end(), first + p + 1);
      labels[k] = has_next ? next[static_cast<size_t>(k) + 1] : kIgnoreIndex;
    }
    if (is_answer != nullptr)
      for (int64_t k = 0; k < count; ++k) is_answer[k] = labels[k] != kIgnoreIndex ? 1 : 0;
    return Status::ok_status();
  }
  // Sample i: its stream and the stream position of its first token.
  std::pair<size_t, int64_t> locate(int64_t i, int64_t seq_len) const {
    const size_t g = stream_of(i);
    const int64_t k = streams_.size() == 1 ? i : drawn_before(i, g);  // the stream's k-th sequence
    const int64_t n = streams_[g]->size();
    using u128 = unsigned __int128;
    if (!shuffle_) return {g, static_cast<int64_t>((static_cast<u128>(k) * static_cast<u128>(seq_len)) % static_cast<u128>(n))};
    const int64_t p = per_pass(g, seq_len), pass = k / p;
    const uint64_t key = pass_key(g, pass);
    const int64_t j = static_cast<int64_t>(permute(static_cast<uint64_t>(k % p), static_cast<uint64_t>(p), key));
    const int64_t slack = std::max<int64_t>(0, n - p * seq_len);
    const int64_t offset = slack > 0 ? static_cast<int64_t>(splitmix64(key) % static_cast<uint64_t>(slack + 1)) : 0;
    return {g, static_cast<int64_t>((static_cast<u128>(offset) + static_cast<u128>(j) * static_cast<u128>(seq_len)) %
                                    static_cast<u128>(n))};
  }
  // The sample positions p in [from, to) whose token (stream position (base + p) mod N) starts a
  // document, increasing.
  static std::vector<int64_t> starts_in(const Stream& st, int64_t base, int64_t from, int64_t to) {
    std::vector<int64_t> out;
    const std::vector<int64_t>& docs = st.documents();
    if (docs.empty()) return out;
    const int64_t n = st.size();
    for (int64_t p = from; p < to;) {
      const int64_t sp = (base + p) % n, take = std::min(to - p, n - sp);
      for (auto it = std::lower_bound(docs.begin(), docs.end(), sp); it != docs.end() && *it < sp + take; ++it)
        out.push_back(p + (*it - sp));
      p += take;
    }
    return out;
  }
  // Tokens (or their loss mask) at stream positions pos, pos + 1, ... (mod N), n of them; 0 <= pos < N.
  template <typename T>
  static Status read_wrapped(const Stream& st, int64_t pos, int64_t n, T* out) {
    const int64_t size = st.size();
    while (n > 0) {
      const int64_t take = std::min(n, size - pos);
      Status s;
      if constexpr (std::is_same_v<T, int32_t>) s = st.read(pos, take, out);
      else s = st.read_targets(pos, take, out);
      if (!s.ok()) return s;
      out += take;
      n -= take;
      pos = 0;
    }
    return Status::ok_status();
  }

  std::string kind_;
  int64_t vocab_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<uint64_t> thresholds_;  // stream g takes u in [thresholds_[g-1], thresholds_[g])
  bool shuffle_;
  uint64_t seed_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<size_t, int64_t>, Packing> packings_;     // (stream, seq_len) -> its packing
  mutable std::map<std::pair<size_t, int64_t>, int64_t> truncated_;    // documents cut at seq_len
  mutable std::vector<std::vector<int64_t>> block_counts_;  // per stream, samples drawn before k * kBlock
};

}  // namespace

StatusOr<std::vector<std::vector<std::string>>> expand_data_path(const std::string& path) {
  std::vector<std::vector<std::string>> out;
  size_t from = 0;
  while (from <= path.size()) {
    const size_t comma = std::min(path.find(',', from), path.size());
    const std::string entry = path.substr(from, comma - from);
    from = comma + 1;
    if (entry.empty())
      return Status::invalid_argument("the data path '" + path + "' has an empty entry: separate files with single commas");
    if (entry.find_first_of("*?[") == std::string::npos) {
      out.push_back({entry});
      continue;
    }
    glob_t g{};
    const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::string> files;
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (files.empty())
      return Status::not_found("the data pattern '" + entry + "' matches no file: check the path");
    std::sort(files.begin(), files.end());
    out.push_back(std::move(files));
  }
  return out;
}

StatusOr<std::unique_ptr<DataSource>> make_data_source(std::string_view kind, const std::string& path,
                                                       const DataOptions& options) {
  if (kind == "kv") {
    if (!path.empty())
      return Status::invalid_argument("the kv task is synthetic and reads no file, but the path " + path +
                                      " was given: drop the path, or choose data kind 'tokens' or 'text'");
    StatusOr<KvTask> task = KvTask::create(options.kv);
    if (!task.ok()) return task.status();
    return std::unique_ptr<DataSource>(std::make_unique<KvTask>(std::move(task).value()));
  }
  if (kind == "tokens" || kind == "text") {
    if (path.empty())
      return Status::invalid_argument("data kind '" + std::string(kind) + "' needs a file: give its path");
    auto entries = expand_data_path(path);
    if (!entries.ok()) return entries.status();
    const bool mix = !options.weights.empty();
    if (mix && options.weights.size() != entries.value().size())
      return Status::invalid_argument("--data-weights gives " + std::to_string(options.weights.size()) +
                                      " weights for " + std::to_string(entries.value().size()) +
                                      " entries of --data-path: give one weight per entry");
    for (const double w : options.weights)
      if (!(w > 0) || !std::isfinite(w))
        return Status::invalid_argument("--data-weights must be positive numbers, one per entry of --data-path");
    // Without weights every file is one stream; with them, each entry is one.
    std::vector<std::vector<std::string>> groups;
    if (mix) groups = entries.value();
    else {
      groups.emplace_back();
      for (const auto& e : entries.value()) groups[0].insert(groups[0].end(), e.begin(), e.end());
    }
    std::vector<std::unique_ptr<Stream>> streams;
    int64_t vocab = kind == "text" ? kByteVocabSize : 0;
    for (const auto& files : groups) {
      if (kind == "tokens") {
        std::vector<TokenFile> opened;
        for (const std::string& f : files) {
          StatusOr<TokenFile> file = TokenFile::open(f);
          if (!file.ok()) return file.status();
          if (file.value().size() == 0)
            return Status::invalid_argument("token file " + f + " holds no tokens: give a file with data");
          opened.push_back(std::move(file).value());
        }
        auto st = std::make_unique<TokenFilesStream>(std::move(opened));
        vocab = std::max(vocab, st->vocab_size());
        streams.push_back(std::move(st));
      } else {
        StatusOr<std::vector<int32_t>> ids = read_text_tokens(files, options.text_split);
        if (!ids.ok()) return ids.status();
        streams.push_back(std::make_unique<TextStream>(std::move(ids).value(),
                                                       files[0] + (files.size() > 1 ? "+" + std::to_string(files.size() - 1) + " more" : "")));
      }
      const Stream& st = *streams.back();
      if (options.seq_len > 0 && st.size() < options.seq_len && !options.repeat)
        return Status::invalid_argument("the data " + st.name + " holds " + std::to_string(st.size()) +
                                        " tokens, fewer than one sequence of --seq " + std::to_string(options.seq_len) +
                                        ": give more data, a smaller --seq, or --data-repeat to repeat its tokens "
                                        "within a sequence");
    }
    return std::unique_ptr<DataSource>(std::make_unique<SequenceSource>(
        kind, vocab, std::move(streams), mix ? options.weights : std::vector<double>{}, options.shuffle, options.seed));
  }
  return Status::invalid_argument("unknown data kind '" + std::string(kind) + "': use kv, tokens or text");
}

}  // namespace untied
