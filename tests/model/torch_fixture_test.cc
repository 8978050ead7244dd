// The whole decoder against PyTorch: reference/make_decoder_fixtures.py wrote a small model's
// weights, tokens and labels with its float64 loss and every parameter's gradient; untied must
// reproduce them with every strategy and rank count.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/compare.h"
#include "common/decoder_step.h"
#include "untied/core/json.h"
#include "untied/core/npy.h"
#include "untied/dist/sharded_params.h"
#include "untied/model/decoder.h"

#ifndef UNTIED_FIXTURES
#error "UNTIED_FIXTURES must name the fixture directory"
#endif

namespace untied {
namespace {


double json_number(const std::string& text, const std::string& key) {
  const auto k = text.find("\"" + key + "\"");
  EXPECT_NE(k, std::string::npos) << key;
  return std::stod(text.substr(text.find(':', k) + 1));
}

bool json_bool(const std::string& text, const std::string& key) {
  const auto k = text.find("\"" + key + "\"");
  return k != std::string::npos && text.compare(text.find(':', k) + 1, 5, " true") == 0;
}

std::vector<float> load(const std::string& dir, const std::string& name) {
  std::vector<int64_t> shape;
  std::vector<float> data;
  Status s = read_npy(dir + "/" + name + ".npy", &shape, &data);
  EXPECT_TRUE(s.ok()) << s.message();
  return data;
}

struct Fixture {
  ModelConfig m;
  int64_t seq = 0;
  double loss = 0;
  std::vector<int32_t> tokens, labels;
  std::vector<int64_t> doc_lens;  // packed documents (empty: one)
};

Fixture read_fixture(const std::string& dir) {
  std::ifstream f(dir + "/config.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string t = ss.str();
  Fixture fx;
  fx.m.name = "fixture";
  fx.m.vocab = json_number(t, "vocab"), fx.m.hidden = json_number(t, "hidden"), fx.m.layers = json_number(t, "layers");
  fx.m.heads = json_number(t, "heads"), fx.m.kv_heads = json_number(t, "kv_heads");
  fx.m.head_dim = json_number(t, "head_dim"), fx.m.ffn = json_number(t, "ffn");
  fx.m.rope_theta = json_number(t, "rope_theta");
  fx.m.norm_eps = static_cast<float>(json_number(t, "norm_eps"));
  fx.m.qk_norm = json_bool(t, "qk_norm");
  fx.seq = json_number(t, "seq");
  fx.loss = json_number(t, "loss");
  const Json cfg = Json::parse(t);
  if (cfg.contains("doc_lens")) fx.doc_lens = cfg["doc_lens"].get<std::vector<int64_t>>();
  for (float v : load(dir, "tokens")) fx.tokens.push_back(static_cast<int32_t>(v));
  for (float v : load(dir, "labels")) fx.labels.push_back(static_cast<int32_t>(v));
  return fx;
}

class DecoderVsPyTorch : public ::testing::TestWithParam<const char*> {};

// decoder_small: Llama 3 style; decoder_qknorm: Qwen3 style (RMSNorm on each q and k head).
// decoder_packed: documents packed into the sequence (Hugging Face packing with position_ids).
INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderVsPyTorch, ::testing::Values("decoder_small", "decoder_qknorm",
                                                                       "decoder_packed"));

TEST_P(DecoderVsPyTorch, LossAndEveryGradient) {
  const std::string dir = std::string(UNTIED_FIXTURES) + "/" + GetParam();
  const Fixture fx = read_fixture(dir);
  ASSERT_EQ(fx.m.qk_norm, std::string(GetParam()) == "decoder_qknorm");
  ASSERT_EQ(static_cast<int64_t>(fx.tokens.size()), fx.seq);
  const auto descs = parameter_descriptors(fx.m);
  std::vector<std::vector<float>> weights, want;
  for (const auto& d : descs) {
    weights.push_back(load(dir, d.name));
    want.push_back(load(dir, "grad." + d.name));
    ASSERT_EQ(static_cast<int64_t>(weights.back().size()), d.shape.numel()) << d.name;
  }
  struct Run {
    Strategy strategy;
    int ranks, ring;
  };
  for (auto [strategy, ranks, ring] : {Run{Strategy::kLocal, 1, 1}, {Strategy::kUlysses, 2, 1}, {Strategy::kUPipe, 2, 1},
                                       {Strategy::kUPipe, 4, 1}, {Strategy::kRing, 3, 1}, {Strategy::kUPipe, 4, 2}}) {
    SCOPED_TRACE(std::string(strategy_name(strategy)) + " on " + std::to_string(ranks) + " ranks, ring " +
                 std::to_string(ring));
    const test::DecoderStep step = test::run_decoder_step(
        fx.m, DecoderOptions{.seq = fx.seq, .strategy = strategy, .ring = ring, .mlp_tile = 16}, ranks, fx.tokens,
        fx.labels, test::params_from(weights), fx.doc_lens);
    const double loss = step.loss;
    const std::vector<std::vector<float>>& got = step.grads;
    // fp32 against float64: the loss to ~1e-7 relative; each gradient to 1e-4 of its largest
    // element (fp32 sums over S*E terms, observed ~1e-6).
    EXPECT_NEAR(loss, fx.loss, 1e-5 * fx.loss);
    for (size_t i = 0; i < descs.size(); ++i) {
      const std::vector<double> w = test::to_double(want[i]), g = test::to_double(got[i]);
      const double mx = test::max_abs(w), err = test::max_abs_error(w, g);  // a NaN gives err = inf
      EXPECT_LE(err, 1e-4 * mx) << descs[i].name << ": max |untied - torch| " << err << ", max |grad| " << mx;
    }
  }
}

}  // namespace
}  // namespace untied
