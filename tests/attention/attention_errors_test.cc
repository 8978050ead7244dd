// Bad input to the attention block: every refusal comes before any compute, says what to change
// (STYLE.md habit 6), and, in a run where every rank has the same bad input, every rank refuses
// and run_in_process returns by rethrowing: nothing hangs.
//
//   validate(cfg, C)           a non-ok Status whose message names the value to change
//   make_attention_block       Error(kInvalidArgument) with validate's message, on every rank
//   forward / backward         Error(kInvalidArgument) naming the tensor, its shape (or dtype) and
//                              the expected one, before anything is allocated
//
// Tensors with a wrong shape are backed by buffers large enough for both the wrong and the right
// shape, so a block that does not check reads and writes only memory it owns: the test then
// fails with "did not throw" instead of crashing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/expect_error.h"
#include "untied/attention/attention_block.h"
#include "untied/comm/inproc.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"

namespace untied {
namespace {

using untied::testing::throws_error;

// Runs fn on its own thread. A hang must fail the suite, not stall it: if fn has not returned
// after `seconds`, print what hung and exit 1. Rethrows what fn throws.
void within_deadline(double seconds, const std::string& what, const std::function<void()>& fn) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::exception_ptr error;
  std::thread t([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    done.set_value();
  });
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "HANG: %s did not return within %.0f s\n", what.c_str(), seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  t.join();
  if (error) std::rethrow_exception(error);
}

AttentionConfig good_config() {
  return AttentionConfig{.seq = 48, .hidden = 32, .heads = 8, .kv_heads = 2, .head_dim = 16, .rope_theta = 10000.0,
                         .dtype = DType::kF32, .strategy = Strategy::kUPipe, .upipe_heads = 0};
}

struct BadConfig {
  std::string what;
  AttentionConfig cfg;
  int ranks;
  std::vector<std::string> must_name;
};

std::vector<BadConfig> bad_configs() {
  std::vector<BadConfig> b;
  auto with = [](auto edit) {
    AttentionConfig c = good_config();
    edit(c);
    return c;
  };
  b.push_back({"H not divisible by C (upipe)", with([](auto& c) { c.heads = 6; c.kv_heads = 6; }), 4,
               {"heads (6)", "number of ranks (4)"}});
  b.push_back({"H not divisible by C (ulysses)",
               with([](auto& c) { c.heads = 6; c.kv_heads = 6; c.strategy = Strategy::kUlysses; }), 4,
               {"ulysses", "heads (6)", "number of ranks (4)"}});
  b.push_back({"U not a multiple of C", with([](auto& c) { c.upipe_heads = 6; }), 4,
               {"upipe", "U (6)", "multiple of the ranks (4)", "valid U", "4, 8"}});
  b.push_back({"U does not divide H", with([](auto& c) { c.upipe_heads = 6; }), 2,
               {"upipe", "U (6)", "divides heads (8)", "valid U", "2, 4, 8"}});
  b.push_back({"G does not divide H", with([](auto& c) { c.kv_heads = 3; }), 2,
               {"heads (8)", "multiple of kv_heads (3)"}});
  b.push_back({"G neither multiple nor divisor of C", with([](auto& c) { c.heads = 12; c.kv_heads = 6; }), 4,
               {"kv_heads (6)", "multiple or a divisor", "ranks (4)"}});
  b.push_back({"S not divisible by C", with([](auto& c) { c.seq = 50; }), 4,
               {"sequence length 50", "divisible by the number of ranks (4)", "--seq 52"}});
  b.push_back({"local on more than one rank", with([](auto& c) { c.strategy = Strategy::kLocal; }), 2,
               {"strategy local runs on one rank, not 2", "ulysses or upipe"}});
  b.push_back({"odd head_dim", with([](auto& c) { c.head_dim = 15; }), 2, {"head_dim must be even", "got 15"}});
  b.push_back({"head_dim 0", with([](auto& c) { c.head_dim = 0; }), 1, {"head_dim", "got 0"}});
  b.push_back({"negative U", with([](auto& c) { c.upipe_heads = -4; }), 2, {"upipe_heads must be >= 0"}});
  b.push_back({"zero seq", with([](auto& c) { c.seq = 0; }), 1, {"sequence length must be >= 1", "got 0"}});
  b.push_back({"zero hidden", with([](auto& c) { c.hidden = 0; }), 1, {"hidden size E", "got 0"}});
  b.push_back({"zero kv_heads", with([](auto& c) { c.kv_heads = 0; }), 1, {"kv_heads must be >= 1"}});
  b.push_back({"rope_theta 0", with([](auto& c) { c.rope_theta = 0; }), 1, {"rope_theta must be > 0"}});
  b.push_back({"f64 storage", with([](auto& c) { c.dtype = DType::kF64; }), 1, {"dtype must be f32 or bf16"}});
  // Ring and the Ulysses x ring hybrid.
  b.push_back({"ranks not divisible by R", with([](auto& c) { c.ring = 3; }), 4,
               {"--ring 3 must divide the number of ranks (4)"}});
  b.push_back({"S not divisible by 2RC", with([](auto& c) { c.seq = 50; c.ring = 2; }), 2,
               {"sequence length 50", "2 * R * C = 4", "--seq 52"}});
  b.push_back({"S not divisible by 2RC (ring)", with([](auto& c) { c.seq = 60; c.strategy = Strategy::kRing; }), 4,
               {"sequence length 60", "2 * R * C = 8", "--seq 64"}});
  b.push_back({"heads the Ulysses degree does not divide",
               with([](auto& c) { c.heads = 6; c.kv_heads = 6; c.ring = 2; c.strategy = Strategy::kUlysses; }), 8,
               {"ulysses with ring 2", "the 4 ranks of a ring group", "heads (6)"}});
  b.push_back({"U not a multiple of C (hybrid)", with([](auto& c) { c.upipe_heads = 2; c.ring = 2; }), 8,
               {"upipe with ring 2", "U (2)", "multiple of the ranks (4)"}});
  b.push_back({"ring on local", with([](auto& c) { c.strategy = Strategy::kLocal; c.ring = 2; }), 1,
               {"strategy local has no ring"}});
  b.push_back({"ring strategy with another ring degree",
               with([](auto& c) { c.strategy = Strategy::kRing; c.ring = 2; }), 4,
               {"strategy ring runs one ring over all 4 ranks", "--ring 2"}});
  b.push_back({"ring degree 0", with([](auto& c) { c.ring = 0; }), 2, {"ring degree (--ring) must be >= 1"}});
  return b;
}

TEST(AttentionErrors, ValidateSaysWhatToChange) {
  for (const BadConfig& b : bad_configs()) {
    const Status s = validate(b.cfg, b.ranks);
    ASSERT_FALSE(s.ok()) << b.what << ": accepted";
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << b.what;
    for (const std::string& part : b.must_name)
      EXPECT_NE(s.message().find(part), std::string::npos)
          << b.what << ": message lacks \"" << part << "\": " << s.message();
    std::printf("  %-38s -> %s\n", b.what.c_str(), s.message().c_str());
  }
  EXPECT_FALSE(validate(good_config(), 0).ok()) << "0 ranks accepted";
  EXPECT_TRUE(validate(good_config(), 4).ok()) << validate(good_config(), 4).message();
}

TEST(AttentionErrors, ParseStrategyNamesTheChoices) {
  EXPECT_EQ(parse_strategy("upipe").value(), Strategy::kUPipe);
  EXPECT_EQ(parse_strategy("ulysses").value(), Strategy::kUlysses);
  EXPECT_EQ(parse_strategy("local").value(), Strategy::kLocal);
  EXPECT_EQ(parse_strategy("ring").value(), Strategy::kRing);
  auto bad = parse_strategy("usp");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'usp'"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("local, ulysses, upipe or ring"), std::string::npos) << bad.status().message();
}

// Every rank gets the same bad config: every rank throws kInvalidArgument with validate's
// message, and run_in_process rethrows it. Nothing is allocated.
TEST(AttentionErrors, MakeBlockRefusesOnEveryRank) {
  for (const BadConfig& b : bad_configs()) {
    if (b.ranks < 1) continue;
    std::atomic<int> refused{0}, allocated{0};
    const std::string expected = validate(b.cfg, b.ranks).message();
    std::string msg;
    EXPECT_TRUE(throws_error(
        [&] {
          within_deadline(60, "make_attention_block: " + b.what, [&] {
            run_in_process(b.ranks, [&](Communicator& comm) {
              auto dev = make_cpu_device({.threads = 1});
              try {
                auto block = make_attention_block(*dev, comm, b.cfg);
              } catch (const Error& e) {
                if (e.kind() == ErrorKind::kInvalidArgument && std::string(e.what()).find(expected) != std::string::npos)
                  ++refused;
                allocated += dev->allocator().stats().num_allocations > 0;
                throw;
              }
            });
          });
        },
        ErrorKind::kInvalidArgument, {expected}, &msg))
        << b.what;
    EXPECT_EQ(refused.load(), b.ranks) << b.what << ": only " << refused.load() << " of " << b.ranks << " ranks refused";
    EXPECT_EQ(allocated.load(), 0) << b.what << ": allocated before refusing";
  }
}

// ---- tensors that do not match the config ----------------------------------------------------

// A tensor argument: its claimed shape and dtype, backed by enough memory for any use.
struct Arg {
  std::vector<float> mem;
  Tensor t;
  Arg(DType dtype, Shape s, int64_t min_elems) {
    mem.assign(static_cast<size_t>(2 * std::max(s.numel(), min_elems) + 64), 0.01f);
    t = Tensor(mem.data(), dtype, s);
  }
};

enum class Which { kX, kY, kWq, kWk, kWv, kWo, kDx, kDy, kDwq, kDwk, kDwv, kDwo };

struct BadTensor {
  std::string what;
  Which which;
  Shape shape;       // the wrong shape given
  DType dtype;       // the dtype given
  std::vector<std::string> must_name;  // e.g. the tensor's name and both shapes
  bool strided = false;  // a view with a padded row stride (right shape, not contiguous)
};

// For cfg on C ranks (L = S/C): the argument list of forward + backward with one of them bad.
struct Call {
  std::vector<Arg> args;  // indexed by Which
  Call(const AttentionConfig& c, int C, const BadTensor* bad) {
    args.reserve(12);
    const int64_t L = c.seq / C, E = c.hidden, HD = c.heads * c.head_dim, GD = c.kv_heads * c.head_dim;
    const Shape good[] = {{L, E}, {L, E}, {HD, E}, {GD, E}, {GD, E}, {E, HD},
                          {L, E}, {L, E}, {HD, E}, {GD, E}, {GD, E}, {E, HD}};
    for (int i = 0; i < 12; ++i) {
      const bool is_bad = bad != nullptr && static_cast<int>(bad->which) == i;
      args.emplace_back(is_bad ? bad->dtype : c.dtype, is_bad ? bad->shape : good[i], good[i].numel());
      if (is_bad && bad->strided) {
        const Shape& s = bad->shape;
        args.back().t = Tensor(args.back().mem.data(), bad->dtype, s, Shape{s[1] + 1, 1});
      }
    }
  }
  const Tensor& operator[](Which w) const { return args[static_cast<size_t>(w)].t; }
  AttentionWeights weights() const { return {(*this)[Which::kWq], (*this)[Which::kWk], (*this)[Which::kWv], (*this)[Which::kWo]}; }
  AttentionGrads grads() const { return {(*this)[Which::kDwq], (*this)[Which::kDwk], (*this)[Which::kDwv], (*this)[Which::kDwo]}; }
};

bool is_backward_arg(Which w) { return w >= Which::kDx; }

// Config: S=48, E=32, H=8, G=2, D=16. On C ranks L = 48/C.
std::vector<BadTensor> bad_tensors(int C) {
  const int64_t L = 48 / C;
  auto sh = [](Shape s) { return s.to_string(); };
  return {
      {"x with wrong E", Which::kX, {L, 33}, DType::kF32, {sh({L, 33}), sh({L, 32})}},
      {"x with wrong rows (not S/C)", Which::kX, {L + 1, 32}, DType::kF32, {sh({L + 1, 32}), sh({L, 32})}},
      {"x as a 1-d tensor", Which::kX, {L * 32}, DType::kF32, {sh({L * 32}), sh({L, 32})}},
      {"x in bf16 when the config says f32", Which::kX, {L, 32}, DType::kBF16, {"bf16", "f32"}},
      {"x a strided view (row stride E+1)", Which::kX, {L, 32}, DType::kF32, {"x", "contiguous"}, true},
      {"wk in bf16 when the config says f32", Which::kWk, {32, 32}, DType::kBF16, {"wk", "bf16", "f32"}},
      {"dwv a strided view", Which::kDwv, {32, 32}, DType::kF32, {"dwv", "contiguous"}, true},
      {"y with wrong E", Which::kY, {L, 31}, DType::kF32, {sh({L, 31}), sh({L, 32})}},
      {"wq with wrong rows", Which::kWq, {112, 32}, DType::kF32, {"wq", sh({112, 32}), sh({128, 32})}},
      {"wq with wrong E", Which::kWq, {128, 16}, DType::kF32, {"wq", sh({128, 16}), sh({128, 32})}},
      {"wk with H*D rows (MHA weights for a GQA config)", Which::kWk, {128, 32}, DType::kF32,
       {"wk", sh({128, 32}), sh({32, 32})}},
      {"wv with wrong rows", Which::kWv, {48, 32}, DType::kF32, {"wv", sh({48, 32}), sh({32, 32})}},
      {"wo transposed", Which::kWo, {128, 32}, DType::kF32, {"wo", sh({128, 32}), sh({32, 128})}},
      {"dx with wrong E", Which::kDx, {L, 33}, DType::kF32, {sh({L, 33}), sh({L, 32})}},
      {"dy with wrong rows", Which::kDy, {L + 2, 32}, DType::kF32, {sh({L + 2, 32}), sh({L, 32})}},
      {"dwq with wrong rows", Which::kDwq, {112, 32}, DType::kF32, {"dwq", sh({112, 32}), sh({128, 32})}},
      {"dwk with wrong rows", Which::kDwk, {48, 32}, DType::kF32, {"dwk", sh({48, 32}), sh({32, 32})}},
      {"dwo transposed", Which::kDwo, {128, 32}, DType::kF32, {"dwo", sh({128, 32}), sh({32, 128})}},
  };
}

// Runs forward (and backward, when the bad tensor is a backward argument) on C ranks, every rank
// with the same bad tensor. Expects kInvalidArgument naming it on every rank, raised before the
// call allocated anything.
void expect_refused(const AttentionConfig& cfg, int C, const BadTensor& bad) {
  std::atomic<int> refused{0}, allocated_before_refusing{0};
  const std::string label = std::string(strategy_name(cfg.strategy)) + " C=" + std::to_string(C) + ": " + bad.what;
  std::string msg;
  EXPECT_TRUE(throws_error(
      [&] {
        within_deadline(60, label, [&] {
          run_in_process(C, [&](Communicator& comm) {
            auto dev = make_cpu_device({.threads = 1});
            auto block = make_attention_block(*dev, comm, cfg);
            Call call(cfg, C, &bad);
            AttentionSaved saved;
            int64_t allocs = dev->allocator().stats().num_allocations;
            try {
              if (!is_backward_arg(bad.which)) {
                block->forward(call[Which::kY], call[Which::kX], call.weights(), saved);
              } else {
                block->forward(call[Which::kY], call[Which::kX], call.weights(), saved);
                allocs = dev->allocator().stats().num_allocations;
                AttentionGrads g = call.grads();
                block->backward(call[Which::kDx], g, call[Which::kDy], call[Which::kX], call.weights(), saved);
              }
            } catch (const Error& e) {
              if (e.kind() == ErrorKind::kInvalidArgument) ++refused;
              allocated_before_refusing += dev->allocator().stats().num_allocations > allocs;
              throw;
            }
          });
        });
      },
      ErrorKind::kInvalidArgument, {}, &msg))
      << label;
  bool named = true;
  for (const std::string& part : bad.must_name)
    if (msg.find(part) == std::string::npos) named = false;
  if (!msg.empty()) {
    EXPECT_TRUE(named) << label << ": the message should name " << ::testing::PrintToString(bad.must_name)
                       << "; got: " << msg;
    EXPECT_EQ(refused.load(), C) << label << ": only " << refused.load() << " of " << C << " ranks refused";
    EXPECT_EQ(allocated_before_refusing.load(), 0) << label << ": allocated before refusing (compute had started)";
    std::printf("  %-52s -> %s\n", label.c_str(), msg.c_str());
  }
}

TEST(AttentionErrors, ForwardBackwardRefuseMismatchedTensorsLocal) {
  AttentionConfig cfg = good_config();
  cfg.strategy = Strategy::kLocal;
  for (const BadTensor& b : bad_tensors(1)) expect_refused(cfg, 1, b);
}

TEST(AttentionErrors, ForwardBackwardRefuseMismatchedTensorsUPipe) {
  const AttentionConfig cfg = good_config();  // upipe, U = C
  for (const BadTensor& b : bad_tensors(4)) expect_refused(cfg, 4, b);
}

TEST(AttentionErrors, ForwardBackwardRefuseMismatchedTensorsUlysses) {
  AttentionConfig cfg = good_config();
  cfg.strategy = Strategy::kUlysses;
  for (const BadTensor& b : bad_tensors(2)) expect_refused(cfg, 2, b);
}

// The same argument lists with nothing wrong run (guards the harness above against refusing
// for a reason of its own).
TEST(AttentionErrors, GoodTensorsRun) {
  for (Strategy s : {Strategy::kLocal, Strategy::kUlysses, Strategy::kUPipe}) {
    AttentionConfig cfg = good_config();
    cfg.strategy = s;
    const int C = s == Strategy::kLocal ? 1 : 4;
    within_deadline(60, "good tensors", [&] {
      run_in_process(C, [&](Communicator& comm) {
        auto dev = make_cpu_device({.threads = 1});
        auto block = make_attention_block(*dev, comm, cfg);
        Call call(cfg, C, nullptr);
        AttentionSaved saved;
        block->forward(call[Which::kY], call[Which::kX], call.weights(), saved);
        AttentionGrads g = call.grads();
        block->backward(call[Which::kDx], g, call[Which::kDy], call[Which::kX], call.weights(), saved);
      });
    });
  }
}

// Backward without a forward (or twice after one forward: backward frees `saved`) is refused.
TEST(AttentionErrors, BackwardWithoutForwardIsRefused) {
  for (Strategy s : {Strategy::kLocal, Strategy::kUlysses, Strategy::kUPipe}) {
    AttentionConfig cfg = good_config();
    cfg.strategy = s;
    const int C = s == Strategy::kLocal ? 1 : 2;
    EXPECT_TRUE(throws_error(
        [&] {
          within_deadline(60, "backward without forward", [&] {
            run_in_process(C, [&](Communicator& comm) {
              auto dev = make_cpu_device({.threads = 1});
              auto block = make_attention_block(*dev, comm, cfg);
              Call call(cfg, C, nullptr);
              AttentionSaved saved;
              block->forward(call[Which::kY], call[Which::kX], call.weights(), saved);
              AttentionGrads g = call.grads();
              block->backward(call[Which::kDx], g, call[Which::kDy], call[Which::kX], call.weights(), saved);
              block->backward(call[Which::kDx], g, call[Which::kDy], call[Which::kX], call.weights(), saved);
            });
          });
        },
        ErrorKind::kInvalidArgument, {"without a matching forward"}))
        << strategy_name(s);
  }
}

}  // namespace
}  // namespace untied
