// The zig-zag token layout (token_layout.h).
#include "untied/attention/token_layout.h"

#include <algorithm>

#include "untied/core/check.h"

namespace untied {

namespace {
// Appends a segment, merged into the previous one when rows and positions both continue it.
void append(std::vector<TokenSegment>& out, TokenSegment s) {
  if (s.length <= 0) return;
  if (!out.empty()) {
    TokenSegment& b = out.back();
    if (b.first_row + b.length == s.first_row && b.first_position + b.length == s.first_position) {
      b.length += s.length;
      return;
    }
  }
  out.push_back(s);
}
}  // namespace

int64_t TokenLayout::chunk_position(int j, int c) const {
  const int64_t lc = chunk_tokens();
  if (order_ == RingOrder::kContiguous) return (2 * int64_t{j} + c) * lc;
  return (c == 0 ? int64_t{j} : 2 * int64_t{ring_} - 1 - j) * lc;
}

std::vector<TokenSegment> TokenLayout::group_segments(int j) const {
  UNTIED_CHECK(j >= 0 && j < ring_, "token layout: ring group ", j, " of ", ring_);
  std::vector<TokenSegment> out;
  if (ring_ == 1) {
    append(out, {0, 0, seq_});
    return out;
  }
  const int64_t lc = chunk_tokens();
  append(out, {0, chunk_position(j, 0), lc});
  append(out, {lc, chunk_position(j, 1), lc});
  return out;
}

std::vector<TokenSegment> sub_segments(const std::vector<TokenSegment>& segs, int64_t row0, int64_t rows) {
  std::vector<TokenSegment> out;
  for (const TokenSegment& s : segs) {
    const int64_t a = std::max(s.first_row, row0), b = std::min(s.first_row + s.length, row0 + rows);
    if (a < b) append(out, {a - row0, s.first_position + (a - s.first_row), b - a});
  }
  return out;
}

std::vector<TokenSegment> TokenLayout::rank_segments(int rank) const {
  UNTIED_CHECK(rank >= 0 && rank < ranks(), "token layout: rank ", rank, " of ", ranks());
  const int64_t L = local_tokens();
  return sub_segments(group_segments(rank / group_), (rank % group_) * L, L);
}

int64_t TokenLayout::position(int rank, int64_t row) const {
  for (const TokenSegment& s : rank_segments(rank))
    if (row >= s.first_row && row < s.first_row + s.length) return s.first_position + (row - s.first_row);
  fail(ErrorKind::kInvalidArgument, str_cat("token layout: row ", row, " of a rank holding ", local_tokens()));
}

}  // namespace untied
