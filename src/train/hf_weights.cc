// Hugging Face weights into untied's parameters (hf_weights.h).
#include "untied/train/hf_weights.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "untied/core/checked_math.h"
#include "untied/core/file_io.h"
#include "untied/core/json.h"
#include "untied/model/hf_config.h"
#include "untied/train/checkpoint.h"

namespace untied {

std::string hf_tensor_name(const std::string& n) {
  if (n == "embed") return "model.embed_tokens.weight";
  if (n == "final_norm") return "model.norm.weight";
  if (n == "lm_head") return "lm_head.weight";
  const auto dot = n.find('.', 7);  // "layers.L.x"
  if (n.rfind("layers.", 0) != 0 || dot == std::string::npos) return n;
  const std::string pre = "model." + n.substr(0, dot) + ".", x = n.substr(dot + 1);
  static const std::map<std::string, std::string> names = {
      {"attn_norm", "input_layernorm"},    {"wq", "self_attn.q_proj"},    {"wk", "self_attn.k_proj"},
      {"wv", "self_attn.v_proj"},          {"wo", "self_attn.o_proj"},    {"q_norm", "self_attn.q_norm"},
      {"k_norm", "self_attn.k_norm"},      {"mlp_norm", "post_attention_layernorm"}, {"w_gate", "mlp.gate_proj"},
      {"w_up", "mlp.up_proj"},             {"w_down", "mlp.down_proj"}};
  static const std::map<std::string, std::string> biases = {
      {"bq", "self_attn.q_proj.bias"}, {"bk", "self_attn.k_proj.bias"}, {"bv", "self_attn.v_proj.bias"}};
  if (auto b = biases.find(x); b != biases.end()) return pre + b->second;
  auto it = names.find(x);
  return it == names.end() ? n : pre + it->second + ".weight";
}

std::vector<HfTensor> hf_tensors(const ParamDesc& d, bool mixtral_names) {
  std::vector<int64_t> shape;
  for (int k = 0; k < d.shape.ndim(); ++k) shape.push_back(d.shape[k]);
  const bool router = d.kind == ParamKind::kRouter, experts = d.kind == ParamKind::kExperts;
  if (!router && !experts) return {HfTensor{.name = hf_tensor_name(d.name), .shape = shape, .numel = d.shape.numel()}};
  const auto dot = d.name.find('.', 7);  // "layers.L.x"
  const std::string pre = "model." + d.name.substr(0, dot) + (mixtral_names ? ".block_sparse_moe." : ".mlp.");
  if (router) return {HfTensor{.name = pre + "gate.weight", .shape = shape, .numel = d.shape.numel()}};
  const std::string which = d.name.substr(d.name.rfind('.') + 1);  // w_gate, w_up, w_down
  const std::string proj = mixtral_names ? (which == "w_gate" ? "w1" : which == "w_up" ? "w3" : "w2")
                                         : (which == "w_gate" ? "gate_proj" : which == "w_up" ? "up_proj" : "down_proj");
  std::vector<HfTensor> out;
  const int64_t per = shape[1] * shape[2];
  for (int64_t j = 0; j < shape[0]; ++j)
    out.push_back(HfTensor{.name = pre + "experts." + std::to_string(j) + "." + proj + ".weight",
                           .shape = {shape[1], shape[2]}, .offset = j * per, .numel = per});
  return out;
}

StatusOr<HfWeights> HfWeights::open(const std::string& dir) {
  HfWeights w;
  std::vector<std::string> files;
  const std::string index = dir + "/model.safetensors.index.json";
  struct stat st;
  if (::stat(index.c_str(), &st) == 0) {
    auto text = read_regular_file(index, int64_t{256} << 20, "the model's safetensors index");
    if (!text.ok()) return text.status();
    Json j;
    try {
      j = Json::parse(text.value());
    } catch (const std::exception& e) {
      return Status::corrupt(index + " is not JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return Status::corrupt(index + " has no weight_map object");
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return Status::corrupt(index + ": weight_map[" + it.key() + "] is not a file name");
      names.insert(it.value().get<std::string>());
    }
    files.assign(names.begin(), names.end());
    std::map<std::string, const SafetensorsFile*> by_name;
    for (const std::string& fname : files) {
      auto sf = SafetensorsFile::open(dir + "/" + fname);
      if (!sf.ok()) return sf.status();
      w.files_.push_back(std::make_unique<SafetensorsFile>(std::move(sf).value()));
      by_name[fname] = w.files_.back().get();
    }
    // Every mapped tensor must be in the file the map names.
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string file = it.value().get<std::string>();
      const SafetensorsFile* sf = by_name.at(file);
      if (sf->find(it.key()) == nullptr)
        return Status::corrupt(index + " maps " + it.key() + " to " + file + ", which does not hold it");
      w.where_[it.key()] = sf;
    }
    for (const auto& sf : w.files_)
      for (const auto& [name, t] : sf->tensors())
        if (!w.where_.count(name)) return Status::corrupt(sf->path() + " holds " + name + ", which " + index + " does not map");
    w.mixtral_names_ = w.any_tensor_contains(".block_sparse_moe.");
    return w;
  }
  auto sf = SafetensorsFile::open(dir + "/model.safetensors");
  if (!sf.ok()) {
    if (sf.status().code() == Status::Code::kNotFound)
      return Status::not_found(dir + " holds neither model.safetensors nor model.safetensors.index.json: "
                                     "--hf-model takes a Hugging Face model directory");
    return sf.status();
  }
  w.files_.push_back(std::make_unique<SafetensorsFile>(std::move(sf).value()));
  for (const auto& [name, t] : w.files_[0]->tensors()) w.where_[name] = w.files_[0].get();
  w.mixtral_names_ = w.any_tensor_contains(".block_sparse_moe.");
  return w;
}

Status HfWeights::check(const ModelConfig& m) const {
  std::set<std::string> expected;
  if (m.tied_embeddings) expected.insert(hf_tensor_name("lm_head"));  // tolerated, never read
  for (const ParamDesc& d : parameter_descriptors(m))
  for (const HfTensor& piece : hf_tensors(d, mixtral_names_)) {
    const std::string& hf = piece.name;
    expected.insert(hf);
    auto it = where_.find(hf);
    if (it == where_.end())
      return Status::invalid_argument("the model has no tensor " + hf + " (untied's " + d.name +
                                      "): the checkpoint does not match its config.json");
    const SafetensorsEntry& e = *it->second->find(hf);
    const std::vector<int64_t>& want = piece.shape;
    if (e.shape != want) {
      std::string got, need;
      for (int64_t x : e.shape) got += (got.empty() ? "" : ", ") + std::to_string(x);
      for (int64_t x : want) need += (need.empty() ? "" : ", ") + std::to_string(x);
      return Status::invalid_argument(hf + " in " + it->second->path() + " has shape (" + got + "), config.json says (" +
                                      need + ")");
    }
    if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
      return Status::unsupported(hf + " in " + it->second->path() + " is " + e.dtype + "; weights must be F32, BF16 or F16");
  }
  for (const auto& [name, file] : where_)
    if (!expected.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos)
      return Status::invalid_argument(file->path() + " holds " + name +
                                      ", which the model does not have (another architecture, or a config.json that does not match)");
  return Status::ok_status();
}

Status HfWeights::read(const std::string& hf_name, int64_t first, int64_t count, float* out) const {
  auto it = where_.find(hf_name);
  if (it == where_.end()) return Status::not_found("the model has no tensor " + hf_name);
  return it->second->read(hf_name, first, count, out);
}

Status load_hf_weights(const HfWeights& w, ShardedParams& params) {
  Status st;
  params.init([&](int i, int64_t first, std::span<float> out) {
    if (!st.ok()) return;
    // The shard's elements that exist (the last rank's shard may run past the tensor: zeros),
    // from each Hugging Face tensor they overlap.
    const int64_t numel = params.desc(i).shape.numel();
    const int64_t end = std::min<int64_t>(first + static_cast<int64_t>(out.size()), numel);
    for (const HfTensor& piece : hf_tensors(params.desc(i), w.mixtral_names())) {
      const int64_t a = std::max(first, piece.offset), b = std::min(end, piece.offset + piece.numel);
      if (a >= b || !st.ok()) continue;
      st = w.read(piece.name, a - piece.offset, b - a, out.data() + (a - first));
      if (const int64_t bad = st.ok() ? first_nonfinite(out.data() + (a - first), b - a) : -1; bad >= 0)
        st = Status::corrupt("the model's " + piece.name + " holds a non-finite value (element " +
                             std::to_string(a - piece.offset + bad) + "): it is not a usable model");
    }
  });
  return st;
}

StatusOr<std::string> parse_hf_dtype(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32") return std::string("F32");
  if (s == "bf16" || s == "bfloat16") return std::string("BF16");
  if (s == "f16" || s == "fp16" || s == "float16") return std::string("F16");
  return Status::invalid_argument("unknown weight dtype '" + s + "' (f32, bf16 or f16)");
}

std::string hf_config_json(const ModelConfig& m, int64_t max_position, const std::string& torch_dtype) {
  UNTIED_CHECK(m.experts == 0 || hf_mixtral_names(m) || m.qk_norm, "hf_config_json: a MoE model is Qwen3-MoE or Mixtral");
  UNTIED_CHECK(m.experts == 0 || !hf_mixtral_names(m) || (m.norm_topk_prob && m.expert_ffn == m.ffn &&
                                                          m.moe_every == 1 && m.dense_layers.empty()),
               "hf_config_json: a MoE model without q/k norms is written as Mixtral, which has every layer MoE, "
               "experts as wide as intermediate_size and norm_topk_prob");
  Json c;
  c["architectures"] = {m.qk_norm ? "Qwen3ForCausalLM" : m.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = m.qk_norm ? "qwen3" : m.qkv_bias ? "qwen2" : "llama";
  if (m.experts > 0) {  // Qwen3-MoE (q/k norms) or Mixtral, as hf_mixtral_names
    const bool mixtral = hf_mixtral_names(m);
    c["architectures"] = {mixtral ? "MixtralForCausalLM" : "Qwen3MoeForCausalLM"};
    c["model_type"] = mixtral ? "mixtral" : "qwen3_moe";
    c[mixtral ? "num_local_experts" : "num_experts"] = m.experts;
    c["num_experts_per_tok"] = m.experts_per_token;
    c["router_aux_loss_coef"] = m.router_aux_coef;
    c["output_router_logits"] = false;  // (as published checkpoints have it: their loss is the cross-entropy)
    if (!mixtral) {
      c["moe_intermediate_size"] = m.expert_ffn;
      c["norm_topk_prob"] = m.norm_topk_prob;
      c["decoder_sparse_step"] = m.moe_every;
      c["mlp_only_layers"] = m.dense_layers;
    }
  }
  c["vocab_size"] = m.vocab;
  c["hidden_size"] = m.hidden;
  c["intermediate_size"] = m.ffn;
  c["num_hidden_layers"] = m.layers;
  c["num_attention_heads"] = m.heads;
  c["num_key_value_heads"] = m.kv_heads;
  c["head_dim"] = m.head_dim;
  c["hidden_act"] = "silu";
  c["rms_norm_eps"] = m.norm_eps;
  c["rope_theta"] = m.rope_theta;
  c["max_position_embeddings"] = max_position;
  if (!m.qkv_bias) {  // (Qwen2's q/k/v biases are its architecture's own: it has no such keys)
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
  } else {
    c["use_sliding_window"] = false;
  }
  c["tie_word_embeddings"] = m.tied_embeddings;
  c["torch_dtype"] = torch_dtype;
  const RopeScaling& r = m.rope_scaling;
  if (r.type == RopeScalingType::kLinear) c["rope_scaling"] = Json{{"rope_type", "linear"}, {"factor", r.factor}};
  if (r.type == RopeScalingType::kLlama3)
    c["rope_scaling"] = Json{{"rope_type", "llama3"},
                             {"factor", r.factor},
                             {"low_freq_factor", r.low_freq_factor},
                             {"high_freq_factor", r.high_freq_factor},
                             {"original_max_position_embeddings", static_cast<int64_t>(r.original_max_position)}};
  return c.dump(2) + "\n";
}

Status check_hf_output_dir(const std::string& dir, const std::string& what) {
  for (const char* f : {"model.safetensors", "model.safetensors.index.json", "config.json"}) {
    struct stat st;
    if (::stat((dir + "/" + f).c_str(), &st) == 0)
      return Status::invalid_argument(what + " " + dir + " already holds a model (" + f +
                                      "): choose a new directory, or remove it first");
  }
  return Status::ok_status();
}

Status check_hf_output_space(const std::string& dir, const ModelConfig& m, const std::string& dtype,
                             const std::string& what) {
  int64_t elems = 0;
  for (const ParamDesc& d : parameter_descriptors(m)) elems += d.shape.numel();
  const int64_t need = elems * (dtype == "F32" ? 4 : 2) + (int64_t{1} << 20);  // the tensors and their header
  // The nearest directory that exists: where the files will go.
  std::filesystem::path p = std::filesystem::absolute(dir);
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec) && p != p.root_path()) p = p.parent_path();
  struct statvfs fs;
  if (::statvfs(p.c_str(), &fs) != 0) return Status::ok_status();  // (nothing known: the write will say)
  const int64_t free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (free < need)
    return Status::invalid_argument(what + " " + dir + ": the model needs " + format_bytes(need) + " there, and " +
                                    p.string() + " has " + format_bytes(free) +
                                    " free: free space, choose another directory, or a smaller --save-hf-dtype");
  return Status::ok_status();
}

const char* const kTokenizerFiles[10] = {"tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
                                         "generation_config.json", "chat_template.jinja", "chat_template.json",
                                         "added_tokens.json",   "vocab.json",            "merges.txt",
                                         "tokenizer.model"};

Status copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir, std::vector<std::string>* copied) {
  std::error_code ec;
  for (const char* name : kTokenizerFiles) {
    const std::string from = from_dir + "/" + name, to = to_dir + "/" + name;
    if (!std::filesystem::exists(from, ec)) continue;
    auto text = read_regular_file(from, int64_t{256} << 20, name);
    if (!text.ok()) return Status::io_error("cannot copy " + from + ": " + text.status().message());
    std::filesystem::create_directories(to_dir, ec);
    if (!write_file_atomically(to, text.value()))
      return Status::io_error("cannot write " + to + ": choose a writable directory with room for the tokenizer");
    if (copied != nullptr) copied->push_back(name);
  }
  return Status::ok_status();
}

std::string hf_dtype_of_config(const std::string& config_path) {
  std::error_code ec;
  if (!std::filesystem::exists(config_path, ec)) return "F32";
  const std::string dir = std::filesystem::path(config_path).parent_path().string();
  auto cfg = read_hf_config(dir.empty() ? "." : dir);
  if (!cfg.ok()) return "F32";
  auto d = parse_hf_dtype(cfg.value().torch_dtype);
  return d.ok() ? d.value() : "F32";
}

Status write_hf_config(const std::string& dir, const ModelConfig& m, const SaveHfOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const bool keep_dtype = o.dtype.empty();
  const std::string torch_dtype = o.dtype == "BF16" ? "bfloat16" : o.dtype == "F16" ? "float16" : "float32";
  std::string config = hf_config_json(m, o.max_position, torch_dtype);
  if (!o.source_config.empty()) {  // the source's, with what this model changed
    auto text = read_regular_file(o.source_config, int64_t{16} << 20, "the source model's config.json");
    if (!text.ok()) return Status::io_error("cannot read " + o.source_config + ": " + text.status().message());
    Json c;
    try {
      c = Json::parse(text.value());
    } catch (const Json::exception& e) {
      return Status::corrupt(o.source_config + " is not JSON: " + e.what());
    }
    if (!c.is_object()) return Status::corrupt(o.source_config + " is not a JSON object");
    const bool in_parameters = c.contains("rope_parameters") && c["rope_parameters"].is_object();
    if (in_parameters) c["rope_parameters"]["rope_theta"] = m.rope_theta;
    if (c.contains("rope_theta") || !in_parameters) c["rope_theta"] = m.rope_theta;
    const int64_t had = c.contains("max_position_embeddings") && c["max_position_embeddings"].is_number_integer()
                            ? c["max_position_embeddings"].get<int64_t>()
                            : 0;
    c["max_position_embeddings"] = std::max(had, o.max_position);
    if (!keep_dtype && c.contains("dtype")) c["dtype"] = torch_dtype;
    if (!keep_dtype && (c.contains("torch_dtype") || !c.contains("dtype"))) c["torch_dtype"] = torch_dtype;
    c["tie_word_embeddings"] = m.tied_embeddings;
    const bool mistral = c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
                         (c["architectures"][0] == "MistralForCausalLM" || c["architectures"][0] == "MixtralForCausalLM");
    if (mistral && o.window >= 0) c["sliding_window"] = o.window > 0 ? Json(o.window) : Json(nullptr);
    config = c.dump(2) + "\n";
  }
  const std::string path = dir + "/config.json";
  if (!write_file_atomically(path, config)) return Status::io_error("cannot write " + path + ": choose a writable directory");
  return Status::ok_status();
}

Status save_hf_model(const std::string& dir, ShardedParams& params, Communicator& comm, const ModelConfig& m,
                     const SaveHfOptions& o) {
  const bool root = comm.rank() == 0;
  Status st;
  if (root) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) st = Status::io_error("cannot create " + dir + ": " + ec.message());
  }
  st = first_failure(comm, st);
  if (!st.ok()) return st;
  std::vector<SafetensorsTensor> specs;
  for (int i = 0; i < params.num_params(); ++i)
    for (const HfTensor& piece : hf_tensors(params.desc(i), hf_mixtral_names(m)))
      specs.push_back({.name = piece.name, .dtype = o.dtype, .shape = piece.shape});
  std::unique_ptr<SafetensorsWriter> writer;
  if (root) {
    auto w = SafetensorsWriter::create(dir + "/model.safetensors", specs, {{"format", "pt"}});
    if (w.ok()) writer = std::make_unique<SafetensorsWriter>(std::move(w).value());
    else st = w.status();
  }
  st = first_failure(comm, st);
  if (!st.ok()) return st;
  // One tensor at a time: every rank's master shard, gathered (on the host) in rank order.
  std::vector<float> shard, full;
  for (int i = 0; i < params.num_params(); ++i) {
    const int64_t n = params.shard_elems(i);
    shard.resize(static_cast<size_t>(n));
    params.read_master(i, shard.data());
    full.resize(static_cast<size_t>(n * comm.size()));
    comm.all_gather(shard.data(), full.data(), n * 4);
    if (const int64_t bad = root && st.ok() ? first_nonfinite(full.data(), params.desc(i).shape.numel()) : -1; bad >= 0)
      st = Status::invalid_argument(params.desc(i).name + " holds a non-finite value (element " + std::to_string(bad) +
                                    "): the model was not written to " + dir);
    if (root && st.ok())
      for (const HfTensor& piece : hf_tensors(params.desc(i), hf_mixtral_names(m)))
        if (st.ok()) st = writer->add(piece.name, full.data() + piece.offset);
  }
  if (root && st.ok()) st = writer->finish();
  if (root && st.ok() && !o.tokenizer_from.empty()) st = copy_tokenizer_files(o.tokenizer_from, dir);
  if (root && st.ok()) st = write_hf_config(dir, m, o);  // last: a directory with a config has its weights
  return first_failure(comm, st);
}

Status export_checkpoint(const std::string& ckpt_dir, const std::string& out_dir, const std::string& dtype_wanted,
                         int64_t step, ExportResult* written) {
  auto cfg = read_hf_config(ckpt_dir);
  if (!cfg.ok()) {
    if (cfg.status().code() == Status::Code::kNotFound)
      return Status::not_found(ckpt_dir + "/config.json is missing: give the directory `untied train --checkpoint-dir` "
                                          "wrote");
    return cfg.status();
  }
  const ModelConfig& m = cfg.value().model;
  const std::string dtype = dtype_wanted.empty() ? hf_dtype_of_config(ckpt_dir + "/config.json") : dtype_wanted;
  auto w = CheckpointWeights::open(ckpt_dir, true, step);
  if (!w.ok()) return w.status();
  const std::vector<ParamDesc> descs = parameter_descriptors(m);
  Status st = w.value().check(m);
  if (!st.ok()) return st;
  std::error_code ec;  // out_dir may not exist yet: then it is not the checkpoint's
  if (std::filesystem::equivalent(std::filesystem::path(ckpt_dir), std::filesystem::path(out_dir), ec))
    return Status::invalid_argument("export into a new directory, not the checkpoint's own");
  std::vector<SafetensorsTensor> specs;
  for (const ParamDesc& d : descs)
    for (const HfTensor& piece : hf_tensors(d, hf_mixtral_names(m)))
      specs.push_back({.name = piece.name, .dtype = dtype, .shape = piece.shape});
  st = check_hf_output_dir(out_dir, "--out");
  if (!st.ok()) return st;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Status::io_error("cannot create " + out_dir + ": " + ec.message());
  auto created = SafetensorsWriter::create(out_dir + "/model.safetensors", specs, {{"format", "pt"}});
  if (!created.ok()) return created.status();
  SafetensorsWriter writer = std::move(created).value();
  std::vector<float> full;
  for (size_t i = 0; i < descs.size(); ++i) {
    const int64_t n = descs[i].shape.numel();
    full.resize(static_cast<size_t>(n));
    st = w.value().read(static_cast<int>(i), n, 0, n, full.data());
    if (!st.ok()) return st;
    if (const int64_t bad = first_nonfinite(full.data(), n); bad >= 0)
      return Status::invalid_argument("the checkpoint's " + descs[i].name + " holds a non-finite value (element " +
                                      std::to_string(bad) + "): nothing usable to export; resume from an earlier step");
    for (const HfTensor& piece : hf_tensors(descs[i], hf_mixtral_names(m))) {
      st = writer.add(piece.name, full.data() + piece.offset);
      if (!st.ok()) return st;
    }
  }
  st = writer.finish();
  if (!st.ok()) return st;
  std::vector<std::string> copied;
  st = copy_tokenizer_files(ckpt_dir, out_dir, &copied);
  if (!st.ok()) return st;
  if (written != nullptr) *written = ExportResult{.step = w.value().step(), .dtype = dtype, .tokenizer_files = copied};
  // Last: a directory with a config has its weights.
  return write_hf_config(out_dir, m, SaveHfOptions{.max_position = 0, .source_config = ckpt_dir + "/config.json",
                                                   .dtype = dtype});
}

}  // namespace untied
