// The draws of random_inputs.h.
#include "common/random_inputs.h"

#include <cmath>

#include "common/compare.h"

namespace untied::test {

std::vector<double> normal_values(Rng& rng, int64_t n, DType t, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return stored_as(x, t);
}

std::vector<double> uniform_values(Rng& rng, int64_t n, DType t, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return stored_as(x, t);  // rounding to storage may land on hi
}

std::vector<int32_t> uniform_ints(Rng& rng, int64_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

std::vector<double> quantized(Rng& rng, int64_t n, int levels, double unit) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> x(static_cast<size_t>(n));
  for (auto& v : x) v = unit * std::round(static_cast<double>(levels) * dist(rng));
  return x;
}

}  // namespace untied::test
