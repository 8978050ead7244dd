// InputReader: the bytes of one text input (`untied prepare`'s files), decompressed when they
// are compressed, refused when they are not text.
//
// What it opens:
//   "-"         standard input (fd 0), whatever it is: a pipe, a redirected file, a socket. Not
//               closed by the reader. A terminal is refused (the read would wait for typing).
//   any other   a regular file, opened as open_regular_file (file_io.h) opens one: a FIFO, a
//               device, a directory or a socket is refused without blocking on it.
//
// Compression is recognised by the first bytes, never by the name, for files and standard input
// alike:
//   gzip  1f 8b          every member of a multi-member file (concatenated .gz files) is read;
//                        each member's CRC-32 and length are checked (zlib's inflate).
//   zstd  28 b5 2f fd    every frame of a multi-frame file, skippable frames (5? 2a 4d 18)
//                        included (ZSTD_decompressStream); windows up to 2^27 bytes.
//   none                 anything else, read as it is.
// A stream that ends inside a member or frame, or holds corrupt data, or a gzip member followed
// by bytes that are not another member, is an error naming the input and the compressed byte
// offset. A name ending in .gz, .zst or .zstd whose bytes are not that format is an error (a
// mislabelled file is more likely a mistake than a wish). Archives and other compressors that
// are recognised by their magic are refused, naming the format and a command that decompresses
// them into standard input: xz (fd 37 7a 58 5a 00), bzip2 ("BZh" + level + block magic), zip
// ("PK\3\4", "PK\5\6"), 7z (37 7a bc af 27 1c), lz4 (04 22 4d 18), tar ("ustar" + NUL or "  \0"
// at offset 257).
//
// Text only: open() decodes the first kTextCheckBytes of the (decompressed) data and refuses
// them with check_text() below when they are not text. Those bytes are then served by read()
// first; nothing is lost.
//
// Memory is bounded, whatever the input's size: a kReadBufferBytes buffer of compressed bytes,
// the kTextCheckBytes first block (released once read() has handed it out), and the
// decompressor's state (zlib about 44 KiB; zstd up to its frame's window, at most 128 MiB,
// 8 MiB or less for files written by `zstd` at levels 1-19 without --long).
//
// Errors are Statuses whose messages name the input ("input F", or "standard input") and say
// what to change: not_found (cannot open), invalid_argument (not a regular file, a terminal,
// a refused format, a name that disagrees with the bytes, binary data), corrupt (a truncated or
// damaged stream), io_error (a failed read). After read() has returned an error the reader
// must not be read again.
//
// Thread safety: none; one thread reads one reader. Move-only; the destructor closes what
// open() opened (never fd 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "untied/core/status.h"

namespace untied {

// Reading text: the share of a first block that may be invalid UTF-8 before it is called
// binary. Text in UTF-8 with a few damaged bytes (the tokenizer replaces each with U+FFFD)
// passes; random bytes (about 60% invalid), UTF-16 and most Latin-1 prose (2-4% accented letters)
// do not. A block is allowed kTextMaxInvalidFloor invalid bytes whatever its size, so that a
// short file with a stray Latin-1 byte or two still reads.
inline constexpr double kTextMaxInvalidShare = 0.01;
inline constexpr int64_t kTextMaxInvalidFloor = 8;
inline constexpr size_t kTextCheckBytes = size_t{64} << 10;
inline constexpr size_t kReadBufferBytes = size_t{64} << 10;

// Whether first_block (the first bytes of an input, after decompression) is text. Refused
// (invalid_argument) when it holds a NUL byte anywhere, or when more than kTextMaxInvalidShare
// of its bytes, and more than kTextMaxInvalidFloor, are not valid UTF-8 (a sequence cut by the
// end of the block is not counted). The message names `path` ("-" is standard input), says it
// looks binary and, when the first bytes say so, what it looks like (an untied token file,
// safetensors, Parquet, Arrow, NumPy, a pickle, an executable, UTF-16 text, or a compressed file
// or archive inside the input) and what to do instead. An empty block is text.
Status check_text(std::string_view first_block, std::string_view path);

class InputReader {
 public:
  // Opens `path` ("-": standard input), detects its compression from its first bytes and checks
  // that its first kTextCheckBytes (decompressed) are text. May block reading standard input
  // until those bytes or its end arrive. Errors as above.
  static StatusOr<InputReader> open(const std::string& path);

  InputReader(InputReader&&) noexcept;
  InputReader& operator=(InputReader&&) noexcept;
  InputReader(const InputReader&) = delete;
  InputReader& operator=(const InputReader&) = delete;
  ~InputReader();

  // Reads up to n (decompressed) bytes into buf; returns how many, 0 only at the end of the
  // input (after the last member or frame). Fewer than n does not mean the end.
  // REQUIRES: n > 0; no earlier read() returned an error.
  StatusOr<size_t> read(char* buf, size_t n);

  // The path given to open() ("-" for standard input).
  std::string_view path() const { return path_; }
  // "none", "gzip" or "zstd".
  std::string_view compression() const;
  // Bytes read from the file or standard input so far (compressed bytes when it is compressed):
  // the progress through size_bytes(). Runs ahead of what read() has handed out by up to
  // kReadBufferBytes + kTextCheckBytes.
  int64_t compressed_bytes_read() const { return raw_read_; }
  // The size of the file in bytes when open() found it (compressed), or -1 when standard input
  // is not a regular file (a pipe).
  int64_t size_bytes() const { return size_bytes_; }

 private:
  enum class Compression { kNone, kGzip, kZstd };
  struct Fd {
    int fd = -1;
    bool owned = false;
    Fd() = default;
    Fd(int f, bool o) : fd(f), owned(o) {}
    Fd(Fd&& o) noexcept;
    Fd& operator=(Fd&& o) noexcept;
    ~Fd();
  };
  struct Gzip;  // zlib's z_stream, kept at one address (zlib checks it)
  struct GzipDeleter {
    void operator()(Gzip* g) const;
  };
  struct ZstdDeleter {
    void operator()(void* d) const;
  };

  InputReader() = default;
  // "input F" or "standard input".
  std::string name() const;
  // One read(2) of the fd into buf (EINTR retried; a non-blocking fd waited on); 0 at its end.
  StatusOr<size_t> read_fd(char* buf, size_t n);
  // Reads more bytes from the fd until `need` bytes are buffered or the end; io_error on failure.
  Status fill(size_t need);
  int64_t offset_of_buffered() const { return raw_read_ - static_cast<int64_t>(in_end_ - in_pos_); }
  Status start();  // detection and the first-block text check, for open()
  StatusOr<size_t> decode(char* buf, size_t n);
  StatusOr<size_t> decode_none(char* buf, size_t n);
  StatusOr<size_t> decode_gzip(char* buf, size_t n);
  StatusOr<size_t> decode_zstd(char* buf, size_t n);

  std::string path_;
  Fd fd_;
  int64_t size_bytes_ = -1;
  int64_t raw_read_ = 0;
  bool eof_ = false;
  Compression compression_ = Compression::kNone;
  std::unique_ptr<char[]> in_;  // kReadBufferBytes of undecoded bytes: [in_pos_, in_end_)
  size_t in_pos_ = 0, in_end_ = 0;
  std::string first_;  // the checked first block, handed out from first_pos_ before anything else
  size_t first_pos_ = 0;
  std::unique_ptr<Gzip, GzipDeleter> gzip_;
  bool gzip_member_done_ = false;
  std::unique_ptr<void, ZstdDeleter> zstd_;  // a ZSTD_DStream
  bool zstd_frame_done_ = false;
};

}  // namespace untied
