// Typed views of the parameter groups, and the model's initialisation (parameters.h).
#include "untied/model/parameters.h"

#include <algorithm>
#include <cmath>

#include "untied/core/check.h"
#include "untied/core/random.h"

namespace untied {

namespace {
void check_count(const ParamGroup& g, size_t n, const char* kind) {
  UNTIED_ASSERT(g.tensors.size() == n, "a ", kind, " group has ", n, " parameters, got ", g.tensors.size(),
                " (group ", g.group, ")");
}
}  // namespace

EmbeddingWeights bind_embedding(const ParamGroup& g) {
  check_count(g, 1, "embedding");
  return EmbeddingWeights{.embed = g.tensors[0]};
}

// Descriptor order (parameter_descriptors): attn_norm, wq, wk, wv, wo, [q_norm, k_norm,]
// [bq, bk, bv,] mlp_norm, w_gate, w_up, w_down (a MoE layer: router, experts.w_gate, .w_up, .w_down).
BlockWeights bind_block(const ModelConfig& m, const ParamGroup& g) {
  const bool moe = moe_layer(m, g.group - 1);
  check_count(g, 9 + (m.qk_norm ? 2 : 0) + (m.qkv_bias ? 3 : 0) + (moe ? 1 : 0), "block");
  const auto& t = g.tensors;
  BlockWeights b{.attn_norm = t[0], .wq = t[1], .wk = t[2], .wv = t[3], .wo = t[4]};
  size_t i = 5;
  if (m.qk_norm) {
    b.q_norm = t[i++];
    b.k_norm = t[i++];
  }
  if (m.qkv_bias) {
    b.bq = t[i++];
    b.bk = t[i++];
    b.bv = t[i++];
  }
  b.mlp_norm = t[i++];
  if (moe) {
    b.router = t[i++];
    b.e_gate = t[i++];
    b.e_up = t[i++];
    b.e_down = t[i++];
    return b;
  }
  b.w_gate = t[i++];
  b.w_up = t[i++];
  b.w_down = t[i++];
  return b;
}

HeadWeights bind_head(const ModelConfig& m, const ParamGroup& g) {
  if (m.tied_embeddings) {
    check_count(g, 1, "final norm (tied embeddings)");
    return HeadWeights{.final_norm = g.tensors[0]};
  }
  check_count(g, 2, "final norm and LM head");
  return HeadWeights{.final_norm = g.tensors[0], .lm_head = g.tensors[1]};
}

void init_parameter(const ModelConfig& m, const ParamDesc& d, int index, uint64_t seed, int64_t first,
                    std::span<float> out) {
  if (d.kind == ParamKind::kNorm || d.kind == ParamKind::kBias) {
    std::fill(out.begin(), out.end(), d.kind == ParamKind::kNorm ? 1.0f : 0.0f);
    return;
  }
  float scale = 0.02f * std::sqrt(3.0f);  // uniform(-a, a) has std 0.02
  if (d.name.ends_with(".wo") || d.name.ends_with("w_down")) scale /= std::sqrt(2.0f * static_cast<float>(m.layers));
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = scale * hash_uniform(seed, 1000 + static_cast<uint64_t>(index), first + static_cast<int64_t>(k));
}

std::function<void(int, int64_t, std::span<float>)> parameter_init(const ModelConfig& m, uint64_t seed) {
  return [m, seed, descs = parameter_descriptors(m)](int i, int64_t first, std::span<float> out) {
    init_parameter(m, descs[static_cast<size_t>(i)], i, seed, first, out);
  };
}

}  // namespace untied
