// The DataSource contract for every kind: shard reads over C ranks, concatenated, equal the
// whole-sequence read (tokens, labels, flags), including the label shifted across each shard
// boundary; token and text sources against an independent model of "sample i = stream tokens
// [i*S, (i+1)*S) mod N"; the factory's errors.
#include <gtest/gtest.h>

#include <algorithm>

#include <memory>
#include <thread>
#include <vector>

#include "train_data/data_test_util.h"
#include "untied/train/data.h"

namespace untied {
namespace {

using Code = Status::Code;
using testing::fails_with;
using testing::TempDir;
using testing::write_bytes;

struct Range {
  std::vector<int32_t> tokens, labels;
  std::vector<uint8_t> answer;
};

Range fill_range(const DataSource& src, int64_t index, int64_t seq_len, int64_t start, int64_t count) {
  Range r;
  // One guard element past the end catches writes beyond count.
  r.tokens.assign(static_cast<size_t>(count) + 1, -55);
  r.labels.assign(static_cast<size_t>(count) + 1, -55);
  r.answer.assign(static_cast<size_t>(count) + 1, 55);
  const Status s = src.fill(index, seq_len, start, count, r.tokens.data(), r.labels.data(), r.answer.data());
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(r.tokens.back(), -55);
  EXPECT_EQ(r.labels.back(), -55);
  EXPECT_EQ(r.answer.back(), 55);
  r.tokens.pop_back();
  r.labels.pop_back();
  r.answer.pop_back();
  return r;
}

// For C ranks: rank r's shard is [r*L, (r+1)*L). Checks that the concatenation equals `whole`
// and names the first mismatch; also checks each boundary label by hand.
void expect_shards_match(const DataSource& src, int64_t index, int64_t seq_len) {
  const Range whole = fill_range(src, index, seq_len, 0, seq_len);
  ASSERT_EQ(whole.labels.back(), kIgnoreIndex) << "the sequence's last position must be ignored";
  for (int64_t c : {1, 2, 3, 4}) {
    ASSERT_EQ(seq_len % c, 0);
    const int64_t l = seq_len / c;
    Range cat;
    std::vector<Range> shards;
    for (int64_t r = 0; r < c; ++r) {
      shards.push_back(fill_range(src, index, seq_len, r * l, l));
      const Range& s = shards.back();
      cat.tokens.insert(cat.tokens.end(), s.tokens.begin(), s.tokens.end());
      cat.labels.insert(cat.labels.end(), s.labels.begin(), s.labels.end());
      cat.answer.insert(cat.answer.end(), s.answer.begin(), s.answer.end());
    }
    int64_t wrong = 0, first = -1;
    for (int64_t p = 0; p < seq_len; ++p) {
      const bool bad = cat.tokens[p] != whole.tokens[p] || cat.labels[p] != whole.labels[p] ||
                       cat.answer[p] != whole.answer[p];
      if (bad && first < 0) first = p;
      wrong += bad;
    }
    EXPECT_EQ(wrong, 0) << src.kind() << " C=" << c << " sample " << index << ": first mismatch at " << first;
    // The last label of rank r is rank r+1's first token (unless the source masks it).
    for (int64_t r = 0; r + 1 < c; ++r) {
      const int32_t label = shards[r].labels.back();
      if (label != kIgnoreIndex) {
        EXPECT_EQ(label, shards[r + 1].tokens.front()) << src.kind() << " C=" << c << " r=" << r;
      }
    }
  }
  // Uneven ranges too: a few odd split points.
  for (int64_t cut : {int64_t{1}, int64_t{7}, seq_len / 2 + 1, seq_len - 1}) {
    const Range a = fill_range(src, index, seq_len, 0, cut);
    const Range b = fill_range(src, index, seq_len, cut, seq_len - cut);
    for (int64_t p = 0; p < seq_len; ++p) {
      const Range& part = p < cut ? a : b;
      const int64_t k = p < cut ? p : p - cut;
      ASSERT_EQ(part.tokens[k], whole.tokens[p]) << "cut " << cut << " p " << p;
      ASSERT_EQ(part.labels[k], whole.labels[p]) << "cut " << cut << " p " << p;
      ASSERT_EQ(part.answer[k], whole.answer[p]) << "cut " << cut << " p " << p;
    }
  }
}

// The stream model of token and text sources: token p of sample i is stream[(i*S + p) mod N]; a
// document starts at p when its stream position is in `docs` (p = 0 always), and then position
// p - 1 has no label.
void expect_stream_model(const DataSource& src, const std::vector<int32_t>& stream, int64_t index, int64_t seq_len,
                         const std::vector<int64_t>& docs = {}) {
  const int64_t n = static_cast<int64_t>(stream.size());
  auto starts_doc = [&](int64_t p) {
    const int64_t q = (index * seq_len + p) % n;
    return std::find(docs.begin(), docs.end(), q) != docs.end();
  };
  const Range w = fill_range(src, index, seq_len, 0, seq_len);
  std::vector<int64_t> expected_starts = {0};
  for (int64_t p = 0; p < seq_len; ++p) {
    ASSERT_EQ(w.tokens[p], stream[(index * seq_len + p) % n]) << "sample " << index << " p " << p;
    const bool labelled = p + 1 < seq_len && !starts_doc(p + 1);
    const int32_t label = labelled ? stream[(index * seq_len + p + 1) % n] : kIgnoreIndex;
    ASSERT_EQ(w.labels[p], label) << "sample " << index << " p " << p;
    ASSERT_EQ(w.answer[p], labelled ? 1 : 0) << "sample " << index << " p " << p;
    if (p > 0 && starts_doc(p)) expected_starts.push_back(p);
  }
  auto got = src.document_starts(index, seq_len);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got.value(), expected_starts) << "sample " << index;
}

std::vector<int32_t> stream_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + i / 3) % vocab);
  return t;
}

constexpr int64_t kS = 240;  // divisible by 1, 2, 3 and 4

// A version 2 token file: its documents give each sample's starts (across the wrap of the stream:
// the file's start is one), and no label crosses one; any split over ranks gives the same.
TEST(DataSource, TokenFileDocuments) {
  TempDir dir;
  for (int64_t n : {1000, 100, 7}) {
    SCOPED_TRACE("N " + std::to_string(n));
    const std::vector<int32_t> stream = stream_tokens(n, 500);
    std::vector<int64_t> docs = {0};
    for (int64_t at : {int64_t{1}, int64_t{3}, int64_t{50}, int64_t{51}, int64_t{99}, int64_t{500}, int64_t{777}})
      if (at < n) docs.push_back(at);  // one-token documents (0, 50) included
    const std::string path = dir.file("d.tok");
    ASSERT_TRUE(write_token_file(path, stream, 500, 2, docs).ok());
    StatusOr<std::unique_ptr<DataSource>> src = make_data_source("tokens", path, {});
    ASSERT_TRUE(src.ok()) << src.status().message();
    for (int64_t index : {0, 1, 3, 17}) {
      expect_stream_model(*src.value(), stream, index, kS, docs);
      expect_shards_match(*src.value(), index, kS);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(DataSource, TokenFileShardsAndWrapping) {
  TempDir dir;
  for (int width : {2, 4}) {
    for (int64_t n : {1000, 100, 240, 1}) {  // samples that wrap mid-sample; a file shorter than S
      SCOPED_TRACE("width " + std::to_string(width) + " N " + std::to_string(n));
      const int64_t vocab = width == 2 ? 500 : 100000;
      const std::vector<int32_t> stream = stream_tokens(n, vocab);
      const std::string path = dir.file("s.tok");
      ASSERT_TRUE(write_token_file(path, stream, vocab, width).ok());
      StatusOr<std::unique_ptr<DataSource>> src = make_data_source("tokens", path, {});
      ASSERT_TRUE(src.ok()) << src.status().message();
      EXPECT_EQ(src.value()->kind(), "tokens");
      EXPECT_EQ(src.value()->vocab_size(), vocab);
      for (int64_t index : {0, 1, 4, 5, 1000003}) {
        expect_stream_model(*src.value(), stream, index, kS);
        expect_shards_match(*src.value(), index, kS);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(DataSource, TextShards) {
  TempDir dir;
  const std::string text = "The first document.\nIt has two lines.\n\nSecond: caf\xC3\xA9 \xE2\x9C\x93\n\n\nthird\n";
  write_bytes(dir.file("t.txt"), text);
  for (DocumentSplit split : {DocumentSplit::kBlankLines, DocumentSplit::kLines, DocumentSplit::kWholeFile}) {
    StatusOr<std::unique_ptr<DataSource>> src = make_data_source("text", dir.file("t.txt"), {.text_split = split});
    ASSERT_TRUE(src.ok()) << src.status().message();
    EXPECT_EQ(src.value()->kind(), "text");
    EXPECT_EQ(src.value()->vocab_size(), kByteVocabSize);
    const std::vector<int32_t> stream = text_to_tokens(text, split);
    // Documents: 3 blocks, 4 lines, 1 file; each starts at a BOS.
    EXPECT_EQ(static_cast<int64_t>(bos_positions(stream).size()),
              split == DocumentSplit::kBlankLines ? 3 : split == DocumentSplit::kLines ? 4 : 1);
    for (int64_t index : {0, 1, 2, 99}) {
      expect_stream_model(*src.value(), stream, index, kS, bos_positions(stream));
      expect_shards_match(*src.value(), index, kS);
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Sample 0 starts with the first document.
    const Range r = fill_range(*src.value(), 0, kS, 0, 4);
    EXPECT_EQ(byte_decode(r.tokens, SpecialTokens::kShow), "<bos>The");
  }
}

TEST(DataSource, KvShards) {
  for (KvTaskOptions o : {KvTaskOptions{}, KvTaskOptions{.seed = 5, .num_keys = 10, .num_values = 7, .label_structure = true}}) {
    StatusOr<std::unique_ptr<DataSource>> src = make_data_source("kv", "", {.kv = o});
    ASSERT_TRUE(src.ok()) << src.status().message();
    EXPECT_EQ(src.value()->kind(), "kv");
    EXPECT_EQ(src.value()->vocab_size(), 3 + o.num_keys + o.num_values);
    for (int64_t index : {0, 3, 77}) {
      expect_shards_match(*src.value(), index, kS);
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Longer, with 4 ranks: most answers sit on the last rank, their pairs elsewhere.
    expect_shards_match(*src.value(), 1, 4104);  // 4104 = 12 * 342
  }
}

TEST(DataSource, IsAnswerMayBeNull) {
  StatusOr<std::unique_ptr<DataSource>> src = make_data_source("kv", "", {});
  ASSERT_TRUE(src.ok());
  std::vector<int32_t> t(kS), l(kS);
  ASSERT_TRUE(src.value()->fill(0, kS, 0, kS, t.data(), l.data(), nullptr).ok());
  const Range r = fill_range(*src.value(), 0, kS, 0, kS);
  EXPECT_EQ(t, r.tokens);
  EXPECT_EQ(l, r.labels);
}

TEST(DataSource, ConcurrentFillsAgree) {
  TempDir dir;
  const std::vector<int32_t> stream = stream_tokens(5000, 1000);
  ASSERT_TRUE(write_token_file(dir.file("c.tok"), stream, 1000, 2).ok());
  StatusOr<std::unique_ptr<DataSource>> src = make_data_source("tokens", dir.file("c.tok"), {});
  ASSERT_TRUE(src.ok());
  const DataSource& s = *src.value();
  // Four "ranks" as threads, each filling its shard of the same samples at the same time.
  constexpr int kRanks = 4;
  constexpr int64_t kL = 1024, kSeq = kRanks * kL;
  std::vector<std::vector<int32_t>> tok(kRanks, std::vector<int32_t>(kL)), lab(kRanks, std::vector<int32_t>(kL));
  std::vector<int> failures(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      for (int64_t index = 0; index < 20; ++index) {
        if (!s.fill(index, kSeq, r * kL, kL, tok[r].data(), lab[r].data(), nullptr).ok()) ++failures[r];
        for (int64_t k = 0; k < kL; ++k)
          if (tok[r][k] != stream[(index * kSeq + r * kL + k) % 5000]) ++failures[r];
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

TEST(DataSource, CorruptTokenInASampleNamesItsPosition) {
  TempDir dir;
  std::vector<int32_t> stream = stream_tokens(1000, 500);
  const std::string path = dir.file("x.tok");
  ASSERT_TRUE(write_token_file(path, stream, 500, 2).ok());
  std::string bytes = testing::read_bytes(path);
  bytes[32 + 2 * 300] = static_cast<char>(0xff);  // token 300 := 0x??ff >= 500
  bytes[32 + 2 * 300 + 1] = static_cast<char>(0xff);
  write_bytes(path, bytes);
  StatusOr<std::unique_ptr<DataSource>> src = make_data_source("tokens", path, {});
  ASSERT_TRUE(src.ok());
  std::vector<int32_t> t(kS), l(kS);
  // Sample 1 covers tokens 240..479: rank 0 of 2 ([240, 360)) holds it.
  EXPECT_TRUE(fails_with(src.value()->fill(1, kS, 0, 120, t.data(), l.data(), nullptr), Code::kCorrupt,
                         {path, "position 300"}));
  EXPECT_TRUE(src.value()->fill(1, kS, 120, 120, t.data(), l.data(), nullptr).ok());
  // Token 300 is also the label of position 59 of sample 1... and of nothing in sample 0.
  EXPECT_TRUE(fails_with(src.value()->fill(1, kS, 0, 60, t.data(), l.data(), nullptr), Code::kCorrupt, {"position 300"}));
  EXPECT_TRUE(src.value()->fill(1, kS, 0, 59, t.data(), l.data(), nullptr).ok());
  EXPECT_TRUE(src.value()->fill(0, kS, 0, kS, t.data(), l.data(), nullptr).ok());
}

TEST(DataSource, FactoryErrors) {
  TempDir dir;
  EXPECT_TRUE(fails_with(make_data_source("parquet", "", {}).status(), Code::kInvalidArgument,
                         {"unknown data kind 'parquet'", "kv, tokens or text"}));
  EXPECT_TRUE(fails_with(make_data_source("kv", "a.tok", {}).status(), Code::kInvalidArgument, {"a.tok", "drop the path"}));
  EXPECT_TRUE(fails_with(make_data_source("tokens", "", {}).status(), Code::kInvalidArgument, {"'tokens' needs a file"}));
  EXPECT_TRUE(fails_with(make_data_source("text", "", {}).status(), Code::kInvalidArgument, {"'text' needs a file"}));
  const std::string missing = dir.file("missing.tok");
  EXPECT_TRUE(fails_with(make_data_source("tokens", missing, {}).status(), Code::kNotFound, {missing}));
  EXPECT_TRUE(fails_with(make_data_source("text", missing, {}).status(), Code::kNotFound, {missing}));
  ASSERT_TRUE(write_token_file(dir.file("empty.tok"), {}, 10, 2).ok());
  EXPECT_TRUE(fails_with(make_data_source("tokens", dir.file("empty.tok"), {}).status(), Code::kInvalidArgument,
                         {"empty.tok", "no tokens"}));
  write_bytes(dir.file("plain.txt"), "just some text, not tokens\n");
  EXPECT_TRUE(fails_with(make_data_source("tokens", dir.file("plain.txt"), {}).status(), Code::kCorrupt,
                         {"plain.txt", "not an untied token file", "'text'"}));
  EXPECT_TRUE(fails_with(make_data_source("kv", "", {.kv = {.num_keys = 0}}).status(), Code::kInvalidArgument, {"num_keys"}));
}

TEST(DataSource, RangeOutsideTheSequenceIsABug) {
  StatusOr<std::unique_ptr<DataSource>> src = make_data_source("kv", "", {});
  ASSERT_TRUE(src.ok());
  std::vector<int32_t> t(kS + 1), l(kS + 1);
  EXPECT_THROW((void)src.value()->fill(0, kS, 1, kS, t.data(), l.data(), nullptr), Error);
  EXPECT_THROW((void)src.value()->fill(-1, kS, 0, 1, t.data(), l.data(), nullptr), Error);
}

}  // namespace
}  // namespace untied
