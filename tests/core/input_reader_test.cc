// InputReader: plain, gzip and zstd inputs (one or several members or frames) read back byte for
// byte whatever the read size, from files and from standard input; truncated and damaged
// streams, mislabelled names, archives and binary data refused with messages that name the input
// and say what to do. The compressed fixtures are made here with zlib and libzstd.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "untied/core/input_reader.h"

namespace untied {
namespace {

// UTF-8 text of about `bytes` bytes: numbered lines with two- and three-byte characters.
std::string sample_text(size_t bytes) {
  std::string s;
  for (int i = 0; s.size() < bytes; ++i)
    s += "line " + std::to_string(i) + ": the quick brown fox, caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87, " +
         std::to_string(i * 7919 % 1000) + "\n";
  s.resize(bytes);
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xc0) == 0x80) s.pop_back();  // no cut character
  if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xc0) s.pop_back();
  return s;
}

// One gzip member holding `text` (zlib's deflate with a gzip wrapper).
std::string gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// One zstd frame holding `text`.
std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  out.resize(n);
  return out;
}

class InputReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "untied_input_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::string dir_;
};

// Everything the reader gives, read `chunk` bytes at a time, or the first error (of open or read).
StatusOr<std::string> read_all(const std::string& path, size_t chunk, std::string* compression = nullptr) {
  StatusOr<InputReader> opened = InputReader::open(path);
  if (!opened.ok()) return opened.status();
  InputReader r = std::move(opened).value();
  if (compression != nullptr) *compression = std::string(r.compression());
  std::string all;
  std::vector<char> buf(chunk);
  for (;;) {
    StatusOr<size_t> n = r.read(buf.data(), buf.size());
    if (!n.ok()) return n.status();
    if (n.value() == 0) break;
    EXPECT_LE(n.value(), chunk);
    all.append(buf.data(), n.value());
  }
  return all;
}

// The status of reading `path` to its end, which must fail; the message is checked for parts.
::testing::AssertionResult refused(const std::string& path, Status::Code code,
                                   std::initializer_list<std::string_view> parts) {
  StatusOr<std::string> r = read_all(path, 4096);
  if (r.ok()) return ::testing::AssertionFailure() << path << " was read (" << r.value().size() << " bytes)";
  if (r.status().code() != code) return ::testing::AssertionFailure() << "wrong code: " << r.status().to_string();
  for (std::string_view p : parts)
    if (r.status().message().find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks \"" << p << "\": " << r.status().message();
  return ::testing::AssertionSuccess() << r.status().message();
}

TEST_F(InputReaderTest, PlainTextReadsAsItIs) {
  const std::string text = sample_text(300 << 10);
  const std::string path = write("a.txt", text);
  StatusOr<InputReader> r = InputReader::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().compression(), "none");
  EXPECT_EQ(r.value().path(), path);
  EXPECT_EQ(r.value().size_bytes(), static_cast<int64_t>(text.size()));
  std::string c;
  StatusOr<std::string> all = read_all(path, 4096, &c);
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_TRUE(all.value() == text);
  EXPECT_EQ(c, "none");
}

TEST_F(InputReaderTest, GzipOneMemberAndSeveral) {
  const std::string a = sample_text(200 << 10), b = sample_text(3000), c = sample_text(70 << 10);
  std::string kind;
  StatusOr<std::string> one = read_all(write("one.jsonl.gz", gzip(a)), 4096, &kind);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(kind, "gzip");
  EXPECT_TRUE(one.value() == a);
  // Concatenated .gz files (cat a.gz b.gz > ab.gz), an empty member among them.
  StatusOr<std::string> three = read_all(write("three.gz", gzip(a) + gzip("") + gzip(b) + gzip(c)), 4096);
  ASSERT_TRUE(three.ok()) << three.status().message();
  EXPECT_TRUE(three.value() == a + b + c);
  // The name does not matter, only the bytes.
  StatusOr<std::string> unnamed = read_all(write("data.txt", gzip(b)), 4096, &kind);
  ASSERT_TRUE(unnamed.ok()) << unnamed.status().message();
  EXPECT_EQ(kind, "gzip");
  EXPECT_TRUE(unnamed.value() == b);
}

TEST_F(InputReaderTest, ZstdOneFrameAndSeveral) {
  const std::string a = sample_text(200 << 10), b = sample_text(5000);
  std::string kind;
  StatusOr<std::string> one = read_all(write("one.zst", zstd(a)), 4096, &kind);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(kind, "zstd");
  EXPECT_TRUE(one.value() == a);
  // Frames one after another, a skippable frame (magic 0x184D2A50, 4 bytes of payload) between.
  const std::string skippable("\x50\x2a\x4d\x18\x04\x00\x00\x00" "abcd", 12);
  StatusOr<std::string> frames = read_all(write("frames.zstd", zstd(a) + skippable + zstd("") + zstd(b)), 4096);
  ASSERT_TRUE(frames.ok()) << frames.status().message();
  EXPECT_TRUE(frames.value() == a + b);
}

TEST_F(InputReaderTest, OddReadSizesGiveTheSameBytes) {
  const std::string text = sample_text(150 << 10);
  for (const std::string& path : {write("p.txt", text), write("g.gz", gzip(text) + gzip(text)),
                                  write("z.zst", zstd(text) + zstd(text))}) {
    const std::string want = path.ends_with(".txt") ? text : text + text;
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
      StatusOr<std::string> got = read_all(path, chunk);
      ASSERT_TRUE(got.ok()) << path << ": " << got.status().message();
      EXPECT_TRUE(got.value() == want) << path << " read " << chunk << " bytes at a time: " << got.value().size()
                                       << " bytes, expected " << want.size();
    }
  }
}

TEST_F(InputReaderTest, EmptyInputsReadAsEmpty) {
  std::string kind;
  StatusOr<std::string> empty = read_all(write("empty.txt", ""), 7, &kind);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty.value(), "");
  EXPECT_EQ(kind, "none");
  empty = read_all(write("empty.gz", gzip("")), 7, &kind);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty.value(), "");
  EXPECT_EQ(kind, "gzip");
  empty = read_all(write("empty.zst", zstd("")), 7, &kind);
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty.value(), "");
  EXPECT_EQ(kind, "zstd");
}

// Standard input is a pipe here: the test puts one on fd 0 and a thread writes into it.
class StdinPipe {
 public:
  explicit StdinPipe(std::string bytes) {
    saved_ = ::dup(0);
    int p[2];
    EXPECT_EQ(::pipe(p), 0);
    ::dup2(p[0], 0);
    ::close(p[0]);
    writer_ = std::thread([fd = p[1], bytes = std::move(bytes)] {
      size_t off = 0;
      while (off < bytes.size()) {  // small writes: the reader sees short reads
        const ssize_t w = ::write(fd, bytes.data() + off, std::min<size_t>(1000, bytes.size() - off));
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
      ::close(fd);
    });
  }
  ~StdinPipe() {
    writer_.join();
    ::dup2(saved_, 0);
    ::close(saved_);
  }

 private:
  int saved_;
  std::thread writer_;
};

TEST(InputReaderStdin, PlainAndCompressedFromAPipe) {
  const std::string text = sample_text(180 << 10);
  struct Case {
    std::string bytes, kind;
  };
  for (const Case& c : {Case{text, "none"}, Case{gzip(text) + gzip(text), "gzip"}, Case{zstd(text), "zstd"}}) {
    const std::string want = c.kind == "gzip" ? text + text : text;
    std::string got;
    {
      StdinPipe in(c.bytes);
      StatusOr<InputReader> r = InputReader::open("-");
      ASSERT_TRUE(r.ok()) << r.status().message();
      InputReader reader = std::move(r).value();
      EXPECT_EQ(reader.compression(), c.kind);
      EXPECT_EQ(reader.path(), "-");
      EXPECT_EQ(reader.size_bytes(), -1);  // a pipe has no size
      std::vector<char> buf(4093);
      for (;;) {
        StatusOr<size_t> n = reader.read(buf.data(), buf.size());
        ASSERT_TRUE(n.ok()) << n.status().message();
        if (n.value() == 0) break;
        got.append(buf.data(), n.value());
      }
      EXPECT_EQ(reader.compressed_bytes_read(), static_cast<int64_t>(c.bytes.size()));
    }
    EXPECT_TRUE(got == want) << c.kind << ": " << got.size() << " bytes, expected " << want.size();
  }
}

TEST(InputReaderStdin, BinaryIsRefusedNamingStandardInput) {
  StdinPipe in(std::string("UNTIEDTK\x02\x00\x00\x00\x02\x00\x00\x00", 16) + std::string(64, '\x01'));
  StatusOr<InputReader> r = InputReader::open("-");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("standard input looks binary"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("untied token file"), std::string::npos) << r.status().message();
}

TEST_F(InputReaderTest, TruncatedStreamsNameTheFileAndTheOffset) {
  const std::string small = sample_text(2000), big = sample_text(400 << 10);
  const std::string gz = gzip(big), zs = zstd(big);
  // Cut inside the data of a large stream (found by read, after open) and inside a small one's
  // trailer (found by open, while it checks the first block).
  std::string path = write("cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt,
                      {path, "truncated", "after " + std::to_string(gz.size() / 2) + " compressed bytes"}));
  path = write("short.gz", gzip(small).substr(0, gzip(small).size() - 4));
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "ends inside a gzip member", "truncated"}));
  path = write("cut.zst", zs.substr(0, zs.size() / 2));
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt,
                      {path, "ends inside a zstd frame", "after " + std::to_string(zs.size() / 2) + " compressed"}));
  path = write("short.zst", zstd(small).substr(0, zstd(small).size() - 3));
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "truncated"}));
  // The second member cut.
  path = write("two.gz", gzip(small) + gzip(small).substr(0, 15));
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "truncated"}));
}

TEST_F(InputReaderTest, DamagedStreamsNameTheOffset) {
  const std::string text = sample_text(300 << 10);
  std::string gz = gzip(text);
  gz[gz.size() / 2] ^= 0x55;
  gz[gz.size() / 2 + 1] ^= 0x33;
  std::string path = write("bad.gz", gz);
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "corrupt gzip data at compressed byte"}));
  // A flipped bit in the trailer: the CRC check catches it.
  gz = gzip(text);
  gz[gz.size() - 6] ^= 0x01;
  path = write("crc.gz", gz);
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "corrupt gzip data", "incorrect data check"}));
  // Trailing bytes that are not another member.
  path = write("tail.gz", gzip(text) + "garbage");
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt,
                      {path, "member that ends at compressed byte " + std::to_string(gzip(text).size()),
                       "not another gzip member"}));
  std::string zs = zstd(text);
  zs[zs.size() / 2] ^= 0x55;
  zs[zs.size() / 2 + 7] ^= 0x55;
  path = write("bad.zst", zs);
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt, {path, "corrupt zstd data at compressed byte"}));
  path = write("tail.zst", zstd(text) + "garbage");
  EXPECT_TRUE(refused(path, Status::Code::kCorrupt,
                      {path, "corrupt zstd data at compressed byte " + std::to_string(zstd(text).size())}));
}

TEST_F(InputReaderTest, NamesThatDisagreeWithTheBytesAreRefused) {
  const std::string text = sample_text(1000);
  std::string path = write("valid.jsonl.gz", text);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "named as gzip", "not compressed"}));
  path = write("x.zst", gzip(text));
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "named as zstd", "gzip data"}));
  path = write("x.ZSTD", text);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "named as zstd"}));
  path = write("empty.gz", "");
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "named as gzip", "it is empty"}));
}

TEST_F(InputReaderTest, ArchivesAndOtherCompressorsAreRefusedWithACommand) {
  const std::string pad(600, 'x');
  std::string path = write("a.txt.xz", std::string("\xfd\x37\x7a\x58\x5a\x00\x00\x04", 8) + pad);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "xz-compressed", "xz -dc " + path + " | untied"}));
  path = write("a.zip", std::string("PK\x03\x04\x14\x00", 6) + pad);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "zip archive", "unzip -p"}));
  path = write("a.bz2", "BZh91AY&SY" + pad);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "bzip2", "bzip2 -dc"}));
  path = write("a.7z", std::string("\x37\x7a\xbc\xaf\x27\x1c\x00\x04", 8) + pad);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "7z archive"}));
  std::string tar(1024, '\0');
  tar.replace(0, 5, "a.txt");
  tar.replace(257, 6, std::string("ustar\0", 6));
  path = write("a.tar", tar);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "tar archive", "tar -xOf"}));
  // A tar inside gzip (.tar.gz) is refused as binary, naming the tar.
  path = write("a.tar.gz", gzip(tar));
  EXPECT_TRUE(
      refused(path, Status::Code::kInvalidArgument, {path, "gzip-decompressed", "looks binary", "tar archive"}));
  // Text that merely starts with "BZh" is text.
  StatusOr<std::string> bzh = read_all(write("bzh.txt", "BZh is not bzip2 here\n"), 64);
  ASSERT_TRUE(bzh.ok()) << bzh.status().message();
}

TEST_F(InputReaderTest, BinaryIsRefused) {
  std::string path = write("nul.txt", "text, then a NUL" + std::string(1, '\0') + "and more text\n");
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "looks binary", "a NUL byte at byte 16"}));
  std::mt19937 rng(7);
  std::string noise(64 << 10, '\0');
  for (char& c : noise) c = static_cast<char>(1 + rng() % 255);  // no NUL: the UTF-8 share decides
  path = write("noise.txt", noise);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "looks binary", "are not UTF-8", "iconv"}));
  // An untied token file (token_file.h's header: magic, version 2, width 2, counts).
  std::string tok("UNTIEDTK\x02\x00\x00\x00\x02\x00\x00\x00", 16);
  tok += std::string(16, '\0') + std::string(200, '\x05');
  path = write("train.tok", tok);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument,
                      {path, "untied token file", "untied train --data tokens --data-path " + path}));
  path = write("model.safetensors", std::string("\x40\x00\x00\x00\x00\x00\x00\x00{\"w\":{}}", 16) + noise);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "safetensors"}));
  path = write("data.parquet", "PAR1" + noise);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "Parquet"}));
  path = write("twice.gz", gzip(gzip(sample_text(5000))));
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "gzip-compressed data (compressed twice?)",
                                                            "gzip -dc " + path + " | untied prepare ... -"}));
  std::string utf16;
  for (char c : std::string("hello, world\n")) utf16 += std::string{c, '\0'};
  path = write("wide.txt", "\xff\xfe" + utf16);
  EXPECT_TRUE(refused(path, Status::Code::kInvalidArgument, {path, "UTF-16", "iconv -f UTF-16"}));
}

TEST_F(InputReaderTest, TextWithAFewBadBytesIsText) {
  // 0.1% of the bytes replaced with bytes that are never UTF-8 (0xff): text, read unchanged.
  std::string text = sample_text(100 << 10);
  for (size_t i = 500; i < text.size(); i += 1000) text[i] = '\xff';
  StatusOr<std::string> got = read_all(write("damaged.txt", text), 4096);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(got.value() == text);
  EXPECT_TRUE(check_text(text, "x").ok());
  // 2%: binary.
  for (size_t i = 250; i < text.size(); i += 50) text[i] = '\xff';
  EXPECT_FALSE(check_text(text, "x").ok());
  // A short file with two Latin-1 bytes (under the floor of 8) is still text.
  EXPECT_TRUE(check_text("caf\xe9 cr\xe8me\n", "menu.txt").ok());
  // A block that ends inside a character is not held against it; a lone continuation byte is.
  std::string cut(300, 'a');
  cut += "\xe4\xb8";
  EXPECT_TRUE(check_text(cut, "x").ok());
  // Overlong forms and surrogates count as invalid.
  std::string bad(100, 'a');
  for (int i = 0; i < 5; ++i) bad += "\xc0\xaf\xed\xa0\x80";  // 5 x (2 + 3) invalid bytes in 125
  Status s = check_text(bad, "bad.txt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("25 of its first 125 bytes (20%)"), std::string::npos) << s.message();
  EXPECT_TRUE(check_text("", "empty.txt").ok());
}

TEST_F(InputReaderTest, WhatIsNotAFileIsRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(refused(fifo, Status::Code::kInvalidArgument, {fifo, "FIFO"}));
  EXPECT_TRUE(refused(dir_, Status::Code::kInvalidArgument, {dir_, "directory"}));
  EXPECT_TRUE(refused(dir_ + "/missing.txt", Status::Code::kNotFound, {dir_ + "/missing.txt"}));
}

TEST_F(InputReaderTest, MovedReaderKeepsReading) {
  const std::string text = sample_text(100 << 10);
  StatusOr<InputReader> opened = InputReader::open(write("m.gz", gzip(text)));
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  InputReader a = std::move(opened).value();
  std::string got(10, '\0');
  ASSERT_EQ(a.read(got.data(), 10).value(), 10u);
  InputReader b = std::move(a);
  std::vector<char> buf(1 << 16);
  for (;;) {
    StatusOr<size_t> n = b.read(buf.data(), buf.size());
    ASSERT_TRUE(n.ok()) << n.status().message();
    if (n.value() == 0) break;
    got.append(buf.data(), n.value());
  }
  EXPECT_TRUE(got == text);
}

}  // namespace
}  // namespace untied
