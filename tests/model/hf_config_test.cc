// Hugging Face config.json: the published conventions (Llama 3.1's rope_scaling, Llama 3.2's tied
// embeddings and head_dim, Qwen3's QK-norm, transformers 5's rope_parameters) and the refusals.
#include "untied/model/hf_config.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

namespace untied {
namespace {

// As published with Llama 3.1 8B (keys that untied does not read included).
const char* kLlama31 = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 128256})";

// Llama 3.2 1B: tied embeddings, head_dim 64, factor 32.
const char* kLlama32 = R"({"architectures": ["LlamaForCausalLM"], "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072, "num_attention_heads": 32,
  "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0,
  "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})";

// Qwen3 0.6B: QK-norm, head_dim 128 > hidden / heads, tied, rope_scaling null, an integer theta.
const char* kQwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vocab_size": 151936})";

// transformers 5 (LlamaConfig(...).to_json_string()): rope_parameters holding the theta, no
// architectures.
const char* kRopeParameters = R"({"attention_bias": false, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
  "intermediate_size": 96, "max_position_embeddings": 2048, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
  "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"},
  "tie_word_embeddings": false, "vocab_size": 100})";

TEST(HfConfig, Llama31) {
  auto c = parse_hf_config(kLlama31);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const ModelConfig& m = c.value().model;
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 128);
  EXPECT_EQ(m.ffn, 14336);
  EXPECT_FLOAT_EQ(m.norm_eps, 1e-5f);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(m.rope_scaling.factor, 8.0);
  EXPECT_EQ(m.rope_scaling.original_max_position, 8192.0);
  EXPECT_FALSE(c.value().tied_embeddings);
  EXPECT_EQ(c.value().max_position, 131072);
  EXPECT_EQ(c.value().torch_dtype, "bfloat16");
}

// Mistral: Llama's layers with one sliding window on every layer (null: none).
TEST(HfConfig, MistralSlidingWindow) {
  const std::string base = R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
    "intermediate_size": 96, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "vocab_size": 100, "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"},
    "sliding_window": )";
  auto w = parse_hf_config(base + "4096}");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w.value().sliding_window, 4096);
  EXPECT_EQ(w.value().architecture, "MistralForCausalLM");
  EXPECT_FALSE(w.value().model.qk_norm);
  EXPECT_EQ(w.value().model.rope_theta, 1000.0);
  auto none = parse_hf_config(base + "null}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value().sliding_window, 0);
  for (const char* bad : {"0}", "-3}", "\"4096\"}"}) {
    auto b = parse_hf_config(base + bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("sliding_window must be a positive integer or null"), std::string::npos);
  }
}

TEST(HfConfig, Llama32TiedAndQwen3) {
  auto l = parse_hf_config(kLlama32);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_TRUE(l.value().tied_embeddings);
  EXPECT_EQ(l.value().model.head_dim, 64);
  EXPECT_EQ(l.value().model.rope_scaling.factor, 32.0);
  auto q = parse_hf_config(kQwen3);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q.value().architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(q.value().model.qk_norm);
  EXPECT_TRUE(q.value().tied_embeddings);
  EXPECT_EQ(q.value().model.head_dim, 128);  // not hidden / heads (64)
  EXPECT_EQ(q.value().model.rope_theta, 1000000.0);
  EXPECT_EQ(q.value().model.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FLOAT_EQ(q.value().model.norm_eps, 1e-6f);
}

// As published with Qwen2.5 7B: Qwen2ForCausalLM has q/k/v biases whatever the config says (it
// has no attention_bias key); its sliding_window is unused while use_sliding_window is false.
const char* kQwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})";

TEST(HfConfig, Qwen25HasQkvBiasesAndMatchesItsPreset) {
  auto q = parse_hf_config(kQwen25);
  ASSERT_TRUE(q.ok()) << q.status().message();
  const ModelConfig& m = q.value().model;
  EXPECT_EQ(q.value().architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(q.value().sliding_window, 0);
  auto preset = model_preset("qwen2.5-7b");
  ASSERT_TRUE(preset.ok());
  const ModelConfig& p = preset.value();
  EXPECT_EQ(std::tie(m.vocab, m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn),
            std::tie(p.vocab, p.hidden, p.layers, p.heads, p.kv_heads, p.head_dim, p.ffn));
  EXPECT_EQ(m.rope_theta, p.rope_theta);
  EXPECT_EQ(m.qkv_bias, p.qkv_bias);
  // The bias parameters' count: (H + 2G) * D per layer.
  EXPECT_EQ(parameter_count(m), parameter_count([&] { ModelConfig n = m; n.qkv_bias = false; return n; }()) +
                                    m.layers * (m.heads + 2 * m.kv_heads) * m.head_dim);
}

// As published with Qwen3-30B-A3B and Mixtral-8x7B v0.1: each matches its preset (the mixture's
// shape included); router noise is refused.
const char* kQwen3Moe = R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";
const char* kMixtral = R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
  "vocab_size": 32000})";

TEST(HfConfig, RopeParametersBlock) {
  auto c = parse_hf_config(kRopeParameters);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c.value().architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.value().model.rope_theta, 500000.0);
  EXPECT_EQ(c.value().model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.value().model.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.value().model.head_dim, 16);
}

::testing::AssertionResult refused(const std::string& text, Status::Code code, const std::string& words) {
  auto c = parse_hf_config(text, "m/config.json");
  if (c.ok()) return ::testing::AssertionFailure() << "accepted";
  if (c.status().code() != code) return ::testing::AssertionFailure() << "code of: " << c.status().message();
  if (c.status().message().find(words) == std::string::npos || c.status().message().find("m/config.json") != 0)
    return ::testing::AssertionFailure() << "'" << words << "' not in: " << c.status().message();
  return ::testing::AssertionSuccess();
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(HfConfig, RefusalsNameTheKey) {
  using C = Status::Code;
  EXPECT_TRUE(refused(replaced(kLlama31, "LlamaForCausalLM", "DeepseekV3ForCausalLM"), C::kUnsupported,
                      "architecture 'DeepseekV3ForCausalLM' is not supported"));
  // A Mixtral needs its experts.
  EXPECT_TRUE(refused(replaced(kLlama31, "LlamaForCausalLM", "MixtralForCausalLM"), C::kInvalidArgument,
                      "the key 'num_local_experts' is missing"));
  EXPECT_TRUE(refused(replaced(kLlama31, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""), C::kUnsupported,
                      "rope_type 'yarn' is not supported"));
  EXPECT_TRUE(refused(replaced(kLlama31, "\"vocab_size\": 128256", "\"vocab\": 128256"), C::kInvalidArgument,
                      "'vocab_size' is missing"));
  EXPECT_TRUE(refused(replaced(kLlama31, "\"intermediate_size\": 14336", "\"intermediate_size\": \"big\""),
                      C::kInvalidArgument, "'intermediate_size' must be an integer"));
  EXPECT_TRUE(refused(replaced(kLlama31, "\"factor\": 8.0, ", ""), C::kInvalidArgument, "'factor' is missing"));
  EXPECT_TRUE(refused(replaced(kQwen3, "\"attention_bias\": false", "\"attention_bias\": true"), C::kUnsupported,
                      "attention_bias"));
  EXPECT_TRUE(refused(replaced(kLlama31, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"),
                      C::kInvalidArgument, "kv_heads"));
  EXPECT_TRUE(refused("[1, 2]", C::kInvalidArgument, "not a JSON object"));
  EXPECT_TRUE(refused("{\"vocab_size\": ", C::kInvalidArgument, "not JSON"));
}

TEST(HfConfig, MixturesOfExpertsMatchTheirPresets) {
  for (auto [text, preset] : {std::pair{kQwen3Moe, "qwen3-30b-a3b"}, {kMixtral, "mixtral-8x7b"}}) {
    SCOPED_TRACE(preset);
    auto c = parse_hf_config(text);
    ASSERT_TRUE(c.ok()) << c.status().message();
    const ModelConfig& m = c.value().model;
    const ModelConfig p = model_preset(preset).value();
    EXPECT_EQ(std::tie(m.vocab, m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.qk_norm),
              std::tie(p.vocab, p.hidden, p.layers, p.heads, p.kv_heads, p.head_dim, p.qk_norm));
    EXPECT_EQ(std::tie(m.experts, m.experts_per_token, m.expert_ffn, m.norm_topk_prob, m.moe_every),
              std::tie(p.experts, p.experts_per_token, p.expert_ffn, p.norm_topk_prob, p.moe_every));
    EXPECT_EQ(m.router_aux_coef, p.router_aux_coef);
    EXPECT_TRUE(m.dense_layers.empty());
    for (int64_t l = 0; l < m.layers; ++l) EXPECT_TRUE(moe_layer(m, l));
  }
  auto noisy = parse_hf_config(replaced(kMixtral, "\"vocab_size\": 32000", "\"vocab_size\": 32000, \"router_jitter_noise\": 0.1"));
  ASSERT_FALSE(noisy.ok());
  EXPECT_NE(noisy.status().message().find("router_jitter_noise"), std::string::npos);
}

}  // namespace
}  // namespace untied
