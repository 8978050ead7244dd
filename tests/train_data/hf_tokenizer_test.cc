// Hugging Face tokenizers against the `tokenizers` library itself: reference/make_tokenizer_fixtures.py
// built a Llama 3 style, a Qwen style and a GPT-2 style tokenizer.json and wrote the ids
// `tokenizers` gives on a multilingual sample (emoji, CJK, long whitespace runs, NFD input,
// special tokens in the text) and on edge cases, and a probe of where Oniguruma's \s splits.
// Here: the same ids exactly, round trips, every malformed file refused with a message naming
// it, and `untied prepare` writing what the fixture says for its JSONL and text inputs.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "train_data/data_test_util.h"
#include "untied/core/json.h"
#include "untied/train/hf_tokenizer.h"
#include "untied/train/token_file.h"

namespace untied {
namespace {

using Code = Status::Code;
using testing::fails_with;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

const std::string kFixtures = std::string(UNTIED_FIXTURES) + "/tokenizers";
const char* const kStyles[] = {"llama3_style", "qwen_style", "gpt2_style"};

nlohmann::json expected(const std::string& style) {
  return nlohmann::json::parse(read_bytes(kFixtures + "/" + style + "/expected.json"));
}

HfTokenizer load(const std::string& style) {
  StatusOr<HfTokenizer> t = HfTokenizer::load(kFixtures + "/" + style);
  UNTIED_CHECK(t.ok(), t.status().message());
  return std::move(t).value();
}

std::vector<int32_t> ids_of(const nlohmann::json& list) { return list.get<std::vector<int32_t>>(); }

// Equal, or the first difference with the text around it (decoded by the tokenizer).
::testing::AssertionResult same_ids(const std::vector<int32_t>& want, const std::vector<int32_t>& got,
                                    const HfTokenizer& tok) {
  if (want == got) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto around = [&](const std::vector<int32_t>& v) {
    std::string out;
    for (size_t k = i > 3 ? i - 3 : 0; k < std::min(v.size(), i + 4); ++k)
      out += (k == i ? "[" : "") + std::to_string(v[k]) + "'" + tok.decode(std::vector<int32_t>{v[k]}) + "'" +
             (k == i ? "] " : " ");
    return out;
  };
  return ::testing::AssertionFailure() << "first difference at id " << i << " of " << want.size() << " (got "
                                       << got.size() << "):\n  tokenizers: " << around(want)
                                       << "\n  untied:     " << around(got);
}

TEST(HfTokenizer, SidesAsTheModelDirectorySays) {
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    const nlohmann::json e = expected(style);
    HfTokenizer tok = load(style);
    EXPECT_EQ(tok.vocab_size(), e["vocab_size"].get<int64_t>());
    ASSERT_TRUE(tok.bos_id().has_value());
    ASSERT_TRUE(tok.eos_id().has_value());
    EXPECT_EQ(*tok.bos_id(), e["bos_id"].get<int32_t>());
    EXPECT_EQ(*tok.eos_id(), e["eos_id"].get<int32_t>());
    EXPECT_EQ(tok.adds_bos(), e["adds_bos"].get<bool>());
  }
  // Llama 3 lists several end ids in config.json (the first is EOS); tokenizer_config names its BOS.
  HfTokenizer llama = load("llama3_style");
  EXPECT_EQ(llama.bos_id(), llama.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama.eos_id(), llama.token_to_id("<|end_of_text|>"));
  EXPECT_TRUE(llama.token_to_id("\xC4\xA0jumps").has_value());  // " jumps", as the vocab writes it: "Ġjumps"
  EXPECT_EQ(llama.encode(" jumps", {.add_special_tokens = false}),
            std::vector<int32_t>{*llama.token_to_id("\xC4\xA0jumps")});
  EXPECT_FALSE(llama.token_to_id("no such token").has_value());
  // The tokenizer.json alone: BOS from its template, no EOS.
  StatusOr<HfTokenizer> bare = HfTokenizer::from_json(read_bytes(kFixtures + "/llama3_style/tokenizer.json"), "t.json");
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_EQ(bare.value().bos_id(), llama.bos_id());
  EXPECT_TRUE(bare.value().adds_bos());
  EXPECT_FALSE(bare.value().eos_id().has_value());
}

TEST(HfTokenizer, SampleIdsEqualTokenizers) {
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    const nlohmann::json e = expected(style);
    HfTokenizer tok = load(style);
    const std::string sample = read_bytes(kFixtures + "/" + style + "/sample.txt");
    ASSERT_GT(sample.size(), 3000u);
    EXPECT_TRUE(same_ids(ids_of(e["sample"]["ids"]), tok.encode(sample, {.add_special_tokens = false}), tok));
    EXPECT_TRUE(same_ids(ids_of(e["sample"]["ids_add_special"]), tok.encode(sample), tok));
    EXPECT_TRUE(same_ids(ids_of(e["sample"]["ids_special_as_text"]),
                         tok.encode(sample, {.add_special_tokens = false, .parse_special = false}), tok));
  }
}

TEST(HfTokenizer, EdgeCasesEqualTokenizers) {
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    const nlohmann::json e = expected(style);
    HfTokenizer tok = load(style);
    for (const auto& c : e["cases"]) {
      const std::string text = c["text"].get<std::string>();
      SCOPED_TRACE("text \"" + text.substr(0, 60) + "\"");
      EXPECT_TRUE(same_ids(ids_of(c["ids"]), tok.encode(text, {.add_special_tokens = false}), tok));
      EXPECT_TRUE(same_ids(ids_of(c["ids_add_special"]), tok.encode(text), tok));
      EXPECT_TRUE(same_ids(ids_of(c["ids_special_as_text"]),
                           tok.encode(text, {.add_special_tokens = false, .parse_special = false}), tok));
    }
  }
}

// Llama 3's ignore_merges: a pre-token in the vocab is one token. The same file with it false
// gives what tokenizers gives then (the fixture has words whose merges split them).
TEST(HfTokenizer, IgnoreMergesMatters) {
  const nlohmann::json e = expected("llama3_style");
  nlohmann::json j = nlohmann::json::parse(read_bytes(kFixtures + "/llama3_style/tokenizer.json"));
  ASSERT_TRUE(j["model"]["ignore_merges"].get<bool>());
  j["model"]["ignore_merges"] = false;
  StatusOr<HfTokenizer> plain = HfTokenizer::from_json(j.dump(), "patched");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const std::string sample = read_bytes(kFixtures + "/llama3_style/sample.txt");
  const std::vector<int32_t> want = ids_of(e["sample"]["ids_without_ignore_merges"]);
  HfTokenizer tok = std::move(plain).value();
  EXPECT_TRUE(same_ids(want, tok.encode(sample, {.add_special_tokens = false}), tok));
  EXPECT_NE(want, ids_of(e["sample"]["ids"]));
}

// Merges as "a b" strings (llama3_style's file) and as ["a", "b"] pairs (qwen_style's) are the
// same merges: each file converted to the other format gives the same ids.
TEST(HfTokenizer, BothMergeFormats) {
  for (const char* style : {"llama3_style", "qwen_style"}) {
    SCOPED_TRACE(style);
    nlohmann::json j = nlohmann::json::parse(read_bytes(kFixtures + "/" + std::string(style) + "/tokenizer.json"));
    const bool strings = j["model"]["merges"][0].is_string();
    EXPECT_EQ(strings, std::string(style) == "llama3_style");
    for (auto& m : j["model"]["merges"]) {
      if (strings) {
        const std::string s = m.get<std::string>();
        m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
      } else {
        m = m[0].get<std::string>() + " " + m[1].get<std::string>();
      }
    }
    StatusOr<HfTokenizer> converted = HfTokenizer::from_json(j.dump(), "converted");
    ASSERT_TRUE(converted.ok()) << converted.status().message();
    HfTokenizer tok = load(style);
    const std::string sample = read_bytes(kFixtures + "/" + std::string(style) + "/sample.txt");
    EXPECT_EQ(converted.value().vocab_size(), tok.vocab_size());
    HfTokenizer other = std::move(converted).value();
    EXPECT_EQ(other.encode(sample), tok.encode(sample));
  }
}

TEST(HfTokenizer, DecodeRoundTrips) {
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    HfTokenizer tok = load(style);
    const std::string sample = read_bytes(kFixtures + "/" + style + "/sample.txt");
    const std::vector<int32_t> ids = tok.encode(sample, {.add_special_tokens = false});
    if (std::string(style) == "qwen_style") {
      // NFC composes the sample's NFD paragraph, so that round-trips as NFC; the rest exactly.
      EXPECT_NE(tok.decode(ids), sample);
      const size_t nfd = sample.find("\n\nNFD:"), after = sample.find("\n\n", nfd + 2);
      ASSERT_NE(after, std::string::npos);
      const std::string rest = sample.substr(0, nfd) + sample.substr(after);
      EXPECT_EQ(tok.decode(tok.encode(rest, {.add_special_tokens = false})), rest);
      EXPECT_EQ(tok.decode(tok.encode("A\xCC\x8A", {.add_special_tokens = false})), "\xC3\x85");  // A + ring -> Å
      // An added token is decoded through the byte alphabet as tokenizers does: its 'é' is the
      // alphabet's character for byte 0xE9 (Python then shows U+FFFD: "Caf\ufffd").
      EXPECT_EQ(tok.decode(std::vector<int32_t>{*tok.token_to_id("Caf\xC3\xA9")}), "Caf\xE9");
    } else {
      EXPECT_EQ(tok.decode(ids), sample);
    }
    // Special tokens are kept or skipped; the text between them is unchanged.
    const std::vector<int32_t> with = tok.encode("a<|endoftext|>b", {.add_special_tokens = true});
    if (tok.token_to_id("<|endoftext|>")) {
      EXPECT_EQ(tok.decode(with, true), "ab");
    }
    EXPECT_EQ(tok.decode(tok.encode("x  \n\t y", {.add_special_tokens = false})), "x  \n\t y");
  }
}

// Where \s matches: Oniguruma's set (U+0085 and the separators, not U+180E, U+200B or U+001C),
// which PCRE2's own \s is not (it adds U+180E). One id: X did not split "aXb".
TEST(HfTokenizer, WhitespaceAsOniguruma) {
  const nlohmann::json e = nlohmann::json::parse(read_bytes(kFixtures + "/whitespace_probe/expected.json"));
  StatusOr<HfTokenizer> t = HfTokenizer::load(kFixtures + "/whitespace_probe");
  ASSERT_TRUE(t.ok()) << t.status().message();
  HfTokenizer tok = std::move(t).value();
  for (const auto& c : e["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_TRUE(same_ids(ids_of(c["ids"]), tok.encode(text), tok)) << text;
  }
  EXPECT_EQ(tok.encode("a\xE1\xA0\x8E"
                       "b")
                .size(),
            1u);  // U+180E
  EXPECT_EQ(tok.encode("a\xC2\x85"
                       "b")
                .size(),
            4u);  // U+0085
}

TEST(HfTokenizer, InvalidUtf8IsReplacedAsPythonDoes) {
  HfTokenizer tok = load("llama3_style");
  // b"a\xffb\xe2\x82c\xf0\x9f\x98".decode("utf-8", errors="replace") == "a\ufffdb\ufffdc\ufffd"
  const std::vector<int32_t> bad = tok.encode(
      "a\xff"
      "b\xe2\x82"
      "c\xf0\x9f\x98",
      {.add_special_tokens = false});
  EXPECT_EQ(bad, tok.encode("a\xEF\xBF\xBD"
                            "b\xEF\xBF\xBD"
                            "c\xEF\xBF\xBD",
                            {.add_special_tokens = false}));
  EXPECT_EQ(tok.invalid_utf8_replaced(), 3);
  // A surrogate written in UTF-8 (CESU) is three ill-formed bytes.
  EXPECT_EQ(tok.encode("\xED\xA0\x80", {.add_special_tokens = false}),
            tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", {.add_special_tokens = false}));
  EXPECT_EQ(tok.invalid_utf8_replaced(), 6);
}

// A long document in pieces, cut where safe_cut says: the same ids as the whole.
TEST(HfTokenizer, SafeCutsDoNotChangeIds) {
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    HfTokenizer tok = load(style);
    const std::string sample = read_bytes(kFixtures + "/" + style + "/sample.txt");
    const HfEncodeOptions o{.add_special_tokens = false};
    const std::vector<int32_t> whole = tok.encode(sample, o);
    if (std::string(style) == "gpt2_style") {  // the GPT-2 regex (and lstrip/rstrip tokens): no cut is promised
      EXPECT_EQ(tok.safe_cut(sample), 0u);
      continue;
    }
    int cuts = 0;
    for (size_t len = 2; len <= sample.size(); len += 7) {
      const size_t q = tok.safe_cut(std::string_view(sample).substr(0, len));
      if (q == 0) continue;
      ASSERT_LT(q, len);
      std::vector<int32_t> pieces = tok.encode(std::string_view(sample).substr(0, q), o);
      tok.encode_append(std::string_view(sample).substr(q), o, &pieces);
      ASSERT_EQ(pieces, whole) << "cut at " << q;
      ++cuts;
    }
    EXPECT_GT(cuts, 100);
  }
  // A regex that safe_cut does not know: no cut.
  nlohmann::json j = nlohmann::json::parse(read_bytes(kFixtures + "/llama3_style/tokenizer.json"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+|\\S+";
  StatusOr<HfTokenizer> other = HfTokenizer::from_json(j.dump(), "other");
  ASSERT_TRUE(other.ok()) << other.status().message();
  EXPECT_EQ(other.value().safe_cut("some text\nmore text here"), 0u);
}

// ---------------------------------------------------------------------------------------------
// Malformed and unsupported files: a Status naming the file and the key, never a crash.

class BadTokenizer : public ::testing::Test {
 protected:
  void SetUp() override { good_ = nlohmann::json::parse(read_bytes(kFixtures + "/qwen_style/tokenizer.json")); }
  Status from(const nlohmann::json& j) { return HfTokenizer::from_json(j.dump(), "bad.json").status(); }
  nlohmann::json good_;
};

TEST_F(BadTokenizer, NotJson) {
  EXPECT_TRUE(fails_with(HfTokenizer::from_json("{\"model\": ", "bad.json").status(), Code::kInvalidArgument,
                         {"bad.json", "not valid JSON"}));
  EXPECT_TRUE(fails_with(HfTokenizer::from_json("[1, 2]", "bad.json").status(), Code::kInvalidArgument,
                         {"bad.json", "JSON object"}));
  TempDir dir;
  write_bytes(dir.file("tokenizer.json"), "not json at all");
  EXPECT_TRUE(fails_with(HfTokenizer::load(dir.path().string()).status(), Code::kInvalidArgument,
                         {dir.file("tokenizer.json"), "not valid JSON"}));
}

TEST_F(BadTokenizer, MissingFiles) {
  EXPECT_TRUE(fails_with(HfTokenizer::load("/nonexistent/model").status(), Code::kNotFound, {"/nonexistent/model"}));
  TempDir dir;
  EXPECT_TRUE(
      fails_with(HfTokenizer::load(dir.path().string()).status(), Code::kNotFound, {"holds no tokenizer.json"}));
}

TEST_F(BadTokenizer, UnknownModelType) {
  nlohmann::json j = good_;
  j["model"]["type"] = "WordPiece";
  EXPECT_TRUE(fails_with(from(j), Code::kUnsupported, {"bad.json", "model", "'WordPiece'"}));
  j = good_;
  j.erase("model");
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"bad.json", "model", "missing"}));
}

TEST_F(BadTokenizer, MissingOrBadVocab) {
  nlohmann::json j = good_;
  j["model"].erase("vocab");
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"bad.json", "model.vocab", "missing"}));
  j = good_;
  j["model"]["vocab"] = nlohmann::json::array();
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.vocab", "object"}));
  j = good_;
  j["model"]["vocab"]["!"] = "one";
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.vocab", "'!'", "integer"}));
  j = good_;
  j["model"]["vocab"]["new"] = 5;  // the id of another token
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.vocab", "id 5"}));
  j = good_;
  j["model"].erase("merges");
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.merges", "missing"}));
}

TEST_F(BadTokenizer, MergesReferencingUnknownTokens) {
  nlohmann::json j = good_;
  j["model"]["merges"][3] = nlohmann::json::array({"\xC4\xA0", "zzzz"});
  EXPECT_TRUE(
      fails_with(from(j), Code::kInvalidArgument, {"bad.json", "model.merges[3]", "'zzzz'", "not in model.vocab"}));
  j = good_;
  j["model"]["merges"][0] = "a b c";
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.merges[0]", "one space"}));
  j = good_;
  j["model"]["merges"][1] = 7;
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.merges[1]", "pair"}));
  j = good_;
  j["model"]["merges"][2] = nlohmann::json::array({"x", "q"});  // both in the vocab, "xq" is not
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"model.merges[2]", "'xq'"}));
}

TEST_F(BadTokenizer, UnsupportedPipelineSteps) {
  struct Case {
    const char* pointer;  // JSON pointer to replace
    nlohmann::json value;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"/pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "_"}}, {"pre_tokenizer", "'Metaspace'"}},
      {"/pre_tokenizer", nullptr, {"pre_tokenizer", "null"}},
      {"/pre_tokenizer/pretokenizers/0/behavior", "Removed", {"pre_tokenizer.pretokenizers[0].behavior", "'Removed'"}},
      {"/pre_tokenizer/pretokenizers/0/invert", true, {"invert"}},
      {"/pre_tokenizer/pretokenizers/0/pattern", {{"Regex", "(unclosed"}}, {"pattern", "(unclosed"}},
      {"/pre_tokenizer/pretokenizers/1/add_prefix_space", true, {"add_prefix_space"}},
      {"/pre_tokenizer/pretokenizers/1/type", "Whitespace", {"'Whitespace'"}},
      {"/normalizer", {{"type", "Lowercase"}}, {"normalizer", "'Lowercase'"}},
      {"/normalizer",
       {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKD"}}}}},
       {"normalizer.normalizers[1]", "'NFKD'"}},
      {"/post_processor", {{"type", "RobertaProcessing"}}, {"post_processor", "'RobertaProcessing'"}},
      {"/decoder", {{"type", "WordPiece"}}, {"decoder", "'WordPiece'"}},
      {"/model/continuing_subword_prefix", "##", {"continuing_subword_prefix", "'##'"}},
      {"/model/dropout", 0.1, {"model.dropout"}},
      {"/truncation", {{"max_length", 512}}, {"truncation"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    nlohmann::json j = good_;
    j[nlohmann::json::json_pointer(c.pointer)] = c.value;
    const Status s = from(j);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("bad.json"), std::string::npos) << s.message();
    for (const std::string& p : c.parts) EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  }
}

TEST_F(BadTokenizer, BadAddedTokensAndTemplates) {
  nlohmann::json j = good_;
  j["added_tokens"][0].erase("content");
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"added_tokens[0].content"}));
  j = good_;
  j["added_tokens"][1]["id"] = -3;
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"added_tokens[1].id"}));
  j = nlohmann::json::parse(read_bytes(kFixtures + "/llama3_style/tokenizer.json"));
  j["post_processor"]["processors"][1]["special_tokens"].erase("<|begin_of_text|>");
  EXPECT_TRUE(fails_with(from(j), Code::kInvalidArgument, {"special_tokens", "<|begin_of_text|>"}));
}

TEST_F(BadTokenizer, BadSideFiles) {
  TempDir dir;
  write_bytes(dir.file("tokenizer.json"), read_bytes(kFixtures + "/qwen_style/tokenizer.json"));
  write_bytes(dir.file("config.json"), "{\"bos_token_id\": \"one\"}");
  EXPECT_TRUE(fails_with(HfTokenizer::load(dir.path().string()).status(), Code::kInvalidArgument,
                         {dir.file("config.json"), "bos_token_id"}));
  write_bytes(dir.file("config.json"), "{\"eos_token_id\": [99999999]}");
  EXPECT_TRUE(fails_with(HfTokenizer::load(dir.path().string()).status(), Code::kInvalidArgument,
                         {"eos_token_id", "99999999"}));
  write_bytes(dir.file("config.json"), "{\"eos_token_id\": null}");
  write_bytes(dir.file("tokenizer_config.json"), "{\"eos_token\": \"<|nope|>\"}");
  EXPECT_TRUE(fails_with(HfTokenizer::load(dir.path().string()).status(), Code::kInvalidArgument,
                         {dir.file("tokenizer_config.json"), "'<|nope|>'"}));
  write_bytes(dir.file("tokenizer_config.json"), "{\"eos_token\": {\"content\": \"<|im_end|>\"}}");
  StatusOr<HfTokenizer> t = HfTokenizer::load(dir.file("tokenizer.json"));  // a file path finds its neighbours too
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t.value().eos_id(), t.value().token_to_id("<|im_end|>"));
  EXPECT_FALSE(t.value().bos_id().has_value());
}

// ---------------------------------------------------------------------------------------------
// untied prepare: the token file holds what the fixture says.

struct Prepared {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  std::vector<int32_t> tokens;
  std::vector<int64_t> starts;
  int64_t vocab = 0;
};

Prepared prepare(const std::string& args, const std::string& out_path) {
  Prepared p;
  TempDir log;
  const std::string cmd = std::string(UNTIED_BINARY) + " prepare --no-progress " + args + " --output " + out_path +
                          " > " + log.file("out") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  p.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  p.output = read_bytes(log.file("out"));
  if (p.exit_code != 0) return p;
  StatusOr<TokenFile> f = TokenFile::open(out_path);
  UNTIED_CHECK(f.ok(), f.status().message());
  p.tokens.resize(static_cast<size_t>(f.value().size()));
  UNTIED_CHECK(f.value().read(0, f.value().size(), p.tokens.data()).ok(), "read");
  p.starts = f.value().document_starts();
  p.vocab = f.value().vocab_size();
  return p;
}

TEST(Prepare, OutputEqualsTheFixture) {
  TempDir dir;
  const std::string out = dir.file("out.tok");
  for (const char* style : kStyles) {
    SCOPED_TRACE(style);
    const std::string d = kFixtures + "/" + style;
    const nlohmann::json e = expected(style)["prepare"];
    HfTokenizer tok = load(style);
    struct Run {
      const char* key;
      std::string args;
    };
    const std::vector<Run> runs = {
        {"jsonl", d + "/docs.jsonl"},
        {"jsonl_parse_special", "--parse-special --input " + d + "/docs.jsonl"},
        {"jsonl_no_bos_no_eos", "--bos no --eos no --input=" + d + "/docs.jsonl"},
        {"text_blank_lines", d + "/sample.txt"},
        {"text_lines", "--split lines " + d + "/sample.txt"},
        // Tiny blocks: documents arrive in pieces and long ones are cut; the same file results.
        {"jsonl", "--block-bytes 7 " + d + "/docs.jsonl"},
        {"text_blank_lines", "--block-bytes 5 " + d + "/sample.txt"},
        {"text_lines", "--block-bytes 64 --split lines " + d + "/sample.txt"},
    };
    for (const Run& r : runs) {
      SCOPED_TRACE(r.args);
      const Prepared p = prepare("--tokenizer " + d + " " + r.args, out);
      ASSERT_EQ(p.exit_code, 0) << p.output;
      EXPECT_TRUE(same_ids(ids_of(e[r.key]["tokens"]), p.tokens, tok));
      EXPECT_EQ(p.starts, e[r.key]["doc_starts"].get<std::vector<int64_t>>());
      EXPECT_EQ(p.vocab, tok.vocab_size());
      EXPECT_NE(p.output.find("prepared " + std::to_string(p.starts.size()) + " documents"), std::string::npos)
          << p.output;
    }
  }
}

// A whole file as one document, and two inputs (text and JSONL) into one token file.
TEST(Prepare, WholeFilesAndSeveralInputs) {
  TempDir dir;
  const std::string d = kFixtures + "/llama3_style";
  HfTokenizer tok = load("llama3_style");
  const std::string sample = read_bytes(d + "/sample.txt");
  const std::vector<int32_t> body = tok.encode(sample, {.add_special_tokens = false, .parse_special = false});
  for (const char* block : {"4M", "100"}) {  // 100 bytes: cut at safe places, the same ids
    const Prepared p = prepare("--tokenizer " + d + " --split file --block-bytes " + block + " " + d + "/sample.txt",
                               dir.file("f.tok"));
    ASSERT_EQ(p.exit_code, 0) << p.output;
    std::vector<int32_t> want = {*tok.bos_id()};
    want.insert(want.end(), body.begin(), body.end());
    want.push_back(*tok.eos_id());
    EXPECT_TRUE(same_ids(want, p.tokens, tok));
    EXPECT_EQ(p.starts, std::vector<int64_t>{0});
  }
  const Prepared both = prepare("--tokenizer " + d + " " + d + "/sample.txt " + d + "/docs.jsonl", dir.file("b.tok"));
  ASSERT_EQ(both.exit_code, 0) << both.output;
  const nlohmann::json e = expected("llama3_style")["prepare"];
  std::vector<int32_t> want = ids_of(e["text_blank_lines"]["tokens"]);
  const std::vector<int32_t> jsonl = ids_of(e["jsonl"]["tokens"]);
  want.insert(want.end(), jsonl.begin(), jsonl.end());
  EXPECT_EQ(both.tokens, want);
  EXPECT_EQ(both.starts.size(), e["text_blank_lines"]["doc_starts"].size() + e["jsonl"]["doc_starts"].size());
}

TEST(Prepare, RefusalsWriteNothing) {
  TempDir dir;
  const std::string d = kFixtures + "/qwen_style";
  const std::string out = dir.file("out.tok");
  write_bytes(out, "an existing file");
  // A bad JSONL line: file:line, and the existing output untouched.
  write_bytes(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n\n{\"text\": \"also fine\"}\n{\"text\": 3}\n");
  Prepared p = prepare("--tokenizer " + d + " " + dir.file("bad.jsonl"), out);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.output.find(dir.file("bad.jsonl") + ":4: field \"text\" is number"), std::string::npos) << p.output;
  write_bytes(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \"broken\n");
  p = prepare("--tokenizer " + d + " " + dir.file("bad.jsonl"), out);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.output.find(dir.file("bad.jsonl") + ":2: not valid JSON"), std::string::npos) << p.output;
  p = prepare("--tokenizer " + d + " --field body " + d + "/docs.jsonl", out);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.output.find("docs.jsonl:1: no field \"body\""), std::string::npos) << p.output;
  // A missing input among good ones: refused before the output is created.
  p = prepare("--tokenizer " + d + " " + d + "/docs.jsonl " + dir.file("missing.txt"), out);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.output.find("cannot open input " + dir.file("missing.txt")), std::string::npos) << p.output;
  // Usage errors.
  p = prepare("--tokenizer " + d + " --bos sometimes " + d + "/docs.jsonl", out);
  EXPECT_EQ(p.exit_code, 2);
  p = prepare("--tokenizer " + d, out);
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_NE(p.output.find("no input"), std::string::npos) << p.output;
  // A tokenizer that is not one.
  write_bytes(dir.file("tokenizer.json"), "{\"model\": {\"type\": \"Unigram\"}}");
  p = prepare("--tokenizer " + dir.file("tokenizer.json") + " " + d + "/docs.jsonl", out);
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_NE(p.output.find("'Unigram'"), std::string::npos) << p.output;
  EXPECT_EQ(read_bytes(out), "an existing file");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"bad.jsonl", "out.tok", "tokenizer.json"}))
      << "a temporary was left";
}

}  // namespace
}  // namespace untied
