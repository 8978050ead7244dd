#include "untied/train/token_file.h"

#include "untied/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

namespace untied {
namespace {

constexpr int64_t kMaxVocab = std::numeric_limits<int32_t>::max();

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string errno_text(int err) { return std::strerror(err); }

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all n bytes (retrying short writes and EINTR). Returns 0 or an errno value.
int write_all(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}


// The temporary file of one write: removed on destruction unless released by a rename.
class TempFile {
 public:
  explicit TempFile(std::string target) : name_(std::move(target) + ".tmp.XXXXXX") {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_) ::unlink(name_.c_str());
  }
  // Returns 0 or an errno value.
  int create() {
    fd_ = ::mkstemp(name_.data());
    if (fd_ < 0) return errno;
    created_ = true;
    ::fchmod(fd_, 0644);  // mkstemp's 0600 would make data files private to their writer
    return 0;
  }
  int fd() const { return fd_; }
  const std::string& name() const { return name_; }
  // Closes the descriptor (reporting a delayed write error). Returns 0 or an errno value.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void renamed() { created_ = false; }
  // Closes and removes the file now.
  void discard() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (created_) ::unlink(name_.c_str());
    created_ = false;
  }

 private:
  std::string name_;
  int fd_ = -1;
  bool created_ = false;
};

}  // namespace

int token_width_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

namespace {

Status check_width_and_vocab(const std::string& path, int width_bytes, int64_t vocab_size) {
  if (width_bytes != 2 && width_bytes != 4)
    return Status::invalid_argument("token width " + std::to_string(width_bytes) + " bytes for " + path +
                                    " is not supported: use 2 (uint16) or 4 (uint32)");
  if (vocab_size < 1 || vocab_size > kMaxVocab)
    return Status::invalid_argument("vocab size " + std::to_string(vocab_size) + " for " + path +
                                    " is outside [1, 2^31 - 1]");
  if (width_bytes == 2 && vocab_size > 65536)
    return Status::invalid_argument("vocab size " + std::to_string(vocab_size) + " does not fit 2-byte tokens in " +
                                    path + ": use width 4");
  return Status::ok_status();
}

// Index of the first token outside [0, vocab), or tokens.size().
size_t first_bad_token(std::span<const int32_t> tokens, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab) return i;
  return tokens.size();
}

}  // namespace

struct TokenFileWriter::State {
  static constexpr size_t kBufferBytes = 1 << 20;
  static constexpr size_t kStartsInMemory = 1 << 20;

  State(std::string p, int64_t v, int w, bool idx, bool m)
      : path(std::move(p)), vocab(v), width(w), index(idx), mask(m), tmp(path), spill(path + ".index"),
        mask_spill(path + ".mask"), keep(" (any existing " + path + " is unchanged)") {}

  std::string path;
  int64_t vocab;
  int width;
  bool index;
  bool mask;  // version 3: the loss mask, one bit per token
  TempFile tmp;
  TempFile spill;  // document starts beyond kStartsInMemory, until finish()
  TempFile mask_spill;  // the mask's whole bytes beyond kBufferBytes, until finish()
  bool mask_spill_created = false;
  int64_t mask_spilled = 0;          // bytes in mask_spill
  std::vector<unsigned char> bits;   // the mask bytes not yet spilled; the last may be partial
  bool spill_created = false;
  int64_t spilled = 0;
  std::string keep;
  std::vector<unsigned char> buf;
  int64_t count = 0;
  std::vector<int64_t> starts;
  int64_t last_start = -1;
  bool pending = false;
  bool closed = false;
  Status failed;

  Status write_error(const std::string& name, int err) {
    failed = Status::io_error("writing " + name + " failed: " + errno_text(err) +
                              "; free disk space or write somewhere else" + keep);
    return failed;
  }
  Status flush() {
    if (buf.empty()) return Status::ok_status();
    const int err = write_all(tmp.fd(), buf.data(), buf.size());
    buf.clear();
    return err == 0 ? Status::ok_status() : write_error(tmp.name(), err);
  }
  Status spill_starts() {
    if (!spill_created) {
      if (const int err = spill.create())
        return failed = Status::io_error("cannot create a temporary file next to " + path + ": " + errno_text(err) +
                                         "; check that the directory " + dir_of(path) + " exists and is writable");
      spill_created = true;
    }
    std::vector<unsigned char> raw(8 * starts.size());
    for (size_t d = 0; d < starts.size(); ++d) put_u64(raw.data() + 8 * d, static_cast<uint64_t>(starts[d]));
    if (const int err = write_all(spill.fd(), raw.data(), raw.size())) return write_error(spill.name(), err);
    spilled += static_cast<int64_t>(starts.size());
    starts.clear();
    return Status::ok_status();
  }
};

namespace {
// Appends n mask bits (targets[i] != 0) for tokens [count, count + n) to the writer's bit buffer,
// spilling whole bytes to a temporary next to the target past 1 MiB.
Status append_mask_bits(TokenFileWriter::State& s, std::span<const uint8_t> targets);
}  // namespace

TokenFileWriter::TokenFileWriter(std::unique_ptr<State> s) : s_(std::move(s)) {}
TokenFileWriter::TokenFileWriter(TokenFileWriter&&) noexcept = default;
TokenFileWriter& TokenFileWriter::operator=(TokenFileWriter&&) noexcept = default;
TokenFileWriter::~TokenFileWriter() = default;

StatusOr<TokenFileWriter> TokenFileWriter::create(const std::string& path, int64_t vocab_size, Options options) {
  const int width = options.width_bytes == 0 ? token_width_for_vocab(vocab_size) : options.width_bytes;
  if (Status s = check_width_and_vocab(path, width, vocab_size); !s.ok()) return s;
  if (options.loss_mask && !options.document_index)
    return Status::invalid_argument("a loss mask (version 3) needs the document index too: " + path);
  auto st = std::make_unique<State>(path, vocab_size, width, options.document_index, options.loss_mask);
  if (const int err = st->tmp.create())
    return Status::io_error("cannot create a temporary file next to " + path + ": " + errno_text(err) +
                            "; check that the directory " + dir_of(path) + " exists and is writable");
  unsigned char header[kTokenFileHeaderBytes] = {};  // the count (offset 16) is patched by finish()
  std::memcpy(header, kTokenFileMagic, 8);
  put_u32(header + 8, options.loss_mask ? 3 : options.document_index ? 2 : 1);
  put_u32(header + 12, static_cast<uint32_t>(width));
  put_u64(header + 24, static_cast<uint64_t>(vocab_size));
  if (const int err = write_all(st->tmp.fd(), header, sizeof header)) return st->write_error(st->tmp.name(), err);
  st->buf.reserve(State::kBufferBytes);
  return TokenFileWriter(std::move(st));
}

void TokenFileWriter::begin_document() { s_->pending = s_->index; }

Status TokenFileWriter::append(std::span<const int32_t> tokens) {
  if (s_->mask) {  // every token a target
    const std::vector<uint8_t> all(tokens.size(), 1);
    return append(tokens, all);
  }
  return append_tokens(tokens, {});
}

Status TokenFileWriter::append(std::span<const int32_t> tokens, std::span<const uint8_t> targets) {
  if (!s_->mask) return Status::invalid_argument("a loss mask given to " + s_->path + ", a file written without one");
  if (targets.size() != tokens.size())
    return Status::invalid_argument("the loss mask has " + std::to_string(targets.size()) + " values for " +
                                    std::to_string(tokens.size()) + " tokens (" + s_->path + ")");
  return append_tokens(tokens, targets);
}

Status TokenFileWriter::append_tokens(std::span<const int32_t> tokens, std::span<const uint8_t> targets) {
  State& s = *s_;
  if (s.closed) return Status::invalid_argument("append to " + s.path + " after finish()");
  if (!s.failed.ok()) return s.failed;
  if (tokens.empty()) return Status::ok_status();
  if (const size_t bad = first_bad_token(tokens, s.vocab); bad < tokens.size())
    return Status::invalid_argument("token " + std::to_string(s.count + static_cast<int64_t>(bad)) + " is " +
                                    std::to_string(tokens[bad]) + ", outside [0, " + std::to_string(s.vocab) +
                                    "); it was not written to " + s.path + ": fix the tokens or the vocab size");
  if (s.index && (s.pending || s.count == 0) && s.count > s.last_start) {
    s.starts.push_back(s.count);
    s.last_start = s.count;
    if (s.starts.size() >= State::kStartsInMemory)
      if (Status e = s.spill_starts(); !e.ok()) return e;
  }
  s.pending = false;
  const auto w = static_cast<size_t>(s.width);
  for (size_t done = 0; done < tokens.size();) {
    const size_t room = (State::kBufferBytes - s.buf.size()) / w;
    const size_t n = std::min(room, tokens.size() - done);
    const size_t at = s.buf.size();
    s.buf.resize(at + n * w);
    unsigned char* p = s.buf.data() + at;
    for (size_t i = 0; i < n; ++i, p += w) {
      const auto t = static_cast<uint32_t>(tokens[done + i]);
      for (size_t b = 0; b < w; ++b) p[b] = static_cast<unsigned char>(t >> (8 * b));
    }
    done += n;
    if (s.buf.size() + w > State::kBufferBytes)
      if (Status e = s.flush(); !e.ok()) return e;
  }
  if (s.mask)
    if (Status e = append_mask_bits(s, targets); !e.ok()) return e;
  s.count += static_cast<int64_t>(tokens.size());
  return Status::ok_status();
}

namespace {
Status append_mask_bits(TokenFileWriter::State& s, std::span<const uint8_t> targets) {
  int64_t at = s.count;  // the bit of token `at` is bit at % 8 of byte at / 8 (of the whole mask)
  for (const uint8_t t : targets) {
    const int64_t byte = at / 8 - s.mask_spilled;
    if (static_cast<int64_t>(s.bits.size()) <= byte) s.bits.push_back(0);
    if (t != 0) s.bits[static_cast<size_t>(byte)] |= static_cast<unsigned char>(1u << (at % 8));
    ++at;
  }
  // Spill the whole bytes (all but a partial last one) once the buffer is large.
  if (s.bits.size() >= TokenFileWriter::State::kBufferBytes) {
    if (!s.mask_spill_created) {
      if (const int err = s.mask_spill.create())
        return s.failed = Status::io_error("cannot create a temporary file next to " + s.path + ": " + errno_text(err));
      s.mask_spill_created = true;
    }
    const size_t whole = at % 8 == 0 ? s.bits.size() : s.bits.size() - 1;
    if (const int err = write_all(s.mask_spill.fd(), s.bits.data(), whole)) return s.write_error(s.mask_spill.name(), err);
    s.mask_spilled += static_cast<int64_t>(whole);
    s.bits.erase(s.bits.begin(), s.bits.begin() + static_cast<std::ptrdiff_t>(whole));
  }
  return Status::ok_status();
}
}  // namespace

Status TokenFileWriter::finish() {
  State& s = *s_;
  if (s.closed) return Status::invalid_argument("finish() of " + s.path + " a second time");
  s.closed = true;
  struct DiscardSpill {
    TempFile& f;
    ~DiscardSpill() { f.discard(); }
  } discard_spill{s.spill};
  if (!s.failed.ok()) return s.failed;
  if (Status e = s.flush(); !e.ok()) return e;
  int err = 0;
  if (s.index) {  // version 2: the document count, then the starts (spilled ones first)
    unsigned char m[8];
    put_u64(m, static_cast<uint64_t>(s.spilled) + s.starts.size());
    err = write_all(s.tmp.fd(), m, 8);
    if (err == 0 && s.spilled > 0) {
      std::vector<unsigned char> chunk(State::kBufferBytes);
      for (int64_t off = 0; err == 0 && off < 8 * s.spilled;) {
        const auto n = static_cast<size_t>(std::min(static_cast<int64_t>(chunk.size()), 8 * s.spilled - off));
        const int r = pread_all(s.spill.fd(), chunk.data(), n, off);
        if (r != 0) return Status::io_error("reading back " + s.spill.name() + " failed" + s.keep);
        err = write_all(s.tmp.fd(), chunk.data(), n);
        off += static_cast<int64_t>(n);
      }
    }
    if (err == 0 && !s.starts.empty()) {
      std::vector<unsigned char> raw(8 * s.starts.size());
      for (size_t d = 0; d < s.starts.size(); ++d) put_u64(raw.data() + 8 * d, static_cast<uint64_t>(s.starts[d]));
      err = write_all(s.tmp.fd(), raw.data(), raw.size());
    }
  }
  if (err == 0 && s.mask) {  // version 3: the loss mask, ceil(N / 8) bytes (spilled ones first)
    struct DiscardMask {
      TempFile& f;
      ~DiscardMask() { f.discard(); }
    } discard_mask{s.mask_spill};
    std::vector<unsigned char> chunk(State::kBufferBytes);
    for (int64_t off = 0; err == 0 && off < s.mask_spilled;) {
      const auto n = static_cast<size_t>(std::min(static_cast<int64_t>(chunk.size()), s.mask_spilled - off));
      if (pread_all(s.mask_spill.fd(), chunk.data(), n, off) != 0)
        return Status::io_error("reading back " + s.mask_spill.name() + " failed" + s.keep);
      err = write_all(s.tmp.fd(), chunk.data(), n);
      off += static_cast<int64_t>(n);
    }
    if (err == 0 && !s.bits.empty()) err = write_all(s.tmp.fd(), s.bits.data(), s.bits.size());
  }
  if (err == 0) {  // the header's token count
    unsigned char c[8];
    put_u64(c, static_cast<uint64_t>(s.count));
    errno = 0;
    if (::pwrite(s.tmp.fd(), c, 8, 16) != 8) err = errno != 0 ? errno : EIO;
  }
  if (err != 0) return s.write_error(s.tmp.name(), err);
  if (::fsync(s.tmp.fd()) != 0)
    return Status::io_error("flushing " + s.tmp.name() + " failed: " + errno_text(errno) + s.keep);
  if (const int cerr = s.tmp.close())
    return Status::io_error("closing " + s.tmp.name() + " failed: " + errno_text(cerr) + s.keep);
  if (std::rename(s.tmp.name().c_str(), s.path.c_str()) != 0)
    return Status::io_error("cannot rename " + s.tmp.name() + " to " + s.path + ": " + errno_text(errno) +
                            "; check that " + s.path + " is not a directory" + s.keep);
  s.tmp.renamed();
  // Make the rename itself durable; a failure here loses nothing that was promised.
  const int dfd = ::open(dir_of(s.path).c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok_status();
}

int64_t TokenFileWriter::tokens() const { return s_->count; }
int64_t TokenFileWriter::documents() const { return s_->spilled + static_cast<int64_t>(s_->starts.size()); }
int TokenFileWriter::width_bytes() const { return s_->width; }
const std::string& TokenFileWriter::path() const { return s_->path; }

Status write_token_file(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size,
                        int width_bytes, std::span<const int64_t> doc_starts) {
  // Every argument is checked before anything is created.
  if (Status s = check_width_and_vocab(path, width_bytes, vocab_size); !s.ok()) return s;
  if (const size_t i = first_bad_token(tokens, vocab_size); i < tokens.size())
    return Status::invalid_argument("token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                                    ", outside [0, " + std::to_string(vocab_size) + "); nothing was written to " +
                                    path + ": fix the tokens or the vocab size");
  for (size_t d = 0; d < doc_starts.size(); ++d) {
    const bool ok = d == 0 ? doc_starts[0] == 0 : doc_starts[d] > doc_starts[d - 1];
    if (!ok || doc_starts[d] >= static_cast<int64_t>(tokens.size()))
      return Status::invalid_argument("document start " + std::to_string(d) + " is " + std::to_string(doc_starts[d]) +
                                      ": starts must begin at 0 and increase strictly below the token count (" +
                                      std::to_string(tokens.size()) + "); nothing was written to " + path);
  }
  StatusOr<TokenFileWriter> w = TokenFileWriter::create(
      path, vocab_size, TokenFileWriter::Options{.width_bytes = width_bytes, .document_index = !doc_starts.empty()});
  if (!w.ok()) return w.status();
  TokenFileWriter writer = std::move(w).value();
  if (doc_starts.empty()) {
    if (Status s = writer.append(tokens); !s.ok()) return s;
  }
  for (size_t d = 0; d < doc_starts.size(); ++d) {
    const auto begin = static_cast<size_t>(doc_starts[d]);
    const size_t end = d + 1 < doc_starts.size() ? static_cast<size_t>(doc_starts[d + 1]) : tokens.size();
    if (Status s = writer.append_document(tokens.subspan(begin, end - begin)); !s.ok()) return s;
  }
  return writer.finish();
}

StatusOr<TokenFile> TokenFile::open(const std::string& path) {
  const std::string redo = "; re-create it (write_token_file, or convert text with text_files_to_token_file)";
  struct stat pst;
  if (::stat(path.c_str(), &pst) == 0 && S_ISDIR(pst.st_mode))
    return Status::invalid_argument(path + " is a directory, not a token file; name the file");
  StatusOr<int> opened = open_regular_file(path, "token file");  // (a FIFO or a device: refused)
  if (!opened.ok()) return opened.status();
  const int fd = opened.value();
  // From here the TokenFile owns fd, so every early return closes it.
  TokenFile file(path, fd, 0, 0, 0);

  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::io_error("cannot stat " + path + ": " + errno_text(errno));
  const int64_t file_bytes = st.st_size;
  const std::string not_ours = path + " is not an untied token file";
  const std::string hint = "; pass a file written by write_token_file, or use data kind 'text' for plain text";
  if (file_bytes < kTokenFileHeaderBytes)
    return Status::corrupt(not_ours + " (" + std::to_string(file_bytes) + " bytes, shorter than the " +
                           std::to_string(kTokenFileHeaderBytes) + "-byte header)" + hint);
  unsigned char h[kTokenFileHeaderBytes];
  if (const int err = pread_all(fd, h, sizeof h, 0))
    return Status::io_error("cannot read the header of " + path + ": " +
                            (err < 0 ? std::string("unexpected end of file") : errno_text(err)));
  if (std::memcmp(h, kTokenFileMagic, 8) != 0) return Status::corrupt(not_ours + " (bad magic bytes)" + hint);

  const uint32_t version = get_u32(h + 8);
  if (version < 1 || version > 3)
    return Status::unsupported(path + " has token file format version " + std::to_string(version) +
                               "; this build reads versions 1 to 3" +
                               ": re-create the file with this build, or use the build that wrote it");
  const uint32_t width = get_u32(h + 12);
  if (width != 2 && width != 4)
    return Status::corrupt(path + ": token width " + std::to_string(width) +
                           " bytes in the header (must be 2 or 4); the file is corrupt" + redo);
  const uint64_t count = get_u64(h + 16);
  const uint64_t vocab = get_u64(h + 24);
  if (vocab == 0) return Status::corrupt(path + ": vocab size 0 in the header; the file is corrupt" + redo);
  if (vocab > static_cast<uint64_t>(kMaxVocab) || (width == 2 && vocab > 65536))
    return Status::corrupt(path + ": vocab size " + std::to_string(vocab) + " does not fit " +
                           std::to_string(width) + "-byte tokens (or exceeds 2^31 - 1); the file is corrupt" + redo);
  const uint64_t payload = static_cast<uint64_t>(file_bytes - kTokenFileHeaderBytes);
  // Versions 2 and 3: the document index follows the tokens (then, in 3, the loss mask).
  uint64_t index_bytes = 0;
  const uint64_t mask_bytes = version == 3 ? (count + 7) / 8 : 0;
  if (version >= 2 && count <= payload / width && payload - count * width >= 8) {
    unsigned char m[8];
    if (const int err = pread_all(fd, m, 8, static_cast<off_t>(kTokenFileHeaderBytes + count * width)))
      return Status::io_error("cannot read the document index of " + path);
    const uint64_t docs = get_u64(m);
    if (docs > (payload - count * width - 8 - std::min(mask_bytes, payload - count * width - 8)) / 8 ||
        (count > 0 && docs == 0))
      return Status::corrupt(path + ": the document index says " + std::to_string(docs) +
                             " documents, which the file does not hold; it is truncated or corrupt" + redo);
    index_bytes = 8 + 8 * docs;
    std::vector<unsigned char> raw(8 * docs);
    if (docs > 0 &&
        pread_all(fd, raw.data(), raw.size(), static_cast<off_t>(kTokenFileHeaderBytes + count * width + 8)) != 0)
      return Status::io_error("cannot read the document index of " + path);
    file.doc_starts_.resize(docs);
    for (uint64_t d = 0; d < docs; ++d) {
      const uint64_t at = get_u64(raw.data() + 8 * d);
      if (at >= count || (d == 0 ? at != 0 : at <= static_cast<uint64_t>(file.doc_starts_[d - 1])))
        return Status::corrupt(path + ": document start " + std::to_string(d) + " (" + std::to_string(at) +
                               ") does not begin at 0 and increase strictly below the token count; the file is corrupt" +
                               redo);
      file.doc_starts_[d] = static_cast<int64_t>(at);
    }
  } else if (version >= 2 && count <= payload / width) {
    return Status::corrupt(path + ": a version " + std::to_string(version) +
                           " file without its document index; it is truncated or corrupt" + redo);
  }
  if (count > payload / width || count * width + index_bytes + mask_bytes != payload)
    return Status::corrupt(path + ": the header says " + std::to_string(count) + " tokens of " +
                           std::to_string(width) + " bytes (" + std::to_string(kTokenFileHeaderBytes) +
                           " + " + std::to_string(count) + "*" + std::to_string(width) + " bytes) but the file has " +
                           std::to_string(file_bytes) + " bytes; it is truncated or corrupt" + redo);
  file.width_ = static_cast<int>(width);
  file.count_ = static_cast<int64_t>(count);
  file.vocab_ = static_cast<int64_t>(vocab);
  file.version_ = static_cast<int>(version);
  file.mask_offset_ = version == 3 ? static_cast<int64_t>(kTokenFileHeaderBytes + count * width + index_bytes) : -1;
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), width_(other.width_), count_(other.count_),
      vocab_(other.vocab_), version_(other.version_), mask_offset_(other.mask_offset_),
      doc_starts_(std::move(other.doc_starts_)) {
  other.fd_ = -1;
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    width_ = other.width_;
    count_ = other.count_;
    vocab_ = other.vocab_;
    version_ = other.version_;
    mask_offset_ = other.mask_offset_;
    doc_starts_ = std::move(other.doc_starts_);
    other.fd_ = -1;
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status TokenFile::read(int64_t start, int64_t count, int32_t* out) const {
  UNTIED_CHECK(start >= 0 && count >= 0 && start <= count_ - count, "read of tokens [", start, ", ", start + count,
               ") is outside ", path_, " (", count_, " tokens)");
  if (count == 0) return Status::ok_status();
  UNTIED_CHECK(out != nullptr, "read into a null buffer");
  // The raw bytes land in out itself and are widened in place: decoding from the last token
  // down never overwrites bytes that are still to be read (token i's bytes start at i*w <= 4i).
  unsigned char* raw = reinterpret_cast<unsigned char*>(out);
  const off_t offset = static_cast<off_t>(kTokenFileHeaderBytes + start * width_);
  if (const int err = pread_all(fd_, raw, static_cast<size_t>(count * width_), offset)) {
    if (err < 0)
      return Status::corrupt(path_ + " ended before token " + std::to_string(start + count - 1) +
                             "; it was truncated after it was opened: re-create it");
    return Status::io_error("reading tokens [" + std::to_string(start) + ", " + std::to_string(start + count) +
                            ") of " + path_ + " failed: " + errno_text(err));
  }
  for (int64_t i = count - 1; i >= 0; --i) {
    const unsigned char* p = raw + i * width_;
    const uint32_t t = width_ == 2 ? static_cast<uint32_t>(p[0] | (p[1] << 8)) : get_u32(p);
    out[i] = static_cast<int32_t>(t);  // t < vocab <= 2^31 - 1 once checked below
    if (t >= static_cast<uint64_t>(vocab_))
      return Status::corrupt(path_ + ": the token at position " + std::to_string(start + i) + " is " +
                             std::to_string(t) + ", not below the vocab size " + std::to_string(vocab_) +
                             "; the file is corrupt: re-create it");
  }
  return Status::ok_status();
}

Status TokenFile::read_targets(int64_t start, int64_t count, uint8_t* out) const {
  UNTIED_CHECK(start >= 0 && count >= 0 && start <= count_ - count, "read of the mask of tokens [", start, ", ",
               start + count, ") is outside ", path_, " (", count_, " tokens)");
  if (count == 0) return Status::ok_status();
  if (mask_offset_ < 0) {
    std::fill_n(out, count, uint8_t{1});
    return Status::ok_status();
  }
  const int64_t first = start / 8, last = (start + count - 1) / 8;
  std::vector<unsigned char> raw(static_cast<size_t>(last - first + 1));
  if (const int err = pread_all(fd_, raw.data(), raw.size(), static_cast<off_t>(mask_offset_ + first)))
    return err < 0 ? Status::corrupt(path_ + " ended inside its loss mask; it was truncated after it was opened: re-create it")
                   : Status::io_error("reading the loss mask of " + path_ + " failed: " + errno_text(err));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t t = start + i;
    out[i] = (raw[static_cast<size_t>(t / 8 - first)] >> (t % 8)) & 1u;
  }
  return Status::ok_status();
}

}  // namespace untied
