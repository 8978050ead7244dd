// The emulated tests' input generator: one xorshift64 stream per test program, so a run is
// reproducible from its start.
#pragma once

#include <cstdint>

namespace {

uint64_t g_rng_state = 12345;

// Uniform in [-1, 1).
inline float uniform_pm1() {
  g_rng_state ^= g_rng_state << 13;
  g_rng_state ^= g_rng_state >> 7;
  g_rng_state ^= g_rng_state << 17;
  return static_cast<float>((g_rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

}  // namespace
