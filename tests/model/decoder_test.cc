// The decoder's forward_backward on in-process ranks: local (1 rank) against ulysses and upipe
// on 2 and 4 ranks, loss and every parameter gradient; and the gradient of the local model
// against central finite differences of its loss.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <mutex>

#include "common/compare.h"
#include "common/decoder_step.h"
#include "untied/comm/inproc.h"
#include "untied/core/random.h"
#include "untied/dist/sharded_params.h"
#include "untied/model/decoder.h"

namespace untied {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.name = "test";
  m.vocab = 37, m.hidden = 32, m.layers = 2, m.heads = 4, m.kv_heads = 2, m.head_dim = 8, m.ffn = 48;
  m.rope_theta = 10000.0;
  return m;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter, full
};

// Tokens and labels of the whole sequence (labels: next token, the last ignored, one more ignored).
void make_data(int64_t S, int64_t V, std::vector<int32_t>* tokens, std::vector<int32_t>* labels) {
  tokens->resize(S);
  labels->resize(S);
  for (int64_t i = 0; i < S; ++i) (*tokens)[i] = static_cast<int32_t>((hash_uniform(7, 1, i) + 1.0f) * 0.5f * V) % V;
  for (int64_t i = 0; i < S; ++i) (*labels)[i] = i + 1 < S ? (*tokens)[i + 1] : -100;
  (*labels)[S / 3] = -100;
}

// Direction t_k = hash_uniform(99, i, k) of parameter i's element k (global index).
float direction(int i, int64_t k) { return hash_uniform(99, static_cast<uint64_t>(i), static_cast<uint64_t>(k)); }

// perturb = (parameter i, eps): every element k of parameter i moves by eps * direction(i, k).
// doc_lens, window: the sequence mask (packed documents: no label crosses a document).
Result run(const ModelConfig& m, DecoderOptions o, int ranks, uint64_t seed = 3,
           const std::pair<int, float>* perturb = nullptr, const std::vector<int64_t>& doc_lens = {},
           int64_t window = 0) {
  std::vector<int32_t> tokens, labels;
  make_data(o.seq, m.vocab, &tokens, &labels);
  for (int64_t at = 0, d = 0; d + 1 < static_cast<int64_t>(doc_lens.size()); ++d) {
    at += doc_lens[d];
    labels[at - 1] = -100;
  }
  const test::DecoderStep step = test::run_decoder_step(m, o, ranks, tokens, labels, [&](ShardedParams& params, int rank) {
    params.init(parameter_init(m, seed));
    if (perturb) {
      const int i = perturb->first;
      const int64_t start = params.shard_elems(i) * rank;
      for (int64_t k = 0; k < params.owned_elems(i); ++k) params.master(i)[k] += perturb->second * direction(i, start + k);
    }
  }, doc_lens, window);
  return Result{step.loss, step.grads};
}

// Tolerance: the fp32 rounding of a sum of ~S*E terms of gradient size; local vs distributed
// differ only in summation order (GEMM shapes, reduction order), observed ~1e-7 relative.
void expect_close(const Result& a, const Result& b, const ModelConfig& m, double rtol) {
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::fabs(a.loss));
  auto descs = parameter_descriptors(m);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const std::vector<double> ga = test::to_double(a.grads[i]), gb = test::to_double(b.grads[i]);
    const double mx = test::max_abs(ga), err = test::max_abs_error(ga, gb);  // a NaN gives err = inf
    EXPECT_LE(err, rtol * mx + 1e-9) << descs[i].name << ": max |diff| " << err << ", max |grad| " << mx;
  }
}

TEST(Decoder, StrategiesAgreeWithLocal) {
  const ModelConfig m = tiny_model();
  DecoderOptions o{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
  const Result ref = run(m, o, 1);
  EXPECT_GT(ref.loss, 0.0);
  for (int ranks : {2, 4}) {
    for (Strategy st : {Strategy::kUlysses, Strategy::kUPipe}) {
      SCOPED_TRACE(std::string(strategy_name(st)) + " on " + std::to_string(ranks) + " ranks");
      o.strategy = st;
      expect_close(ref, run(m, o, ranks), m, 2e-5);
    }
  }
}

// Ring and the Ulysses x ring hybrid through the whole decoder: the data layer's two segments per
// rank, RoPE at global positions, the ring's merge and its dK/dV travelling back, ZeRO-3 over all
// ranks. The loss and every gradient as local's, at the tolerance of the other strategies.
TEST(Decoder, RingAndHybridAgreeWithLocal) {
  for (bool qk_norm : {false, true}) {
    ModelConfig m = tiny_model();
    m.qk_norm = qk_norm;
    DecoderOptions o{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
    const Result ref = run(m, o, 1);
    struct Layout {
      Strategy strategy;
      int ranks, ring;
    };
    for (Layout l : {Layout{Strategy::kRing, 2, 1}, Layout{Strategy::kRing, 3, 1}, Layout{Strategy::kUlysses, 4, 2},
                     Layout{Strategy::kUPipe, 4, 2}, Layout{Strategy::kUPipe, 6, 3}}) {
      SCOPED_TRACE(std::string(strategy_name(l.strategy)) + " ring " + std::to_string(l.ring) + " on " +
                   std::to_string(l.ranks) + " ranks" + (qk_norm ? ", qk_norm" : ""));
      o.strategy = l.strategy;
      o.ring = l.ring;
      expect_close(ref, run(m, o, l.ranks), m, 2e-5);
    }
  }
}

// Packed documents (a one-token one, boundaries inside and at rank boundaries, one longer than a
// rank's share) and a window, through every strategy: the loss and every gradient as local's with
// the same mask. And the mask matters: local with documents differs from local without.
TEST(Decoder, PackedDocumentsAgreeWithLocal) {
  const std::vector<int64_t> docs = {5, 7, 12, 1, 23};
  for (int64_t window : {int64_t{0}, int64_t{6}}) {
    const ModelConfig m = tiny_model();
    DecoderOptions o{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
    const Result ref = run(m, o, 1, 3, nullptr, docs, window);
    const Result unmasked = run(m, o, 1, 3, nullptr, {}, window);
    EXPECT_GT(std::fabs(ref.loss - unmasked.loss), 1e-4 * std::fabs(ref.loss)) << "documents changed nothing";
    struct Layout {
      Strategy strategy;
      int ranks, ring;
    };
    for (Layout l : {Layout{Strategy::kUlysses, 2, 1}, Layout{Strategy::kUPipe, 4, 1}, Layout{Strategy::kRing, 3, 1},
                     Layout{Strategy::kUPipe, 4, 2}}) {
      SCOPED_TRACE(std::string(strategy_name(l.strategy)) + " ring " + std::to_string(l.ring) + " on " +
                   std::to_string(l.ranks) + " ranks, window " + std::to_string(window));
      o.strategy = l.strategy;
      o.ring = l.ring;
      expect_close(ref, run(m, o, l.ranks, 3, nullptr, docs, window), m, 2e-5);
    }
  }
}

// Any S: a sequence the ranks do not divide runs padded (tokens nothing attends to, no loss),
// and gives the single-rank result on the unpadded sequence: S = 50 on 4 ranks (padded to 52),
// on a ring of 3 (to 54) and on 2 x 2 hybrid (to 56); S = 1000 on 3 ranks (to 1002).
TEST(Decoder, AnySequenceLengthEqualsOneRank) {
  const ModelConfig m = tiny_model();
  for (int64_t S : {int64_t{50}, int64_t{1000}}) {
    DecoderOptions o{.seq = S, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
    const Result ref = run(m, o, 1);
    struct Layout {
      Strategy strategy;
      int ranks, ring;
    };
    const std::vector<Layout> layouts =
        S == 50 ? std::vector<Layout>{{Strategy::kUlysses, 4, 1}, {Strategy::kRing, 3, 1}, {Strategy::kUPipe, 4, 2}}
                : std::vector<Layout>{{Strategy::kRing, 3, 1}};
    for (Layout l : layouts) {
      SCOPED_TRACE("S " + std::to_string(S) + " " + std::string(strategy_name(l.strategy)) + " ring " +
                   std::to_string(l.ring) + " on " + std::to_string(l.ranks) + " ranks");
      o.strategy = l.strategy;
      o.ring = l.ring;
      expect_close(ref, run(m, o, l.ranks), m, 2e-5);
    }
  }
}

// Qwen3 style: RMSNorm on each q and k head, through every strategy.
TEST(Decoder, QkNormStrategiesAgreeWithLocal) {
  ModelConfig m = tiny_model();
  m.qk_norm = true;
  DecoderOptions o{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16};
  const Result ref = run(m, o, 1);
  for (int ranks : {2, 4})
    for (Strategy st : {Strategy::kUlysses, Strategy::kUPipe}) {
      SCOPED_TRACE(std::string(strategy_name(st)) + " on " + std::to_string(ranks) + " ranks");
      o.strategy = st;
      expect_close(ref, run(m, o, ranks), m, 2e-5);
    }
  o.dtype = DType::kBF16;  // the bf16 path of the k-norm backward
  EXPECT_NEAR(run(m, o, 2).loss, ref.loss, 2e-2 * ref.loss);
}

// Qwen2 style: biases on q, k and v (drawn non-zero here), through every path of the strategies:
// ulysses with KV heads replicated over ranks (a replicated head's bias gradient adds up), upipe
// in two rounds of stages with overlap, its kept last stage and the selective recompute, the
// attention's input made whole, ring, and the hybrid; loss and every gradient as local's.
TEST(Decoder, QkvBiasStrategiesAgreeWithLocal) {
  ModelConfig m = tiny_model();
  m.qkv_bias = true;
  std::vector<int32_t> tokens, labels;
  make_data(48, m.vocab, &tokens, &labels);
  const std::vector<ParamDesc> descs = parameter_descriptors(m);
  auto step = [&](const DecoderOptions& o, int ranks) {
    return test::run_decoder_step(m, o, ranks, tokens, labels, [&](ShardedParams& params, int rank) {
      params.init(parameter_init(m, 3));
      for (int i = 0; i < static_cast<int>(descs.size()); ++i) {
        if (descs[i].kind != ParamKind::kBias) continue;
        const int64_t start = params.shard_elems(i) * rank;
        for (int64_t k = 0; k < params.owned_elems(i); ++k) params.master(i)[k] = 0.5f * direction(i, start + k);
      }
    });
  };
  const DecoderOptions base{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
  const test::DecoderStep ref = step(base, 1);
  ModelConfig no_bias = m;  // the biases matter: the same weights without them give another loss
  no_bias.qkv_bias = false;
  EXPECT_GT(std::fabs(ref.loss - run(no_bias, base, 1).loss), 1e-3 * ref.loss);
  struct Case {
    const char* what;
    Strategy strategy;
    int ranks, ring = 1;
    int64_t upipe_heads = 0;
    bool overlap = false, whole_input = false;
    Recompute recompute = Recompute::kFull;
  };
  const Case cases[] = {
      {"ulysses, 4 ranks (replicated KV)", Strategy::kUlysses, 4},
      {"upipe, 2 ranks, 2 stages, overlap", Strategy::kUPipe, 2, 1, 2, true},
      {"upipe, 4 ranks, selective", Strategy::kUPipe, 4, 1, 0, false, false, Recompute::kSelective},
      {"upipe, 2 ranks, whole input", Strategy::kUPipe, 2, 1, 2, false, true},
      {"ring, 3 ranks", Strategy::kRing, 3},
      {"upipe, 4 ranks as 2 x 2", Strategy::kUPipe, 4, 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    DecoderOptions o = base;
    o.strategy = c.strategy;
    o.ring = c.ring, o.upipe_heads = c.upipe_heads, o.overlap = c.overlap, o.recompute = c.recompute;
    if (c.whole_input) o.attn_tile = -1;
    const test::DecoderStep got = step(o, c.ranks);
    expect_close(Result{ref.loss, ref.grads}, Result{got.loss, got.grads}, m, 2e-5);
  }
}

// A mixture of experts (8 experts, 2 a token, a dense layer between two MoE ones) through every
// strategy, with its experts spread over the ranks (expert parallelism: 2 and 4 ranks own 4 and 2
// experts each, the rows crossing in all-to-alls) and with every expert on every rank (no
// dispatch; 3 ranks, which 8 experts do not divide, run that way too): the loss with the
// load-balancing term, the tokens per expert and every gradient as one rank's. Then bf16 and the
// selective recompute with expert parallelism.
TEST(Decoder, MixtureOfExpertsAgreesWithLocalWithAndWithoutExpertParallelism) {
  ModelConfig m = tiny_model();
  m.layers = 3, m.experts = 8, m.experts_per_token = 2, m.expert_ffn = 24, m.norm_topk_prob = true;
  m.router_aux_coef = 0.05, m.dense_layers = {1};
  DecoderOptions o{.seq = 48, .strategy = Strategy::kLocal, .mlp_tile = 16, .loss_chunk = 7};
  std::vector<int32_t> tokens, labels;
  make_data(48, m.vocab, &tokens, &labels);
  auto step = [&](const DecoderOptions& opt, int ranks) {
    return test::run_decoder_step(m, opt, ranks, tokens, labels, [&](ShardedParams& params, int) {
      params.init(parameter_init(m, 3));
    });
  };
  const test::DecoderStep ref = step(o, 1);
  EXPECT_GT(ref.router_aux, 0.0);
  ASSERT_EQ(ref.expert_load.size(), 2u * 8u);  // two MoE layers
  EXPECT_EQ(ref.moe_sent_bytes, 0);
  struct Case {
    Strategy strategy;
    int ranks, ring = 1;
    bool expert_parallel = true;
  };
  for (Case c : {Case{Strategy::kUlysses, 2}, Case{Strategy::kUPipe, 4}, Case{Strategy::kUPipe, 4, 1, false},
                 Case{Strategy::kRing, 3}, Case{Strategy::kUPipe, 4, 2}, Case{Strategy::kRing, 2, 1, false}}) {
    const bool ep = c.expert_parallel && 8 % c.ranks == 0;
    SCOPED_TRACE(std::string(strategy_name(c.strategy)) + " on " + std::to_string(c.ranks) + " ranks, ring " +
                 std::to_string(c.ring) + (ep ? ", experts over the ranks" : ", every expert on every rank"));
    DecoderOptions d = o;
    d.strategy = c.strategy, d.ring = c.ring, d.expert_parallel = c.expert_parallel;
    const test::DecoderStep got = step(d, c.ranks);
    expect_close(Result{ref.loss, ref.grads}, Result{got.loss, got.grads}, m, 2e-5);
    EXPECT_NEAR(got.router_aux, ref.router_aux, 1e-6 * ref.router_aux);
    EXPECT_EQ(got.expert_load, ref.expert_load);
    if (ep) EXPECT_GT(got.moe_sent_bytes, 0);
    else EXPECT_EQ(got.moe_sent_bytes, 0);
  }
  DecoderOptions d = o;
  d.strategy = Strategy::kUPipe;
  d.recompute = Recompute::kSelective;
  const test::DecoderStep selective = step(d, 4);
  expect_close(Result{ref.loss, ref.grads}, Result{selective.loss, selective.grads}, m, 2e-5);
  d.dtype = DType::kBF16;
  EXPECT_NEAR(step(d, 2).loss, ref.loss, 2e-2 * ref.loss);
}

// Expert parallelism with routing far from the plan's: the MoE layer's MLP norm weights zeroed
// make every router logit 0, so every token picks experts 0 and 1 (ties go to the lower expert),
// rank 0's: twice the balanced share. Under a budget its balanced step fits in, every rank stops
// with the same error (kOutOfBudget, naming rank 0 and the rows) before the rows are allocated,
// rather than one rank failing inside an exchange the other waits in.
TEST(Decoder, ExpertParallelRoutingPastThePlanStopsEveryRank) {
  ModelConfig m = tiny_model();
  m.experts = 8, m.experts_per_token = 2, m.expert_ffn = 1024;
  const DecoderOptions o{.seq = 48, .strategy = Strategy::kUlysses, .mlp_tile = 16};
  std::vector<int32_t> tokens, labels;
  make_data(48, m.vocab, &tokens, &labels);
  const std::vector<ParamDesc> descs = parameter_descriptors(m);
  // One step on 2 ranks under `budget` (0: none); returns each rank's peak, or its error.
  auto step = [&](bool skewed, int64_t budget, std::vector<std::string>* errors) {
    std::vector<int64_t> peaks(2, 0);
    std::mutex mu;
    run_in_process(2, [&](Communicator& comm) {
      auto dev = make_cpu_device({.threads = 1, .budget_bytes = budget});
      ShardedParams params(*dev, comm, descs, o.dtype, ShardedState::kTraining, experts_parallel(m, o, 2));
      params.init([&](int i, int64_t first, std::span<float> out) {
        init_parameter(m, descs[static_cast<size_t>(i)], i, 3, first, out);
        if (skewed && descs[static_cast<size_t>(i)].name.ends_with("mlp_norm")) std::fill(out.begin(), out.end(), 0.0f);
      });
      Decoder dec(*dev, comm, m, o);
      const int64_t L = 24;
      std::vector<int32_t> t(tokens.begin() + comm.rank() * L, tokens.begin() + (comm.rank() + 1) * L);
      std::vector<int32_t> l(labels.begin() + comm.rank() * L, labels.begin() + (comm.rank() + 1) * L);
      try {
        dec.forward_backward(params, t.data(), l.data(), nullptr, 47);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors->push_back(e.what());
      }
      peaks[static_cast<size_t>(comm.rank())] = dev->allocator().stats().peak_total;
    });
    return std::max(peaks[0], peaks[1]);
  };
  std::vector<std::string> none, errors;
  const int64_t balanced = step(false, 0, &none);
  ASSERT_TRUE(none.empty()) << none[0];
  step(true, balanced, &errors);
  ASSERT_EQ(errors.size(), 2u) << "every rank stops";
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("expert parallelism: the router sent rank 0's experts 64 rows of one tile, against the 32 planned"), std::string::npos) << e;
  }
  std::vector<std::string> unbounded;
  step(true, 0, &unbounded);  // without a budget the skewed step runs
  EXPECT_TRUE(unbounded.empty());
}

// The selective recompute (the attention output and LSE kept from the forward pass, no attention
// in the recompute) gives the bits of the full one, loss and every gradient, for every strategy:
// local, ulysses (G < C on 4 ranks: replicated KV), upipe in one stage and in two rounds of stages,
// with overlap, ring, the hybrid, packed documents with a window, qk_norm, bf16, and the
// attention's input made whole (no tiles) as well as by tiles.
TEST(Decoder, SelectiveRecomputeGivesTheBitsOfFull) {
  struct Case {
    const char* what;
    Strategy strategy;
    int ranks, ring = 1;
    int64_t upipe_heads = 0;
    bool overlap = false, qk_norm = false, docs = false, whole_input = false;
    DType dtype = DType::kF32;
  };
  const Case cases[] = {
      {"local", Strategy::kLocal, 1},
      {"ulysses, 4 ranks", Strategy::kUlysses, 4},
      {"ulysses, 2 ranks, bf16", Strategy::kUlysses, 2, 1, 0, false, false, false, false, DType::kBF16},
      {"upipe, 2 ranks, 2 stages", Strategy::kUPipe, 2, 1, 2},
      {"upipe, 2 ranks, 2 stages, overlap, qk_norm", Strategy::kUPipe, 2, 1, 2, true, true},
      {"ring, 3 ranks", Strategy::kRing, 3},
      {"upipe, 4 ranks as 2 x 2, documents and a window", Strategy::kUPipe, 4, 2, 0, false, false, true},
      {"upipe, 2 ranks, whole input, bf16", Strategy::kUPipe, 2, 1, 2, false, false, false, true, DType::kBF16},
      {"ulysses, 2 ranks, whole input", Strategy::kUlysses, 2, 1, 0, false, false, false, true},
  };
  const std::vector<int64_t> docs = {5, 7, 12, 1, 23};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ModelConfig m = tiny_model();
    m.qk_norm = c.qk_norm;
    DecoderOptions o{.seq = 48, .strategy = c.strategy, .upipe_heads = c.upipe_heads, .ring = c.ring,
                     .overlap = c.overlap, .dtype = c.dtype, .mlp_tile = 16, .loss_chunk = 7};
    if (c.whole_input) o.attn_tile = -1;
    const std::vector<int64_t> d = c.docs ? docs : std::vector<int64_t>{};
    const int64_t window = c.docs ? 6 : 0;
    const Result full = run(m, o, c.ranks, 3, nullptr, d, window);
    o.recompute = Recompute::kSelective;
    const Result selective = run(m, o, c.ranks, 3, nullptr, d, window);
    EXPECT_GT(full.loss, 0.0);
    EXPECT_EQ(full.loss, selective.loss);
    const auto descs = parameter_descriptors(m);
    ASSERT_EQ(full.grads.size(), selective.grads.size());
    for (size_t i = 0; i < full.grads.size(); ++i) EXPECT_EQ(full.grads[i], selective.grads[i]) << descs[i].name;
  }
}

TEST(Decoder, Bf16StaysCloseToF32) {
  const ModelConfig m = tiny_model();
  DecoderOptions o{.seq = 48, .strategy = Strategy::kUPipe};
  const Result f = run(m, o, 2);
  o.dtype = DType::kBF16;
  const Result b = run(m, o, 2);
  // bf16 keeps 8 bits: the loss agrees to ~1e-2 relative.
  EXPECT_NEAR(f.loss, b.loss, 2e-2 * f.loss);
}

TEST(Decoder, GradientMatchesFiniteDifferences) {
  const ModelConfig m = tiny_model();
  DecoderOptions o{.seq = 24, .strategy = Strategy::kUPipe};
  const Result base = run(m, o, 2);
  auto descs = parameter_descriptors(m);
  // For every parameter tensor, the directional derivative along a random direction t:
  // <grad, t> against (loss(p + eps t) - loss(p - eps t)) / (2 eps).
  for (int i = 0; i < static_cast<int>(descs.size()); ++i) {
    const float eps = 2e-3f;
    double an = 0;
    for (size_t k = 0; k < base.grads[i].size(); ++k) an += base.grads[i][k] * double(direction(i, k));
    const std::pair<int, float> plus{i, eps}, minus{i, -eps};
    const double fd = (run(m, o, 2, 3, &plus).loss - run(m, o, 2, 3, &minus).loss) / (2 * eps);
    // Central differences of an fp32 loss: rounding ~1e-7 * loss / eps ~ 1e-4 relative to the loss
    // scale, truncation O(eps^2); observed agreement 3-4 digits.
    if (getenv("UNTIED_PRINT")) printf("%s an %.6g fd %.6g\n", descs[i].name.c_str(), an, fd);
    EXPECT_NEAR(an, fd, 2e-5 + 5e-3 * std::fabs(fd)) << descs[i].name << " (analytic " << an << ", fd " << fd << ")";
  }
}

}  // namespace
}  // namespace untied
