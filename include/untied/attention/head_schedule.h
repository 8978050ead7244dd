// The head schedule of UPipe (and of Ulysses, its one-stage case): which query and KV heads
// each rank handles at each stage.
//
// Terms: C ranks, H query heads, G KV heads, U heads per stage (U % C == 0, H % U == 0).
//   G_eff = G when G % C == 0, else C (each KV head replicated C/G times; needs C % G == 0).
//   g_eff = H / G_eff: query heads served by one effective KV head.
//   u = U / C query heads per rank per stage; w = gcd(u, G_eff / C) KV heads per rank that are
//   resident together; m = u / w query heads per resident KV head per stage (m must divide
//   g_eff).
// Stages come in rounds of g_eff / m stages. At the first stage of round t, rank r receives the
// effective KV heads e = t*C*w + r*w + i (i < w), which stay resident for the round. At stage
// s (round t = s / (g_eff/m), step q = s % (g_eff/m)) rank r's query slot j = i*m + k holds
//     query head  h = e(t, r, i) * g_eff + q*m + k.
// So every KV head is exchanged exactly once, and with U = C (u = w = m = 1) each stage takes
// one query head from each of C different KV groups (paper §3.5). With U = H there is a single
// stage and rank r holds query heads r*H/C .. (r+1)*H/C - 1: plain Ulysses.
// Query slot j of a rank uses its KV slot j / m, which is the attention kernel's own GQA rule
// for (heads = u, kv_heads = w). Weights keep the standard layout: the schedule selects rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "untied/core/status.h"

namespace untied {

struct HeadSchedule {
  int64_t heads = 0, kv_heads = 0, ranks = 0, stage_heads = 0;
  int64_t kv_eff = 0;            // G_eff
  int64_t q_per_kv_eff = 0;      // g_eff
  int64_t q_per_rank = 0;        // u
  int64_t kv_per_rank = 0;       // w
  int64_t q_per_kv_stage = 0;    // m
  int64_t stages = 0;            // H / U
  int64_t stages_per_round = 0;  // g_eff / m

  int64_t round(int64_t s) const { return s / stages_per_round; }
  bool first_of_round(int64_t s) const { return s % stages_per_round == 0; }
  bool last_of_round(int64_t s) const { return s % stages_per_round == stages_per_round - 1; }
  // Effective KV head in slot i of rank r during round t.
  int64_t kv_head_eff(int64_t t, int64_t r, int64_t i) const { return (t * ranks + r) * kv_per_rank + i; }
  // The model's KV head (whose weight rows are used) in that slot.
  int64_t kv_head(int64_t t, int64_t r, int64_t i) const { return kv_head_eff(t, r, i) * kv_heads / kv_eff; }
  // Query head in slot j of rank r at stage s.
  int64_t q_head(int64_t s, int64_t r, int64_t j) const {
    const int64_t i = j / q_per_kv_stage, k = j % q_per_kv_stage;
    return kv_head_eff(round(s), r, i) * q_per_kv_eff + (s % stages_per_round) * q_per_kv_stage + k;
  }
  // Every rank's query heads of stage s, rank by rank and slot by slot (the columns that one
  // projection of the stage makes for all ranks at once).
  std::vector<int64_t> stage_q_heads(int64_t s) const;
};

// Whether heads[k] == heads[0] + k for every k: their weight rows (or wo's columns) are one run,
// used in place instead of copied.
bool consecutive_heads(const std::vector<int64_t>& heads);

// The schedule for (H, G, C, U), or a Status saying which of them to change.
StatusOr<HeadSchedule> make_head_schedule(int64_t heads, int64_t kv_heads, int64_t ranks, int64_t stage_heads);

// The U values that work for (H, G, C), e.g. "8, 16, 32" (for messages).
std::string valid_stage_heads(int64_t heads, int64_t kv_heads, int64_t ranks);

}  // namespace untied
