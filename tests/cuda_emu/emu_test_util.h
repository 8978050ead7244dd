// What the emulated tests share: the input generator (one xorshift64 stream per test program,
// so a run is reproducible from its start) and the loop over thread schedules.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

uint64_t g_rng_state = 12345;

// Uniform in [-1, 1).
inline float uniform_pm1() {
  g_rng_state ^= g_rng_state << 13;
  g_rng_state ^= g_rng_state >> 7;
  g_rng_state ^= g_rng_state << 17;
  return static_cast<float>((g_rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

// Runs `body` under the default schedules (lanes reversed; warps one at a time in a random order;
// warps one at a time in order), or under every schedule when UNTIED_EMU_SWEEP is set (not "0"),
// then prints the count of failed comparisons and returns the program's exit status (0: none).
template <typename Body>
int run_under_schedules(Body body, const int& failures, const int& checks) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* sweep_env = std::getenv("UNTIED_EMU_SWEEP");
  const std::string sweep = sweep_env != nullptr ? sweep_env : "";
  std::vector<emu::Options> runs;
  if (sweep.empty() || sweep == "0") {
    runs = {{.schedule = emu::Schedule::kLanesReverse},
            {.schedule = emu::Schedule::kWarpsRandom, .seed = 7},
            {.schedule = emu::Schedule::kWarpsForward}};
  } else {
    for (const emu::Schedule s : emu::kAllSchedules) runs.push_back({.schedule = s});
  }
  for (const emu::Options& o : runs) {
    std::printf("schedule %s\n", emu::schedule_name(o.schedule));
    emu::g_options = o;
    body();
  }
  std::printf("%d of %d comparisons failed, %lld fiber switches\n", failures, checks, emu::g_switches);
  return failures == 0 ? 0 : 1;
}

}  // namespace
