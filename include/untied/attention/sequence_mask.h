// The attention mask of one sequence: the documents packed into it and an optional sliding
// window.
//
// A sequence of S tokens (global positions 0 .. S-1) holds documents back to back: document d
// covers positions [starts[d], starts[d+1]) (the last one ends at S; starts[0] = 0). A query at
// position p sees the keys at positions j with
//     key_lo(p) <= j <= p,     key_lo(p) = max(doc_start(p), p - W + 1)   (W = 0: no window),
// the block-diagonal causal mask, banded by the window. One document and no window is the plain
// causal mask. key_lo is non-decreasing in p, so the keys that a run of queries sees, and the
// queries that see a run of keys, are each one contiguous range: the kernels' tile skipping
// relies on it.
//
// RoPE positions restart at each document: the token at p rotates by p - doc_start(p), as Hugging
// Face packing with position_ids does.
//
// Padding: a sequence that the ranks do not divide is run padded to the next length they do
// (padded_seq). The padding is one more document at the end: causal attention never lets an
// earlier token see it, and no loss counts it, so every real token's result is the unpadded one.
//
// A mask is a plain value: every rank builds the same one from the data alone (no communication).
#pragma once

#include <cstdint>
#include <vector>

#include "untied/attention/token_layout.h"
#include "untied/core/status.h"

namespace untied {

class SequenceMask {
 public:
  SequenceMask() = default;  // no tokens
  // One causal sequence of `seq` tokens, with a window of `window` keys (0 = none).
  // REQUIRES: seq >= 0, window >= 0 (from_lengths checks user input).
  explicit SequenceMask(int64_t seq, int64_t window = 0);

  // Documents of the given lengths back to back (S = their sum). invalid_argument, naming the
  // bad value, for no lengths, a length < 1 or a window < 0.
  static StatusOr<SequenceMask> from_lengths(const std::vector<int64_t>& lengths, int64_t window = 0);
  // Documents starting at `starts` (strictly increasing, starts[0] = 0, each < seq).
  static StatusOr<SequenceMask> from_starts(int64_t seq, std::vector<int64_t> starts, int64_t window = 0);

  // This mask on `padded` >= seq() tokens: positions seq() .. padded-1 are one more document.
  SequenceMask padded_to(int64_t padded) const;
  // The same documents (RoPE restarting at each) with attention across them: what a packed
  // sequence gets when the mask is lost (the common context-parallel packing bug). For measuring
  // what the mask is worth; key_lo then follows the window alone.
  SequenceMask attending_across_documents() const;
  bool attends_across_documents() const { return across_; }
  // Whether the kernels need the document starts: more than one document, not attended across.
  bool masks_documents() const { return starts_.size() > 1 && !across_; }

  int64_t seq() const { return seq_; }
  int64_t window() const { return window_; }
  const std::vector<int64_t>& starts() const { return starts_; }
  int64_t num_docs() const { return static_cast<int64_t>(starts_.size()); }
  std::vector<int64_t> lengths() const;
  // One document, no window: the kernels' plain causal path, RoPE at global positions.
  bool plain() const { return starts_.size() <= 1 && window_ == 0; }

  // REQUIRES: 0 <= p < seq().
  int64_t doc_start(int64_t p) const;
  int64_t key_lo(int64_t p) const;
  int64_t rope_position(int64_t p) const { return p - doc_start(p); }
  // Whether some query in positions [q0, q1] sees some key in [k0, k1] (inclusive, non-empty).
  bool any_visible(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const;
  // The RoPE positions of the rows the segments give (token_layout.h), in row order.
  std::vector<int64_t> rope_positions(const std::vector<TokenSegment>& segments) const;
  // The (query, key) pairs the mask lets through: the work of a causal attention over it.
  double visible_pairs() const;

 private:
  int64_t seq_ = 0;
  int64_t window_ = 0;
  std::vector<int64_t> starts_;  // empty only when seq_ == 0
  bool across_ = false;
};

// The shortest length >= seq that `ranks` ranks in ring groups of `ring` run: a multiple of the
// ranks without a ring, of 2 * ranks with one (token_layout.h). REQUIRES: ring divides ranks.
int64_t padded_seq(int64_t seq, int ranks, int64_t ring);

}  // namespace untied
