#include "untied/core/input_reader.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "untied/core/file_io.h"

namespace untied {

namespace {

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool ends_with_lower(const std::string& s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i) {
    char c = s[s.size() - suffix.size() + i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != suffix[i]) return false;
  }
  return true;
}

std::string shown(std::string_view path) { return path == "-" ? "standard input" : "input " + std::string(path); }

// "TOOL -dc F | untied prepare ... -", or with standard input "... | TOOL -dc | untied prepare ... -".
std::string piped(std::string_view tool, std::string_view path) {
  if (path == "-") return "... | " + std::string(tool) + " | untied prepare ... -";
  return std::string(tool) + " " + std::string(path) + " | untied prepare ... -";
}

bool is_gzip(std::string_view h) { return starts_with(h, "\x1f\x8b"); }
bool is_zstd(std::string_view h) {
  if (starts_with(h, "\x28\xb5\x2f\xfd")) return true;
  // A skippable frame: 0x184D2A50..0x184D2A5F, little-endian.
  return h.size() >= 4 && (static_cast<unsigned char>(h[0]) & 0xf0) == 0x50 && h.substr(1, 3) == "\x2a\x4d\x18";
}

// What the first bytes of a file say it is, when they say it: a name ("xz data") and what to do.
struct Known {
  std::string what;
  std::string advice;
};

// Formats that InputReader does not decompress: archives and other compressors.
std::optional<Known> identify_archive(std::string_view h, std::string_view path) {
  using namespace std::string_view_literals;
  if (starts_with(h, "\xfd\x37\x7a\x58\x5a\x00"sv))
    return Known{"xz-compressed data", "decompress it first: " + piped("xz -dc", path)};
  if (h.size() >= 10 && starts_with(h, "BZh") && h[3] >= '1' && h[3] <= '9' &&
      (h.substr(4, 6) == "\x31\x41\x59\x26\x53\x59" || h.substr(4, 6) == "\x17\x72\x45\x38\x50\x90"))
    return Known{"bzip2-compressed data", "decompress it first: " + piped("bzip2 -dc", path)};
  if (starts_with(h, "PK\x03\x04") || starts_with(h, "PK\x05\x06"))
    return Known{"a zip archive", "extract its text first: " + piped("unzip -p", path)};
  if (starts_with(h, "\x37\x7a\xbc\xaf\x27\x1c"))
    return Known{"a 7z archive", "extract its text first: " + piped("7z x -so", path)};
  if (starts_with(h, "\x04\x22\x4d\x18"))
    return Known{"lz4-compressed data", "decompress it first: " + piped("lz4 -dc", path)};
  if (h.size() >= 265 && (h.substr(257, 6) == "ustar\0"sv || h.substr(257, 8) == "ustar  \0"sv))
    return Known{"a tar archive", "extract its files (tar -xf) and give them to untied prepare, or stream them: " +
                                      piped("tar -xOf", path)};
  return std::nullopt;
}

// Everything identify_archive knows, plus the compressors InputReader reads (found inside an
// input: compressed twice) and binary formats of this field.
std::optional<Known> identify(std::string_view h, std::string_view path) {
  using namespace std::string_view_literals;
  if (is_gzip(h))
    return Known{"gzip-compressed data (compressed twice?)",
                 "decompress one layer first: " + piped("gzip -dc", path) + " (untied prepare reads the other)"};
  if (is_zstd(h))
    return Known{"zstd-compressed data (compressed twice?)",
                 "decompress one layer first: " + piped("zstd -dc", path) + " (untied prepare reads the other)"};
  if (auto k = identify_archive(h, path)) return k;
  // The magic of token_file.h's files (core cannot include train/).
  if (starts_with(h, "UNTIEDTK"))
    return Known{"an untied token file (already tokenized)",
                 "train on it as it is: untied train --data tokens --data-path " + std::string(path)};
  if (h.size() >= 9 && h[8] == '{' && h.substr(5, 3) == "\0\0\0"sv)  // u64 header length, then JSON
    return Known{"a safetensors file (tensors, not text)", "give untied prepare the text files instead"};
  if (starts_with(h, "PAR1"))
    return Known{"a Parquet file", "export its text column to JSONL first (pandas: df.to_json(F, orient='records', "
                                   "lines=True)) and prepare that with --format jsonl"};
  if (starts_with(h, "ARROW1") || starts_with(h, "\xff\xff\xff\xff"))
    return Known{"an Arrow file (a Hugging Face datasets cache file?)",
                 "export its text to JSONL first (datasets: ds.to_json('F.jsonl')) and prepare that"};
  if (starts_with(h, "\x93NUMPY")) return Known{"a NumPy array (.npy)", "give untied prepare the text files instead"};
  if (h.size() >= 2 && h[0] == '\x80' && h[1] >= 2 && h[1] <= 5)
    return Known{"a Python pickle", "give untied prepare the text files instead"};
  if (starts_with(h, "\x7f" "ELF")) return Known{"an executable (ELF)", "give untied prepare the text files instead"};
  const auto ascii = [&](size_t i) { return (h[i] >= ' ' && h[i] <= '~') || h[i] == '\n' || h[i] == '\t'; };
  if (starts_with(h, "\xff\xfe") || starts_with(h, "\xfe\xff") ||
      (h.size() >= 4 && ascii(0) && h[1] == 0 && ascii(2) && h[3] == 0) ||
      (h.size() >= 4 && h[0] == 0 && ascii(1) && h[2] == 0 && ascii(3)))
    return Known{"UTF-16 text", "convert it to UTF-8 first: " + piped("iconv -f UTF-16 -t UTF-8", path)};
  return std::nullopt;
}

// The length of the valid UTF-8 sequence at s[i], 0 when the bytes there are not one, or -1 when
// a sequence that may be valid is cut by the end of s.
int utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  int len;
  unsigned lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -1;
    const unsigned x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xbf)) return 0;
  }
  return len;
}

// decoded_from: "gzip" when the block is what a gzip file held ("" when it is the file's own bytes).
Status binary(std::string_view block, std::string_view path, std::string_view decoded_from, const std::string& why) {
  std::string msg = shown(path);
  if (!decoded_from.empty()) msg += ", once " + std::string(decoded_from) + "-decompressed,";
  msg += " looks binary, not text (" + why + ")";
  if (auto k = identify(block, path)) {
    msg += ": it looks like " + k->what + "; " + k->advice;
  } else {
    msg += ": untied prepare reads UTF-8 text or JSONL; if it is text in another encoding, convert it to UTF-8 "
           "first (" + piped("iconv -f LATIN1 -t UTF-8", path) + ")";
  }
  return Status::invalid_argument(msg);
}

Status check_text_of(std::string_view block, std::string_view path, std::string_view decoded_from) {
  if (const size_t nul = block.find('\0'); nul != std::string_view::npos)
    return binary(block, path, decoded_from, "a NUL byte at byte " + std::to_string(nul));
  int64_t invalid = 0;
  for (size_t i = 0; i < block.size();) {
    const int len = utf8_length(block, i);
    if (len < 0) break;  // cut by the end of the block
    if (len == 0) {
      ++invalid;
      ++i;
    } else {
      i += static_cast<size_t>(len);
    }
  }
  const double share = block.empty() ? 0.0 : static_cast<double>(invalid) / static_cast<double>(block.size());
  if (invalid > kTextMaxInvalidFloor && share > kTextMaxInvalidShare) {
    const int pct = static_cast<int>(share * 100 + 0.5);
    return binary(block, path, decoded_from,
                  std::to_string(invalid) + " of its first " + std::to_string(block.size()) + " bytes (" +
                      std::to_string(pct) + "%) are not UTF-8, more than the 1% a text file may hold");
  }
  return Status::ok_status();
}

}  // namespace

Status check_text(std::string_view first_block, std::string_view path) {
  return check_text_of(first_block, path, "");
}

// ---- the reader's owned pieces ----

struct InputReader::Gzip {
  z_stream z{};
};

void InputReader::GzipDeleter::operator()(Gzip* g) const {
  inflateEnd(&g->z);
  delete g;
}

void InputReader::ZstdDeleter::operator()(void* d) const { ZSTD_freeDStream(static_cast<ZSTD_DStream*>(d)); }

InputReader::Fd::Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)), owned(std::exchange(o.owned, false)) {}

InputReader::Fd& InputReader::Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (owned && fd >= 0) ::close(fd);
    fd = std::exchange(o.fd, -1);
    owned = std::exchange(o.owned, false);
  }
  return *this;
}

InputReader::Fd::~Fd() {
  if (owned && fd >= 0) ::close(fd);
}

InputReader::InputReader(InputReader&&) noexcept = default;
InputReader& InputReader::operator=(InputReader&&) noexcept = default;
InputReader::~InputReader() = default;

std::string InputReader::name() const { return shown(path_); }

std::string_view InputReader::compression() const {
  switch (compression_) {
    case Compression::kNone: return "none";
    case Compression::kGzip: return "gzip";
    case Compression::kZstd: return "zstd";
  }
  return "none";
}

StatusOr<InputReader> InputReader::open(const std::string& path) {
  InputReader r;
  r.path_ = path;
  struct stat st;
  if (path == "-") {
    if (::isatty(0))
      return Status::invalid_argument(
          "standard input is a terminal: pipe the text in (cat F | untied prepare ... -) or name the files");
    r.fd_ = Fd(0, /*owned=*/false);
    if (::fstat(0, &st) == 0 && S_ISREG(st.st_mode)) r.size_bytes_ = st.st_size;
  } else {
    StatusOr<int> fd = open_regular_file(path, "input");
    if (!fd.ok() && fd.status().code() == Status::Code::kNotFound)
      return Status::not_found("cannot open input " + path + ": " + std::strerror(errno) + "; check the path");
    if (!fd.ok()) return fd.status();
    r.fd_ = Fd(fd.value(), /*owned=*/true);
    if (::fstat(r.fd_.fd, &st) != 0)
      return Status::io_error(r.name() + ": cannot stat it (" + std::strerror(errno) + ")");
    r.size_bytes_ = st.st_size;
  }
  r.in_ = std::make_unique<char[]>(kReadBufferBytes);
  if (Status s = r.start(); !s.ok()) return s;
  return r;
}

StatusOr<size_t> InputReader::read_fd(char* buf, size_t n) {
  for (;;) {
    const ssize_t r = ::read(fd_.fd, buf, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // a non-blocking standard input: wait
      pollfd p{fd_.fd, POLLIN, 0};
      ::poll(&p, 1, -1);
      continue;
    }
    if (r < 0) return Status::io_error("reading " + name() + " failed: " + std::strerror(errno));
    if (r == 0) eof_ = true;
    raw_read_ += r;
    return static_cast<size_t>(r);
  }
}

Status InputReader::fill(size_t need) {
  need = std::min(need, kReadBufferBytes);
  if (in_pos_ > 0) {
    std::memmove(in_.get(), in_.get() + in_pos_, in_end_ - in_pos_);
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }
  while (!eof_ && in_end_ < need) {
    StatusOr<size_t> r = read_fd(in_.get() + in_end_, kReadBufferBytes - in_end_);
    if (!r.ok()) return r.status();
    in_end_ += r.value();
  }
  return Status::ok_status();
}

Status InputReader::start() {
  // 265 bytes reach tar's magic at 257; 512 is one tar header.
  if (Status s = fill(512); !s.ok()) return s;
  const std::string_view head(in_.get(), in_end_);
  if (auto k = identify_archive(head, path_))
    return Status::invalid_argument(name() + " is " + k->what + ", which untied prepare does not read: " + k->advice);
  if (is_gzip(head)) {
    compression_ = Compression::kGzip;
  } else if (is_zstd(head)) {
    compression_ = Compression::kZstd;
  }
  const bool named_gzip = ends_with_lower(path_, ".gz");
  const bool named_zstd = ends_with_lower(path_, ".zst") || ends_with_lower(path_, ".zstd");
  if ((named_gzip && compression_ != Compression::kGzip) || (named_zstd && compression_ != Compression::kZstd)) {
    const std::string named = named_gzip ? "gzip (.gz)" : "zstd (.zst)";
    const std::string is = compression_ == Compression::kNone ? "its bytes are not compressed"
                                                              : "its bytes are " + std::string(compression()) + " data";
    return Status::invalid_argument(name() + " is named as " + named + " but " + is +
                                    (head.empty() ? " (it is empty)" : "") +
                                    ": rename it to what it holds, or recompress it");
  }
  if (compression_ == Compression::kGzip) {
    gzip_.reset(new Gzip);
    // 16 + 15: gzip only (its header and trailer checked), windows up to 32 KiB.
    if (inflateInit2(&gzip_->z, 16 + MAX_WBITS) != Z_OK)
      return Status::io_error(name() + ": zlib could not start (out of memory?)");
  } else if (compression_ == Compression::kZstd) {
    ZSTD_DStream* d = ZSTD_createDStream();
    if (d == nullptr) return Status::io_error(name() + ": libzstd could not start (out of memory?)");
    zstd_.reset(d);
    ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, 27);
  }
  // The first block, decoded and checked before anything is handed out.
  first_.resize(kTextCheckBytes);
  size_t got = 0;
  while (got < first_.size()) {
    StatusOr<size_t> n = decode(first_.data() + got, first_.size() - got);
    if (!n.ok()) return n.status();
    if (n.value() == 0) break;
    got += n.value();
  }
  first_.resize(got);
  return check_text_of(first_, path_, compression_ == Compression::kNone ? std::string_view() : compression());
}

StatusOr<size_t> InputReader::read(char* buf, size_t n) {
  UNTIED_CHECK(n > 0, "InputReader::read of 0 bytes: a 0 would read as the end of ", name());
  if (first_pos_ < first_.size()) {
    const size_t k = std::min(n, first_.size() - first_pos_);
    std::memcpy(buf, first_.data() + first_pos_, k);
    first_pos_ += k;
    if (first_pos_ == first_.size()) {
      first_ = std::string();  // release the first block's memory
      first_pos_ = 0;
    }
    return k;
  }
  return decode(buf, n);
}

StatusOr<size_t> InputReader::decode(char* buf, size_t n) {
  switch (compression_) {
    case Compression::kNone: return decode_none(buf, n);
    case Compression::kGzip: return decode_gzip(buf, n);
    case Compression::kZstd: return decode_zstd(buf, n);
  }
  return decode_none(buf, n);
}

StatusOr<size_t> InputReader::decode_none(char* buf, size_t n) {
  if (in_pos_ == in_end_) {
    if (eof_) return size_t{0};
    if (n >= kReadBufferBytes) return read_fd(buf, n);  // large reads skip the buffer
    if (Status s = fill(1); !s.ok()) return s;
    if (in_pos_ == in_end_) return size_t{0};
  }
  const size_t k = std::min(n, in_end_ - in_pos_);
  std::memcpy(buf, in_.get() + in_pos_, k);
  in_pos_ += k;
  return k;
}

StatusOr<size_t> InputReader::decode_gzip(char* buf, size_t n) {
  z_stream& z = gzip_->z;
  const uInt out_room = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
  for (;;) {
    if (gzip_member_done_) {
      // After a member: the end, or another member (concatenated .gz files).
      if (in_end_ - in_pos_ < 2 && !eof_) {
        if (Status s = fill(2); !s.ok()) return s;
      }
      if (in_pos_ == in_end_ && eof_) return size_t{0};
      if (!is_gzip(std::string_view(in_.get() + in_pos_, in_end_ - in_pos_)))
        return Status::corrupt(name() + ": the bytes after the gzip member that ends at compressed byte " +
                               std::to_string(offset_of_buffered()) +
                               " are not another gzip member (trailing garbage): the file is damaged or "
                               "was appended to; check it with gzip -t");
      inflateReset(&z);
      gzip_member_done_ = false;
    }
    if (in_pos_ == in_end_ && !eof_) {
      if (Status s = fill(1); !s.ok()) return s;
    }
    const size_t avail = in_end_ - in_pos_;
    z.next_in = reinterpret_cast<Bytef*>(in_.get() + in_pos_);
    z.avail_in = static_cast<uInt>(avail);
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = out_room;
    const int ret = inflate(&z, Z_NO_FLUSH);
    const size_t consumed = avail - z.avail_in;
    const size_t produced = out_room - z.avail_out;
    in_pos_ += consumed;
    if (ret == Z_STREAM_END) {
      gzip_member_done_ = true;
    } else if (ret == Z_DATA_ERROR || ret == Z_NEED_DICT || ret == Z_STREAM_ERROR) {
      return Status::corrupt(name() + ": corrupt gzip data at compressed byte " + std::to_string(offset_of_buffered()) +
                             " (" + (z.msg != nullptr ? z.msg : "zlib error " + std::to_string(ret)) +
                             "): the file is damaged; fetch or compress it again (gzip -t checks a file)");
    } else if (ret == Z_MEM_ERROR) {
      return Status::io_error(name() + ": zlib ran out of memory");
    }
    if (produced > 0) return produced;
    if (!gzip_member_done_ && in_pos_ == in_end_ && eof_)
      return Status::corrupt(name() + " ends inside a gzip member after " + std::to_string(raw_read_) +
                             " compressed bytes: it is truncated (an interrupted download or copy?); fetch or "
                             "compress it again");
  }
}

StatusOr<size_t> InputReader::decode_zstd(char* buf, size_t n) {
  auto* d = static_cast<ZSTD_DStream*>(zstd_.get());
  for (;;) {
    if (in_pos_ == in_end_ && !eof_) {
      if (Status s = fill(1); !s.ok()) return s;
    }
    ZSTD_inBuffer in{in_.get() + in_pos_, in_end_ - in_pos_, 0};
    ZSTD_outBuffer out{buf, n, 0};
    const size_t ret = ZSTD_decompressStream(d, &out, &in);
    if (ZSTD_isError(ret)) {
      const int64_t at = offset_of_buffered() + static_cast<int64_t>(in.pos);
      std::string msg = name() + ": corrupt zstd data at compressed byte " + std::to_string(at) + " (" +
                        ZSTD_getErrorName(ret) + ")";
      if (ZSTD_getErrorCode(ret) == ZSTD_error_frameParameter_windowTooLarge)
        msg += ": its window is larger than the 128 MiB untied reads; decompress it first: " +
               piped("zstd -dc --long=31", path_);
      else
        msg += ": the file is damaged; fetch or compress it again (zstd -t checks a file)";
      return Status::corrupt(msg);
    }
    in_pos_ += in.pos;
    // 0: a frame ended and is flushed. A call that moves nothing (at the end of the input) says
    // only how much the next frame's header needs, so it leaves that state as it was.
    if (in.pos > 0 || out.pos > 0) zstd_frame_done_ = ret == 0;
    if (out.pos > 0) return out.pos;
    if (in_pos_ == in_end_ && eof_) {
      if (zstd_frame_done_) return size_t{0};
      return Status::corrupt(name() + " ends inside a zstd frame after " + std::to_string(raw_read_) +
                             " compressed bytes: it is truncated (an interrupted download or copy?); fetch or "
                             "compress it again");
    }
  }
}

}  // namespace untied
