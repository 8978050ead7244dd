// The byte-level tokenizer: round trips, specials, document splitting, text -> token file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "train_data/data_test_util.h"
#include "untied/train/token_file.h"
#include "untied/train/tokenizer.h"

namespace untied {
namespace {

using Code = Status::Code;
using testing::fails_with;
using testing::TempDir;
using testing::write_bytes;

// Hand-written UTF-8: 2-, 3- and 4-byte sequences, plus a NUL and a byte that is not UTF-8.
const std::string kUtf8 = std::string("h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82 tab\there") +
                          std::string("\0nul", 4) + "\xFF" + "end\n";

TEST(ByteTokenizer, VocabAndSpecials) {
  EXPECT_EQ(kBos, 256);
  EXPECT_EQ(kEos, 257);
  EXPECT_EQ(kPad, 258);
  EXPECT_EQ(kByteVocabSize, 259);
}

TEST(ByteTokenizer, EncodeIsTheBytes) {
  const std::vector<int32_t> ids = byte_encode("h\xC3\xA9");
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 0xC3, 0xA9}));
  EXPECT_TRUE(byte_encode("").empty());
}

TEST(ByteTokenizer, Utf8RoundTrip) {
  const std::vector<int32_t> ids = byte_encode(kUtf8);
  ASSERT_EQ(ids.size(), kUtf8.size());
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(byte_decode(ids), kUtf8);
}

TEST(ByteTokenizer, DecodeSpecials) {
  std::vector<int32_t> ids = {kBos, 'a', 'b', kEos, kPad, 'c', 300, -1};
  EXPECT_EQ(byte_decode(ids), "abc<unk:300><unk:-1>");
  EXPECT_EQ(byte_decode(ids, SpecialTokens::kShow), "<bos>ab<eos><pad>c<unk:300><unk:-1>");
}

TEST(ByteTokenizer, SplitOnBlankLines) {
  const std::string text = "\n\nfirst line\nsecond line\n\n  \t \r\nthird\r\nstill third\r\n\r\n\n last \n";
  const std::vector<std::string_view> docs = split_documents(text, DocumentSplit::kBlankLines);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "first line\nsecond line");
  EXPECT_EQ(docs[1], "third\r\nstill third");
  EXPECT_EQ(docs[2], " last ");
  EXPECT_TRUE(split_documents(" \n\t\n", DocumentSplit::kBlankLines).empty());
  EXPECT_TRUE(split_documents("", DocumentSplit::kBlankLines).empty());
  // Without a final newline.
  EXPECT_EQ(split_documents("a\n\nb", DocumentSplit::kBlankLines), (std::vector<std::string_view>{"a", "b"}));
}

TEST(ByteTokenizer, WholeFileIsOneDocument) {
  const std::string text = "a\n\nb\n";
  EXPECT_EQ(split_documents(text, DocumentSplit::kWholeFile), std::vector<std::string_view>{text});
  EXPECT_TRUE(split_documents("\n \n", DocumentSplit::kWholeFile).empty());
}

TEST(ByteTokenizer, TextToTokensWrapsEachDocument) {
  const std::vector<int32_t> ids = text_to_tokens("ab\n\nc", DocumentSplit::kBlankLines);
  EXPECT_EQ(ids, (std::vector<int32_t>{kBos, 'a', 'b', kEos, kBos, 'c', kEos}));
  EXPECT_EQ(byte_decode(ids, SpecialTokens::kShow), "<bos>ab<eos><bos>c<eos>");
}

TEST(ByteTokenizer, TextFilesToTokenFile) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "one\n\n" + kUtf8);
  write_bytes(dir.file("b.txt"), "two\n");
  const std::string out = dir.file("text.tok");

  ASSERT_TRUE(text_files_to_token_file({dir.file("a.txt"), dir.file("b.txt")}, out, DocumentSplit::kBlankLines).ok());
  StatusOr<TokenFile> f = TokenFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().vocab_size(), kByteVocabSize);
  EXPECT_EQ(f.value().width_bytes(), 2);
  std::vector<int32_t> ids(static_cast<size_t>(f.value().size()));
  ASSERT_TRUE(f.value().read(0, f.value().size(), ids.data()).ok());
  std::string kUtf8_doc = kUtf8.substr(0, kUtf8.size() - 1);  // the final newline ends the block
  EXPECT_EQ(byte_decode(ids, SpecialTokens::kShow), "<bos>one<eos><bos>" + kUtf8_doc + "<eos><bos>two<eos>");

  // One document per file keeps blank lines inside.
  ASSERT_TRUE(text_files_to_token_file({dir.file("a.txt"), dir.file("b.txt")}, out, DocumentSplit::kWholeFile).ok());
  StatusOr<TokenFile> g = TokenFile::open(out);
  ASSERT_TRUE(g.ok());
  ids.assign(static_cast<size_t>(g.value().size()), 0);
  ASSERT_TRUE(g.value().read(0, g.value().size(), ids.data()).ok());
  EXPECT_EQ(byte_decode(ids, SpecialTokens::kShow), "<bos>one\n\n" + kUtf8 + "<eos><bos>two\n<eos>");
}

TEST(ByteTokenizer, TextFileErrors) {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  EXPECT_TRUE(fails_with(text_files_to_token_file({missing}, dir.file("o.tok"), DocumentSplit::kBlankLines),
                         Code::kNotFound, {missing, "check the path"}));
  write_bytes(dir.file("blank.txt"), "\n  \n");
  EXPECT_TRUE(fails_with(read_text_tokens({dir.file("blank.txt")}, DocumentSplit::kBlankLines).status(),
                         Code::kInvalidArgument, {"blank.txt", "no text"}));
  EXPECT_TRUE(fails_with(read_text_tokens({dir.path().string()}, DocumentSplit::kBlankLines).status(),
                         Code::kInvalidArgument, {"is a directory"}));
  EXPECT_TRUE(fails_with(read_text_tokens({}, DocumentSplit::kBlankLines).status(), Code::kInvalidArgument, {"no text files"}));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"blank.txt"});
}

}  // namespace
}  // namespace untied
