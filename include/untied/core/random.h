// Counter-based random numbers: the value at (seed, stream, index) is a pure function, so every
// rank can generate its own shard of a global tensor (or a full copy of the weights) and get the
// same numbers as a single rank would, with no communication and in any order.
#pragma once

#include <cstdint>

#include "untied/core/tensor.h"

namespace untied {

// Uniform in [-1, 1), from a SplitMix64 hash of (seed, stream, index).
inline float hash_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ index;
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) * (1.0 / 8388608.0) - 1.0);
}

// t (contiguous, f32 or bf16) [i] = scale * hash_uniform(seed, stream, first_index + i).
void fill_hash_uniform(const Tensor& t, uint64_t seed, uint64_t stream, int64_t first_index, float scale);

}  // namespace untied
