#include "untied/model/model_config.h"

#include <algorithm>

namespace untied {

bool preset_keeps_vocabulary(const std::string& name) {
  return name == "llama3-8b" || name == "llama3-70b" || name == "mistral-7b" || name == "qwen2.5-7b" ||
         name == "qwen3-32b" || name == "qwen3-30b-a3b" || name == "mixtral-8x7b";
}

StatusOr<ModelConfig> model_preset(const std::string& name) {
  ModelConfig m;
  m.name = name;
  if (name == "tiny") {
    m.vocab = 512, m.hidden = 64, m.layers = 2, m.heads = 8, m.kv_heads = 4, m.head_dim = 16, m.ffn = 192;
    m.rope_theta = 10000.0;
  } else if (name == "small") {
    m.vocab = 512, m.hidden = 256, m.layers = 4, m.heads = 8, m.kv_heads = 4, m.head_dim = 32, m.ffn = 768;
    m.rope_theta = 10000.0;
  } else if (name == "tiny-moe") {  // tiny's attention, Mixtral's MoE layout: 8 experts, 2 a token
    m.vocab = 512, m.hidden = 64, m.layers = 2, m.heads = 8, m.kv_heads = 4, m.head_dim = 16, m.ffn = 96;
    m.rope_theta = 10000.0;
    m.experts = 8, m.experts_per_token = 2, m.expert_ffn = 96, m.norm_topk_prob = true, m.router_aux_coef = 0.01;
  } else if (name == "llama3-8b") {
    m.vocab = 128256, m.hidden = 4096, m.layers = 32, m.heads = 32, m.kv_heads = 8, m.head_dim = 128;
    m.ffn = 14336, m.rope_theta = 500000.0;
  } else if (name == "llama3-70b") {
    m.vocab = 128256, m.hidden = 8192, m.layers = 80, m.heads = 64, m.kv_heads = 8, m.head_dim = 128;
    m.ffn = 28672, m.rope_theta = 500000.0;
  } else if (name == "mistral-7b") {  // Mistral-7B v0.3 (sliding_window null: full attention)
    m.vocab = 32768, m.hidden = 4096, m.layers = 32, m.heads = 32, m.kv_heads = 8, m.head_dim = 128;
    m.ffn = 14336, m.rope_theta = 1000000.0, m.norm_eps = 1e-5f;
  } else if (name == "qwen2.5-7b") {  // Qwen2.5-7B (and its 1M-token variant's shapes)
    m.vocab = 152064, m.hidden = 3584, m.layers = 28, m.heads = 28, m.kv_heads = 4, m.head_dim = 128;
    m.ffn = 18944, m.rope_theta = 1000000.0, m.norm_eps = 1e-6f, m.qkv_bias = true;
  } else if (name == "qwen3-32b") {
    m.vocab = 151936, m.hidden = 5120, m.layers = 64, m.heads = 64, m.kv_heads = 8, m.head_dim = 128;
    m.ffn = 25600, m.rope_theta = 1000000.0, m.norm_eps = 1e-6f, m.qk_norm = true;
  } else if (name == "qwen3-30b-a3b") {  // Qwen3-30B-A3B: 128 experts, 8 a token, every layer MoE
    m.vocab = 151936, m.hidden = 2048, m.layers = 48, m.heads = 32, m.kv_heads = 4, m.head_dim = 128;
    m.ffn = 6144, m.rope_theta = 1000000.0, m.norm_eps = 1e-6f, m.qk_norm = true;
    m.experts = 128, m.experts_per_token = 8, m.expert_ffn = 768, m.norm_topk_prob = true, m.router_aux_coef = 0.001;
  } else if (name == "mixtral-8x7b") {  // Mixtral-8x7B: 8 experts, 2 a token
    m.vocab = 32000, m.hidden = 4096, m.layers = 32, m.heads = 32, m.kv_heads = 8, m.head_dim = 128;
    m.ffn = 14336, m.rope_theta = 1000000.0, m.norm_eps = 1e-5f;
    m.experts = 8, m.experts_per_token = 2, m.expert_ffn = 14336, m.norm_topk_prob = true, m.router_aux_coef = 0.02;
  } else {
    return Status::invalid_argument("unknown model preset '" + name + "': use one of " + model_preset_names());
  }
  return m;
}

std::string model_preset_names() {
  return "tiny, tiny-moe, small, llama3-8b, llama3-70b, mistral-7b, qwen2.5-7b, qwen3-32b, qwen3-30b-a3b, "
         "mixtral-8x7b";
}

Status validate(const ModelConfig& m) {
  auto bad = [](const std::string& s) { return Status::invalid_argument(s); };
  if (m.vocab < 2) return bad("vocab must be >= 2");
  if (m.hidden < 1 || m.layers < 1 || m.ffn < 1) return bad("hidden, layers and ffn must be >= 1");
  if (m.heads < 1 || m.kv_heads < 1 || m.heads % m.kv_heads != 0)
    return bad("heads (" + std::to_string(m.heads) + ") must be a positive multiple of kv_heads (" +
               std::to_string(m.kv_heads) + ")");
  if (m.head_dim < 2 || m.head_dim % 2 != 0 || m.head_dim > 1024) return bad("head_dim must be even and in [2, 1024]");
  if (!(m.norm_eps > 0)) return bad("norm_eps must be > 0");
  if (!(m.rope_theta > 0)) return bad("rope_theta must be > 0");
  if (m.vocab > INT32_MAX) return bad("vocab must fit in int32 token ids");
  // (kMaxWidth, attention_block.h: every size product stays far inside int64.)
  if (m.ffn > int64_t{1} << 20 || m.layers > int64_t{1} << 16)
    return bad("ffn must be at most 2^20 and layers at most 2^16");
  if (m.experts < 0 || m.experts > 4096) return bad("experts must be in [0, 4096] (0: no mixture of experts)");
  if (m.experts > 0) {
    if (m.experts_per_token < 1 || m.experts_per_token > m.experts)
      return bad("experts_per_token (" + std::to_string(m.experts_per_token) + ") must be in [1, experts = " +
                 std::to_string(m.experts) + "]");
    if (m.expert_ffn < 1 || m.expert_ffn > int64_t{1} << 20) return bad("expert_ffn must be in [1, 2^20]");
    if (m.moe_every < 1) return bad("moe_every (decoder_sparse_step) must be >= 1");
    if (!(m.router_aux_coef >= 0)) return bad("router_aux_coef must be >= 0");
  }
  return Status::ok_status();
}

bool moe_layer(const ModelConfig& m, int64_t l) {
  return m.experts > 0 && (l + 1) % m.moe_every == 0 &&
         std::find(m.dense_layers.begin(), m.dense_layers.end(), l) == m.dense_layers.end();
}

std::vector<ParamDesc> parameter_descriptors(const ModelConfig& m) {
  const int64_t E = m.hidden, HD = m.heads * m.head_dim, GD = m.kv_heads * m.head_dim, F = m.ffn, V = m.vocab;
  std::vector<ParamDesc> p;
  p.push_back({"embed", 0, ParamKind::kEmbedding, {V, E}, false});
  for (int l = 0; l < m.layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    const int g = l + 1;
    p.push_back({pre + "attn_norm", g, ParamKind::kNorm, {E}, false});
    p.push_back({pre + "wq", g, ParamKind::kAttention, {HD, E}, true});
    p.push_back({pre + "wk", g, ParamKind::kAttention, {GD, E}, true});
    p.push_back({pre + "wv", g, ParamKind::kAttention, {GD, E}, true});
    p.push_back({pre + "wo", g, ParamKind::kAttention, {E, HD}, true});
    if (m.qk_norm) {
      p.push_back({pre + "q_norm", g, ParamKind::kNorm, {m.head_dim}, false});
      p.push_back({pre + "k_norm", g, ParamKind::kNorm, {m.head_dim}, false});
    }
    if (m.qkv_bias) {
      p.push_back({pre + "bq", g, ParamKind::kBias, {HD}, false});
      p.push_back({pre + "bk", g, ParamKind::kBias, {GD}, false});
      p.push_back({pre + "bv", g, ParamKind::kBias, {GD}, false});
    }
    p.push_back({pre + "mlp_norm", g, ParamKind::kNorm, {E}, false});
    if (moe_layer(m, l)) {
      const int64_t X = m.experts, Fe = m.expert_ffn;
      p.push_back({pre + "router", g, ParamKind::kRouter, {X, E}, true});
      p.push_back({pre + "experts.w_gate", g, ParamKind::kExperts, {X, Fe, E}, true});
      p.push_back({pre + "experts.w_up", g, ParamKind::kExperts, {X, Fe, E}, true});
      p.push_back({pre + "experts.w_down", g, ParamKind::kExperts, {X, E, Fe}, true});
      continue;
    }
    p.push_back({pre + "w_gate", g, ParamKind::kMlp, {F, E}, true});
    p.push_back({pre + "w_up", g, ParamKind::kMlp, {F, E}, true});
    p.push_back({pre + "w_down", g, ParamKind::kMlp, {E, F}, true});
  }
  const int last = static_cast<int>(m.layers) + 1;
  p.push_back({"final_norm", last, ParamKind::kNorm, {E}, false});
  if (!m.tied_embeddings) p.push_back({"lm_head", last, ParamKind::kLmHead, {V, E}, true});
  return p;
}

int64_t parameter_count(const ModelConfig& m) {
  int64_t n = 0;
  for (const auto& d : parameter_descriptors(m)) n += d.shape.numel();
  return n;
}

}  // namespace untied
