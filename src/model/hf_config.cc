// Hugging Face config.json (hf_config.h).
#include "untied/model/hf_config.h"

#include <fstream>
#include <sstream>

#include "untied/core/file_io.h"
#include "untied/core/json.h"

namespace untied {
namespace {

// Reads numbers and flags from a JSON object, recording the first problem.
class Keys {
 public:
  Keys(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const Status& status() const { return st_; }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  int64_t integer(const char* k, int64_t fallback = -1) {
    if (!has(k)) {
      if (fallback < 0) fail(std::string("the key '") + k + "' is missing");
      return fallback;
    }
    if (!j_[k].is_number_integer()) fail(std::string("'") + k + "' must be an integer");
    return j_[k].is_number_integer() ? j_[k].get<int64_t>() : 0;
  }
  double number(const char* k, double fallback, bool required = false) {
    if (!has(k)) {
      if (required) fail(std::string("the key '") + k + "' is missing");
      return fallback;
    }
    if (!j_[k].is_number()) fail(std::string("'") + k + "' must be a number");
    return j_[k].is_number() ? j_[k].get<double>() : fallback;
  }
  bool flag(const char* k, bool fallback) {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) fail(std::string("'") + k + "' must be true or false");
    return j_[k].is_boolean() ? j_[k].get<bool>() : fallback;
  }
  std::string text(const char* k) {
    if (!has(k)) return "";
    if (!j_[k].is_string()) fail(std::string("'") + k + "' must be a string");
    return j_[k].is_string() ? j_[k].get<std::string>() : "";
  }
  void fail(const std::string& why) {
    if (st_.ok()) st_ = Status::invalid_argument(where_ + ": " + why);
  }

 private:
  const Json& j_;
  std::string where_;
  Status st_;
};

// rope_scaling or rope_parameters (both may hold the rope type and its factors).
Status parse_rope(const Json& r, const std::string& where, const char* key, RopeScaling* out) {
  if (!r.is_object()) return Status::invalid_argument(where + ": '" + key + "' must be an object");
  Keys k(r, where + " " + key);
  std::string type = k.text("rope_type");
  if (type.empty()) type = k.text("type");
  if (type.empty() || type == "default") {
    out->type = RopeScalingType::kNone;
  } else if (type == "linear") {
    out->type = RopeScalingType::kLinear;
    out->factor = k.number("factor", 1.0, true);
  } else if (type == "llama3") {
    out->type = RopeScalingType::kLlama3;
    out->factor = k.number("factor", 1.0, true);
    out->low_freq_factor = k.number("low_freq_factor", 1.0, true);
    out->high_freq_factor = k.number("high_freq_factor", 4.0, true);
    out->original_max_position = k.number("original_max_position_embeddings", 8192.0, true);
  } else {
    return Status::unsupported(where + ": " + key + " rope_type '" + type +
                               "' is not supported (default, linear and llama3 are)");
  }
  if (!k.status().ok()) return k.status();
  if (out->type != RopeScalingType::kNone && !(out->factor > 0))
    return Status::invalid_argument(where + ": " + key + " factor must be > 0");
  if (out->type == RopeScalingType::kLlama3 &&
      !(out->low_freq_factor > 0 && out->high_freq_factor > out->low_freq_factor && out->original_max_position > 0))
    return Status::invalid_argument(where + ": " + key +
                                    " needs 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0");
  return Status::ok_status();
}

}  // namespace

StatusOr<HfModelConfig> parse_hf_config(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const std::exception& e) {
    return Status::invalid_argument(where + " is not JSON: " + e.what());
  }
  if (!j.is_object()) return Status::invalid_argument(where + " is not a JSON object");
  HfModelConfig c;
  if (j.contains("architectures") && !j["architectures"].is_null()) {
    if (!j["architectures"].is_array() || j["architectures"].size() != 1 || !j["architectures"][0].is_string())
      return Status::invalid_argument(where + ": 'architectures' must list one architecture");
    c.architecture = j["architectures"][0].get<std::string>();
  } else if (j.contains("model_type") && j["model_type"].is_string()) {  // a bare config: its model type
    const std::string t = j["model_type"].get<std::string>();
    c.architecture = t == "llama"     ? "LlamaForCausalLM"
                     : t == "qwen3"   ? "Qwen3ForCausalLM"
                     : t == "qwen2"   ? "Qwen2ForCausalLM"
                     : t == "mistral" ? "MistralForCausalLM"
                     : t == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                     : t == "mixtral" ? "MixtralForCausalLM"
                                      : "model_type " + t;
  } else {
    return Status::invalid_argument(where + ": neither 'architectures' nor 'model_type' says what model this is");
  }
  const bool qwen3_moe = c.architecture == "Qwen3MoeForCausalLM", mixtral = c.architecture == "MixtralForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM" || qwen3_moe,
             mistral = c.architecture == "MistralForCausalLM" || mixtral, qwen2 = c.architecture == "Qwen2ForCausalLM";
  if (c.architecture != "LlamaForCausalLM" && !qwen3 && !mistral && !qwen2)
    return Status::unsupported(where + ": architecture '" + c.architecture +
                               "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                               "MistralForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM are)");
  if (mistral && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    if (!j["sliding_window"].is_number_integer() || j["sliding_window"].get<int64_t>() < 1)
      return Status::invalid_argument(where + ": sliding_window must be a positive integer or null");
    c.sliding_window = j["sliding_window"].get<int64_t>();
  }
  Keys k(j, where);
  ModelConfig& m = c.model;
  m.name = c.architecture;
  m.vocab = k.integer("vocab_size");
  m.hidden = k.integer("hidden_size");
  m.layers = k.integer("num_hidden_layers");
  m.heads = k.integer("num_attention_heads");
  m.kv_heads = k.integer("num_key_value_heads", m.heads > 0 ? m.heads : 1);
  m.head_dim = k.integer("head_dim", m.heads > 0 ? m.hidden / m.heads : 0);
  m.ffn = k.integer("intermediate_size");
  m.norm_eps = static_cast<float>(k.number("rms_norm_eps", 1e-6, true));
  m.qk_norm = qwen3;
  m.qkv_bias = qwen2;  // Qwen2Attention's q/k/v projections have biases whatever the config says
  m.rope_theta = k.number("rope_theta", 10000.0);
  c.tied_embeddings = m.tied_embeddings = k.flag("tie_word_embeddings", false);
  c.max_position = k.integer("max_position_embeddings", 0);
  c.torch_dtype = k.text("torch_dtype");
  if (c.torch_dtype.empty()) c.torch_dtype = k.text("dtype");
  const std::string act = k.text("hidden_act");
  if (!act.empty() && act != "silu")
    return Status::unsupported(where + ": hidden_act '" + act + "' is not supported (silu is)");
  if (k.flag("use_sliding_window", false))
    return Status::unsupported(where + ": use_sliding_window (Qwen's per-layer sliding window) is not supported; "
                               "set it false, or train with untied's --window on every layer");
  if (k.flag("attention_bias", false) || k.flag("mlp_bias", false))
    return Status::unsupported(where + ": attention_bias / mlp_bias are not supported (the models have none)");
  if (qwen3_moe || mixtral) {
    // Qwen3-MoE's checkpoints spell the expert count num_experts; transformers 5 writes
    // num_local_experts (Mixtral's key) for both.
    m.experts = k.integer(k.has("num_experts") ? "num_experts" : "num_local_experts");
    m.experts_per_token = k.integer("num_experts_per_tok");
    m.expert_ffn = qwen3_moe ? k.integer("moe_intermediate_size") : m.ffn;
    // transformers' defaults: Qwen3-MoE renormalises only with norm_topk_prob (default false);
    // Mixtral always does.
    m.norm_topk_prob = qwen3_moe ? k.flag("norm_topk_prob", false) : true;
    m.router_aux_coef = k.number("router_aux_loss_coef", 0.001);
    if (qwen3_moe) {
      m.moe_every = k.integer("decoder_sparse_step", 1);
      if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
        const Json& d = j["mlp_only_layers"];
        if (!d.is_array()) return Status::invalid_argument(where + ": mlp_only_layers must be a list of layer numbers");
        for (const Json& x : d) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0)
            return Status::invalid_argument(where + ": mlp_only_layers must be a list of layer numbers");
          m.dense_layers.push_back(x.get<int64_t>());
        }
      }
    }
    const double jitter = k.number("router_jitter_noise", 0.0);
    if (jitter != 0.0)
      return Status::unsupported(where + ": router_jitter_noise " + std::to_string(jitter) +
                                 " is not supported (untied routes without noise): set it to 0");
  }
  if (!k.status().ok()) return k.status();
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const Json& r = j["rope_parameters"];
    Status s = parse_rope(r, where, "rope_parameters", &m.rope_scaling);
    if (!s.ok()) return s;
    if (r.contains("rope_theta")) {
      if (!r["rope_theta"].is_number())
        return Status::invalid_argument(where + ": rope_parameters rope_theta must be a number");
      m.rope_theta = r["rope_theta"].get<double>();
    }
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    Status s = parse_rope(j["rope_scaling"], where, "rope_scaling", &m.rope_scaling);
    if (!s.ok()) return s;
  }
  Status v = validate(m);
  if (!v.ok()) return Status::invalid_argument(where + ": " + v.message());
  return c;
}

StatusOr<HfModelConfig> read_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  auto text = read_regular_file(path, int64_t{16} << 20, "the model's config.json");
  if (!text.ok() && text.status().code() == Status::Code::kNotFound)
    return Status::not_found("cannot read " + path + ": --hf-model takes a Hugging Face model directory");
  if (!text.ok()) return text.status();
  return parse_hf_config(text.value(), path);
}

}  // namespace untied
