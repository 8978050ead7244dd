// Which global positions of the sequence each rank holds.
//
// R ring groups of C consecutive ranks (rank r is member r % C of group r / C). With R = 1 rank r
// holds positions r*L .. r*L + L - 1 (L = S / C), as every strategy without a ring does. With
// R > 1 the layout is zig-zag at ring granularity (the causal load balance of ring attention):
// the sequence is cut into 2R chunks of S / (2R) tokens, and group j holds chunk j followed by
// chunk 2R-1-j (its "group sequence" of S / R rows); inside the group the ranks hold that group
// sequence contiguously, L = S / (R C) rows each. A rank's rows are then one or two segments of
// consecutive positions.
//
// REQUIRES (validate(AttentionConfig) checks them): S % C == 0 when R = 1, S % (2 R C) == 0 when
// R > 1.
#pragma once

#include <cstdint>
#include <vector>

namespace untied {

// Rows [first_row, first_row + length) of a rank's (or a group's) rows hold the global positions
// [first_position, first_position + length).
struct TokenSegment {
  int64_t first_row = 0;
  int64_t first_position = 0;
  int64_t length = 0;
};

// How the ring groups share the sequence: zig-zag (the default, causal load balance) or
// contiguous (group j holds chunks 2j and 2j+1; for measuring the imbalance zig-zag removes).
enum class RingOrder { kZigzag, kContiguous };

class TokenLayout {
 public:
  TokenLayout(int64_t seq, int ring, int group, RingOrder order = RingOrder::kZigzag)
      : seq_(seq), ring_(ring), group_(group), order_(order) {}

  int64_t seq() const { return seq_; }
  int ring() const { return ring_; }
  int group() const { return group_; }
  int ranks() const { return ring_ * group_; }
  int64_t local_tokens() const { return seq_ / ranks(); }          // L
  int64_t group_tokens() const { return seq_ / ring_; }            // S / R
  int64_t chunk_tokens() const { return seq_ / (2 * int64_t{ring_}); }  // S / (2R), R > 1

  RingOrder order() const { return order_; }
  // The first position of chunk c (0 or 1) of ring group j's group sequence.
  int64_t chunk_position(int j, int c) const;
  // The group sequence of ring group j: two segments (one when R = 1), in row order.
  std::vector<TokenSegment> group_segments(int j) const;
  // Rank r's rows: one or two segments in row order (adjacent positions merged into one).
  std::vector<TokenSegment> rank_segments(int rank) const;
  // The global position of rank r's row i.
  int64_t position(int rank, int64_t row) const;

 private:
  int64_t seq_;
  int ring_, group_;
  RingOrder order_;
};

// The segments of rows [row0, row0 + rows) of a list of segments, with first_row relative to row0.
std::vector<TokenSegment> sub_segments(const std::vector<TokenSegment>& segs, int64_t row0, int64_t rows);

}  // namespace untied
