// The search behind --fit (untied plan) and --fit-seq (untied train): the largest k >= 1 with
// fits(k), for a fits that holds up to some k and not beyond.
#pragma once

#include <cstdint>
#include <functional>

namespace untied::cli {

// Doubles k from 1 until fits(k) fails (or k passes 2^24), then bisects between the last k that
// fit and the first that did not. Returns that largest k, or 0 when fits(1) fails. The last call
// that returned true was fits(result), so a fits that records what it saw when it holds leaves
// the result's record behind.
inline int64_t largest_fitting(const std::function<bool(int64_t)>& fits) {
  int64_t lo = 0, hi = 0;  // lo fits (0 = none yet), hi does not (0 = not found yet)
  for (int64_t k = 1; hi == 0 && k <= (int64_t{1} << 24); k *= 2) (fits(k) ? lo : hi) = k;
  if (lo == 0) return 0;
  while (hi != 0 && hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace untied::cli
