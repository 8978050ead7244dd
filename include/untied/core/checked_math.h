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

}  // namespace untied
