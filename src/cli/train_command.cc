// `untied train`: the main job. Flags and config files use the same names: a config file holds
// `name = value` lines (# starts a comment) or one JSON object {"name": value, ...}, and the
// command line overrides it.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "untied/comm/inproc.h"

#include "cli/args.h"
#include "untied/model/hf_config.h"
#include "cli/commands.h"
#include "cli/fit_search.h"
#include "cli/common_flags.h"
#include "cli/launch.h"
#include "cli/rank_device.h"
#include "cli/stop_signal.h"
#include "cli/train_flags.h"
#include "untied/train/hf_weights.h"
#include "untied/train/memory_plan.h"
#include "untied/train/trainer.h"

namespace untied::cli {

void add_train_flags(FlagSet& f) {
  f.add("config", FlagKind::kConfig, "",
        "config file of these flags: `name = value` lines, or a JSON object {\"name\": value} of strings, numbers "
        "and booleans (flags on the command line win)");
  f.add("preset", FlagKind::kString, "tiny", "model preset: " + model_preset_names());
  f.add("save-hf", FlagKind::kString, "",
        "at the end, write the model here as a Hugging Face directory (config.json, model.safetensors and the "
        "--hf-model's tokenizer files) that transformers loads");
  f.add_checked("save-hf-dtype", "auto",
                "--save-hf tensors: auto (the --hf-model's own dtype, f32 for a model made here), f32, bf16 or f16",
                [](const std::string& v) { return v == "auto" ? Status::ok_status() : parse_hf_dtype(v).status(); });
  f.add("hf-model", FlagKind::kString, "",
        "start from a Hugging Face model directory (config.json and model.safetensors or its sharded index): "
        "Llama, Qwen2, Qwen3, Mistral, Qwen3-MoE or Mixtral; each rank reads only its own shard of each tensor");
  add_rope_theta_flag(
      f, "", "RoPE base, replacing the model's (a larger base for a longer context; --save-hf and checkpoints record it)");
  f.add("vocab", FlagKind::kInt, "0",
        "vocabulary size (0 = the preset's for llama3-8b, llama3-70b and qwen3-32b, else the data's)");
  f.add("layers", FlagKind::kInt, "0", "decoder blocks (0 = the preset's)");
  f.add_choice("data", {"kv", "tokens", "text"}, "kv", "data: kv (built-in key-value retrieval task), tokens or text");
  f.add("data-path", FlagKind::kString, "",
        "token files (--data tokens) or UTF-8 text files (--data text): comma-separated paths or glob patterns "
        "(`a.tok,b.tok`, `shards/*.tok`), one stream in that order unless --data-weights mixes them");
  f.add("data-weights", FlagKind::kString, "",
        "a weighted mix: one positive weight per --data-path entry (`3,1`: three sequences of the first for one of "
        "the second), seeded by --seed");
  f.add("eval-data", FlagKind::kString, "",
        "evaluate on this data (of the --data kind: token files or text) while training: eval's loss, perplexity "
        "and accuracy with the run's weights, strategy and ranks, in the metrics and the log");
  f.add_int("eval-every", "0", "with --eval-data: evaluate every N steps (0: after the last step only)", {.min = 0});
  f.add_int("eval-samples", "0", "with --eval-data: sequences evaluated each time (0: every whole sequence of it)",
            {.min = 0});
  f.add("shuffle", FlagKind::kBool, "false",
        "sequences in a seeded (--seed) random order within each pass over the data, resumed exactly");
  f.add("data-repeat", FlagKind::kBool, "false",
        "accept data shorter than one sequence (its tokens repeat within each sequence); refused otherwise");
  f.add("kv-keys", FlagKind::kInt, "16", "kv task: distinct keys");
  f.add("kv-values", FlagKind::kInt, "4", "kv task: distinct values (chance accuracy 1/values)");
  f.add("kv-pairs", FlagKind::kInt, "0", "kv task: pairs per sequence (0 = as many as fit)");
  f.add("kv-fused", FlagKind::kBool, "true", "kv task: each pair one token (one-hop retrieval; --no-kv-fused: key then value, a two-hop task that learns far slower)");
  f.add("seq", FlagKind::kInt, "256",
        "sequence length S (any: padded to a multiple of the ranks, or of 2*ranks with a ring; no loss on the padding)");
  f.add("window", FlagKind::kInt, "0",
        "sliding-window attention: a query at p sees keys in (p-W, p] (default: none, or the --hf-model's sliding_window)");
  f.add("doc-mask", FlagKind::kBool, "true",
        "attend only inside each document of packed data (--no-doc-mask: across them, with RoPE still restarting "
        "per document: what a lost mask does, for measuring what it is worth)");
  f.add("kv-docs", FlagKind::kInt, "1",
        "kv task: documents packed per sequence, each its own pairs and queries over the same keys (only the "
        "query's own document answers it)");
  f.add_checked("text-split", "blank-lines",
        "--data text: documents are blocks between blank lines (blank-lines), single lines (lines) or the file (file); "
        "each attends only to itself",
        [](const std::string& v) { return parse_document_split(v).status(); });
  add_strategy_flag(f, "attention strategy: local, ulysses, upipe or ring");
  f.add("upipe-heads", FlagKind::kInt, "0", "heads per UPipe stage (0 = ranks per ring group)");
  add_overlap_flag(f);
  f.add("ring", FlagKind::kInt, "1",
        "ring degree R of ulysses/upipe: R groups of ranks/R consecutive ranks, zig-zag ring attention across them");
  add_dtype_flag(f, "f32", "activation and compute-weight storage: f32 or bf16");
  f.add("steps", FlagKind::kInt, "1500", "optimizer steps");
  f.add("batch", FlagKind::kInt, "4", "sequences per step (their gradients add up)");
  f.add_number("lr", "0.003", "peak learning rate (with --hf-model: 2e-5, a fine-tune's)", positive_number());
  f.add_number("min-lr-ratio", "0.1", "final learning rate as a fraction of --lr (cosine)",
               NumberBound{.min = 0, .what = "a fraction in [0, 1]"});
  f.add("warmup", FlagKind::kInt, "50", "warm-up steps (with --hf-model: 3% of --steps)");
  f.add_number("weight-decay", "0.1", "AdamW weight decay (matrices only)", non_negative_number());
  f.add_number("clip", "1.0", "clip the global gradient norm to this (0 = off)", non_negative_number());
  f.add_int("seed", "0", "seed of the weights and of the kv task", {.min = 0});
  f.add("mlp-tile", FlagKind::kInt, "0", "tokens per MLP tile (0 = automatic)");
  f.add("expert-parallel", FlagKind::kBool, "true",
        "a mixture of experts: spread the experts over the ranks when their number is a multiple of the ranks "
        "(each rank owns experts/ranks of every MoE layer; tokens travel to them and back in all-to-alls); "
        "--no-expert-parallel: every rank runs every expert on its own tokens");
  f.add_number("router-aux-coef", "", "a mixture of experts: the load-balancing loss's weight in the loss (default: "
               "the model's router_aux_loss_coef, added as transformers adds it with output_router_logits on; 0: off)",
               non_negative_number());
  f.add_number("moe-skew", "1", "a mixture of experts under expert parallelism: the plan and --rehearsal size each "
               "rank's received rows as this many times the balanced share (a real step sizes them from the router's "
               "counts)", NumberBound{.min = 1, .what = "a factor >= 1"});
  f.add("loss-chunk", FlagKind::kInt, "0", "tokens per LM-head loss chunk (0 = automatic)");
  add_ranks_flag(f, 1);
  add_device_flag(f);
  add_threads_flag(f);
  add_mem_budget_flag(f);
  add_watchdog_flags(f);
  f.add("checkpoint-dir", FlagKind::kString, "", "save checkpoints here (per-rank shards)");
  f.add("save-every", FlagKind::kInt, "0", "save every N steps (0 = at the end only)");
  f.add("resume", FlagKind::kBool, "false",
        "continue from the newest intact checkpoint in --checkpoint-dir, at any rank count, strategy, --ring and "
        "--upipe-heads (resharded as it is read)");
  f.add_int("resume-from", "0", "with --resume: the step to continue from (0 = the newest intact one)", {.min = 0});
  f.add("keep", FlagKind::kInt, "0", "keep only the newest K checkpoints (0 = all)");
  f.add("skip-nonfinite", FlagKind::kInt, "0",
        "skip (no update) up to N steps whose loss or gradient is NaN/Inf; past that, or with 0, training stops");
  f.add("stop-after", FlagKind::kInt, "0", "stop (and save) after this step, as an interrupted run would");
  f.add("metrics", FlagKind::kString, "", "append one JSON line per step to this file");
  f.add_number("peak-tflops", "0",
               "one rank's device peak TFLOP/s for the metrics' MFU (0: the GPU's known bf16/TF32 peak; none on a CPU)",
               non_negative_number());
  f.add("tensorboard", FlagKind::kString, "",
        "write every step's metrics as TensorBoard scalars (an event file) into this directory (rank 0)");
  f.add("progress", FlagKind::kBool, "true", "progress bar on rank 0 (--no-progress to turn off)");
  f.add("offload-inputs", FlagKind::kBool, "false", "keep each block's saved input in host memory, outside --mem-budget");
  f.add("keep-inputs", FlagKind::kInt, "0",
        "with --offload-inputs: the first K blocks' inputs stay on the device (partial offload)");
  f.add("offload-every", FlagKind::kInt, "1",
        "with --offload-inputs: offload every N-th block's input from block --keep-inputs on, keep the rest on the device");
  f.add("host-budget", FlagKind::kBytes, "",
        "host memory per node for the offloaded block inputs and what a block's backward keeps there (e.g. 1T), "
        "shared evenly by the node's ranks; checked before the first step");
  f.add("refetch-inputs", FlagKind::kBool, "true",
        "with --offload-inputs: fetch a block's input again for its last step instead of holding it through the "
        "attention's backward (--no-refetch-inputs holds it: one (L, E) buffer more at the peak, one host copy less)");
  f.add_choice("upipe-keep-last", {"on", "off", "auto"}, "auto",
        "upipe: the recompute keeps its last stage's q, k and v for the backward, which starts with that stage "
        "instead of projecting and exchanging them again; they stay through the MLP's backward: on, off, or auto "
        "(on unless that raises the step's planned peak memory)");
  f.add_choice("recompute", {"full", "selective", "auto"}, "auto",
        "what a block's backward recomputes: full (the whole block from its saved input: the least memory), "
        "selective (all but the attention: each block's attention output and LSE are kept from the forward, in host "
        "memory with --offload-inputs, and the attention runs once per step), or auto (selective where the step's "
        "planned memory with it fits --mem-budget, --host-budget and 80% of this machine's memory, full otherwise; "
        "a rehearsal weighs the budgets alone, and without any chooses full)");
  f.add("attn-tile", FlagKind::kInt, "0",
        "rows per tile of the attention's input attn_norm(x), computed as the projections read it and never whole "
        "(0 = the MLP tile, -1 = off: made whole)");
  f.add("tiled-dx", FlagKind::kBool, "true",
        "the attention hands its input gradient out a tile of rows at a time, formed from the stages' kept q/k/v "
        "gradients, and the norm backward runs per tile: no (L, E) fp32 dx (--no-tiled-dx makes it whole)");
  f.add("grads-on-host", FlagKind::kBool, "true",
        "with --offload-inputs and --tiled-dx: the stages' returned q/k/v gradients wait for dx in host memory "
        "(--no-grads-on-host keeps them on the device: upipe holds the dq of every stage run before its last one)");
  f.add("dh-on-host", FlagKind::kBool, "true",
        "with --offload-inputs and tiles: the block's output gradient waits in host memory through the attention's "
        "backward, read a tile at a time (--no-dh-on-host keeps it on the device: one (L, E) buffer more)");
  f.add("attn-out-on-host", FlagKind::kBool, "true",
        "with --offload-inputs, tiles and --early-delta: the attention output saved for the backward waits in host "
        "memory, read a tile at a time (--no-attn-out-on-host keeps it on the device: one (L, H*D) buffer more)");
  f.add("early-delta", FlagKind::kBool, "true",
        "ulysses/upipe: compute every head's D = rowsum(dO * O) first in the attention's backward and free the saved "
        "output (--no-early-delta keeps it through the stages: one (L, H*D) buffer more, one dO projection less)");
  f.add("rehearsal", FlagKind::kBool, "false", "run one step with every allocation counted, none backed, compute skipped; print peaks");
  f.add("fit-seq", FlagKind::kBool, "false",
        "with --rehearsal and --mem-budget: find the longest --seq whose step fits the budget, one rehearsed step per "
        "length tried (minutes at millions of tokens; `untied plan --fit` finds the same from closed forms at once)");
}

// "kv", "tokens corpus.tok", "text notes.txt": the data kind and its file.
static std::string data_note(const FlagSet& f) {
  const std::string path = f.get_string("data-path");
  return f.get_string("data") + (path.empty() ? "" : " " + path);
}

// ", padded to 1002" when the ranks do not divide S; ", window W" with a window.
static std::string pad_note(const TrainOptions& o, const RunGeometry& g) {
  std::string note = g.Sp != g.S ? ", padded to " + std::to_string(g.Sp) : "";
  if (o.window > 0) note += ", window " + std::to_string(o.window);
  return note;
}

// --hf-model's defaults where --lr and --warmup are not given: a fine-tune's usual peak learning
// rate, and a warm-up of 3% of the steps.
constexpr float kFineTuneLr = 2e-5f;
constexpr int64_t kFineTuneWarmupPercent = 3;

Status options_from_flags(const FlagSet& f, int ranks, TrainOptions* o, DataOptions* d, DeviceChoice* device) {
  int64_t model_window = 0;  // Mistral's sliding_window, the default of --window
  if (!f.get_string("hf-model").empty()) {
    for (const char* flag : {"preset", "vocab", "layers"})
      if (f.was_set(flag))
        return Status::invalid_argument(std::string("--hf-model sets the model from its config.json: drop --") + flag);
    auto hf = read_hf_config(f.get_string("hf-model"));
    if (!hf.ok()) return hf.status();
    o->model = hf.value().model;
    o->hf_model = f.get_string("hf-model");
    model_window = hf.value().sliding_window;
  } else {
    auto m = model_preset(f.get_string("preset"));
    if (!m.ok()) return Status::invalid_argument("--preset: " + m.status().message());
    o->model = m.value();
    if (f.get_int("vocab") != 0) o->model.vocab = f.get_int("vocab");
    if (f.get_int("layers") != 0) o->model.layers = f.get_int("layers");
  }
  rope_theta_from_flags(f, &o->model.rope_theta);
  if (!f.get_string("router-aux-coef").empty()) {
    if (o->model.experts == 0)
      return Status::invalid_argument("--router-aux-coef weighs a mixture of experts' load balancing: this model has none");
    o->model.router_aux_coef = f.get_number("router-aux-coef");
  }
  o->save_hf = f.get_string("save-hf");
  o->save_hf_dtype =
      f.get_string("save-hf-dtype") == "auto" ? std::string() : parse_hf_dtype(f.get_string("save-hf-dtype")).value();
  o->rehearsal = f.get_bool("rehearsal");
  o->offload_inputs = f.get_bool("offload-inputs");
  if (o->rehearsal) {
    if (f.get_bool("resume") || !f.get_string("checkpoint-dir").empty() || !f.get_string("metrics").empty())
      return Status::invalid_argument("--rehearsal runs one counted step: drop --resume, --checkpoint-dir and --metrics");
  }
  if (f.get_bool("fit-seq") && (!o->rehearsal || f.get_bytes("mem-budget") == 0))
    return Status::invalid_argument("--fit-seq needs --rehearsal and --mem-budget");
  *device = parse_device_choice(f.get_string("device")).value();
  o->decoder = DecoderOptions{.seq = f.get_int("seq"), .strategy = parse_strategy(f.get_string("strategy")).value(),
                              .upipe_heads = f.get_int("upipe-heads"), .ring = f.get_int("ring"),
                              .dtype = parse_dtype(f.get_string("dtype")).value(), .mlp_tile = f.get_int("mlp-tile"),
                              .loss_chunk = f.get_int("loss-chunk")};
  o->decoder.overlap = overlap_from_flags(f, *device == DeviceChoice::kCuda);
  o->decoder.keep_last_stage =
      f.get_choice("upipe-keep-last", std::vector{KeepLastStage::kOn, KeepLastStage::kOff, KeepLastStage::kAuto});
  o->decoder.recompute =
      f.get_choice("recompute", std::vector{Recompute::kFull, Recompute::kSelective, Recompute::kAuto});

  o->decoder.refetch_inputs = f.get_bool("refetch-inputs");
  o->decoder.early_delta = f.get_bool("early-delta");
  o->decoder.tiled_dx = f.get_bool("tiled-dx");
  o->decoder.grads_on_host = f.get_bool("grads-on-host");
  o->decoder.dh_on_host = f.get_bool("dh-on-host");
  o->decoder.attn_out_on_host = f.get_bool("attn-out-on-host");
  o->decoder.attn_tile = f.get_int("attn-tile");
  o->decoder.expert_parallel = f.get_bool("expert-parallel");
  o->decoder.moe_skew = f.get_number("moe-skew");
  if ((f.was_set("keep-inputs") || f.was_set("offload-every")) && !o->offload_inputs)
    return Status::invalid_argument("--keep-inputs and --offload-every choose which inputs --offload-inputs offloads: add it");
  o->decoder.offload_keep_first = f.get_int("keep-inputs");
  o->decoder.offload_every = f.get_int("offload-every");
  o->host_budget_bytes = f.get_bytes("host-budget");
  o->ranks_per_node = ranks;
  o->steps = f.get_int("steps");
  o->batch = f.get_int("batch");
  o->warmup = f.get_int("warmup");
  o->lr = static_cast<float>(f.get_number("lr"));
  // A pretrained model is fine-tuned, not trained from scratch: the toy task's learning rate and
  // warm-up would wreck it, so --hf-model has its own defaults (said in the banner).
  if (!o->hf_model.empty() && !f.was_set("lr")) o->lr = kFineTuneLr;
  if (!o->hf_model.empty() && !f.was_set("warmup")) o->warmup = (o->steps * kFineTuneWarmupPercent + 50) / 100;
  o->min_lr_ratio = static_cast<float>(f.get_number("min-lr-ratio"));
  o->weight_decay = static_cast<float>(f.get_number("weight-decay"));
  o->clip = static_cast<float>(f.get_number("clip"));
  o->seed = static_cast<uint64_t>(f.get_int("seed"));  // (>= 0: the flag's range)
  o->threads = threads_from_flags(f, ranks);
  if (*device == DeviceChoice::kCuda) o->threads = 1;  // a GPU rank's kernels; its rehearsal counts as one
  o->budget_bytes = f.get_bytes("mem-budget");
  o->checkpoint_dir = f.get_string("checkpoint-dir");
  o->save_every = f.get_int("save-every");
  o->resume = f.get_bool("resume");
  o->resume_from = f.get_int("resume-from");
  o->keep = f.get_int("keep");
  o->skip_nonfinite = f.get_int("skip-nonfinite");
  o->stop_after = f.get_int("stop-after");
  o->metrics_path = f.get_string("metrics");
  o->tensorboard_dir = f.get_string("tensorboard");
  o->peak_tflops = f.get_number("peak-tflops");
  o->progress = f.get_bool("progress");
  d->kv.seed = 1234 + o->seed;
  d->kv.num_keys = f.get_int("kv-keys");
  d->kv.num_values = f.get_int("kv-values");
  d->kv.num_pairs = f.get_int("kv-pairs");
  d->kv.fused_pairs = f.get_bool("kv-fused");
  if (Status s = window_from_flags(f, &o->window); !s.ok()) return s;
  if (!f.was_set("window")) o->window = model_window;
  o->doc_mask = f.get_bool("doc-mask");
  d->kv.num_docs = f.get_int("kv-docs");
  d->text_split = parse_document_split(f.get_string("text-split")).value();
  d->shuffle = f.get_bool("shuffle");
  d->repeat = f.get_bool("data-repeat");
  d->seed = o->seed;
  d->seq_len = o->decoder.seq;
  if (const std::string w = f.get_string("data-weights"); !w.empty()) {
    std::istringstream in(w);
    for (std::string item; std::getline(in, item, ',');) {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      if (item.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v))
        return Status::invalid_argument("--data-weights '" + w + "': give positive numbers separated by commas (3,1)");
      d->weights.push_back(v);
    }
  }
  o->eval_every = f.get_int("eval-every");
  o->eval_samples = f.get_int("eval-samples");
  if (f.get_string("eval-data").empty() && (f.was_set("eval-every") || f.was_set("eval-samples")))
    return Status::invalid_argument("--eval-every and --eval-samples need --eval-data: name the evaluation file");
  if (!f.get_string("eval-data").empty() && f.get_string("data") == "kv")
    return Status::invalid_argument("--eval-data is read as --data says, and the kv task reads no file: use --data tokens or text");
  if (f.get_string("data") == "kv" && (!d->weights.empty() || d->shuffle))
    return Status::invalid_argument("--data-weights and --shuffle choose how files are read: the kv task reads none");
  return Status::ok_status();
}

// " (ring 2 x 8)": R ring groups of C ranks, or "" without a ring.
std::string ring_note(const AttentionConfig& c, int ranks) {
  const int R = ring_degree(c, ranks);
  if (R == 1 || c.strategy == Strategy::kRing) return "";
  return " x ring " + std::to_string(R) + " (" + std::to_string(ranks / R) + " ranks per group)";
}

void print_peaks(const TrainOptions& o, int ranks, const MemoryStats& m, int64_t host_peak,
                 const std::vector<LiveBuffers>& live) {
  const RunGeometry g = run_geometry(o, ranks);
  std::printf("one training step, rehearsal | %s, %lld layers | %s%s U=%lld%s on %d ranks | S=%lld | %s%s\n",
              o.model.name.c_str(), (long long)g.N, std::string(strategy_name(o.decoder.strategy)).c_str(),
              ring_note(g.attention, ranks).c_str(), (long long)g.sched.stage_heads,
              g.attention.overlap && g.sched.stages > 1 ? " overlapped" : "", ranks, (long long)g.S,
              std::string(dtype_name(g.dtype)).c_str(), g.selective ? " | selective recompute" : "");
  std::printf("peak memory per rank (max over ranks):\n");
  for (int t = 0; t < kNumTags; ++t)
    std::printf("  %-16s %14s\n", std::string(tag_name(static_cast<Tag>(t))).c_str(), format_bytes(m.peak[t]).c_str());
  std::printf("  %-16s %14s\n", "total", format_bytes(m.peak_total).c_str());
  if (o.offload_inputs) {
    // With the selective recompute, the other blocks' attention outputs kept from the forward.
    const HostMemory h = host_memory(g);
    const int64_t grads = h.beside_inputs() - h.kept_outputs;
    std::string kept = grads > 0 ? " and " + format_bytes(grads) + " of one block's gradients and attention output" : "";
    if (h.kept_outputs > 0) kept += ", " + format_bytes(h.kept_outputs) + " of the other blocks' attention outputs kept";
    std::printf("  %-16s %14s  (%lld of %lld blocks' inputs offloaded%s, outside the budget; %s per node of %d ranks)\n",
                "host", format_bytes(host_peak).c_str(), (long long)g.offloaded_blocks,
                (long long)o.model.layers, kept.c_str(), format_bytes(host_peak * o.ranks_per_node).c_str(),
                o.ranks_per_node);
  }
  if (live.empty()) return;
  // What rank 0 held at its peak, largest first: the buffers a longer sequence has to shrink.
  int64_t total = 0;
  for (const LiveBuffers& b : live) total += b.bytes;
  std::printf("live at rank 0's peak (%s), largest first:\n", format_bytes(total).c_str());
  const size_t shown = std::min<size_t>(live.size(), 14);
  int64_t rest = total;
  for (size_t i = 0; i < shown; ++i) {
    const LiveBuffers& b = live[i];
    rest -= b.bytes;
    std::printf("  %-44s %-15s %12s%s\n", b.what.c_str(), std::string(tag_name(b.tag)).c_str(),
                format_bytes(b.bytes).c_str(), b.count > 1 ? (" (" + std::to_string(b.count) + " buffers)").c_str() : "");
  }
  if (shown < live.size())
    std::printf("  %-44s %-15s %12s\n", ("(" + std::to_string(live.size() - shown) + " more)").c_str(), "",
                format_bytes(rest).c_str());
}

// One rehearsed step at `seq` on `ranks` in-process ranks; true when it fits the budget.
bool rehearse_fits(TrainOptions o, const DataSource& data, int ranks, int64_t seq, MemoryStats* peak, int64_t* host,
          std::vector<LiveBuffers>* live) {
  o.decoder.seq = seq;
  auto run = resolve_run(o, ranks, MachineMemory{});  // (--mem-budget decides the recompute)
  if (!run.ok()) return false;
  o = run.value().o;
  try {
    std::mutex mu;
    run_in_process(ranks, [&](Communicator& comm) {
      auto r = train(comm, data, o);
      UNTIED_CHECK(r.ok(), r.status().message());
      std::lock_guard<std::mutex> lock(mu);
      if (comm.rank() == 0) *peak = r.value().peak, *host = r.value().host_peak, *live = r.value().live_at_peak;
    });
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kOutOfBudget) return false;
    throw;
  }
  return true;
}

// The longest S (a multiple of ranks * 1024) whose training step fits --mem-budget.
static int fit_seq(const TrainOptions& o, const DataSource& data, int ranks) {
  const int64_t grain = static_cast<int64_t>(ranks) * 1024;
  MemoryStats peak, best_peak;
  int64_t host = 0, best_host = 0;
  std::vector<LiveBuffers> live, best_live;
  // Each length tried is one rehearsed step, said as it ends (at millions of tokens a step's
  // rehearsal takes minutes on 2 cores: `untied plan --fit` answers from closed forms at once).
  std::fprintf(stderr, "untied train: --fit-seq rehearses one step per length tried (untied plan --fit: the same "
                       "answer from closed forms, in milliseconds)\n");
  const int64_t lo = largest_fitting([&](int64_t k) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool fits = rehearse_fits(o, data, ranks, k * grain, &peak, &host, &live);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  S = %lld: %s (%.1f s)\n", (long long)(k * grain),
                 fits ? ("fits, peak " + format_bytes(peak.peak_total)).c_str() : "does not fit", s);
    if (!fits) return false;
    best_peak = peak, best_host = host, best_live = live;
    return true;
  });
  if (lo == 0) {
    std::fprintf(stderr, "untied train: not even S = %lld fits in %s per rank\n", (long long)grain,
                 format_bytes(o.budget_bytes).c_str());
    return 1;
  }
  TrainOptions asked = o;
  asked.decoder.seq = lo * grain;
  const ResolvedRun best = resolve_run(asked, ranks, MachineMemory{}).value();  // (it fit: it is valid)
  std::printf("longest sequence whose training step fits %s per rank: S = %lld (%lld tokens per rank)\n",
              format_bytes(o.budget_bytes).c_str(), (long long)(lo * grain), (long long)(lo * 1024));
  std::printf("(fits: the rehearsed peak of counted buffers is at most --mem-budget, no headroom added, as untied plan "
              "--fit; on a GPU the CUDA context, cuBLAS workspace and NCCL buffers are outside it)\n");
  print_peaks(best.o, ranks, best_peak, best_host, best_live);
  if (!best.recompute_why.empty()) std::printf("recompute: %s\n", best.recompute_why.c_str());
  return 0;
}

int train_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied train",
                "Trains a decoder with context parallelism (the sequence split over the ranks).\n"
                "Launch on N ranks with `mpirun -np N untied train ...` or in one process with --ranks N.");
  add_train_flags(flags);
  const LaunchInfo li = launch_info();
  const bool root = li.world_rank == 0;
  if (auto exit = parse_command_line(flags, args, root)) return *exit;
  auto refuse = [&](const Status& s) { return cli::refuse(flags, s, root); };
  const int inproc = static_cast<int>(flags.get_int("ranks"));  // (in kRanksRange: the flag's range)
  TrainOptions opts;
  DataOptions dopts;
  DeviceChoice device = DeviceChoice::kCpu;
  Status st = options_from_flags(flags, li.launched ? local_ranks_launched() : inproc, &opts, &dopts, &device);
  if (!st.ok()) return refuse(st);
  // The data source is built once per process and shared by its in-process ranks (fill is const).
  auto data = make_data_source(flags.get_string("data"), flags.get_string("data-path"), dopts);
  if (!data.ok()) return refuse(data.status());
  std::unique_ptr<DataSource> eval_data;  // --eval-data: read as eval reads, in order
  if (!flags.get_string("eval-data").empty()) {
    DataOptions eopts;
    eopts.text_split = dopts.text_split;
    auto e = make_data_source(flags.get_string("data"), flags.get_string("eval-data"), eopts);
    if (!e.ok()) return refuse(Status::invalid_argument("--eval-data: " + e.status().message()));
    eval_data = std::move(e).value();
    opts.eval_data = eval_data.get();
  }
  if (flags.get_int("vocab") == 0 && opts.hf_model.empty() && !preset_keeps_vocabulary(opts.model.name))
    opts.model.vocab = data.value()->vocab_size();

  if (opts.rehearsal) {
    opts.steps = 1, opts.warmup = 0, opts.progress = false;
    if (flags.get_bool("fit-seq")) {
      if (li.launched) return refuse(Status::invalid_argument("--fit-seq runs in one process: use --ranks instead of mpirun"));
      return fit_seq(opts, *data.value(), inproc);
    }
  }

  apply_watchdog_flags(flags);
  // SIGTERM, SIGINT and SIGUSR1 end the run after the step in progress, with a checkpoint.
  if (!opts.rehearsal) {
    install_stop_signals(/*announce=*/root);
    opts.stop_request = stop_request();
  }
  int stopped_exit = 0;  // the exit status of a run a signal ended (every rank sets the same)
  const int rc = run_ranks(argc, argv, li.launched ? 1 : inproc, [&](Communicator& comm) {
    // This rank's options, every auto resolved (--recompute from the step's memory plan and the
    // limits: every rank alike, the machine's figures agreed), once the rest is known to be valid.
    const RankDeviceOptions rdo{.device = device, .threads = opts.threads, .budget_bytes = opts.budget_bytes,
                                .rehearsal = opts.rehearsal};
    MachineMemory machine;
    if (opts.decoder.recompute == Recompute::kAuto && !opts.rehearsal) {  // (a rehearsal counts for its budgets)
      TrainOptions full = opts;
      full.decoder.recompute = Recompute::kFull;
      check_all_ranks(comm, validate(full, comm.size()));
      machine = agreed_machine_memory(comm, device, opts.ranks_per_node);
    }
    auto resolved = resolve_run(opts, comm.size(), machine);
    check_all_ranks(comm, resolved.ok() ? Status::ok_status() : resolved.status());
    const TrainOptions& o = resolved.value().o;
    const RunGeometry& g = resolved.value().g;
    // The rank's device and the communicator of its buffers; refusals (no GPU, ...) on every rank.
    RankDevice rd = make_rank_device(comm, rdo);
    // The banner, with --no-progress too (a batch job's log says what ran).
    if (comm.rank() == 0)
      std::fprintf(stderr,
                   "untied train | %s (%lld parameters) | %s%s%s on %d ranks | S=%lld%s (%lld per rank) | %s | "
                   "lr %g%s, warm-up %lld, batch %lld, %lld steps | data %s | %s\n",
                   o.hf_model.empty() ? o.model.name.c_str() : o.hf_model.c_str(), (long long)parameter_count(o.model),
                   std::string(strategy_name(o.decoder.strategy)).c_str(),
                   g.selective   ? " (selective recompute: attention output kept)"
                   : g.keep_last ? " (last stage kept for the backward)"
                                 : "",
                   ring_note(g.attention, comm.size()).c_str(), comm.size(), (long long)g.S, pad_note(o, g).c_str(),
                   (long long)g.L, std::string(dtype_name(g.dtype)).c_str(), o.lr,
                   !o.hf_model.empty() && !flags.was_set("lr") ? " (fine-tuning default)" : "", (long long)o.warmup,
                   (long long)o.batch, (long long)o.steps, data_note(flags).c_str(), rd.dev().name().c_str());
    if (comm.rank() == 0 && o.model.experts > 0)  // a mixture of experts: how its experts are spread
      std::fprintf(stderr, "mixture of experts | %lld experts, %lld a token, %lld MoE layers of %lld | %s\n",
                   (long long)o.model.experts, (long long)o.model.experts_per_token,
                   (long long)[&] {
                     int64_t n = 0;
                     for (int64_t l = 0; l < o.model.layers; ++l) n += moe_layer(o.model, l);
                     return n;
                   }(),
                   (long long)o.model.layers,
                   g.experts_parallel
                       ? str_cat(o.model.experts / comm.size(), " experts per rank (expert parallelism, all-to-alls of "
                                 "the tokens' rows)").c_str()
                       : str_cat("every expert on every rank",
                                 o.decoder.expert_parallel && comm.size() > 1
                                     ? " (the experts are not a multiple of the ranks)"
                                     : "").c_str());
    if (comm.rank() == 0 && o.progress) std::fputs(cpu_kernels_lines(device).c_str(), stderr);
    const std::string& why = resolved.value().recompute_why;
    if (comm.rank() == 0 && o.progress && !why.empty()) std::fprintf(stderr, "recompute: %s\n", why.c_str());
    auto r = train(rd.dev(), rd.comm(), comm, *data.value(), o);
    check_all_ranks(comm, r.ok() ? Status::ok_status() : r.status());
    const TrainSummary& s = r.value();
    if (s.stopped_by != 0) stopped_exit = s.saved_at_stop ? kExitPreempted : 128 + s.stopped_by;
    if (comm.rank() != 0) return;
    if (s.stopped_by != 0) {
      std::fprintf(stderr, "untied train: stopped by %s after step %lld of %lld: %s\n", stop_signal_name(s.stopped_by),
                   (long long)s.last_step, (long long)o.steps,
                   s.saved_at_stop ? ("checkpoint saved in " + o.checkpoint_dir + "; the same command with --resume "
                                      "continues it (exit status 75: preempted, resumable)").c_str()
                                   : "no --checkpoint-dir was given, so nothing was saved");
    }
    if (o.rehearsal) {
      print_peaks(o, comm.size(), s.peak, s.host_peak, s.live_at_peak);
      if (!why.empty()) std::printf("recompute: %s\n", why.c_str());
      return;
    }
    if (s.losses.empty()) {  // (a resumed run that was already at its end)
      std::printf("nothing to train: the checkpoint is at step %lld of --steps %lld (raise --steps to go on)\n",
                  (long long)s.first_step, (long long)o.steps);
      return;
    }
    std::printf("trained steps %lld..%lld: loss %.4f -> %.4f", (long long)s.first_step + 1, (long long)s.last_step,
                s.first_loss, s.last_loss);
    if (s.last_accuracy >= 0)
      std::printf(", %s accuracy %.1f%%", flags.get_string("data") == "kv" ? "answer" : "next-token", 100.0 * s.last_accuracy);
    std::printf("\n");
  });
  return rc != 0 ? rc : stopped_exit;
}

}  // namespace untied::cli
