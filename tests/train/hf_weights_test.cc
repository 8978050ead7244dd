// A Hugging Face model directory made by transformers itself (reference/make_hf_fixtures.py: a
// tiny random Llama 3 with GQA, untied embeddings, llama3 rope scaling in all three wavelength
// bands, sharded safetensors): its config and weights load, every rank reading its own shards,
// and untied's loss on transformers' token sequence equals transformers' own, in every strategy.
// And the refusals: a missing, extra or misshapen tensor, an index pointing at the wrong file.
#include "untied/train/hf_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/decoder_step.h"
#include "untied/comm/inproc.h"
#include "untied/core/json.h"
#include "untied/device/device.h"
#include "untied/model/hf_config.h"

#ifndef UNTIED_FIXTURES
#error "UNTIED_FIXTURES must name the fixture directory"
#endif

namespace untied {
namespace {

const std::string kDir = std::string(UNTIED_FIXTURES) + "/hf_llama_tiny";

Json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

TEST(HfWeights, NamesMapToTheLlamaLayout) {
  EXPECT_EQ(hf_tensor_name("embed"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_tensor_name("layers.11.wq"), "model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(hf_tensor_name("layers.0.k_norm"), "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(hf_tensor_name("layers.3.mlp_norm"), "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(hf_tensor_name("layers.3.w_down"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(hf_tensor_name("final_norm"), "model.norm.weight");
  EXPECT_EQ(hf_tensor_name("lm_head"), "lm_head.weight");
}

// transformers' loss is the mean cross-entropy of tokens[1:] predicted from tokens[:-1].
TEST(HfWeights, LossEqualsTransformersInEveryStrategy) {
  auto cfg = read_hf_config(kDir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  const ModelConfig& m = cfg.value().model;
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::kLlama3);
  auto w = HfWeights::open(kDir);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE(w.value().check(m).ok()) << w.value().check(m).message();
  const Json expected = read_json(kDir + "/expected.json");
  const std::vector<int32_t> tokens = expected["tokens"].get<std::vector<int32_t>>();
  const double want = expected["loss"].get<double>();
  std::vector<int32_t> labels(tokens.size(), -100);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) labels[i] = tokens[i + 1];
  struct Run {
    Strategy strategy;
    int ranks, ring;
  };
  double worst = 0;
  for (Run r : {Run{Strategy::kLocal, 1, 1}, {Strategy::kUlysses, 2, 1}, {Strategy::kUPipe, 2, 1},
                {Strategy::kUlysses, 4, 1}, {Strategy::kUPipe, 4, 1}, {Strategy::kRing, 4, 1}, {Strategy::kUPipe, 4, 2}}) {
    SCOPED_TRACE(std::string(strategy_name(r.strategy)) + " on " + std::to_string(r.ranks) + " ranks");
    Status load = Status::ok_status();
    const test::DecoderStep step = test::run_decoder_step(
        m, DecoderOptions{.seq = static_cast<int64_t>(tokens.size()), .strategy = r.strategy, .ring = r.ring},
        r.ranks, tokens, labels, [&](ShardedParams& params, int) {
          const Status s = load_hf_weights(w.value(), params);  // each rank its own shards
          if (!s.ok()) load = s;
        });
    ASSERT_TRUE(load.ok()) << load.message();
    const double rel = std::fabs(step.loss - want) / want;
    worst = std::max(worst, rel);
    // fp32 against transformers' fp32: the loss of a 2-layer model over 47 tokens, ~1e-7.
    EXPECT_LE(rel, 1e-5) << "untied " << step.loss << ", transformers " << want;
  }
  std::printf("  worst relative loss error against transformers: %.3e\n", worst);
}

// --save-hf's writer: what it writes loads back (config and every tensor) as the same parameters.
TEST(HfWeights, SavedModelLoadsBackUnchanged) {
  auto cfg = read_hf_config(kDir);
  ASSERT_TRUE(cfg.ok());
  const ModelConfig& m = cfg.value().model;
  auto w = HfWeights::open(kDir);
  ASSERT_TRUE(w.ok());
  const std::string out = ::testing::TempDir() + "hf_saved_" + std::to_string(::getpid());
  std::filesystem::remove_all(out);
  for (int ranks : {1, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    Status saved = Status::ok_status();
    run_in_process(ranks, [&](Communicator& comm) {
      auto dev = make_cpu_device({.threads = 1});
      ShardedParams params(*dev, comm, parameter_descriptors(m), DType::kF32);
      Status s = load_hf_weights(w.value(), params);
      if (s.ok()) s = save_hf_model(out, params, comm, m, SaveHfOptions{.max_position = 256});
      if (comm.rank() == 0) saved = s;
    });
    ASSERT_TRUE(saved.ok()) << saved.message();
    auto back_cfg = read_hf_config(out);
    ASSERT_TRUE(back_cfg.ok()) << back_cfg.status().message();
    EXPECT_EQ(back_cfg.value().model.rope_scaling.type, RopeScalingType::kLlama3);
    EXPECT_EQ(back_cfg.value().model.head_dim, m.head_dim);
    auto back = HfWeights::open(out);
    ASSERT_TRUE(back.ok()) << back.status().message();
    ASSERT_TRUE(back.value().check(m).ok());
    for (const ParamDesc& d : parameter_descriptors(m)) {
      const int64_t n = d.shape.numel();
      std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      ASSERT_TRUE(w.value().read(hf_tensor_name(d.name), 0, n, a.data()).ok());
      ASSERT_TRUE(back.value().read(hf_tensor_name(d.name), 0, n, b.data()).ok());
      EXPECT_EQ(a, b) << d.name;
    }
    std::filesystem::remove_all(out);
  }
}

// A saved config.json is the source's with what training changed: rope_theta (at the top level,
// or in transformers 5's rope_parameters), max_position_embeddings, the dtype; the rest kept.
TEST(HfWeights, SavedConfigKeepsTheSourceAndRecordsChanges) {
  for (const std::string fixture : {"hf_llama_tiny", "hf_qwen3_tiny"}) {
    SCOPED_TRACE(fixture);
    const std::string src = std::string(UNTIED_FIXTURES) + "/" + fixture;
    auto cfg = read_hf_config(src);
    ASSERT_TRUE(cfg.ok());
    ModelConfig m = cfg.value().model;
    m.rope_theta = 123456.0;
    const std::string out = ::testing::TempDir() + "hf_config_" + std::to_string(::getpid());
    ASSERT_TRUE(write_hf_config(out, m, SaveHfOptions{.max_position = 100000, .source_config = src + "/config.json",
                                                      .dtype = "BF16"})
                    .ok());
    auto back = read_hf_config(out);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back.value().model.rope_theta, 123456.0);
    EXPECT_EQ(back.value().model.rope_scaling.type, m.rope_scaling.type);
    EXPECT_EQ(back.value().model.tied_embeddings, m.tied_embeddings);
    EXPECT_EQ(back.value().max_position, 100000);
    EXPECT_EQ(back.value().torch_dtype, "bfloat16");
    const Json j = read_json(out + "/config.json"), was = read_json(src + "/config.json");
    for (const auto& [key, value] : was.items()) {
      if (key != "rope_theta" && key != "rope_parameters" && key != "max_position_embeddings" && key != "dtype" &&
          key != "torch_dtype") {
        EXPECT_EQ(j[key], value) << key;
      }
    }
    std::filesystem::remove_all(out);
  }
}

class BadModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "hf_bad_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::copy(kDir, dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  Status check() {
    auto cfg = read_hf_config(dir_);
    if (!cfg.ok()) return cfg.status();
    auto w = HfWeights::open(dir_);
    if (!w.ok()) return w.status();
    return w.value().check(cfg.value().model);
  }
  void edit_index(const std::function<void(Json&)>& f) {
    Json j = read_json(dir_ + "/model.safetensors.index.json");
    f(j);
    std::ofstream(dir_ + "/model.safetensors.index.json") << j.dump();
  }
  std::string dir_;
};

TEST_F(BadModelDir, MissingTensor) {
  // A model whose config asks for a third layer that the weights lack.
  Json c = read_json(dir_ + "/config.json");
  c["num_hidden_layers"] = 3;
  std::ofstream(dir_ + "/config.json") << c.dump();
  const Status s = check();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.layers.2."), std::string::npos) << s.message();
}

TEST_F(BadModelDir, WrongShape) {
  Json c = read_json(dir_ + "/config.json");
  c["intermediate_size"] = 40;
  std::ofstream(dir_ + "/config.json") << c.dump();
  const Status s = check();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("has shape"), std::string::npos) << s.message();
}

TEST_F(BadModelDir, ExtraTensorAndUnknownArchitecture) {
  Json c = read_json(dir_ + "/config.json");
  c["num_hidden_layers"] = 1;  // the second layer's tensors are left over
  std::ofstream(dir_ + "/config.json") << c.dump();
  Status s = check();
  EXPECT_NE(s.message().find("which the model does not have"), std::string::npos) << s.message();
  c["architectures"] = {"GPT2LMHeadModel"};
  std::ofstream(dir_ + "/config.json") << c.dump();
  s = check();
  EXPECT_EQ(s.code(), Status::Code::kUnsupported);
  EXPECT_NE(s.message().find("GPT2LMHeadModel"), std::string::npos) << s.message();
}

TEST_F(BadModelDir, IndexPointsAtTheWrongFileOrATruncatedShard) {
  edit_index([](Json& j) { j["weight_map"]["model.norm.weight"] = "model-00001-of-00005.safetensors"; });
  Status s = check();
  EXPECT_NE(s.message().find("does not hold it"), std::string::npos) << s.message();
  SetUp();
  const std::string shard = dir_ + "/model-00002-of-00005.safetensors";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 10);
  s = check();
  EXPECT_EQ(s.code(), Status::Code::kCorrupt) << s.message();
  EXPECT_NE(s.message().find("model-00002-of-00005.safetensors"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace untied
