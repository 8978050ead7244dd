// Checked size products (checked_math.h).
#include "untied/core/checked_math.h"

#include <cmath>
#include <string>

#include "untied/core/check.h"

namespace untied {

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

int64_t first_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

int64_t mul_or_throw(int64_t a, int64_t b, std::string_view what) {
  const std::optional<int64_t> p = checked_mul(a, b);
  if (!p)
    throw Error(ErrorKind::kInvalidArgument,
                std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                    (a < 0 || b < 0 ? " has a negative factor" : " does not fit in a 64-bit count") +
                    " (a length or shape too large for any buffer: make it smaller)");
  return *p;
}

}  // namespace untied
