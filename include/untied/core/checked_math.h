// Sizes that cannot lie: products of element counts and byte counts checked against int64's
// range, so that a length no buffer could hold is an error naming what was being sized, never a
// count that wraps to a small (or negative) number and a buffer written past its end.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace untied {

// a * b, or nothing where either is negative or the product does not fit in int64.
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
// a * b; throws Error(kInvalidArgument) naming `what` where checked_mul has nothing.
int64_t mul_or_throw(int64_t a, int64_t b, std::string_view what);

// The index of the first NaN or infinity of x[0..n), or -1: weights read or about to be written are
// checked with it, so that a non-finite value is an error naming its tensor, never saved silently.
int64_t first_nonfinite(const float* x, int64_t n);

}  // namespace untied
