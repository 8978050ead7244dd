// The decoder's shapes, its presets, and its parameters as named descriptors.
//
// A Llama-3-family decoder: token embedding (V, E); N blocks of
//   RMSNorm -> attention block (attention_block.h) -> residual -> RMSNorm -> SwiGLU MLP -> residual;
// a final RMSNorm and an LM head (V, E). Qwen3 adds RMSNorm on q and k per head (qk_norm); Qwen2
// adds biases to the q, k and v projections (qkv_bias: no weight decay, initialised to 0). With
// tied_embeddings the LM head is the embedding table itself.
//
// Parameters are grouped for sharding and gathering: group 0 is the embedding, groups 1..N the
// blocks, group N+1 the final norm and LM head (the final norm alone when tied). Each parameter has a descriptor (name, shape,
// whether weight decay applies); code iterates descriptors instead of indices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "untied/core/status.h"
#include "untied/core/tensor.h"
#include "untied/kernels/rope.h"

namespace untied {

struct ModelConfig {
  std::string name = "custom";
  int64_t vocab = 0;     // V
  int64_t hidden = 0;    // E
  int64_t layers = 0;    // N
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // G
  int64_t head_dim = 0;  // D
  int64_t ffn = 0;       // F, the SwiGLU intermediate size
  double rope_theta = 500000.0;
  RopeScaling rope_scaling = {};  // Llama 3.1+: frequency scaling for long contexts (rope.h)
  float norm_eps = 1e-5f;
  bool qk_norm = false;  // Qwen3
  bool qkv_bias = false;  // Qwen2 / Qwen2.5: biases on the q, k and v projections (bq, bk, bv)
  // The LM head is the embedding table (Llama 3.2 1B/3B, small Qwen3): no lm_head parameter; the
  // head's gradient adds to the embedding's.
  bool tied_embeddings = false;
  // Mixture of experts (Qwen3-MoE, Mixtral): with experts > 0 the MLP of every MoE layer
  // (moe_layer) is a router (X, E) whose softmax picks, per token, the experts_per_token (k) most
  // probable of `experts` (X) SwiGLU experts of width expert_ffn (Fe); the token's output is their
  // outputs weighted by those probabilities (renormalised to sum 1 with norm_topk_prob). Other
  // layers keep the dense MLP of width ffn. The loss adds router_aux_coef times the
  // load-balancing loss (moe.h). A layer l is MoE when l is not in dense_layers (Qwen3-MoE's
  // mlp_only_layers) and (l + 1) % moe_every == 0 (its decoder_sparse_step).
  int64_t experts = 0;            // X (0: a dense model)
  int64_t experts_per_token = 0;  // k
  int64_t expert_ffn = 0;         // Fe
  bool norm_topk_prob = true;
  double router_aux_coef = 0.0;
  int64_t moe_every = 1;
  std::vector<int64_t> dense_layers;
};

// Whether block l's MLP is a mixture of experts.
bool moe_layer(const ModelConfig& m, int64_t l);

// Presets with the real shapes: llama3-8b, llama3-70b, qwen3-32b (for planning and benchmarks);
// and small ones that train on a CPU: tiny, small. `vocab` 0 keeps the preset's vocabulary.
StatusOr<ModelConfig> model_preset(const std::string& name);
std::string model_preset_names();  // "tiny, small, llama3-8b, llama3-70b, qwen3-32b"
// Whether a preset's vocabulary is part of its shape (the real models: their embedding and LM
// head sizes decide memory), so that a run keeps it unless told otherwise; the CPU presets (tiny,
// small) take their data's vocabulary instead.
bool preset_keeps_vocabulary(const std::string& name);

// Checks shapes (positive, H % G == 0, D even); the message says which field to change.
Status validate(const ModelConfig& m);

enum class ParamKind { kEmbedding, kNorm, kAttention, kBias, kMlp, kRouter, kExperts, kLmHead };

struct ParamDesc {
  std::string name;  // "layers.3.wq"
  int group;         // 0 embedding, 1..N blocks, N+1 final norm + LM head
  ParamKind kind;
  Shape shape;
  bool decay;        // AdamW weight decay applies
};

// Every parameter, in a fixed order: embed; per block attn_norm, wq, wk, wv, wo, [q_norm, k_norm,]
// [bq, bk, bv,] mlp_norm, then w_gate, w_up, w_down, or in a MoE layer router (X, E) and the
// experts stacked: experts.w_gate, experts.w_up (X, Fe, E), experts.w_down (X, E, Fe); final_norm,
// lm_head (not when tied_embeddings).
std::vector<ParamDesc> parameter_descriptors(const ModelConfig& m);
int64_t parameter_count(const ModelConfig& m);

}  // namespace untied
