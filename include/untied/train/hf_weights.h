// A Hugging Face model directory's weights: model.safetensors, or the shards that
// model.safetensors.index.json's weight_map names, read into untied's parameters.
//
// Names (the Llama/Qwen3 layout, whose matrices are already untied's: wq (H*D, E), ...):
//   model.embed_tokens.weight                 embed
//   model.layers.L.input_layernorm.weight     layers.L.attn_norm
//   model.layers.L.self_attn.{q,k,v,o}_proj.weight   layers.L.{wq, wk, wv, wo}
//   model.layers.L.self_attn.{q,k}_norm.weight       layers.L.{q_norm, k_norm} (Qwen3)
//   model.layers.L.post_attention_layernorm.weight   layers.L.mlp_norm
//   model.layers.L.mlp.{gate,up,down}_proj.weight    layers.L.{w_gate, w_up, w_down}
//   model.norm.weight                         final_norm
//   lm_head.weight                            lm_head
// Each rank reads only its own ZeRO shard of each tensor (a pread of those elements).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "untied/comm/communicator.h"
#include "untied/core/safetensors.h"
#include "untied/core/status.h"
#include "untied/dist/sharded_params.h"
#include "untied/model/model_config.h"

namespace untied {

// The Hugging Face tensor name of an untied parameter ("layers.3.wq" ->
// "model.layers.3.self_attn.q_proj.weight"). Not for a MoE layer's router and experts (hf_tensors).
std::string hf_tensor_name(const std::string& untied_name);

// The Hugging Face tensors that hold one untied parameter: one, or for a MoE layer's stacked
// experts (X, ...) one per expert, each `numel` elements of the parameter from `offset`:
//   layers.L.router           model.layers.L.mlp.gate.weight (X, E)
//   layers.L.experts.w_gate   model.layers.L.mlp.experts.J.gate_proj.weight (Fe, E), J < X
//   layers.L.experts.w_up     model.layers.L.mlp.experts.J.up_proj.weight (Fe, E)
//   layers.L.experts.w_down   model.layers.L.mlp.experts.J.down_proj.weight (E, Fe)
// (Qwen3-MoE), or with mixtral_names block_sparse_moe for mlp and w1, w3, w2 for gate_proj,
// up_proj, down_proj (Mixtral).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0, numel = 0;
};
std::vector<HfTensor> hf_tensors(const ParamDesc& d, bool mixtral_names);
// Mixtral's names for a MoE model without q/k norms (Qwen3-MoE has them).
inline bool hf_mixtral_names(const ModelConfig& m) { return m.experts > 0 && !m.qk_norm; }

class HfWeights {
 public:
  // Opens DIR/model.safetensors.index.json (and every file it names) or DIR/model.safetensors,
  // validating each header (safetensors.h). not_found when neither exists; the file's errors
  // otherwise.
  static StatusOr<HfWeights> open(const std::string& dir);
  // Checks the tensors against the model: each parameter's tensor present with its shape, and
  // no tensor left over (the message names the tensor). A tied model (m.tied_embeddings) needs no
  // lm_head.weight; one that is there anyway (some exports keep the copy) is not read.
  Status check(const ModelConfig& m) const;
  // out = elements [first, first + count) of the tensor, as float32.
  Status read(const std::string& hf_name, int64_t first, int64_t count, float* out) const;
  // Whether the experts are named as Mixtral's (hf_tensors).
  bool mixtral_names() const { return mixtral_names_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;  // tensor -> its file
  bool mixtral_names_ = false;  // the files name experts as Mixtral does (block_sparse_moe)
  bool any_tensor_contains(const std::string& part) const {
    for (const auto& [name, file] : where_)
      if (name.find(part) != std::string::npos) return true;
    return false;
  }
};

// Fills every parameter's shard (master copies) on this rank from the weights. REQUIRES:
// w.check(m).ok(). Returns the first read error.
Status load_hf_weights(const HfWeights& w, ShardedParams& params);

// The Hugging Face config.json of a model untied trained (LlamaForCausalLM, or Qwen3ForCausalLM
// with qk_norm; tie_word_embeddings as the model has them), with torch_dtype `torch_dtype`
// ("float32" or "bfloat16").
std::string hf_config_json(const ModelConfig& m, int64_t max_position, const std::string& torch_dtype = "float32");

struct SaveHfOptions {
  int64_t max_position = 4096;  // max_position_embeddings of a written config.json (at least)
  std::string source_config;    // a config.json to start from (the imported model's), or "" to write one
  // The tensors' safetensors dtype: "F32", "BF16" (rounded to nearest even) or "F16". In
  // write_hf_config, "" keeps source_config's torch_dtype / dtype as they are (a checkpoint's
  // config.json records the source model's dtype so that export can default to it); "" is "F32"
  // for the tensors and for a config written without a source.
  std::string dtype = "F32";
  // A Hugging Face directory whose tokenizer files (kTokenizerFiles) are copied beside the
  // model, or "" for none.
  std::string tokenizer_from;
  // The run's sliding window, written as a Mistral source's sliding_window (0: null); -1 keeps it.
  int64_t window = -1;
};

// The files of a Hugging Face directory that are not the model's weights or config but make it
// usable (AutoTokenizer, generate, chat): tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, generation_config.json, chat_template.jinja, chat_template.json,
// added_tokens.json, vocab.json, merges.txt, tokenizer.model.
extern const char* const kTokenizerFiles[10];

// Copies those of kTokenizerFiles that from_dir holds (regular files, at most 256 MiB each) into
// to_dir, each atomically; the names copied go to *copied (when not null). A missing file is
// skipped; one that cannot be read or written is an io_error naming it. Not collective.
Status copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir,
                            std::vector<std::string>* copied = nullptr);

// The safetensors dtype ("BF16", "F16" or "F32") that the config.json at config_path names in
// torch_dtype or dtype; "F32" when the file or the key is absent or names another type.
std::string hf_dtype_of_config(const std::string& config_path);

// "f32" | "float32" | "bf16" | "bfloat16" | "f16" | "float16" -> "F32" | "BF16" | "F16";
// invalid_argument naming the choices otherwise.
StatusOr<std::string> parse_hf_dtype(const std::string& s);

// invalid_argument (naming `what`, the flag) when DIR already holds a model (config.json,
// model.safetensors or an index of shards), which writing a model there would mix with the new one.
Status check_hf_output_dir(const std::string& dir, const std::string& what);
// Where dir will be (its nearest existing ancestor) has room for m's tensors in dtype ("F32",
// "BF16", "F16"); the message (naming `what`) says how much is needed and free.
Status check_hf_output_space(const std::string& dir, const ModelConfig& m, const std::string& dtype,
                             const std::string& what);

// Writes DIR/config.json (created with its parents if needed), atomically: o.source_config when
// given, with what the model may have changed set to the model's (rope_theta, at the top level
// or in rope_parameters; max_position_embeddings raised to o.max_position; torch_dtype / dtype
// to o.dtype's; tie_word_embeddings) and every other key kept; else hf_config_json(m,
// o.max_position, o.dtype's torch dtype). Not collective (one rank calls it).
Status write_hf_config(const std::string& dir, const ModelConfig& m, const SaveHfOptions& o);

// Collective: writes DIR/model.safetensors (the parameters' master copies gathered one tensor at
// a time, stored in o.dtype) and then DIR/config.json (a copy of o.source_config when given, else
// hf_config_json) from rank 0, a directory transformers loads as it is. The same Status on every
// rank.
Status save_hf_model(const std::string& dir, ShardedParams& params, Communicator& comm, const ModelConfig& m,
                     const SaveHfOptions& o);

// `untied export`: a checkpoint of ckpt_dir (the step `latest` names when step is 0, else that
// step; written at any rank count; its config.json says the model) as a Hugging Face directory
// out_dir: the tokenizer files the run copied beside its checkpoints (copy_tokenizer_files),
// model.safetensors in `dtype` ("F32", "BF16", "F16"; "" is the dtype the checkpoint's
// config.json records, the source model's), one tensor at a time (the largest tensor is the only
// one in memory), and config.json (the checkpoint's, its torch_dtype set to the dtype) last.
// Every rank file's checksum is verified first, and the checkpoint's recorded model must be the
// config's. out_dir must not hold a model already (check_hf_output_dir). One process; no
// communicator. *written (when not null) gets the step, the dtype and the files copied.
struct ExportResult {
  int64_t step = 0;
  std::string dtype;
  std::vector<std::string> tokenizer_files;
};
Status export_checkpoint(const std::string& ckpt_dir, const std::string& out_dir, const std::string& dtype,
                         int64_t step = 0, ExportResult* written = nullptr);

}  // namespace untied
