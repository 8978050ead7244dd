// `untied eval`: a model's loss, perplexity, accuracy and speed on a token file, and its loss by
// position (the long-context curve), with the launch options and strategies of `untied train`.
#include <cmath>
#include <cstdio>
#include <limits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <optional>
#include <mutex>
#include <memory>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/launch.h"
#include "cli/rank_device.h"
#include "untied/core/file_io.h"
#include "untied/core/json.h"
#include "untied/model/hf_config.h"
#include "untied/train/data.h"
#include "untied/train/evaluator.h"
#include "untied/train/hf_tokenizer.h"
#include "untied/train/needle.h"
#include "untied/train/tokenizer.h"

namespace untied::cli {
namespace {

void add_eval_flags(FlagSet& f) {
  f.add("hf-model", FlagKind::kString, "", "evaluate this Hugging Face model directory (config.json + safetensors)");
  f.add("checkpoint-dir", FlagKind::kString, "",
        "or: evaluate the newest checkpoint of an untied run (written at any rank count; its config.json says the model)");
  f.add("preset", FlagKind::kString, "tiny", "or: a preset with its initial weights (a baseline): " + model_preset_names());
  f.add("vocab", FlagKind::kInt, "0", "--preset: vocabulary size (0 = the data's)");
  add_rope_theta_flag(f, "", "RoPE base, replacing the model's (to try a base before training with it)");
  f.add_int("seed", "0", "--preset: seed of the initial weights", {.min = 0});
  f.add_checked("data", "tokens",
                "data: tokens (a token file, `untied prepare`) or text (byte-level); with --needle also kv (the built-in "
                "task's answers by the depth of their pair)",
                [](const std::string& v) {
                  if (v == "tokens" || v == "text" || v == "kv") return Status::ok_status();
                  return Status::invalid_argument("'" + v + "': use tokens or text (or kv with --needle)");
                });
  f.add("kv-keys", FlagKind::kInt, "16", "--needle --data kv: K, the task's keys (as train's)");
  f.add("kv-values", FlagKind::kInt, "4", "--needle --data kv: V, the task's values (as train's)");
  f.add("kv-pairs", FlagKind::kInt, "0", "--needle --data kv: pairs per sample (0: as many as fit, as train's)");
  f.add("kv-fused", FlagKind::kBool, "true", "--needle --data kv: each pair one token (as train's --kv-fused; --no-kv-fused)");
  f.add("data-path", FlagKind::kString, "", "the token file (--data tokens) or UTF-8 text (--data text)");
  f.add_checked("text-split", "blank-lines", "--data text: documents are blank-line blocks, lines or the file",
                [](const std::string& v) { return parse_document_split(v).status(); });
  f.add("seq", FlagKind::kInt, "256", "sequence length S: the file is read as consecutive sequences of S tokens");
  f.add("samples", FlagKind::kInt, "0", "sequences to evaluate (0 = every whole sequence of the file)");
  f.add("buckets", FlagKind::kInt, "16", "the loss by position: S in this many equal ranges");
  f.add_choice("by", {"auto", "doc-position", "window"}, "auto",
               "the loss by position counts each token at its position in its document (doc-position: documents "
               "longer than S count on, past S in one more bucket) or in the S-token window (window); auto: "
               "doc-position when the data has documents and --doc-mask is on");
  f.add("window", FlagKind::kInt, "0", "sliding-window attention (0 = none, or the model's sliding_window)");
  f.add("doc-mask", FlagKind::kBool, "true", "attend only inside each document (--no-doc-mask: across them)");
  add_strategy_flag(f, "attention strategy: local, ulysses, upipe or ring");
  f.add("upipe-heads", FlagKind::kInt, "0", "heads per UPipe stage (0 = ranks per ring group)");
  add_overlap_flag(f);
  f.add("ring", FlagKind::kInt, "1", "ring degree R of ulysses/upipe");
  add_dtype_flag(f, "f32", "activation and compute-weight storage: f32 or bf16");
  f.add("mlp-tile", FlagKind::kInt, "0", "tokens per MLP tile (0 = automatic)");
  f.add("loss-chunk", FlagKind::kInt, "0", "tokens per LM-head loss chunk (0 = automatic)");
  add_ranks_flag(f, 1);
  add_device_flag(f);
  add_threads_flag(f);
  add_mem_budget_flag(f);
  add_watchdog_flags(f);
  f.add("json", FlagKind::kBool, "false", "print one JSON object (loss, tokens, perplexity, buckets, ...) instead of text");
  f.add("svg", FlagKind::kString, "", "write the loss by position as an SVG plot here");
  f.add("compare", FlagKind::kString, "", "with --svg: also plot the curve of this earlier `eval --json` output");
  f.add("label", FlagKind::kString, "", "this run's name in the plot and the JSON (default: the model's directory)");
  f.add("dump-logits", FlagKind::kString, "", "write the first sequence's logits (S, V) float32 here (.npy)");
  f.add_int("step", "0", "with --checkpoint-dir: the checkpoint's step to evaluate (0: the newest, the one `latest` names)",
            {.min = 0});
  f.add("needle", FlagKind::kBool, "false",
        "needle in a haystack: a key hidden at a grid of depths in contexts of a grid of lengths, asked for at the "
        "end, scored by the key tokens' teacher-forced accuracy and log-likelihood (the haystack: --data-path, or "
        "a built-in English filler); --svg draws the heatmap");
  f.add("needle-lengths", FlagKind::kString, "", "context lengths (comma-separated, 4K style; default S/8, S/4, S/2, S)");
  f.add("needle-depths", FlagKind::kString, "0,10,20,30,40,50,60,70,80,90,100", "needle depths, percent of the haystack");
  f.add_int("needle-seed", "0", "--needle: the seed of the keys, names and depths (and of the kv samples)", {.min = 0});
  f.add_int("needle-trials", "4", "sequences per cell (each its own key and haystack)", {.min = 1, .max = 1000});
  f.add_int("needle-keys", "1", "needles per sequence, one asked (multi-key, as RULER's)", {.min = 1, .max = 16});
  f.add_choice("needle-key", {"digits", "word"}, "digits", "the key: 7 random digits or a word");
  f.add("needle-dump", FlagKind::kString, "",
        "--needle: write every sequence (tokens, the key's token range, the key) here as JSON, for comparisons");
  f.add("tokenizer", FlagKind::kString, "",
        "--needle: the model's tokenizer (tokenizer.json or its directory; default: --hf-model's, or the tokenizer "
        "--checkpoint-dir keeps, or the byte-level one with --data text)");
}

// "4K" -> 4096, "1M" -> 1048576, "300" -> 300; invalid_argument otherwise.
StatusOr<std::vector<int64_t>> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t scale = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'k')) scale = 1024, item.pop_back();
    else if (!item.empty() && (item.back() == 'M' || item.back() == 'm')) scale = 1024 * 1024, item.pop_back();
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > (int64_t{1} << 40) / scale)
      return Status::invalid_argument("--" + flag + " '" + text + "': give numbers separated by commas (4K,8K,16K)");
    out.push_back(v * scale);
  }
  if (out.empty()) return Status::invalid_argument("--" + flag + " is empty");
  return out;
}

Status options_from_flags(const FlagSet& f, EvalOptions* o, DeviceChoice* device, int* threads, int ranks) {
  const std::string hf = f.get_string("hf-model"), ck = f.get_string("checkpoint-dir");
  if (!hf.empty() && !ck.empty()) return Status::invalid_argument("give --hf-model or --checkpoint-dir, not both");
  int64_t model_window = 0;  // Mistral's sliding_window, the default of --window
  if (f.was_set("step") && ck.empty())
    return Status::invalid_argument("--step picks a step of --checkpoint-dir: give the checkpoint directory");
  if (!hf.empty() || !ck.empty()) {
    for (const char* flag : {"preset", "vocab", "seed"})
      if (f.was_set(flag))
        return Status::invalid_argument(std::string("the model comes from ") + (hf.empty() ? "--checkpoint-dir" : "--hf-model") +
                                        "'s config.json: drop --" + flag);
    auto c = read_hf_config(hf.empty() ? ck : hf);
    if (!c.ok()) {
      if (!ck.empty() && c.status().code() == Status::Code::kNotFound)
        return Status::not_found(ck + "/config.json is missing: is --checkpoint-dir the directory `untied train "
                                      "--checkpoint-dir` wrote?");
      return c.status();
    }
    o->model = c.value().model;
    model_window = c.value().sliding_window;
    o->hf_model = hf;
    o->checkpoint_dir = ck;
    o->checkpoint_step = f.get_int("step");
  } else {
    auto m = model_preset(f.get_string("preset"));
    if (!m.ok()) return Status::invalid_argument("--preset: " + m.status().message());
    o->model = m.value();
    if (f.get_int("vocab") != 0) o->model.vocab = f.get_int("vocab");
    o->seed = static_cast<uint64_t>(f.get_int("seed"));
  }
  rope_theta_from_flags(f, &o->model.rope_theta);
  *device = parse_device_choice(f.get_string("device")).value();
  o->decoder = DecoderOptions{.seq = f.get_int("seq"), .strategy = parse_strategy(f.get_string("strategy")).value(),
                              .upipe_heads = f.get_int("upipe-heads"), .ring = f.get_int("ring"),
                              .dtype = parse_dtype(f.get_string("dtype")).value(), .mlp_tile = f.get_int("mlp-tile"),
                              .loss_chunk = f.get_int("loss-chunk")};
  o->decoder.overlap = overlap_from_flags(f, *device == DeviceChoice::kCuda);
  o->samples = f.get_int("samples");
  o->buckets = f.get_int("buckets");
  if (Status s = window_from_flags(f, &o->window); !s.ok()) return s;
  if (!f.was_set("window")) o->window = model_window;
  o->doc_mask = f.get_bool("doc-mask");
  o->logits_path = f.get_string("dump-logits");
  *threads = threads_from_flags(f, ranks);
  if (*device == DeviceChoice::kCuda) *threads = 1;
  if (!f.get_string("compare").empty() && f.get_string("svg").empty())
    return Status::invalid_argument("--compare adds a curve to the --svg plot: give --svg too");
  return Status::ok_status();
}

Json result_json(const EvalResult& r, const EvalOptions& o, const std::string& label, int ranks) {
  Json j;
  j["label"] = label;
  j["loss"] = r.loss;
  j["perplexity"] = r.perplexity;
  j["accuracy"] = r.accuracy;
  j["tokens"] = r.tokens;
  j["samples"] = r.samples;
  j["seq"] = o.decoder.seq;
  j["tokens_per_s"] = as_printed("%.1f", r.tokens_per_s);
  j["seconds"] = as_printed("%.3f", r.seconds);
  j["strategy"] = std::string(strategy_name(o.decoder.strategy));
  j["ranks"] = ranks;
  j["dtype"] = std::string(dtype_name(o.decoder.dtype));
  if (r.checkpoint_step >= 0) j["checkpoint_step"] = r.checkpoint_step;
  Json buckets = Json::array();
  for (size_t b = 0; b < r.bucket_loss.size(); ++b) {
    const bool open_end = r.bucket_begin[b + 1] == std::numeric_limits<int64_t>::max();  // [S, inf)
    buckets.push_back(Json{{"begin", r.bucket_begin[b]}, {"end", open_end ? Json(nullptr) : Json(r.bucket_begin[b + 1])},
                           {"tokens", r.bucket_tokens[b]},
                           {"loss", r.bucket_tokens[b] > 0 ? Json(r.bucket_loss[b]) : Json(nullptr)}});
  }
  j["loss_by"] = r.by_doc_position ? "doc-position" : "window";
  j["loss_by_position"] = buckets;
  j["peak_bytes_by_tag"] = peak_bytes_by_tag(r.peak);
  return j;
}

// The curve of an earlier `eval --json` output.
StatusOr<LossCurve> read_curve(const std::string& path) {
  auto text = read_regular_file(path, int64_t{64} << 20, "--compare");
  if (!text.ok()) return text.status();
  try {
    const Json j = Json::parse(text.value());
    LossCurve c;
    c.label = j.value("label", path);
    for (const Json& b : j.at("loss_by_position")) {
      if (b.at("loss").is_null() || b.at("end").is_null()) continue;
      c.position.push_back(0.5 * (b.at("begin").get<double>() + b.at("end").get<double>()));
      c.loss.push_back(b.at("loss").get<double>());
    }
    return c;
  } catch (const Json::exception& e) {
    return Status::invalid_argument("--compare: " + path + " is not the output of `untied eval --json`: " + e.what());
  }
}

void print_text(const EvalResult& r, const EvalOptions& o, const std::string& label, int ranks) {
  std::printf("eval %s | %s | %s on %d ranks | S=%lld | %s\n", label.c_str(), o.model.name.c_str(),
              std::string(strategy_name(o.decoder.strategy)).c_str(), ranks, (long long)o.decoder.seq,
              std::string(dtype_name(o.decoder.dtype)).c_str());
  std::printf("  sequences %lld, predicted tokens %lld\n", (long long)r.samples, (long long)r.tokens);
  std::printf("  loss %.6f nats/token, perplexity %.4f, accuracy %.2f%%\n", r.loss, r.perplexity, 100.0 * r.accuracy);
  std::printf("  %.1f tokens/s (%.3f s of forward), peak %s per rank\n", r.tokens_per_s, r.seconds,
              format_bytes(r.peak.peak_total).c_str());
  std::printf("  loss by position in the %s:\n", r.by_doc_position ? "document" : "window");
  for (size_t b = 0; b < r.bucket_loss.size(); ++b) {
    if (r.bucket_tokens[b] == 0) continue;
    const bool open_end = r.bucket_begin[b + 1] == std::numeric_limits<int64_t>::max();
    std::printf("    [%7lld, %7s)  %.4f  (%lld tokens)\n", (long long)r.bucket_begin[b],
                open_end ? "..." : std::to_string(r.bucket_begin[b + 1]).c_str(), r.bucket_loss[b],
                (long long)r.bucket_tokens[b]);
  }
}

// The tokenizer --needle writes its text with: --tokenizer, else --hf-model's, else the one the
// checkpoint directory keeps, else (--data text) the byte-level one. HfTokenizer::encode is not
// thread-safe and in-process ranks share this: a lock.
StatusOr<NeedleTokenizer> needle_tokenizer(const FlagSet& flags, const EvalOptions& o) {
  std::string path = flags.get_string("tokenizer");
  std::error_code ec;
  if (path.empty() && !o.hf_model.empty() && std::filesystem::exists(o.hf_model + "/tokenizer.json", ec)) path = o.hf_model;
  if (path.empty() && !o.checkpoint_dir.empty() && std::filesystem::exists(o.checkpoint_dir + "/tokenizer.json", ec))
    path = o.checkpoint_dir;
  if (path.empty()) {
    if (flags.get_string("data") != "text" && !flags.get_string("data-path").empty())
      return Status::invalid_argument("--needle writes its needle and question as text: give --tokenizer (the "
                                      "model's tokenizer.json or its directory)");
    return NeedleTokenizer{.encode = [](std::string_view t) { return byte_encode(t); }, .bos = kBos};
  }
  auto loaded = HfTokenizer::load(path);
  if (!loaded.ok()) return loaded.status();
  auto tok = std::make_shared<HfTokenizer>(std::move(loaded).value());
  auto mu = std::make_shared<std::mutex>();
  std::optional<int32_t> bos = tok->adds_bos() ? tok->bos_id() : std::nullopt;
  return NeedleTokenizer{.encode =
                             [tok, mu](std::string_view t) {
                               std::lock_guard<std::mutex> lock(*mu);
                               return tok->encode(t, HfEncodeOptions{.add_special_tokens = false, .parse_special = false});
                             },
                         .bos = bos};
}

int needle_main(int* argc, char*** argv, const FlagSet& flags, const EvalOptions& opts, DeviceChoice device, int threads,
                const LaunchInfo& li, int inproc, const std::string& label, const DataSource* haystack) {
  const bool root = li.world_rank == 0;
  auto refuse = [&](const Status& st) { return cli::refuse(flags, st, root); };
  NeedleOptions n;
  const std::string lengths = flags.get_string("needle-lengths");
  if (lengths.empty()) {
    const int64_t S = opts.decoder.seq;
    for (int64_t div : {8, 4, 2, 1})
      if (S / div >= 64) n.lengths.push_back(S / div);
  } else {
    auto l = parse_int_list("needle-lengths", lengths);
    if (!l.ok()) return refuse(l.status());
    n.lengths = l.value();
  }
  auto depths = parse_int_list("needle-depths", flags.get_string("needle-depths"));
  if (!depths.ok()) return refuse(depths.status());
  n.depths = depths.value();
  for (int64_t d : n.depths)
    if (d > 100) return refuse(Status::invalid_argument("--needle-depths are percent of the haystack: 0 to 100"));
  for (int64_t l : n.lengths)
    if (l < 64) return refuse(Status::invalid_argument("--needle-lengths must be at least 64 tokens"));
  if (n.lengths.empty()) return refuse(Status::invalid_argument("--seq is too short for a needle: give --needle-lengths"));
  n.trials = flags.get_int("needle-trials");
  n.keys = flags.get_int("needle-keys");
  n.key_kind = flags.get_string("needle-key");
  n.seed = static_cast<uint64_t>(flags.get_int("needle-seed"));
  const auto* kv = dynamic_cast<const KvTask*>(haystack);
  if (kv != nullptr && kv->vocab_size() > opts.model.vocab)
    return refuse(Status::invalid_argument("the kv task's vocabulary (" + std::to_string(kv->vocab_size()) +
                                           ") is larger than the model's (" + std::to_string(opts.model.vocab) +
                                           "): give the --kv-keys and --kv-values the model was trained with"));
  auto tok = kv != nullptr ? StatusOr<NeedleTokenizer>(NeedleTokenizer{}) : needle_tokenizer(flags, opts);
  if (!tok.ok()) return refuse(tok.status());
  std::optional<Json> compare;
  if (!flags.get_string("compare").empty()) {
    auto text = read_regular_file(flags.get_string("compare"), int64_t{64} << 20, "--compare");
    if (!text.ok()) return refuse(text.status());
    try {
      compare = Json::parse(text.value());
      if (!compare->contains("cells")) throw std::runtime_error("no cells");
    } catch (const std::exception& e) {
      return refuse(Status::invalid_argument("--compare: " + flags.get_string("compare") +
                                             " is not the output of `untied eval --needle --json`"));
    }
  }
  return run_ranks(argc, argv, li.launched ? 1 : inproc, [&](Communicator& comm) {
    check_all_ranks(comm, validate(opts, comm.size()));
    RankDevice rd = make_rank_device(comm, RankDeviceOptions{.device = device, .threads = threads,
                                                             .budget_bytes = flags.get_bytes("mem-budget")});
    auto r = kv != nullptr ? evaluate_kv_needle(rd.dev(), rd.comm(), comm, *kv, opts, n)
                           : evaluate_needle(rd.dev(), rd.comm(), comm, tok.value(), haystack, opts, n);
    check_all_ranks(comm, r.ok() ? Status::ok_status() : r.status());
    if (comm.rank() != 0) return;
    Json table = needle_json(r.value(), n, label);
    table["strategy"] = std::string(strategy_name(opts.decoder.strategy));
    table["ranks"] = comm.size();
    table["haystack"] = kv != nullptr ? "kv task (answers by the depth of their pair)"
                        : haystack == nullptr ? "built-in filler" : flags.get_string("data-path");
    if (flags.get_bool("json")) {
      std::printf("%s\n", table.dump(2).c_str());
    } else {
      std::printf("needle %s | %s on %d ranks | %lld key%s (%s), %lld trials per cell | haystack %s\n", label.c_str(),
                  std::string(strategy_name(opts.decoder.strategy)).c_str(), comm.size(), (long long)n.keys,
                  n.keys > 1 ? "s, one asked" : "", n.key_kind.c_str(), (long long)n.trials,
                  table["haystack"].get<std::string>().c_str());
      std::printf("  accuracy of the key's tokens (depth down, length across):\n  %6s", "");
      for (int64_t l : n.lengths) std::printf(" %8lld", (long long)l);
      std::printf("\n");
      for (int64_t d : n.depths) {
        std::printf("  %5lld%%", (long long)d);
        for (int64_t l : n.lengths)
          for (const NeedleCell& c : r.value())
            if (c.length == l && c.depth == d) std::printf(" %8.3f", c.accuracy);
        std::printf("\n");
      }
      std::printf("  mean %.4f\n", table["accuracy"].get<double>());
    }
    if (!flags.get_string("needle-dump").empty() && kv == nullptr) {
      Json dump = Json::array();
      for (const int64_t l : n.lengths)
        for (const int64_t dp : n.depths) {
          auto seqs = make_needle_cell(tok.value(), haystack, n, l, dp);
          for (const NeedleSequence& q : seqs.value())
            dump.push_back(Json{{"length", l}, {"depth", dp}, {"key", q.key}, {"tokens", q.tokens},
                                {"answer_begin", q.answer_begin}, {"answer_end", q.answer_end}});
        }
      const bool dumped = write_file_atomically(flags.get_string("needle-dump"), dump.dump() + "\n");
      UNTIED_CHECK_KIND(ErrorKind::kIo, dumped, "cannot write ", flags.get_string("needle-dump"));
    }
    if (!flags.get_string("svg").empty()) {
      std::vector<Json> tables;
      if (compare) tables.push_back(*compare);
      tables.push_back(table);
      const std::string path = flags.get_string("svg");
      const bool written = write_file_atomically(path, needle_svg(tables, "needle in a haystack: accuracy of the key"));
      UNTIED_CHECK_KIND(ErrorKind::kIo, written, "cannot write ", path, ": choose a writable --svg path");
      if (!flags.get_bool("json")) std::printf("  wrote %s\n", path.c_str());
    }
  });
}

}  // namespace

int eval_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied eval",
                "Evaluates a model on a token file: mean next-token loss, perplexity, accuracy, tokens/s and the loss\n"
                "by position. Launch as `untied train` (mpirun -np N, or --ranks N), with any strategy.");
  add_eval_flags(flags);
  const LaunchInfo li = launch_info();
  const bool root = li.world_rank == 0;
  if (auto exit = parse_command_line(flags, args, root)) return *exit;
  auto refuse = [&](const Status& s) { return cli::refuse(flags, s, root); };
  const int inproc = static_cast<int>(flags.get_int("ranks"));  // (in kRanksRange: the flag's range)
  EvalOptions opts;
  DeviceChoice device = DeviceChoice::kCpu;
  int threads = 1;
  Status st = options_from_flags(flags, &opts, &device, &threads, li.launched ? local_ranks_launched() : inproc);
  if (!st.ok()) return refuse(st);
  DataOptions dopts;
  dopts.text_split = parse_document_split(flags.get_string("text-split")).value();
  const bool kv = flags.get_string("data") == "kv";
  if (kv && !flags.get_bool("needle"))
    return refuse(Status::invalid_argument("eval reads tokens or text; the kv task only with --needle (its answers by "
                                           "depth)"));
  const bool needle_filler = flags.get_bool("needle") && !kv && flags.get_string("data-path").empty();
  dopts.kv = KvTaskOptions{.seed = 999 + static_cast<uint64_t>(flags.get_int("needle-seed")),
                           .num_keys = flags.get_int("kv-keys"), .num_values = flags.get_int("kv-values"),
                           .num_pairs = flags.get_int("kv-pairs"), .fused_pairs = flags.get_bool("kv-fused")};
  auto data = needle_filler ? StatusOr<std::unique_ptr<DataSource>>(std::unique_ptr<DataSource>())
                            : make_data_source(flags.get_string("data"), kv ? "" : flags.get_string("data-path"), dopts);
  if (!data.ok()) return refuse(data.status());
  if (opts.hf_model.empty() && opts.checkpoint_dir.empty() && flags.get_int("vocab") == 0 &&
      !preset_keeps_vocabulary(opts.model.name))
    opts.model.vocab = needle_filler ? kByteVocabSize : data.value()->vocab_size();
  opts.by_doc_position = !needle_filler && (flags.get_string("by") == "doc-position" ||
                                            (flags.get_string("by") == "auto" && data.value()->has_documents() &&
                                             opts.doc_mask));
  std::string label = flags.get_string("label");
  if (label.empty()) label = !opts.hf_model.empty() ? opts.hf_model : !opts.checkpoint_dir.empty() ? opts.checkpoint_dir
                                                                                                   : "preset " + opts.model.name;
  LossCurve compare;
  if (!flags.get_string("compare").empty() && !flags.get_bool("needle")) {
    auto c = read_curve(flags.get_string("compare"));
    if (!c.ok()) return refuse(c.status());
    compare = c.value();
  }

  apply_watchdog_flags(flags);
  if (flags.get_bool("needle"))
    return needle_main(argc, argv, flags, opts, device, threads, li, inproc, label, data.value().get());
  return run_ranks(argc, argv, li.launched ? 1 : inproc, [&](Communicator& comm) {
    check_all_ranks(comm, validate(opts, comm.size()));
    RankDevice rd = make_rank_device(comm, RankDeviceOptions{.device = device, .threads = threads,
                                                             .budget_bytes = flags.get_bytes("mem-budget")});
    auto r = evaluate(rd.dev(), rd.comm(), comm, *data.value(), opts);
    check_all_ranks(comm, r.ok() ? Status::ok_status() : r.status());
    if (comm.rank() != 0) return;
    if (flags.get_bool("json")) std::printf("%s\n", result_json(r.value(), opts, label, comm.size()).dump(2).c_str());
    else {
      print_text(r.value(), opts, label, comm.size());
      std::fputs(cpu_kernels_lines(device).c_str(), stdout);
    }
    if (!flags.get_string("svg").empty()) {
      std::vector<LossCurve> curves;
      if (!compare.label.empty() || !compare.loss.empty()) curves.push_back(compare);
      curves.push_back(loss_curve(r.value(), label));
      const std::string path = flags.get_string("svg");
      const bool written = write_file_atomically(
          path, position_loss_svg(curves,
                                  std::string(opts.by_doc_position ? "loss by position in the document"
                                                                   : "loss by position in the window") +
                                      ", S = " + std::to_string(opts.decoder.seq),
                                  opts.by_doc_position ? "position in the document (token)"
                                                       : "position in the sequence (token)"));
      UNTIED_CHECK_KIND(ErrorKind::kIo, written, "cannot write ", path, ": choose a writable --svg path");
      if (!flags.get_bool("json")) std::printf("  wrote %s\n", path.c_str());
    }
    if (!opts.logits_path.empty() && !flags.get_bool("json")) std::printf("  wrote %s\n", opts.logits_path.c_str());
  });
}

}  // namespace untied::cli
