#include "untied/train/data.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

namespace untied {
namespace {

// A source whose samples tile one token stream of N tokens, wrapping around its end.
// Subclasses provide read(): stream tokens [first, first + n), first + n <= N.
class StreamSource : public DataSource {
 public:
  int64_t stream_tokens() const override { return stream_size(); }
  Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens, int32_t* labels,
              uint8_t* is_answer) const override {
    UNTIED_CHECK(sample_index >= 0 && seq_len >= 1 && start >= 0 && count >= 0 && start <= seq_len - count,
                 "fill of positions [", start, ", ", start + count, ") of sample ", sample_index, " with seq_len ",
                 seq_len);
    if (count == 0) return Status::ok_status();
    UNTIED_CHECK(tokens != nullptr && labels != nullptr, "fill into null buffers");
    const int64_t n = stream_size();
    const int64_t base = sample_base(sample_index, seq_len);
    Status s = read_wrapped((base + start % n) % n, count, tokens);
    if (!s.ok()) return s;
    // labels[k] = token start + k + 1: the tokens already read, then one more unless the range
    // ends the sequence.
    if (count > 1) std::memcpy(labels, tokens + 1, static_cast<size_t>(count - 1) * sizeof(int32_t));
    if (start + count < seq_len) {
      s = read_wrapped((base + (start + count) % n) % n, 1, labels + count - 1);
      if (!s.ok()) return s;
    } else {
      labels[count - 1] = kIgnoreIndex;
    }
    // No label crosses a document: position p's next token starts one.
    for (const int64_t p : starts_in(base, start + 1, std::min(start + count + 1, seq_len)))
      labels[p - 1 - start] = kIgnoreIndex;
    if (is_answer != nullptr)
      for (int64_t k = 0; k < count; ++k) is_answer[k] = labels[k] != kIgnoreIndex ? 1 : 0;
    return Status::ok_status();
  }

  StatusOr<std::vector<int64_t>> document_starts(int64_t sample_index, int64_t seq_len) const override {
    std::vector<int64_t> starts = starts_in(sample_base(sample_index, seq_len), 1, seq_len);
    starts.insert(starts.begin(), 0);
    return starts;
  }

 protected:
  virtual int64_t stream_size() const = 0;
  virtual Status read(int64_t first, int64_t n, int32_t* out) const = 0;
  // Stream positions where documents start (increasing, the first 0); empty: one stream, no
  // boundaries.
  virtual const std::vector<int64_t>& stream_documents() const = 0;

 private:
  // Stream position of the sample's first token: (sample_index * seq_len) mod N, in 128 bits.
  int64_t sample_base(int64_t sample_index, int64_t seq_len) const {
    return static_cast<int64_t>((static_cast<unsigned __int128>(sample_index) * static_cast<unsigned __int128>(seq_len)) %
                                static_cast<unsigned __int128>(stream_size()));
  }
  // The sample positions p in [from, to) whose token (stream position (base + p) mod N) starts a
  // document, increasing.
  std::vector<int64_t> starts_in(int64_t base, int64_t from, int64_t to) const {
    std::vector<int64_t> out;
    const std::vector<int64_t>& docs = stream_documents();
    if (docs.empty()) return out;
    const int64_t n = stream_size();
    for (int64_t p = from; p < to;) {
      const int64_t sp = (base + p) % n, take = std::min(to - p, n - sp);
      for (auto it = std::lower_bound(docs.begin(), docs.end(), sp); it != docs.end() && *it < sp + take; ++it)
        out.push_back(p + (*it - sp));
      p += take;
    }
    return out;
  }
  // Tokens at stream positions pos, pos + 1, ... (mod N), n of them; 0 <= pos < N.
  Status read_wrapped(int64_t pos, int64_t n, int32_t* out) const {
    const int64_t size = stream_size();
    while (n > 0) {
      const int64_t take = std::min(n, size - pos);
      Status s = read(pos, take, out);
      if (!s.ok()) return s;
      out += take;
      n -= take;
      pos = 0;
    }
    return Status::ok_status();
  }
};

class TokenFileSource final : public StreamSource {
 public:
  explicit TokenFileSource(TokenFile file) : file_(std::move(file)) {}
  std::string_view kind() const override { return "tokens"; }
  int64_t vocab_size() const override { return file_.vocab_size(); }

 protected:
  int64_t stream_size() const override { return file_.size(); }
  Status read(int64_t first, int64_t n, int32_t* out) const override { return file_.read(first, n, out); }
  const std::vector<int64_t>& stream_documents() const override { return file_.document_starts(); }

 private:
  TokenFile file_;
};

class TextSource final : public StreamSource {
 public:
  // Every document begins with BOS (tokenizer.h): that is where the documents start.
  explicit TextSource(std::vector<int32_t> ids) : ids_(std::move(ids)) {
    for (size_t i = 0; i < ids_.size(); ++i)
      if (ids_[i] == kBos) docs_.push_back(static_cast<int64_t>(i));
    if (!docs_.empty() && docs_[0] != 0) docs_.insert(docs_.begin(), 0);
  }
  std::string_view kind() const override { return "text"; }
  int64_t vocab_size() const override { return kByteVocabSize; }

 protected:
  int64_t stream_size() const override { return static_cast<int64_t>(ids_.size()); }
  Status read(int64_t first, int64_t n, int32_t* out) const override {
    std::memcpy(out, ids_.data() + first, static_cast<size_t>(n) * sizeof(int32_t));
    return Status::ok_status();
  }
  const std::vector<int64_t>& stream_documents() const override { return docs_; }

 private:
  std::vector<int32_t> ids_;
  std::vector<int64_t> docs_;
};

}  // namespace

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
    if (kind == "tokens") {
      StatusOr<TokenFile> file = TokenFile::open(path);
      if (!file.ok()) return file.status();
      if (file.value().size() == 0)
        return Status::invalid_argument("token file " + path + " holds no tokens: give a file with data");
      return std::unique_ptr<DataSource>(std::make_unique<TokenFileSource>(std::move(file).value()));
    }
    StatusOr<std::vector<int32_t>> ids = read_text_tokens({path}, options.text_split);
    if (!ids.ok()) return ids.status();
    return std::unique_ptr<DataSource>(std::make_unique<TextSource>(std::move(ids).value()));
  }
  return Status::invalid_argument("unknown data kind '" + std::string(kind) + "': use kv, tokens or text");
}

}  // namespace untied
