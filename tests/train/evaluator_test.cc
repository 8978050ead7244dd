// Against transformers itself (reference/make_hf_fixtures.py): a tiny Llama 3 (GQA, untied
// embeddings, llama3 rope scaling, sharded float32 safetensors), a tiny Qwen3 (QK-norm, tied
// embeddings, bfloat16 safetensors, the rope_parameters config), a Mistral (a sliding window
// shorter than S) and a Qwen2 (q/k/v biases). untied's evaluation gives
// transformers' loss and logits in every strategy at 1, 2 and 4 ranks, and the Qwen3 model's
// training step gives transformers' gradient of every parameter, the tied embedding's (the sum
// of its two uses) included. Then the evaluator's own contract: checkpoints read at any rank
// count, the loss by position, export.
#include "untied/train/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/decoder_step.h"
#include "untied/comm/inproc.h"
#include "untied/core/json.h"
#include "untied/core/npy.h"
#include "untied/device/device.h"
#include "untied/model/hf_config.h"
#include "untied/train/checkpoint.h"
#include "untied/train/data.h"
#include "untied/train/hf_weights.h"
#include "untied/train/trainer.h"

#ifndef UNTIED_FIXTURES
#error "UNTIED_FIXTURES must name the fixture directory"
#endif

namespace untied {
namespace {

const std::string kFixtures = UNTIED_FIXTURES;

Json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + name + "_" + std::to_string(::getpid());
}

// max |a - b| / max |b|: the error relative to the tensor's scale.
double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

struct StrategyRun {
  Strategy strategy;
  int ranks, ring;
};
const StrategyRun kRuns[] = {{Strategy::kLocal, 1, 1}, {Strategy::kUPipe, 1, 1},   {Strategy::kUlysses, 2, 1},
                     {Strategy::kUPipe, 2, 1}, {Strategy::kUlysses, 4, 1}, {Strategy::kUPipe, 4, 1},
                     {Strategy::kRing, 4, 1},  {Strategy::kUPipe, 4, 2}};

std::string name_of(const StrategyRun& r) {
  return std::string(strategy_name(r.strategy)) + " on " + std::to_string(r.ranks) + " ranks" +
         (r.ring > 1 ? " x ring " + std::to_string(r.ring) : "");
}

// evaluate() on in-process ranks; rank 0's result.
EvalResult run_eval(const DataSource& data, const EvalOptions& o, int ranks) {
  EvalResult out;
  Status failed = Status::ok_status();
  std::mutex mu;
  run_in_process(ranks, [&](Communicator& comm) {
    auto dev = make_cpu_device({.threads = 1});
    auto r = evaluate(*dev, comm, comm, data, o);
    std::lock_guard<std::mutex> lock(mu);
    if (!r.ok()) failed = r.status();
    else if (comm.rank() == 0) out = r.value();
  });
  EXPECT_TRUE(failed.ok()) << failed.message();
  return out;
}

class AgainstTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(AgainstTransformers, LossAndLogitsInEveryStrategy) {
  const std::string dir = kFixtures + "/" + GetParam();
  auto cfg = read_hf_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  const Json expected = read_json(dir + "/expected.json");
  const std::vector<int32_t> tokens = expected["tokens"].get<std::vector<int32_t>>();
  // A MoE model's evaluation is its cross-entropy (transformers' loss without the router's).
  const double want = expected.contains("ce_loss") ? expected["ce_loss"].get<double>() : expected["loss"].get<double>();
  std::vector<int64_t> shape;
  std::vector<float> want_logits;
  ASSERT_TRUE(read_npy(dir + "/logits.npy", &shape, &want_logits).ok());
  const int64_t S = static_cast<int64_t>(tokens.size());
  ASSERT_EQ(shape, (std::vector<int64_t>{S, cfg.value().model.vocab}));

  const std::string tok = temp_path("eval_tokens") + ".tok";
  ASSERT_TRUE(write_token_file(tok, tokens, cfg.value().model.vocab, 2).ok());
  auto data = make_data_source("tokens", tok, {});
  ASSERT_TRUE(data.ok()) << data.status().message();
  double worst_loss = 0, worst_logits = 0;
  for (const StrategyRun& r : kRuns) {
    SCOPED_TRACE(name_of(r));
    EvalOptions o{.model = cfg.value().model,
                  .decoder = {.seq = S, .strategy = r.strategy, .ring = r.ring},
                  .buckets = 4,
                  .window = cfg.value().sliding_window,  // Mistral's, shorter than S: 0 for the others
                  .hf_model = dir,
                  .logits_path = temp_path("eval_logits") + ".npy"};
    const EvalResult e = run_eval(*data.value(), o, r.ranks);
    EXPECT_EQ(e.samples, 1);
    EXPECT_EQ(e.tokens, S - 1);
    const double rel = std::fabs(e.loss - want) / want;
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, 1e-5) << "untied " << e.loss << ", transformers " << want;  // fp32 both: ~1e-7
    std::vector<int64_t> got_shape;
    std::vector<float> logits;
    ASSERT_TRUE(read_npy(o.logits_path, &got_shape, &logits).ok());
    ASSERT_EQ(got_shape, shape);
    const double lerr = scaled_error(logits, want_logits);
    worst_logits = std::max(worst_logits, lerr);
    EXPECT_LE(lerr, 1e-5);
    std::filesystem::remove(o.logits_path);
  }
  std::filesystem::remove(tok);
  std::printf("  %s: worst relative error against transformers: loss %.3e, logits %.3e (max |diff| / max |logit|)\n",
              GetParam().c_str(), worst_loss, worst_logits);
}

INSTANTIATE_TEST_SUITE_P(Models, AgainstTransformers,
                         ::testing::Values("hf_llama_tiny", "hf_qwen3_tiny", "hf_mistral_tiny", "hf_qwen2_tiny",
                                           "hf_qwen3moe_tiny", "hf_qwen3moe_untied_tiny", "hf_mixtral_tiny"));

// Every strategy's gradient of the fixture's loss (window keys per query, 0: all) against
// transformers' (dir/grads/NAME.npy), each within 1e-4 of the largest; returns the worst.
// loss_out (nullable): each strategy's step (its loss and router statistics).
double worst_gradient_error(const std::string& dir, const ModelConfig& m, int64_t window,
                            std::vector<test::DecoderStep>* loss_out = nullptr) {
  auto w = HfWeights::open(dir);
  EXPECT_TRUE(w.ok()) << w.status().message();
  if (!w.ok() || !w.value().check(m).ok()) {
    ADD_FAILURE() << "the fixture's weights do not open or match its config: " << dir;
    return 1.0;
  }
  const std::vector<int32_t> tokens = read_json(dir + "/expected.json")["tokens"].get<std::vector<int32_t>>();
  std::vector<int32_t> labels(tokens.size(), -100);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) labels[i] = tokens[i + 1];
  const std::vector<ParamDesc> descs = parameter_descriptors(m);
  double worst = 0;
  for (const StrategyRun& r : kRuns) {
    SCOPED_TRACE(name_of(r));
    const test::DecoderStep step = test::run_decoder_step(
        m, DecoderOptions{.seq = static_cast<int64_t>(tokens.size()), .strategy = r.strategy, .ring = r.ring}, r.ranks,
        tokens, labels, [&](ShardedParams& params, int) { ASSERT_TRUE(load_hf_weights(w.value(), params).ok()); }, {},
        window);
    if (loss_out != nullptr) loss_out->push_back(step);
    for (size_t i = 0; i < descs.size(); ++i)
      for (const HfTensor& piece : hf_tensors(descs[i], w.value().mixtral_names())) {  // each expert its own
        std::vector<int64_t> shape;
        std::vector<float> want;
        if (!read_npy(dir + "/grads/" + piece.name + ".npy", &shape, &want).ok()) {
          ADD_FAILURE() << "no transformers gradient of " << piece.name;
          continue;
        }
        const std::vector<float> got(step.grads[i].begin() + piece.offset,
                                     step.grads[i].begin() + piece.offset + piece.numel);
        const double e = scaled_error(got, want);
        worst = std::max(worst, e);
        EXPECT_LE(e, 1e-4) << piece.name;
      }
  }
  return worst;
}

// Mistral: its sliding_window (shorter than the sequence) read from config.json, and every
// gradient as transformers computes it with that window, in every strategy.
TEST(Mistral, SlidingWindowGradientsEqualTransformers) {
  const std::string dir = kFixtures + "/hf_mistral_tiny";
  auto cfg = read_hf_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  const Json expected = read_json(dir + "/expected.json");
  const size_t seq = expected["tokens"].size();
  ASSERT_EQ(cfg.value().sliding_window, expected["sliding_window"].get<int64_t>());
  ASSERT_LT(cfg.value().sliding_window, static_cast<int64_t>(seq)) << "the window must bind";
  const double worst = worst_gradient_error(dir, cfg.value().model, cfg.value().sliding_window);
  std::printf("  worst gradient error against transformers (max |diff| / max |grad|, Mistral, window %lld of %zu): %.3e\n",
              (long long)cfg.value().sliding_window, seq, worst);
}

// Qwen2: the q, k and v biases (normal(0, 0.5), large enough that the loss without them differs
// by 0.26) read from the model, and their gradients, like every other, as transformers computes
// them, in every strategy: a head's bias goes with its head through UPipe's stages.
TEST(Qwen2, BiasGradientsEqualTransformers) {
  const std::string dir = kFixtures + "/hf_qwen2_tiny";
  auto cfg = read_hf_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  const ModelConfig& m = cfg.value().model;
  ASSERT_TRUE(m.qkv_bias);
  int biases = 0;
  for (const ParamDesc& d : parameter_descriptors(m)) biases += d.kind == ParamKind::kBias;
  EXPECT_EQ(biases, 3 * m.layers);
  const double worst = worst_gradient_error(dir, m, 0);
  std::printf("  worst gradient error against transformers (max |diff| / max |grad|, Qwen2 with q/k/v biases): %.3e\n",
              worst);
}

// Mixture of experts against transformers (reference/make_moe_fixtures.py): Qwen3-MoE with
// norm_topk_prob, tied embeddings and a dense layer among the MoE ones (mlp_only_layers); Qwen3-MoE
// without norm_topk_prob, untied, decoder_sparse_step 2; Mixtral. In every strategy on 1, 2 and 4
// ranks: the loss with the load-balancing term (transformers' output_router_logits loss: its
// router logits of every MoE layer pooled), the tokens per expert of each layer, and the gradient
// of every parameter (the router's and each expert's included) within 1e-4 of the largest.
class MoeAgainstTransformers : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeAgainstTransformers, LossLoadAndEveryGradient) {
  const std::string dir = kFixtures + "/" + GetParam();
  auto cfg = read_hf_config(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  const ModelConfig& m = cfg.value().model;
  const Json expected = read_json(dir + "/expected.json");
  ASSERT_EQ(m.experts, expected["num_experts"].get<int64_t>());
  ASSERT_EQ(m.experts_per_token, expected["top_k"].get<int64_t>());
  ASSERT_EQ(m.norm_topk_prob, expected["norm_topk_prob"].get<bool>());
  std::vector<int64_t> moe_layers;
  for (int64_t l = 0; l < m.layers; ++l)
    if (moe_layer(m, l)) moe_layers.push_back(l);
  ASSERT_EQ(moe_layers, expected["moe_layers"].get<std::vector<int64_t>>());
  std::vector<double> load;
  for (const auto& layer : expected["expert_load"]) for (const auto& x : layer) load.push_back(x.get<double>());
  std::vector<test::DecoderStep> steps;
  const double worst = worst_gradient_error(dir, m, cfg.value().sliding_window, &steps);
  const double want = expected["loss"].get<double>(), want_aux = expected["aux_loss"].get<double>();
  double worst_loss = 0, worst_aux = 0;
  for (const test::DecoderStep& s : steps) {
    EXPECT_EQ(s.expert_load, load);
    worst_loss = std::max(worst_loss, std::fabs(s.loss - want) / want);
    worst_aux = std::max(worst_aux, std::fabs(s.router_aux / m.router_aux_coef - want_aux) / want_aux);
  }
  EXPECT_LE(worst_loss, 1e-5);
  EXPECT_LE(worst_aux, 1e-5);
  std::printf("  %s: worst relative error against transformers: loss %.3e, load-balancing loss %.3e, gradients %.3e "
              "(max |diff| / max |grad|)\n", GetParam().c_str(), worst_loss, worst_aux, worst);
}

INSTANTIATE_TEST_SUITE_P(Models, MoeAgainstTransformers,
                         ::testing::Values("hf_qwen3moe_tiny", "hf_qwen3moe_untied_tiny", "hf_mixtral_tiny"));

// The tied embedding's gradient is the sum of the embedding's and the LM head's; every other
// parameter's as transformers computes it, in every strategy.
TEST(TiedEmbeddings, GradientsEqualTransformers) {
  const std::string dir = kFixtures + "/hf_qwen3_tiny";
  auto cfg = read_hf_config(dir);
  ASSERT_TRUE(cfg.ok());
  const ModelConfig& m = cfg.value().model;
  ASSERT_TRUE(m.tied_embeddings);
  ASSERT_TRUE(m.qk_norm);
  for (const ParamDesc& d : parameter_descriptors(m)) EXPECT_NE(d.name, "lm_head");
  const double worst = worst_gradient_error(dir, m, 0);
  std::printf("  worst gradient error against transformers (max |diff| / max |grad|, tied Qwen3): %.3e\n", worst);
}

// A run's checkpoint, written on 3 ranks, evaluates on 1, 2 and 4 to the same loss; export
// writes it as a Hugging Face directory that loads back (into the same evaluation) in bf16 and f32.
TEST(Evaluator, CheckpointAtAnyRankCountAndExport) {
  const std::string ck = temp_path("eval_ck"), text = temp_path("eval_text") + ".txt";
  std::filesystem::remove_all(ck);
  {
    std::ofstream f(text);
    for (int i = 0; i < 60; ++i) f << "document " << i << ": the quick brown fox jumps over the lazy dog.\n\n";
  }
  auto data = make_data_source("text", text, {});
  ASSERT_TRUE(data.ok());
  auto preset = model_preset("tiny");
  ASSERT_TRUE(preset.ok());
  TrainOptions t{.model = preset.value(), .decoder = {.seq = 96, .strategy = Strategy::kRing}, .steps = 4, .batch = 1,
                 .warmup = 0, .checkpoint_dir = ck, .progress = false};
  t.model.vocab = data.value()->vocab_size();
  t.model.layers = 2;
  Status trained = Status::ok_status();
  run_in_process(3, [&](Communicator& comm) {
    auto r = train(comm, *data.value(), t);
    if (!r.ok() && comm.rank() == 0) trained = r.status();
  });
  ASSERT_TRUE(trained.ok()) << trained.message();
  auto cfg = read_hf_config(ck);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();

  // 7 buckets of S = 96: ranges of 13 and 14 positions.
  EvalOptions o{.model = cfg.value().model, .decoder = {.seq = 96, .strategy = Strategy::kUPipe}, .samples = 5,
                .buckets = 7, .checkpoint_dir = ck};
  std::vector<int64_t> want_bucket(7, 0);  // the labelled positions of each range, from the data itself
  for (int64_t smp = 0; smp < 5; ++smp) {
    std::vector<int32_t> tk(96), lb(96);
    ASSERT_TRUE(data.value()->fill(smp, 96, 0, 96, tk.data(), lb.data(), nullptr).ok());
    for (int64_t p = 0; p < 96; ++p)
      if (lb[p] != kIgnoreIndex)
        for (int64_t b = 0; b < 7; ++b)
          if (p >= b * 96 / 7 && p < (b + 1) * 96 / 7) ++want_bucket[b];
  }
  double first = -1;
  for (int ranks : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const EvalResult e = run_eval(*data.value(), o, ranks);
    EXPECT_EQ(e.checkpoint_step, 4);
    EXPECT_EQ(e.tokens, 5 * 95 - 0 - [&] {  // 95 labels per sample, less those before a document start
      int64_t cut = 0;
      for (int64_t s = 0; s < 5; ++s) cut += static_cast<int64_t>(data.value()->document_starts(s, 96).value().size()) - 1;
      return cut;
    }());
    if (first < 0) first = e.loss;
    EXPECT_NEAR(e.loss, first, 1e-5 * first);
    // The buckets partition the labelled positions, each range its own, and their mean is the loss.
    EXPECT_EQ(e.bucket_begin, (std::vector<int64_t>{0, 13, 27, 41, 54, 68, 82, 96}));
    EXPECT_EQ(e.bucket_tokens, want_bucket);
    int64_t n = 0;
    double sum = 0;
    for (size_t b = 0; b < e.bucket_loss.size(); ++b) n += e.bucket_tokens[b], sum += e.bucket_loss[b] * e.bucket_tokens[b];
    EXPECT_EQ(n, e.tokens);
    EXPECT_NEAR(sum / n, e.loss, 1e-9 * e.loss);
    EXPECT_NEAR(e.perplexity, std::exp(e.loss), 1e-9 * e.perplexity);
  }
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    const std::string hf = temp_path("eval_export");
    std::filesystem::remove_all(hf);
    ASSERT_TRUE(export_checkpoint(ck, hf, dtype).ok());
    EvalOptions h = o;
    h.checkpoint_dir.clear();
    h.hf_model = hf;
    const EvalResult e = run_eval(*data.value(), h, 2);
    // f32: the same weights, the same loss; bf16: rounded weights (8 bits of mantissa), close.
    EXPECT_NEAR(e.loss, first, std::string(dtype) == "F32" ? 1e-5 * first : 2e-2 * first);
    std::filesystem::remove_all(hf);
  }
  // A config.json that does not describe the checkpoint's model is refused, naming both.
  {
    auto w = CheckpointWeights::open(ck, false);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ModelConfig other = cfg.value().model;
    other.rope_theta *= 2;
    const Status s = w.value().check(other);
    EXPECT_NE(s.message().find("another model than its config.json says"), std::string::npos) << s.message();
  }
  // Export refuses a directory that already holds a model (its old shards would be read), one
  // that is not a checkpoint, and damage in a rank file.
  {
    const std::string hf = temp_path("eval_export_twice");
    std::filesystem::remove_all(hf);
    ASSERT_TRUE(export_checkpoint(ck, hf, "F32").ok());
    const Status again = export_checkpoint(ck, hf, "F32");
    EXPECT_NE(again.message().find("already holds a model"), std::string::npos) << again.message();
    std::filesystem::remove_all(hf);
  }
  EXPECT_EQ(export_checkpoint(text, temp_path("x"), "F32").code(), Status::Code::kNotFound);
  const std::string rank1 = ck + "/step_00000004/rank_00001.bin";
  std::filesystem::resize_file(rank1, std::filesystem::file_size(rank1) - 4);
  const Status damaged = export_checkpoint(ck, temp_path("eval_export_bad"), "F32");
  EXPECT_EQ(damaged.code(), Status::Code::kCorrupt) << damaged.message();
  EXPECT_NE(damaged.message().find("rank_00001.bin"), std::string::npos) << damaged.message();
  std::filesystem::remove_all(ck);
  std::filesystem::remove(text);
}

TEST(Evaluator, RefusesWhatCannotWork) {
  auto preset = model_preset("tiny");
  ASSERT_TRUE(preset.ok());
  EvalOptions o{.model = preset.value(), .decoder = {.seq = 64}};
  o.model.vocab = 300;
  EXPECT_FALSE(validate(EvalOptions{o.model, {.seq = 64}, -1}, 1).ok());
  o.buckets = 65;
  EXPECT_NE(validate(o, 1).message().find("--buckets"), std::string::npos);
  o.buckets = 4;
  o.hf_model = "a", o.checkpoint_dir = "b";
  EXPECT_NE(validate(o, 1).message().find("not both"), std::string::npos);
}

// Loss by position in the document: documents of known lengths give known bucket counts. Token
// file: documents of 24 tokens (a period of 24), read at S = 32 in 4 buckets of 8. Each labelled
// token counts at its position in its document (a document running over from the sample before
// counts on from where it began), so every bucket [0, 8), [8, 16), [16, 24) holds the same share
// and [24, 32) none; by window position all four fill. 1 rank and 4 ranks agree.
TEST(Evaluator, LossByDocumentPosition) {
  const std::string path = ::testing::TempDir() + "docpos_" + std::to_string(::getpid()) + ".tok";
  std::vector<int32_t> tokens(24 * 8);
  std::vector<int64_t> starts;
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1 + i % 50);
  for (int64_t d = 0; d < 8; ++d) starts.push_back(24 * d);
  ASSERT_TRUE(write_token_file(path, tokens, 64, 2, starts).ok());
  auto data = make_data_source("tokens", path, DataOptions{});
  ASSERT_TRUE(data.ok());
  auto preset = model_preset("tiny");
  ASSERT_TRUE(preset.ok());
  EvalOptions o{.model = preset.value(), .decoder = {.seq = 32}, .samples = 6, .buckets = 4};
  o.model.vocab = 64;
  o.by_doc_position = true;
  for (int ranks : {1, 4}) {
    const EvalResult r = run_eval(*data.value(), o, ranks);
    ASSERT_EQ(r.bucket_tokens.size(), 4u) << "no document reaches S: no overflow bucket";
    // 6 samples x 32 positions = 192 tokens = 8 documents; labelled: all but each document's last
    // token (its next starts another) and each sample's last position.
    int64_t total = 0;
    for (int64_t t : r.bucket_tokens) total += t;
    EXPECT_EQ(total, r.tokens);
    // Document positions 0..23, each document once: position q is labelled unless q = 23 or it
    // is a sample's last position (sample ends at stream 32k - 1: document position (32k - 1) % 24).
    std::vector<int64_t> want(4, 0);
    for (int64_t t = 0; t < 192; ++t) {
      const int64_t q = t % 24;
      if (q == 23 || t % 32 == 31) continue;
      ++want[static_cast<size_t>(q / 8)];
    }
    EXPECT_EQ(r.bucket_tokens, want) << ranks << " ranks";
    EXPECT_EQ(r.bucket_tokens[3], 0);
  }
  o.by_doc_position = false;
  const EvalResult w = run_eval(*data.value(), o, 1);
  for (int64_t t : w.bucket_tokens) EXPECT_GT(t, 0) << "by window position every bucket fills";
  // A document longer than S counts on past S, in one more bucket.
  std::vector<int64_t> one = {0};
  ASSERT_TRUE(write_token_file(path, tokens, 64, 2, one).ok());
  auto long_doc = make_data_source("tokens", path, DataOptions{});
  ASSERT_TRUE(long_doc.ok());
  o.by_doc_position = true;
  const EvalResult l = run_eval(*long_doc.value(), o, 2);
  ASSERT_EQ(l.bucket_tokens.size(), 5u);
  EXPECT_EQ(l.bucket_tokens[4], 5 * 31) << "samples 1..5 lie past position 32 of the one document";
  std::filesystem::remove(path);
}

TEST(Evaluator, SvgHasEveryCurve) {
  const std::string svg = position_loss_svg(
      {LossCurve{"before", {8, 24, 40}, {3.0, 2.5, 2.4}}, LossCurve{"after <ft>", {8, 24, 40}, {2.0, 1.5, 1.2}}}, "t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("after &lt;ft&gt;"), std::string::npos);
  size_t lines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++lines;
  EXPECT_EQ(lines, 2u);
}

}  // namespace
}  // namespace untied
