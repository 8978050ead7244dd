// The UPipe GQA head schedule (head_schedule.h) against its contract and paper.md §3.5-3.6:
//   * every query head is handled exactly once over (stage, rank, slot);
//   * inside a rank, the attention kernel's own GQA rule (query slot j reads KV slot j / m)
//     pairs each query head with the model's KV head h / (H/G): so the standard weight layout
//     works unchanged;
//   * every effective KV head is exchanged exactly once (at the first stage of its round) and
//     stays resident for stages_per_round consecutive stages; with G < C every model KV head
//     is replicated C/G times;
//   * U = C reproduces the paper's example; U = H is plain Ulysses;
//   * invalid (H, G, C, U) give a Status that says what to change.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "untied/attention/head_schedule.h"

namespace untied {
namespace {

std::string combo(int64_t H, int64_t G, int64_t C, int64_t U) {
  return "H=" + std::to_string(H) + " G=" + std::to_string(G) + " C=" + std::to_string(C) + " U=" +
         std::to_string(U);
}

// The conditions the header and paper state for a schedule to exist.
bool basic_conditions(int64_t H, int64_t G, int64_t C, int64_t U) {
  return H >= 1 && G >= 1 && C >= 1 && H % G == 0 && H % C == 0 && (G % C == 0 || C % G == 0) && U >= C &&
         U % C == 0 && H % U == 0;
}

// Checks every property of a valid schedule; returns failures as text (empty when fine).
std::string check_schedule(const HeadSchedule& s, int64_t H, int64_t G, int64_t C, int64_t U) {
  std::string bad;
  auto fail = [&](const std::string& m) {
    if (bad.size() < 2000) bad += "\n  " + m;
  };
  const int64_t g = H / G;  // the model's query heads per KV head
  const int64_t u = s.q_per_rank, w = s.kv_per_rank, m = s.q_per_kv_stage;
  if (s.heads != H || s.kv_heads != G || s.ranks != C || s.stage_heads != U) fail("fields do not echo the inputs");
  if (u * C != U) fail("q_per_rank * C != U");
  if (s.stages * U != H) fail("stages * U != H");
  if (w * m != u) fail("kv_per_rank * q_per_kv_stage != q_per_rank");
  if (s.kv_eff != (G % C == 0 ? G : C)) fail("kv_eff is not G (G % C == 0) or C (G < C)");
  if (s.kv_eff % G != 0) fail("kv_eff is not a multiple of G");
  if (s.stages_per_round < 1 || s.stages % s.stages_per_round != 0) fail("stages are not whole rounds");
  if (!bad.empty()) return bad;
  const int64_t rounds = s.stages / s.stages_per_round;

  // Coverage and the kernel's GQA rule.
  std::vector<int> seen(static_cast<size_t>(H), 0);
  for (int64_t st = 0; st < s.stages; ++st)
    for (int64_t r = 0; r < C; ++r)
      for (int64_t j = 0; j < u; ++j) {
        const int64_t h = s.q_head(st, r, j);
        if (h < 0 || h >= H) {
          fail("q_head(" + std::to_string(st) + "," + std::to_string(r) + "," + std::to_string(j) +
               ") = " + std::to_string(h) + " out of range");
          continue;
        }
        ++seen[h];
        const int64_t kv_kernel = s.kv_head(s.round(st), r, j / m);  // what the kernel pairs it with
        if (kv_kernel != h / g)
          fail("stage " + std::to_string(st) + " rank " + std::to_string(r) + " slot " + std::to_string(j) +
               ": query head " + std::to_string(h) + " reads KV head " + std::to_string(kv_kernel) +
               ", the model's is " + std::to_string(h / g));
      }
  for (int64_t h = 0; h < H; ++h)
    if (seen[h] != 1) fail("query head " + std::to_string(h) + " handled " + std::to_string(seen[h]) + " times");

  // KV: each effective head exchanged exactly once (per round), each model head kv_eff/G times.
  std::vector<int> eff_seen(static_cast<size_t>(s.kv_eff), 0), model_seen(static_cast<size_t>(G), 0);
  for (int64_t t = 0; t < rounds; ++t)
    for (int64_t r = 0; r < C; ++r)
      for (int64_t i = 0; i < w; ++i) {
        const int64_t e = s.kv_head_eff(t, r, i);
        if (e < 0 || e >= s.kv_eff) {
          fail("kv_head_eff out of range: " + std::to_string(e));
          continue;
        }
        ++eff_seen[e];
        const int64_t kv = s.kv_head(t, r, i);
        if (kv != e / (s.kv_eff / G)) fail("effective KV head " + std::to_string(e) + " maps to model head " +
                                           std::to_string(kv) + " (replicas must be consecutive)");
        if (kv >= 0 && kv < G) ++model_seen[kv];
      }
  for (int64_t e = 0; e < s.kv_eff; ++e)
    if (eff_seen[e] != 1)
      fail("effective KV head " + std::to_string(e) + " exchanged " + std::to_string(eff_seen[e]) + " times");
  for (int64_t k = 0; k < G; ++k)
    if (model_seen[k] != s.kv_eff / G)
      fail("model KV head " + std::to_string(k) + " held " + std::to_string(model_seen[k]) + " times, expected " +
           std::to_string(s.kv_eff / G) + " (C/G replicas)");

  // Residency: rounds are runs of stages_per_round consecutive stages, exchanged at the first.
  int64_t exchanges = 0;
  for (int64_t st = 0; st < s.stages; ++st) {
    exchanges += s.first_of_round(st);
    if (s.round(st) != st / s.stages_per_round) fail("round(" + std::to_string(st) + ") is not st / stages_per_round");
    if (s.first_of_round(st) != (st % s.stages_per_round == 0)) fail("first_of_round wrong at " + std::to_string(st));
    if (s.last_of_round(st) != (st % s.stages_per_round == s.stages_per_round - 1))
      fail("last_of_round wrong at " + std::to_string(st));
    // Every stage of a round uses exactly the KV heads of that round.
    if (st > 0 && s.round(st) == s.round(st - 1) && s.first_of_round(st)) fail("a round restarts mid-way");
  }
  if (exchanges != rounds) fail("KV exchanged " + std::to_string(exchanges) + " times, expected " + std::to_string(rounds));
  return bad;
}

TEST(HeadSchedule, EveryValidComboCoversHeadsOnceWithTheModelsKvHead) {
  int64_t valid = 0, rejected_despite_basic = 0;
  std::string rejected_examples;
  for (int64_t H = 1; H <= 48; ++H)
    for (int64_t G = 1; G <= H; ++G) {
      if (H % G != 0) continue;
      for (int64_t C = 1; C <= 16; ++C)
        for (int64_t U = C; U <= H; U += C) {
          auto s = make_head_schedule(H, G, C, U);
          if (!s.ok()) {
            if (basic_conditions(H, G, C, U)) {
              // A (H, G, C, U) that meets the header's stated conditions but has no schedule
              // of this form; the message must still list the U that work.
              ++rejected_despite_basic;
              if (rejected_examples.size() < 400) rejected_examples += " [" + combo(H, G, C, U) + "]";
              EXPECT_NE(s.status().message().find("valid U"), std::string::npos)
                  << combo(H, G, C, U) << ": " << s.status().message();
            }
            continue;
          }
          ++valid;
          EXPECT_TRUE(basic_conditions(H, G, C, U)) << combo(H, G, C, U) << " accepted";
          const std::string bad = check_schedule(s.value(), H, G, C, U);
          EXPECT_TRUE(bad.empty()) << combo(H, G, C, U) << ":" << bad;
        }
    }
  std::printf("  %lld valid (H, G, C, U) schedules checked (H <= 48, C <= 16)\n", static_cast<long long>(valid));
  std::printf("  %lld combos meet H%%C, H%%G, G|C or C|G, C|U, U|H but are rejected (kv split), e.g.%s\n",
              static_cast<long long>(rejected_despite_basic), rejected_examples.c_str());
  EXPECT_GT(valid, 1000);
}

TEST(HeadSchedule, PaperExampleH16G4C4) {
  // paper.md §3.5: stage 0: K/V 0-3 with Q0, Q4, Q8, Q12; stage 1: Q1, Q5, Q9, Q13; ...
  auto st = make_head_schedule(16, 4, 4, 4);
  ASSERT_TRUE(st.ok()) << st.status().message();
  const HeadSchedule& s = st.value();
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.stages_per_round, 4);
  EXPECT_EQ(s.q_per_rank, 1);
  EXPECT_EQ(s.kv_per_rank, 1);
  for (int64_t stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(s.first_of_round(stage), stage == 0) << "K/V are exchanged only at stage 0";
    for (int64_t r = 0; r < 4; ++r) {
      EXPECT_EQ(s.q_head(stage, r, 0), 4 * r + stage) << "stage " << stage << " rank " << r;
      EXPECT_EQ(s.kv_head(s.round(stage), r, 0), r) << "stage " << stage << " rank " << r;
    }
  }
}

TEST(HeadSchedule, GeneralRuleOfPaperWhenUEqualsC) {
  // paper.md §3.5 general rule (U = C, G_eff >= C): kv_head(s, r) = floor(s/g) C + r,
  // q_head(s, r) = kv_head(s, r) g + (s mod g), with g = H / G_eff.
  for (int64_t H : {8, 16, 32, 48})
    for (int64_t G : {1, 2, 4, 8, 16})
      for (int64_t C : {1, 2, 4, 8}) {
        if (H % G != 0 || G > H) continue;
        auto st = make_head_schedule(H, G, C, C);
        if (!st.ok()) continue;
        const HeadSchedule& s = st.value();
        const int64_t g = H / s.kv_eff;
        for (int64_t stage = 0; stage < s.stages; ++stage)
          for (int64_t r = 0; r < C; ++r) {
            const int64_t kv = (stage / g) * C + r;
            EXPECT_EQ(s.kv_head_eff(s.round(stage), r, 0), kv) << combo(H, G, C, C) << " stage " << stage;
            EXPECT_EQ(s.q_head(stage, r, 0), kv * g + stage % g) << combo(H, G, C, C) << " stage " << stage;
          }
      }
}

TEST(HeadSchedule, UEqualsHIsPlainUlysses) {
  for (int64_t H : {1, 2, 4, 6, 8, 12, 16, 24, 32})
    for (int64_t G = 1; G <= H; ++G)
      for (int64_t C = 1; C <= H; ++C) {
        if (H % G != 0 || H % C != 0 || (G % C != 0 && C % G != 0)) continue;
        auto st = make_head_schedule(H, G, C, H);
        ASSERT_TRUE(st.ok()) << combo(H, G, C, H) << ": " << st.status().message();
        const HeadSchedule& s = st.value();
        EXPECT_EQ(s.stages, 1);
        for (int64_t r = 0; r < C; ++r)
          for (int64_t j = 0; j < H / C; ++j)
            EXPECT_EQ(s.q_head(0, r, j), r * (H / C) + j) << combo(H, G, C, H) << " rank " << r << " slot " << j;
      }
}

TEST(HeadSchedule, ReplicatedKvWhenFewerKvHeadsThanRanks) {
  // paper.md §3.6: G < C replicates each KV head C/G times (kv0, kv0, kv1, kv1, ...).
  auto st = make_head_schedule(8, 2, 4, 4);
  ASSERT_TRUE(st.ok()) << st.status().message();
  const HeadSchedule& s = st.value();
  EXPECT_EQ(s.kv_eff, 4);
  const int64_t expect_kv[4] = {0, 0, 1, 1};
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(s.kv_head(0, r, 0), expect_kv[r]) << "rank " << r;
  auto one = make_head_schedule(8, 1, 8, 8);
  ASSERT_TRUE(one.ok()) << one.status().message();
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(one.value().kv_head(0, r, 0), 0);
}

struct BadCombo {
  int64_t H, G, C, U;
  std::vector<std::string> must_name;  // parts the message must contain
};

TEST(HeadSchedule, InvalidCombosSayWhatToChange) {
  const std::vector<BadCombo> bad = {
      {6, 6, 4, 4, {"heads (6)", "number of ranks (4)"}},                      // H % C != 0
      {8, 3, 2, 2, {"heads (8)", "kv_heads (3)"}},                              // H % G != 0
      {12, 6, 4, 4, {"kv_heads (6)", "ranks (4)"}},                             // G neither multiple nor divisor of C
      {24, 3, 2, 2, {"kv_heads (3)", "ranks (2)"}},                             // same, G odd
      {8, 2, 4, 6, {"U (6)", "multiple of the ranks (4)", "valid U", "4, 8"}},  // U not a multiple of C
      {8, 2, 2, 6, {"U (6)", "divides heads (8)", "valid U", "2, 4, 8"}},       // U does not divide H
      {8, 2, 4, 2, {"U (2)", "valid U"}},                                       // U < C
      {8, 2, 4, 16, {"U (16)", "valid U"}},                                     // U > H
      {0, 1, 1, 1, {">= 1"}},
      {8, 0, 2, 2, {">= 1"}},
  };
  for (const BadCombo& b : bad) {
    auto s = make_head_schedule(b.H, b.G, b.C, b.U);
    ASSERT_FALSE(s.ok()) << combo(b.H, b.G, b.C, b.U) << " accepted";
    EXPECT_EQ(s.status().code(), Status::Code::kInvalidArgument);
    for (const std::string& part : b.must_name)
      EXPECT_NE(s.status().message().find(part), std::string::npos)
          << combo(b.H, b.G, b.C, b.U) << ": message lacks \"" << part << "\": " << s.status().message();
    std::printf("  %-22s -> %s\n", combo(b.H, b.G, b.C, b.U).c_str(), s.status().message().c_str());
  }
}

// ranks = 0 must be a Status like any other bad size, not a crash. Run in a child process so a
// crash fails this test without taking the rest of the suite down.
TEST(HeadSchedule, ZeroRanksIsAStatusNotACrash) {
  EXPECT_EXIT(
      {
        auto s = make_head_schedule(8, 8, 0, 0);
        std::exit(!s.ok() && s.status().message().find(">= 1") != std::string::npos ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "")
      << "make_head_schedule(8, 8, /*ranks=*/0, 0) must return a non-ok Status (exit 3: it returned ok or "
         "a message without '>= 1'; a signal: it crashed)";
}

TEST(HeadSchedule, ValidStageHeadsListsExactlyTheAcceptedU) {
  for (int64_t H : {8, 12, 16, 24, 32})
    for (int64_t G : {1, 2, 4, 8})
      for (int64_t C : {1, 2, 4, 8}) {
        if (H % G != 0) continue;
        std::string expect;
        for (int64_t U = 1; U <= H; ++U)
          if (make_head_schedule(H, G, C, U).ok()) expect += (expect.empty() ? "" : ", ") + std::to_string(U);
        EXPECT_EQ(valid_stage_heads(H, G, C), expect.empty() ? "none" : expect) << combo(H, G, C, 0);
      }
}

}  // namespace
}  // namespace untied
