// Token files: pre-tokenized training data with a small header, read a range at a time.
//
// Byte layout (every integer little-endian, whatever the host):
//     offset  size  field
//          0     8  magic, the ASCII bytes "UNTIEDTK"
//          8     4  u32 format version: 1 (one token stream), 2 (with a document index) or 3 (with
//                   a document index and a loss mask)
//         12     4  u32 token width in bytes: 2 (uint16 tokens) or 4 (uint32 tokens)
//         16     8  u64 token count N
//         24     8  u64 vocab size V (1 <= V <= 2^31 - 1; V <= 65536 when the width is 2)
//         32  N*w   the N tokens, each w bytes, each < V
//   version 2 only, the document index (packed documents):
//   32 + N*w     8  u64 document count M (>= 1 when N >= 1)
//   40 + N*w   8*M  u64 document starts: token indices, strictly increasing, the first 0, each < N
//   version 3 only, the loss mask (supervised fine-tuning: which tokens are trained on):
//   40 + N*w + 8*M  ceil(N/8)  bit t % 8 (least significant first) of byte t / 8: 1 when token t is
//                   a target (the loss of predicting it counts), 0 when it is context only (a
//                   prompt); the bits past N in the last byte are 0
// The file is exactly 32 + N*w bytes (version 1), 40 + N*w + 8*M bytes (version 2) or
// 40 + N*w + 8*M + ceil(N/8) bytes (version 3) long; anything else is reported as corrupt. A
// version 1 file is one stream with no boundaries; in versions 1 and 2 every token is a target.
//
// Writing is atomic: the bytes go to a temporary file next to the target, which is flushed
// (fsync) and renamed over the target only when complete. A failed write returns a Status,
// removes its temporary and leaves an existing file at the target untouched. write_token_file
// writes tokens held in memory; TokenFileWriter streams them, document by document, in bounded
// memory (the header's count is patched and the document index appended at finish()).
//
// Reading: TokenFile::open validates the header and the file size, and keeps the file open.
// read() fetches one range with pread (only those bytes; never the whole file) and checks each
// token against the vocab size. A TokenFile is immutable after open: read() may be called from
// several threads at once (in-process ranks share one).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "untied/core/status.h"

namespace untied {

inline constexpr char kTokenFileMagic[8] = {'U', 'N', 'T', 'I', 'E', 'D', 'T', 'K'};
inline constexpr uint32_t kTokenFileVersion = 3;  // the newest version; 1 and 2 are still read
inline constexpr int64_t kTokenFileHeaderBytes = 32;

// The narrowest supported width for a vocab size: 2 when vocab <= 65536, else 4.
int token_width_for_vocab(int64_t vocab_size);

// Writes tokens to path in the format above, atomically: version 2 with `doc_starts` as the
// document index when it is given, version 1 without.
// Returns invalid_argument (and writes nothing) when width_bytes is not 2 or 4, vocab_size is
// outside [1, 2^31 - 1] or does not fit the width, a token is negative or >= vocab_size (the
// message names its index), or doc_starts does not start at 0 and increase strictly below N.
// Returns io_error, with the target untouched, when the temporary cannot be created, written,
// flushed or renamed.
Status write_token_file(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size,
                        int width_bytes, std::span<const int64_t> doc_starts = {});

// Streams a token file to `path`, atomically, as write_token_file writes one: tokens go through
// a 1 MiB buffer into a temporary next to the target; finish() appends the document index,
// patches the header's token count, flushes and renames. Until finish() succeeds nothing is at
// the target (an existing file there is untouched); a writer destroyed before (or after a
// failed finish()) removes its temporary. Memory stays bounded: document starts beyond 2^20 are
// kept in a second temporary next to the target until finish().
// Documents: begin_document() makes the next appended token the start of a document; tokens
// appended before any begin_document() start document 0. A document that receives no token is
// not recorded (the index stays strictly increasing). Without a document index (version 1),
// begin_document() does nothing.
// Not thread-safe; move-only.
class TokenFileWriter {
 public:
  struct Options {
    int width_bytes = 0;          // 2 or 4; 0: token_width_for_vocab(vocab_size)
    bool document_index = true;   // version 2 (with the index) or 1
    bool loss_mask = false;       // version 3 (the index and a loss mask; needs document_index)
  };
  // Creates the temporary and writes a provisional header. Errors: invalid_argument for a width
  // that is not 2 or 4 or a vocab size outside [1, 2^31 - 1] or too large for the width (nothing
  // is created); io_error when the temporary cannot be created or written.
  static StatusOr<TokenFileWriter> create(const std::string& path, int64_t vocab_size, Options options);
  static StatusOr<TokenFileWriter> create(const std::string& path, int64_t vocab_size) {
    return create(path, vocab_size, Options{});
  }

  TokenFileWriter(TokenFileWriter&&) noexcept;
  TokenFileWriter& operator=(TokenFileWriter&&) noexcept;
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  ~TokenFileWriter();

  void begin_document();
  // Appends tokens to the current document. invalid_argument (and nothing of this call is
  // appended; the writer stays usable) when a token is negative or >= vocab_size, naming its
  // position in the file; io_error when writing fails (the writer is then failed: every later
  // call returns the same error, and the temporary is removed when the writer is destroyed).
  Status append(std::span<const int32_t> tokens);
  Status append_document(std::span<const int32_t> tokens) {
    begin_document();
    return append(tokens);
  }
  // Version 3: appends tokens with their loss mask (targets[i] != 0: token i is a target); plain
  // append() marks every token a target. invalid_argument when the writer has no mask or the
  // sizes differ.
  Status append(std::span<const int32_t> tokens, std::span<const uint8_t> targets);
  // Writes the index, patches the header, flushes and renames onto the target. Once called, the
  // writer is closed whatever the outcome; a second call returns invalid_argument.
  Status finish();

  int64_t tokens() const;     // appended so far
  int64_t documents() const;  // documents with at least one token so far (0 without an index)
  int width_bytes() const;
  const std::string& path() const;

 public:
  struct State;  // the writer's state (token_file.cc)

 private:
  explicit TokenFileWriter(std::unique_ptr<State> s);
  Status append_tokens(std::span<const int32_t> tokens, std::span<const uint8_t> targets);
  std::unique_ptr<State> s_;
};

class TokenFile {
 public:
  // Opens and validates path. Errors (each message names the file and what to do):
  //   not_found   the file cannot be opened;
  //   corrupt     shorter than the header or bad magic ("not an untied token file"), width not
  //               2 or 4, vocab size 0 or too large for the width, size not 32 + N*w
  //               (truncated or corrupt);
  //               a version 2 document index that is cut short, does not start at 0 or does not
//               increase strictly below N;
//   unsupported a format version other than 1 or 2.
  static StatusOr<TokenFile> open(const std::string& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // N, tokens in the file
  int64_t vocab_size() const { return vocab_; }
  int width_bytes() const { return width_; }
  int version() const { return version_; }
  // Version 2 and 3: the document starts (token indices; read and validated at open). Version 1: empty.
  const std::vector<int64_t>& document_starts() const { return doc_starts_; }
  // Version 3: the file has a loss mask.
  bool has_loss_mask() const { return mask_offset_ >= 0; }
  // out[i] = 1 when token start + i is a target, else 0 (every token is one without a mask).
  // Reads only the mask bytes of the range. REQUIRES as read().
  Status read_targets(int64_t start, int64_t count, uint8_t* out) const;

  // out[i] = token start + i, for i < count (overwrites out[0, count)). Reads count * width
  // bytes at offset 32 + start * width and nothing else.
  // REQUIRES: 0 <= start, 0 <= count, start + count <= size(); out holds count values.
  // Returns corrupt when a token is >= vocab_size() (the message names its position) or the
  // file has become shorter since open; io_error when the read itself fails.
  Status read(int64_t start, int64_t count, int32_t* out) const;

 private:
  TokenFile(std::string path, int fd, int width, int64_t count, int64_t vocab)
      : path_(std::move(path)), fd_(fd), width_(width), count_(count), vocab_(vocab) {}

  std::string path_;
  int fd_ = -1;
  int width_ = 0;
  int64_t count_ = 0;
  int64_t vocab_ = 0;
  int version_ = 1;
  int64_t mask_offset_ = -1;  // version 3: the byte offset of the loss mask
  std::vector<int64_t> doc_starts_;
};

}  // namespace untied
