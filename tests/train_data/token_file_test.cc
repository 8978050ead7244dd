// Token files: byte layout, round trips, atomic writes, and every corrupt-file case.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "train_data/data_test_util.h"
#include "untied/core/check.h"
#include "untied/train/token_file.h"

namespace untied {
namespace {

using Code = Status::Code;
using testing::fails_with;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::vector<int32_t> sample_tokens(int64_t n, int64_t vocab, uint32_t salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 0x12345678u + salt;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  if (n > 0) t[0] = static_cast<int32_t>(vocab - 1);  // the largest legal token is exercised
  return t;
}

uint64_t le(const std::string& bytes, size_t offset, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return v;
}

void put_le(std::string* bytes, size_t offset, uint64_t v, int width) {
  for (int i = 0; i < width; ++i) (*bytes)[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST(TokenFile, WidthForVocab) {
  EXPECT_EQ(token_width_for_vocab(259), 2);
  EXPECT_EQ(token_width_for_vocab(65536), 2);
  EXPECT_EQ(token_width_for_vocab(65537), 4);
  EXPECT_EQ(token_width_for_vocab(151936), 4);
}

TEST(TokenFile, ByteLayoutAndRoundTrip) {
  TempDir dir;
  struct Case {
    int width;
    int64_t vocab;
  };
  for (Case c : {Case{2, 300}, Case{2, 65536}, Case{4, 128256}, Case{4, 2147483647}}) {
    SCOPED_TRACE("width " + std::to_string(c.width) + " vocab " + std::to_string(c.vocab));
    const std::vector<int32_t> tokens = sample_tokens(1001, c.vocab, static_cast<uint32_t>(c.width));
    const std::string path = dir.file("rt.tok");
    ASSERT_TRUE(write_token_file(path, tokens, c.vocab, c.width).ok());

    // The documented layout, byte by byte.
    const std::string bytes = read_bytes(path);
    ASSERT_EQ(bytes.size(), 32u + tokens.size() * c.width);
    EXPECT_EQ(bytes.substr(0, 8), "UNTIEDTK");
    EXPECT_EQ(le(bytes, 8, 4), 1u);
    EXPECT_EQ(le(bytes, 12, 4), static_cast<uint64_t>(c.width));
    EXPECT_EQ(le(bytes, 16, 8), tokens.size());
    EXPECT_EQ(le(bytes, 24, 8), static_cast<uint64_t>(c.vocab));
    int wrong = 0;
    for (size_t i = 0; i < tokens.size(); ++i) wrong += le(bytes, 32 + i * c.width, c.width) != static_cast<uint64_t>(tokens[i]);
    EXPECT_EQ(wrong, 0) << "tokens stored wrongly";

    StatusOr<TokenFile> f = TokenFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f.value().size(), 1001);
    EXPECT_EQ(f.value().vocab_size(), c.vocab);
    EXPECT_EQ(f.value().width_bytes(), c.width);
    std::vector<int32_t> all(tokens.size(), -1);
    ASSERT_TRUE(f.value().read(0, 1001, all.data()).ok());
    EXPECT_EQ(all, tokens);
    // Ranges, including empty ones and the last token.
    const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 1}, {1, 7}, {500, 501}, {1000, 1}, {1001, 0}, {37, 0}};
    for (auto [start, count] : ranges) {
      std::vector<int32_t> part(static_cast<size_t>(count) + 1, -7);
      ASSERT_TRUE(f.value().read(start, count, part.data()).ok());
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(part[i], tokens[start + i]) << "start " << start << " i " << i;
      EXPECT_EQ(part[count], -7) << "read wrote past its range";
    }
  }
}

// Version 2: the document index after the tokens, byte for byte, and read back at open.
TEST(TokenFile, DocumentIndexLayoutAndRoundTrip) {
  TempDir dir;
  const std::vector<int32_t> tokens = sample_tokens(1000, 300, 7);
  const std::vector<int64_t> starts = {0, 1, 2, 517, 999};  // one-token documents included
  const std::string path = dir.file("docs.tok");
  ASSERT_TRUE(write_token_file(path, tokens, 300, 2, starts).ok());
  const std::string b = read_bytes(path);
  ASSERT_EQ(b.size(), 32u + 2000u + 8u + 8u * starts.size());
  EXPECT_EQ(le(b, 8, 4), 2u);
  EXPECT_EQ(le(b, 32 + 2000, 8), starts.size());
  for (size_t d = 0; d < starts.size(); ++d) EXPECT_EQ(le(b, 32 + 2000 + 8 + 8 * d, 8), static_cast<uint64_t>(starts[d]));
  auto f = TokenFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().version(), 2);
  EXPECT_EQ(f.value().document_starts(), starts);
  std::vector<int32_t> got(1000);
  ASSERT_TRUE(f.value().read(0, 1000, got.data()).ok());
  EXPECT_EQ(got, tokens);
  // Without starts: version 1, no index.
  ASSERT_TRUE(write_token_file(path, tokens, 300, 2).ok());
  EXPECT_EQ(read_bytes(path).size(), 32u + 2000u);
  EXPECT_EQ(TokenFile::open(path).value().version(), 1);
  EXPECT_TRUE(TokenFile::open(path).value().document_starts().empty());
}

TEST(TokenFile, BadDocumentIndexIsRefused) {
  TempDir dir;
  const std::string path = dir.file("bad.tok");
  const std::vector<int32_t> tokens = sample_tokens(10, 50, 1);
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{1, 5}, {0, 5, 5}, {0, 10}, {0, 7, 3}})
    EXPECT_TRUE(fails_with(write_token_file(path, tokens, 50, 2, bad), Code::kInvalidArgument, {"document start"}));
  // A file whose index is patched out of order, or cut short, is corrupt.
  ASSERT_TRUE(write_token_file(path, tokens, 50, 2, std::vector<int64_t>{0, 4, 8}).ok());
  std::string b = read_bytes(path);
  put_le(&b, 32 + 20 + 8 + 16, 3, 8);  // start 2: 8 -> 3
  write_bytes(path, b);
  EXPECT_TRUE(fails_with(TokenFile::open(path).status(), Code::kCorrupt, {path, "document start 2"}));
  b = read_bytes(path);
  write_bytes(path, b.substr(0, b.size() - 8));
  EXPECT_TRUE(fails_with(TokenFile::open(path).status(), Code::kCorrupt, {path, "document index"}));
}

TEST(TokenFile, EmptyFileRoundTrips) {
  TempDir dir;
  ASSERT_TRUE(write_token_file(dir.file("e.tok"), {}, 10, 2).ok());
  StatusOr<TokenFile> f = TokenFile::open(dir.file("e.tok"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().size(), 0);
}

TEST(TokenFile, ReadOutsideTheFileIsABug) {
  TempDir dir;
  const std::vector<int32_t> tokens = sample_tokens(10, 50, 1);
  ASSERT_TRUE(write_token_file(dir.file("a.tok"), tokens, 50, 2).ok());
  StatusOr<TokenFile> f = TokenFile::open(dir.file("a.tok"));
  ASSERT_TRUE(f.ok());
  std::vector<int32_t> out(20);
  EXPECT_THROW((void)f.value().read(5, 6, out.data()), Error);
  EXPECT_THROW((void)f.value().read(-1, 2, out.data()), Error);
}

TEST(TokenFile, WriteRejectsBadArgumentsAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("bad.tok");
  const std::vector<int32_t> ok_tokens = {1, 2, 3};
  EXPECT_TRUE(fails_with(write_token_file(path, ok_tokens, 10, 3), Code::kInvalidArgument, {"width 3", "use 2"}));
  EXPECT_TRUE(fails_with(write_token_file(path, ok_tokens, 0, 2), Code::kInvalidArgument, {"vocab size 0"}));
  EXPECT_TRUE(fails_with(write_token_file(path, ok_tokens, 70000, 2), Code::kInvalidArgument, {"use width 4"}));
  const std::vector<int32_t> big = {1, 10, 3};
  EXPECT_TRUE(fails_with(write_token_file(path, big, 10, 2), Code::kInvalidArgument, {"token 1 is 10", path}));
  const std::vector<int32_t> negative = {1, 2, -1};
  EXPECT_TRUE(fails_with(write_token_file(path, negative, 10, 4), Code::kInvalidArgument, {"token 2 is -1"}));
  EXPECT_TRUE(dir.entries().empty());
}

TEST(TokenFile, UnwritableDirectoryGivesStatusAndLeavesNothing) {
  TempDir dir;
  const std::vector<int32_t> tokens = {1, 2, 3};
  // A directory that does not exist.
  const std::string missing = dir.file("no_such_dir/a.tok");
  EXPECT_TRUE(fails_with(write_token_file(missing, tokens, 10, 2), Code::kIoError, {missing, "exists and is writable"}));
  // A "directory" that is a regular file (fails even for root, unlike permission bits).
  write_bytes(dir.file("plain"), "x");
  const std::string under_file = dir.file("plain/a.tok");
  EXPECT_TRUE(fails_with(write_token_file(under_file, tokens, 10, 2), Code::kIoError, {under_file}));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"plain"});
  // A target that is a directory: the rename fails and the temporary is removed.
  std::filesystem::create_directory(dir.file("is_dir"));
  EXPECT_TRUE(fails_with(write_token_file(dir.file("is_dir"), tokens, 10, 2), Code::kIoError, {"rename", "is_dir"}));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"is_dir", "plain"}));
}

TEST(TokenFile, FailedWriteDoesNotClobberAnExistingFile) {
  TempDir dir;
  const std::string path = dir.file("keep.tok");
  const std::vector<int32_t> old_tokens = sample_tokens(100, 1000, 7);
  ASSERT_TRUE(write_token_file(path, old_tokens, 1000, 2).ok());
  const std::string before = read_bytes(path);

  // Rejected arguments.
  const std::vector<int32_t> bad = {5, 1000};
  EXPECT_FALSE(write_token_file(path, bad, 1000, 2).ok());
  EXPECT_EQ(read_bytes(path), before);

  // A write that fails halfway: in a child process, the file size limit stops the temporary at
  // 4 KiB (write() returns EFBIG once SIGXFSZ is ignored). The child reports through its exit
  // code: 0 = the write returned io_error naming the file, 1 = it returned ok, 2 = other status.
  const std::vector<int32_t> big = sample_tokens(100000, 1000, 8);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim;
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 4096;
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const Status s = write_token_file(path, big, 1000, 2);
    const bool expected = !s.ok() && s.code() == Status::Code::kIoError &&
                          s.message().find(path) != std::string::npos &&
                          s.message().find("is unchanged") != std::string::npos;
    ::_exit(s.ok() ? 1 : expected ? 0 : 2);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus)) << "the writer child died instead of returning a Status";
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "1: the write succeeded under a 4 KiB file size limit; 2: wrong Status";
  EXPECT_EQ(read_bytes(path), before) << "a failed write changed the existing file";
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.tok"}) << "a temporary was left behind";

  // And a successful write does replace it.
  ASSERT_TRUE(write_token_file(path, big, 1000, 2).ok());
  EXPECT_EQ(read_bytes(path).size(), 32u + 2 * big.size());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.tok"});
}

// TokenFileWriter: documents streamed in pieces give the bytes write_token_file gives.
TEST(TokenFileWriter, StreamsWhatWriteTokenFileWrites) {
  TempDir dir;
  for (int64_t vocab : {300, 128256}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const std::vector<int32_t> tokens = sample_tokens(300000, vocab, 9);  // more than one 1 MiB buffer
    std::vector<int64_t> starts = {0};
    for (int64_t at = 1; at < 300000; at += 1 + (at * 7919) % 5003) starts.push_back(at);
    ASSERT_TRUE(write_token_file(dir.file("whole.tok"), tokens, vocab, token_width_for_vocab(vocab), starts).ok());
    StatusOr<TokenFileWriter> w = TokenFileWriter::create(dir.file("streamed.tok"), vocab);
    ASSERT_TRUE(w.ok()) << w.status().message();
    TokenFileWriter writer = std::move(w).value();
    EXPECT_EQ(writer.width_bytes(), token_width_for_vocab(vocab));
    for (size_t d = 0; d < starts.size(); ++d) {
      const size_t end = d + 1 < starts.size() ? static_cast<size_t>(starts[d + 1]) : tokens.size();
      writer.begin_document();
      for (size_t at = static_cast<size_t>(starts[d]); at < end;) {  // in pieces of 1..37 tokens
        const size_t n = std::min(end - at, 1 + at % 37);
        ASSERT_TRUE(writer.append(std::span(tokens).subspan(at, n)).ok());
        at += n;
      }
    }
    EXPECT_EQ(writer.tokens(), 300000);
    EXPECT_EQ(writer.documents(), static_cast<int64_t>(starts.size()));
    const std::vector<std::string> during = dir.entries();
    EXPECT_EQ(std::count_if(during.begin(), during.end(),
                            [](const std::string& n) { return n.rfind("streamed.tok.tmp.", 0) == 0; }), 1)
        << "the temporary is next to the target";
    ASSERT_TRUE(writer.finish().ok());
    EXPECT_EQ(read_bytes(dir.file("streamed.tok")), read_bytes(dir.file("whole.tok")));
    EXPECT_EQ(dir.entries(), (std::vector<std::string>{"streamed.tok", "whole.tok"}));
  }
}

TEST(TokenFileWriter, DocumentsWithoutTokensAreNotRecorded) {
  TempDir dir;
  TokenFileWriter w = TokenFileWriter::create(dir.file("d.tok"), 50).value();
  const std::vector<int32_t> a = {1, 2, 3}, b = {4, 5};
  ASSERT_TRUE(w.append(a).ok());  // before any begin_document: document 0
  w.begin_document();
  w.begin_document();
  ASSERT_TRUE(w.append({}).ok());
  ASSERT_TRUE(w.append(b).ok());
  ASSERT_TRUE(w.append(a).ok());  // the same document
  w.begin_document();             // and one that never gets a token
  ASSERT_TRUE(w.finish().ok());
  TokenFile f = TokenFile::open(dir.file("d.tok")).value();
  EXPECT_EQ(f.version(), 2);
  EXPECT_EQ(f.size(), 8);
  EXPECT_EQ(f.document_starts(), (std::vector<int64_t>{0, 3}));
  // Without an index: version 1, begin_document does nothing.
  TokenFileWriter v1 = TokenFileWriter::create(dir.file("v1.tok"), 50, {.document_index = false}).value();
  v1.begin_document();
  ASSERT_TRUE(v1.append(a).ok());
  v1.begin_document();
  ASSERT_TRUE(v1.append(b).ok());
  EXPECT_EQ(v1.documents(), 0);
  ASSERT_TRUE(v1.finish().ok());
  EXPECT_EQ(TokenFile::open(dir.file("v1.tok")).value().version(), 1);
  EXPECT_EQ(read_bytes(dir.file("v1.tok")).size(), 32u + 2 * 5);
  // No token at all: a valid empty file.
  ASSERT_TRUE(TokenFileWriter::create(dir.file("e.tok"), 50).value().finish().ok());
  EXPECT_EQ(TokenFile::open(dir.file("e.tok")).value().size(), 0);
}

TEST(TokenFileWriter, BadTokensAndCallsAreRefused) {
  TempDir dir;
  EXPECT_TRUE(fails_with(TokenFileWriter::create(dir.file("x.tok"), 70000, {.width_bytes = 2}).status(),
                         Code::kInvalidArgument, {"use width 4"}));
  EXPECT_TRUE(
      fails_with(TokenFileWriter::create(dir.file("x.tok"), 0).status(), Code::kInvalidArgument, {"vocab size 0"}));
  EXPECT_TRUE(fails_with(TokenFileWriter::create(dir.file("no/x.tok"), 10).status(), Code::kIoError,
                         {"exists and is writable"}));
  EXPECT_TRUE(dir.entries().empty());
  TokenFileWriter w = TokenFileWriter::create(dir.file("x.tok"), 10).value();
  const std::vector<int32_t> good = {1, 2, 3}, bad = {4, 10, 5};
  ASSERT_TRUE(w.append(good).ok());
  EXPECT_TRUE(fails_with(w.append(bad), Code::kInvalidArgument, {"token 4 is 10", dir.file("x.tok")}));
  ASSERT_TRUE(w.append(good).ok());  // still usable; the bad call appended nothing
  ASSERT_TRUE(w.finish().ok());
  EXPECT_TRUE(fails_with(w.finish(), Code::kInvalidArgument, {"second time"}));
  EXPECT_TRUE(fails_with(w.append(good), Code::kInvalidArgument, {"after finish"}));
  EXPECT_EQ(TokenFile::open(dir.file("x.tok")).value().size(), 6);
}

TEST(TokenFileWriter, NothingAtTheTargetUntilFinish) {
  TempDir dir;
  const std::string path = dir.file("keep.tok");
  write_bytes(path, "old contents");
  {
    TokenFileWriter w = TokenFileWriter::create(path, 100).value();
    ASSERT_TRUE(w.append(sample_tokens(1000, 100, 1)).ok());
    EXPECT_EQ(read_bytes(path), "old contents");
    EXPECT_EQ(dir.entries().size(), 2u);
  }  // destroyed without finish(): the temporary goes, the old file stays
  EXPECT_EQ(read_bytes(path), "old contents");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.tok"});
  // A moved-from writer leaves the temporary to the one it moved to.
  TokenFileWriter a = TokenFileWriter::create(path, 100).value();
  TokenFileWriter b = std::move(a);
  ASSERT_TRUE(b.append(sample_tokens(10, 100, 2)).ok());
  ASSERT_TRUE(b.finish().ok());
  EXPECT_EQ(TokenFile::open(path).value().size(), 10);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"keep.tok"});
}

// More documents than the writer keeps in memory: the rest wait in a second temporary.
TEST(TokenFileWriter, ManyDocumentsSpillToATemporary) {
  TempDir dir;
  constexpr int64_t kDocs = (1 << 20) + 12345;
  TokenFileWriter w = TokenFileWriter::create(dir.file("many.tok"), 7).value();
  const std::vector<int32_t> one = {3};
  for (int64_t d = 0; d < kDocs; ++d) ASSERT_TRUE(w.append_document(one).ok());
  EXPECT_EQ(w.documents(), kDocs);
  EXPECT_EQ(dir.entries().size(), 2u) << "the target's temporary and the index's";
  ASSERT_TRUE(w.finish().ok());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"many.tok"});
  TokenFile f = TokenFile::open(dir.file("many.tok")).value();
  ASSERT_EQ(static_cast<int64_t>(f.document_starts().size()), kDocs);
  int64_t wrong = 0;
  for (int64_t d = 0; d < kDocs; ++d) wrong += f.document_starts()[d] != d;
  EXPECT_EQ(wrong, 0);
}

// A valid file's bytes, patched by each test below.
class CorruptTokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    tokens_ = sample_tokens(64, 500, 3);
    ASSERT_TRUE(write_token_file(path(), tokens_, 500, 2).ok());
    bytes_ = read_bytes(path());
  }
  std::string path() const { return dir_.file("data.tok"); }
  Status open_patched(const std::string& bytes) {
    write_bytes(path(), bytes);
    return TokenFile::open(path()).status();
  }
  TempDir dir_;
  std::vector<int32_t> tokens_;
  std::string bytes_;
};

TEST_F(CorruptTokenFile, MissingFile) {
  const std::string missing = dir_.file("nope.tok");
  EXPECT_TRUE(fails_with(TokenFile::open(missing).status(), Code::kNotFound, {missing, "check the path"}));
}

TEST_F(CorruptTokenFile, Truncated) {
  std::string b = bytes_;
  b.pop_back();
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "64 tokens", "truncated or corrupt"}));
  b = bytes_ + "xy";  // trailing garbage is as wrong as a missing tail
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "truncated or corrupt"}));
  EXPECT_TRUE(fails_with(open_patched(bytes_.substr(0, 20)), Code::kCorrupt, {path(), "not an untied token file", "header"}));
  EXPECT_TRUE(fails_with(open_patched(""), Code::kCorrupt, {path(), "not an untied token file"}));
}

TEST_F(CorruptTokenFile, BadMagic) {
  std::string b = bytes_;
  b[3] ^= 0x20;
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "not an untied token file", "magic"}));
  // Plain text is the usual mistake; the message points at the text kind.
  EXPECT_TRUE(fails_with(open_patched(std::string(100, 'a')), Code::kCorrupt, {"not an untied token file", "'text'"}));
}

TEST_F(CorruptTokenFile, WrongVersion) {
  std::string b = bytes_;
  put_le(&b, 8, 4, 4);
  EXPECT_TRUE(fails_with(open_patched(b), Code::kUnsupported, {path(), "version 4", "reads versions 1 to 3"}));
  // A version 1 file relabelled 2 has no document index.
  b = bytes_;
  put_le(&b, 8, 2, 4);
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "document index"}));
}

TEST_F(CorruptTokenFile, BadWidth) {
  for (uint64_t w : {0, 1, 3, 8}) {
    std::string b = bytes_;
    put_le(&b, 12, w, 4);
    EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "width " + std::to_string(w), "must be 2 or 4"}));
  }
}

TEST_F(CorruptTokenFile, BadVocab) {
  std::string b = bytes_;
  put_le(&b, 24, 0, 8);
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "vocab size 0", "re-create"}));
  put_le(&b, 24, 70000, 8);  // more than 2-byte tokens can hold
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "vocab size 70000"}));
}

TEST_F(CorruptTokenFile, CountDisagreesWithSize) {
  std::string b = bytes_;
  put_le(&b, 16, 65, 8);
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "65 tokens", "truncated or corrupt"}));
  put_le(&b, 16, ~uint64_t{0}, 8);  // a count whose byte size overflows
  EXPECT_TRUE(fails_with(open_patched(b), Code::kCorrupt, {path(), "truncated or corrupt"}));
}

TEST_F(CorruptTokenFile, TokenOutsideVocabIsFoundInTheRangeThatHoldsIt) {
  std::string b = bytes_;
  put_le(&b, 32 + 2 * 40, 500, 2);  // token 40 := vocab size
  ASSERT_TRUE(open_patched(b).ok());
  StatusOr<TokenFile> f = TokenFile::open(path());
  ASSERT_TRUE(f.ok());
  std::vector<int32_t> out(64);
  // Ranges that do not hold position 40 read fine: only the requested bytes are read.
  ASSERT_TRUE(f.value().read(0, 40, out.data()).ok());
  ASSERT_TRUE(f.value().read(41, 23, out.data()).ok());
  EXPECT_TRUE(fails_with(f.value().read(30, 20, out.data()), Code::kCorrupt,
                         {path(), "position 40", "is 500", "vocab size 500"}));
  EXPECT_TRUE(fails_with(f.value().read(40, 1, out.data()), Code::kCorrupt, {"position 40"}));
}

TEST_F(CorruptTokenFile, TruncatedAfterOpen) {
  StatusOr<TokenFile> f = TokenFile::open(path());
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path().c_str(), 32 + 2 * 10), 0);
  std::vector<int32_t> out(64);
  ASSERT_TRUE(f.value().read(0, 10, out.data()).ok());
  EXPECT_TRUE(fails_with(f.value().read(0, 64, out.data()), Code::kCorrupt, {path(), "truncated"}));
}

}  // namespace
}  // namespace untied
