// A Hugging Face model's config.json as untied's model: LlamaForCausalLM (Llama 3, 3.1, 3.2),
// Qwen2ForCausalLM (Qwen2, Qwen2.5: biases on q, k and v), Qwen3ForCausalLM and MistralForCausalLM
// (Llama's layers with a sliding window on every layer).
//
// Keys read: architectures (or, in a bare config, model_type llama / qwen2 / qwen3 / mistral), vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: the heads), head_dim (default: hidden / heads),
// intermediate_size, rms_norm_eps, rope_theta (default 10000), tie_word_embeddings (default
// false), max_position_embeddings, torch_dtype / dtype, hidden_act (must be silu),
// attention_bias, mlp_bias and use_sliding_window (must be false or absent). RoPE scaling in either convention seen on
// published checkpoints: `rope_scaling` next to `rope_theta`, or the newer `rope_parameters`
// block holding rope_theta too; rope_type (or the older `type`) "default", "linear" (factor) or
// "llama3" (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings). Any
// other architecture or rope type, a missing key or a value of the wrong type is refused with a
// message naming it. Qwen3 sets qk_norm (RMSNorm of each q and k head), Qwen2 qkv_bias. Mistral: sliding_window
// (an integer, or null for full attention) is the window of every layer, with transformers'
// semantics, which are untied's --window: a query at position i sees the keys j with
// i - sliding_window < j <= i, itself included.
#pragma once

#include <string>

#include "untied/core/status.h"
#include "untied/model/model_config.h"

namespace untied {

struct HfModelConfig {
  ModelConfig model;            // name = the architecture
  std::string architecture;     // "LlamaForCausalLM" | "Qwen3ForCausalLM"
  bool tied_embeddings = false; // the LM head is the embedding (tie_word_embeddings)
  int64_t max_position = 0;     // max_position_embeddings (0 when absent)
  std::string torch_dtype;      // "bfloat16", "float32", ... ("" when absent)
  int64_t sliding_window = 0;   // Mistral's sliding_window: keys a query sees (0: all, null or absent)
};

// `where` names the file in messages.
StatusOr<HfModelConfig> parse_hf_config(const std::string& json_text, const std::string& where = "config.json");
// DIR/config.json.
StatusOr<HfModelConfig> read_hf_config(const std::string& dir);

}  // namespace untied
