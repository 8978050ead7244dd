// The random inputs of every test (tests/common, library untied_test_common): one engine and
// the few draws the tests make from it.
//
// The engine is std::mt19937_64 (Rng), seeded by the test; each draw takes the engine and
// advances it, so a test's inputs are a function of its seed and the order of its draws (the
// fixtures and budgets of the kernel tests were measured on exactly these streams). Values are
// exactly representable in the storage type they are made for (rounded through it), so the
// same numbers can be stored as f32 or bf16 without another rounding.
//
//   normal_values:  N(0, sigma^2)                 (kernel and block tests: inputs, weights)
//   uniform_values: uniform in [lo, hi], rounded   (cross-backend op test: inputs, prior contents)
//   uniform_ints:   uniform integers in [lo, hi]   (ids, labels)
//   quantized:      unit * round(levels * u), u uniform in [-1, 1): integers in [-levels, levels]
//                   times unit, exact in bf16 for levels <= 256 and unit a power of two (inputs
//                   whose products and sums are exact in fp32)
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "untied/core/dtype.h"

namespace untied::test {

using Rng = std::mt19937_64;

std::vector<double> normal_values(Rng& rng, int64_t n, DType t, double sigma = 1.0);
std::vector<double> uniform_values(Rng& rng, int64_t n, DType t, double lo = -1.0, double hi = 1.0);
std::vector<int32_t> uniform_ints(Rng& rng, int64_t n, int32_t lo, int32_t hi);
std::vector<double> quantized(Rng& rng, int64_t n, int levels, double unit);

// The kernel tests' historical name for normal_values.
inline std::vector<double> random_values(Rng& rng, int64_t n, DType t, double sigma = 1.0) {
  return normal_values(rng, n, t, sigma);
}

}  // namespace untied::test
