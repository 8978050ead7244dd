#include "untied/attention/head_schedule.h"

#include <algorithm>
#include <numeric>

namespace untied {
namespace {

enum class Why { kOk, kSizes, kGqa, kRanks, kKvRanks, kStageHeads, kGroupSplit };

// The schedule for (H, G, C, U) without messages; `out` is filled when kOk.
Why compute(int64_t H, int64_t G, int64_t C, int64_t U, HeadSchedule* out) {
  if (H < 1 || G < 1 || C < 1) return Why::kSizes;
  if (H % G != 0) return Why::kGqa;
  if (H % C != 0) return Why::kRanks;
  if (G % C != 0 && C % G != 0) return Why::kKvRanks;
  if (U < C || U % C != 0 || H % U != 0) return Why::kStageHeads;
  HeadSchedule s;
  s.heads = H;
  s.kv_heads = G;
  s.ranks = C;
  s.stage_heads = U;
  s.kv_eff = G % C == 0 ? G : C;
  s.q_per_kv_eff = H / s.kv_eff;
  s.q_per_rank = U / C;
  // The most KV heads a rank can hold together such that its u query slots split evenly over
  // them and the G_eff / C KV heads it serves split into whole rounds.
  s.kv_per_rank = std::gcd(s.q_per_rank, s.kv_eff / C);
  s.q_per_kv_stage = s.q_per_rank / s.kv_per_rank;
  if (s.q_per_kv_eff % s.q_per_kv_stage != 0) return Why::kGroupSplit;
  s.stages = H / U;
  s.stages_per_round = s.q_per_kv_eff / s.q_per_kv_stage;
  *out = s;
  return Why::kOk;
}

}  // namespace

StatusOr<HeadSchedule> make_head_schedule(int64_t H, int64_t G, int64_t C, int64_t U) {
  HeadSchedule s;
  const std::string hs = std::to_string(H), gs = std::to_string(G), cs = std::to_string(C),
                    us = std::to_string(U);
  std::string m;
  const Why why = compute(H, G, C, U, &s);
  switch (why) {
    case Why::kOk: return s;
    case Why::kSizes: m = "heads, kv_heads and ranks must be >= 1"; break;
    case Why::kGqa: m = "heads (" + hs + ") must be a multiple of kv_heads (" + gs + ")"; break;
    case Why::kRanks:
      m = "heads (" + hs + ") must be divisible by the number of ranks (" + cs +
          "): run on a number of ranks that divides " + hs;
      break;
    case Why::kKvRanks:
      m = "kv_heads (" + gs + ") must be a multiple or a divisor of the number of ranks (" + cs +
          ") so that every rank gets whole KV heads (replicated when fewer than ranks)";
      break;
    case Why::kStageHeads:
      m = "heads per stage U (" + us + ") must be a multiple of the ranks (" + cs + ") that divides heads (" +
          hs + ")";
      break;
    case Why::kGroupSplit:
      m = "heads per stage U (" + us + ") takes more query heads per KV head per stage than divide the " +
          std::to_string(H / (G % C == 0 ? G : C)) + " query heads of each KV head";
      break;
  }
  if (why != Why::kStageHeads && why != Why::kGroupSplit) return Status::invalid_argument(m);
  return Status::invalid_argument(m + "; valid U for heads " + hs + ", kv_heads " + gs + ", " + cs +
                                  " ranks: " + valid_stage_heads(H, G, C));
}

std::string valid_stage_heads(int64_t H, int64_t G, int64_t C) {
  std::string out;
  HeadSchedule s;
  for (int64_t u = C; C >= 1 && u <= H; u += C)
    if (compute(H, G, C, u, &s) == Why::kOk) out += (out.empty() ? "" : ", ") + std::to_string(u);
  return out.empty() ? "none" : out;
}

std::vector<int64_t> HeadSchedule::stage_q_heads(int64_t s) const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(ranks * q_per_rank));
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t j = 0; j < q_per_rank; ++j) out.push_back(q_head(s, r, j));
  return out;
}

bool consecutive_heads(const std::vector<int64_t>& heads) {
  for (size_t k = 1; k < heads.size(); ++k)
    if (heads[k] != heads[k - 1] + 1) return false;
  return true;
}

}  // namespace untied
