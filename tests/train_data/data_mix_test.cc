// Several files, weighted mixes and shuffling (data.h): several files read as one stream equal
// one file holding them all (a file's end a document boundary); a 3:1 mix draws its shares; a
// shuffled pass takes each whole sequence exactly once; every sample a pure function of its
// index (so a resumed run reads what an uninterrupted one reads, and ranks agree); passes();
// data shorter than a sequence refused unless repeat; the path's globs and its errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "train_data/data_test_util.h"
#include "untied/train/data.h"

namespace untied {
namespace {

using testing::TempDir;

// A token file of n tokens base, base + 1, ... (mod vocab), as one document.
std::string make_file(const TempDir& dir, const std::string& name, int n, int base, int vocab = 1000) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (base + i) % vocab;
  const std::string path = dir.file(name);
  const std::vector<int64_t> docs = {0};
  EXPECT_TRUE(write_token_file(path, t, vocab, 2, docs).ok());
  return path;
}

std::unique_ptr<DataSource> source(const std::string& path, DataOptions o = {}) {
  auto s = make_data_source("tokens", path, o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::vector<int32_t> sample(const DataSource& d, int64_t i, int64_t S, std::vector<int32_t>* labels = nullptr) {
  std::vector<int32_t> t(static_cast<size_t>(S)), l(static_cast<size_t>(S));
  EXPECT_TRUE(d.fill(i, S, 0, S, t.data(), l.data(), nullptr).ok());
  if (labels != nullptr) *labels = l;
  return t;
}

TEST(DataMix, SeveralFilesAreOneStreamWithAFileBoundary) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 50, 0), b = make_file(dir, "b.tok", 30, 500);
  auto two = source(a + "," + b);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->stream_tokens(), 80);
  // Sample 1 at S = 40: stream tokens 40..79, a's last 10 then b's 30; b's first token starts a
  // document, so the label before it is ignored.
  std::vector<int32_t> labels;
  const std::vector<int32_t> t = sample(*two, 1, 40, &labels);
  EXPECT_EQ(t[0], 40);
  EXPECT_EQ(t[9], 49);
  EXPECT_EQ(t[10], 500);
  EXPECT_EQ(labels[9], kIgnoreIndex);
  EXPECT_EQ(labels[10], 501);
  auto starts = two->document_starts(1, 40);
  ASSERT_TRUE(starts.ok());
  EXPECT_EQ(starts.value(), (std::vector<int64_t>{0, 10}));
  // A glob gives the same files in name order.
  auto globbed = source(dir.file("*.tok"));
  ASSERT_TRUE(globbed);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(sample(*globbed, i, 40), sample(*two, i, 40)) << i;
}

TEST(DataMix, WeightsDrawTheirShares) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 4000, 0), b = make_file(dir, "b.tok", 4000, 500);
  DataOptions o;
  o.weights = {3, 1};
  o.seed = 7;
  auto mix = source(a + "," + b, o);
  ASSERT_TRUE(mix);
  int from_a = 0;
  // Count by the passes(): tokens drawn from each stream over its size.
  const std::vector<DataSource::Pass> p = mix->passes(1000, 16);
  ASSERT_EQ(p.size(), 2u);
  const double drawn_a = p[0].passes * 4000 / 16, drawn_b = p[1].passes * 4000 / 16;
  EXPECT_NEAR(drawn_a + drawn_b, 1000, 1e-9);
  from_a = static_cast<int>(drawn_a);
  EXPECT_NEAR(from_a, 750, 5) << "a 3:1 mix of 1000 sequences";
  // Each stream's sequences come in order: the k-th drawn from a is a's k-th sequence.
  int k_a = 0, k_b = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const std::vector<int32_t> t = sample(*mix, i, 16);
    const auto pa = mix->passes(i, 16), pb = mix->passes(i + 1, 16);
    if (pb[0].passes > pa[0].passes) {
      EXPECT_EQ(t[0], (k_a * 16) % 1000) << "sample " << i;
      ++k_a;
    } else {
      EXPECT_EQ(t[0], (500 + k_b * 16) % 1000) << "sample " << i;
      ++k_b;
    }
  }
  std::printf("3:1 mix, seed 7: %d of 1000 sequences from the first file, %d from the second\n", from_a, 1000 - from_a);
  // Another seed, another interleaving, the same shares.
  o.seed = 8;
  auto other = source(a + "," + b, o);
  EXPECT_NEAR(other->passes(1000, 16)[0].passes * 4000 / 16, 750, 5);
  bool differs = false;
  for (int64_t i = 0; i < 50 && !differs; ++i) differs = sample(*other, i, 16) != sample(*mix, i, 16);
  EXPECT_TRUE(differs);
}

TEST(DataMix, ShuffledPassTakesEveryWholeSequenceOnce) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 1000, 0, 1000);  // token t is t: the start says which
  DataOptions o;
  o.shuffle = true;
  o.seed = 3;
  auto d = source(a, o);
  ASSERT_TRUE(d);
  const int64_t S = 64, per_pass = 1000 / S;  // 15 whole sequences, 40 tokens of slack
  for (int64_t pass = 0; pass < 3; ++pass) {
    std::set<int32_t> starts;
    int32_t offset = -1;
    for (int64_t j = 0; j < per_pass; ++j) {
      const std::vector<int32_t> t = sample(*d, pass * per_pass + j, S);
      for (int64_t k = 1; k < S; ++k) ASSERT_EQ(t[static_cast<size_t>(k)], t[0] + k) << "a whole, contiguous sequence";
      starts.insert(t[0]);
      if (offset < 0) offset = t[0] % S;
      EXPECT_EQ(t[0] % S, offset) << "one offset per pass";
      EXPECT_LE(t[0] + S, 1000);
    }
    EXPECT_EQ(static_cast<int64_t>(starts.size()), per_pass) << "pass " << pass << ": every sequence once";
    EXPECT_NEAR(d->passes((pass + 1) * per_pass, S)[0].passes, pass + 1, 1e-12);
  }
  // Not the file's order, and a pure function of the index: two sources, read in another order
  // (a resumed run), give the same samples.
  bool in_order = true;
  for (int64_t j = 0; j < per_pass; ++j) in_order = in_order && sample(*d, j, S)[0] == sample(*d, 0, S)[0] + j * S;
  EXPECT_FALSE(in_order);
  auto again = source(a, o);
  for (int64_t i = 40; i >= 0; --i) EXPECT_EQ(sample(*again, i, S), sample(*d, i, S)) << i;
}

TEST(DataMix, ShuffledMixIsAPureFunctionOfTheIndex) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 3000, 0), b = make_file(dir, "b.tok", 2000, 500);
  DataOptions o;
  o.weights = {1, 2};
  o.shuffle = true;
  o.seed = 11;
  auto first = source(a + "," + b, o);
  std::vector<std::vector<int32_t>> want;
  for (int64_t i = 0; i < 300; ++i) want.push_back(sample(*first, i, 32));
  auto resumed = source(a + "," + b, o);  // starts reading at sample 250, then goes back
  for (int64_t i = 250; i < 300; ++i) EXPECT_EQ(sample(*resumed, i, 32), want[static_cast<size_t>(i)]) << i;
  for (int64_t i = 0; i < 250; ++i) EXPECT_EQ(sample(*resumed, i, 32), want[static_cast<size_t>(i)]) << i;
}

TEST(DataMix, ShortDataRefusedUnlessRepeated) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 8, 0);
  DataOptions o;
  o.seq_len = 4096;
  auto refused = make_data_source("tokens", a, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("holds 8 tokens, fewer than one sequence of --seq 4096"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("--data-repeat"), std::string::npos);
  o.repeat = true;
  auto repeated = make_data_source("tokens", a, o);
  ASSERT_TRUE(repeated.ok());
  EXPECT_EQ(sample(*repeated.value(), 0, 16)[8], 0);
}

TEST(DataMix, PathErrors) {
  TempDir dir;
  const std::string a = make_file(dir, "a.tok", 100, 0);
  auto empty_entry = make_data_source("tokens", a + ",", DataOptions{});
  ASSERT_FALSE(empty_entry.ok());
  EXPECT_NE(empty_entry.status().message().find("empty entry"), std::string::npos);
  auto no_match = make_data_source("tokens", dir.file("*.nothing"), DataOptions{});
  ASSERT_FALSE(no_match.ok());
  EXPECT_NE(no_match.status().message().find("matches no file"), std::string::npos);
  DataOptions o;
  o.weights = {1, 2};
  auto wrong_count = make_data_source("tokens", a, o);
  ASSERT_FALSE(wrong_count.ok());
  EXPECT_NE(wrong_count.status().message().find("one weight per entry"), std::string::npos);
}

}  // namespace
}  // namespace untied

namespace untied {
namespace {

using testing::TempDir;

// A version 3 file: documents of the given lengths, token t is t % 1000, the mask given per token.
std::string make_masked(const TempDir& dir, const std::vector<int>& lengths, const std::vector<uint8_t>& targets) {
  const std::string path = dir.file("sft.tok");
  auto created = TokenFileWriter::create(path, 1000, TokenFileWriter::Options{.loss_mask = true});
  EXPECT_TRUE(created.ok());
  TokenFileWriter w = std::move(created).value();
  int t = 0;
  for (const int n : lengths) {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    for (int i = 0; i < n; ++i, ++t) {
      tokens.push_back(t % 1000);
      mask.push_back(targets[static_cast<size_t>(t)]);
    }
    w.begin_document();
    EXPECT_TRUE(w.append(tokens, mask).ok());
  }
  EXPECT_TRUE(w.finish().ok());
  return path;
}

TEST(TokenFileMask, WrittenAndReadBack) {
  TempDir dir;
  std::vector<uint8_t> targets(37);
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = (i * 7 % 3) == 0 ? 1 : 0;
  const std::string path = make_masked(dir, {20, 17}, targets);
  auto f = TokenFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().version(), 3);
  EXPECT_TRUE(f.value().has_loss_mask());
  EXPECT_EQ(f.value().document_starts(), (std::vector<int64_t>{0, 20}));
  for (int64_t start : {0, 3, 8, 15}) {
    std::vector<uint8_t> got(static_cast<size_t>(37 - start));
    ASSERT_TRUE(f.value().read_targets(start, 37 - start, got.data()).ok());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], targets[static_cast<size_t>(start) + i]) << start + i;
  }
  // 32 + 37*2 + 8 + 16 + ceil(37/8) bytes; one byte less is refused.
  EXPECT_EQ(std::filesystem::file_size(path), 32u + 74 + 8 + 16 + 5);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  auto cut = TokenFile::open(path);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("truncated or corrupt"), std::string::npos) << cut.status().message();
}

// Supervised samples are packed whole: documents of 10, 6 and 12 tokens at S = 16 make the
// sequences [10 + 6] and [12 + padding]; labels only where the next token is a target, never
// across a document or into the padding; the padding is a document of its own.
TEST(DataMix, SupervisedSamplesPackedWhole) {
  TempDir dir;
  std::vector<uint8_t> targets(28, 0);
  for (int t : {5, 6, 7, 8, 9, 13, 14, 15, 20, 21, 22, 23, 24, 25, 26, 27}) targets[static_cast<size_t>(t)] = 1;
  const std::string path = make_masked(dir, {10, 6, 12}, targets);
  auto d = source(path);
  ASSERT_TRUE(d);
  std::vector<int32_t> labels;
  std::vector<int32_t> t0 = sample(*d, 0, 16, &labels);
  for (int p = 0; p < 16; ++p) EXPECT_EQ(t0[static_cast<size_t>(p)], p);
  for (int p = 0; p < 16; ++p) {
    const bool want = p + 1 < 16 && targets[static_cast<size_t>(p + 1)] && p + 1 != 10;
    EXPECT_EQ(labels[static_cast<size_t>(p)], want ? p + 1 : kIgnoreIndex) << "position " << p;
  }
  auto starts = d->document_starts(0, 16);
  ASSERT_TRUE(starts.ok());
  EXPECT_EQ(starts.value(), (std::vector<int64_t>{0, 10}));
  std::vector<int32_t> t1 = sample(*d, 1, 16, &labels);
  for (int p = 0; p < 12; ++p) EXPECT_EQ(t1[static_cast<size_t>(p)], 16 + p);
  for (int p = 12; p < 16; ++p) EXPECT_EQ(labels[static_cast<size_t>(p)], kIgnoreIndex) << "padding " << p;
  EXPECT_EQ(labels[11], kIgnoreIndex) << "the last real token has no next";
  EXPECT_EQ(labels[3], 20);
  starts = d->document_starts(1, 16);
  ASSERT_TRUE(starts.ok());
  EXPECT_EQ(starts.value(), (std::vector<int64_t>{0, 12}));
  // Two packed sequences per pass; shards over ranks read what the whole read gives.
  EXPECT_EQ(sample(*d, 2, 16), t0);
  EXPECT_EQ(d->samples_cut(16), 0);
  EXPECT_EQ(d->samples_cut(8), 2) << "the 10- and 12-token samples do not fit 8";
  EXPECT_NEAR(d->passes(2, 16)[0].passes, 1.0, 1e-12);
  for (int64_t c : {2, 4}) {
    std::vector<int32_t> whole_t(16), whole_l(16);
    ASSERT_TRUE(d->fill(1, 16, 0, 16, whole_t.data(), whole_l.data(), nullptr).ok());
    for (int64_t r = 0; r < c; ++r) {
      const int64_t l = 16 / c;
      std::vector<int32_t> st(static_cast<size_t>(l)), sl(static_cast<size_t>(l));
      ASSERT_TRUE(d->fill(1, 16, r * l, l, st.data(), sl.data(), nullptr).ok());
      for (int64_t k = 0; k < l; ++k) {
        EXPECT_EQ(st[static_cast<size_t>(k)], whole_t[static_cast<size_t>(r * l + k)]);
        EXPECT_EQ(sl[static_cast<size_t>(k)], whole_l[static_cast<size_t>(r * l + k)]) << c << " ranks, position " << r * l + k;
      }
    }
  }
}

}  // namespace
}  // namespace untied
