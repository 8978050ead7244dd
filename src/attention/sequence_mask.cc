// Documents and windows of one sequence (sequence_mask.h).
#include "untied/attention/sequence_mask.h"

#include <algorithm>
#include <string>

#include "untied/core/check.h"

namespace untied {

SequenceMask::SequenceMask(int64_t seq, int64_t window) : seq_(seq), window_(window) {
  UNTIED_ASSERT(seq >= 0 && window >= 0, "SequenceMask(", seq, ", ", window, ")");
  if (seq > 0) starts_.push_back(0);
}

StatusOr<SequenceMask> SequenceMask::from_lengths(const std::vector<int64_t>& lengths, int64_t window) {
  if (lengths.empty()) return Status::invalid_argument("documents: give at least one document length");
  std::vector<int64_t> starts;
  int64_t seq = 0;
  for (size_t d = 0; d < lengths.size(); ++d) {
    if (lengths[d] < 1)
      return Status::invalid_argument("documents: document " + std::to_string(d) + " has length " +
                                      std::to_string(lengths[d]) + "; every document needs at least one token");
    starts.push_back(seq);
    seq += lengths[d];
  }
  return from_starts(seq, std::move(starts), window);
}

StatusOr<SequenceMask> SequenceMask::from_starts(int64_t seq, std::vector<int64_t> starts, int64_t window) {
  if (window < 0) return Status::invalid_argument("window: must be >= 1 keys (or 0 for none), got " + std::to_string(window));
  if (seq < 1) return Status::invalid_argument("documents: the sequence is empty");
  if (starts.empty() || starts[0] != 0) return Status::invalid_argument("documents: the first document must start at position 0");
  for (size_t d = 1; d < starts.size(); ++d)
    if (starts[d] <= starts[d - 1] || starts[d] >= seq)
      return Status::invalid_argument("documents: start " + std::to_string(starts[d]) + " of document " +
                                      std::to_string(d) + " is not after the previous start and before the end (" +
                                      std::to_string(seq) + ")");
  SequenceMask m(seq, window);
  m.starts_ = std::move(starts);
  return m;
}

SequenceMask SequenceMask::padded_to(int64_t padded) const {
  UNTIED_ASSERT(padded >= seq_, "padded_to(", padded, ") shorter than the sequence (", seq_, ")");
  SequenceMask m = *this;
  if (padded > seq_) {
    m.starts_.push_back(seq_);
    m.seq_ = padded;
  }
  return m;
}

std::vector<int64_t> SequenceMask::lengths() const {
  std::vector<int64_t> out;
  for (size_t d = 0; d < starts_.size(); ++d) out.push_back((d + 1 < starts_.size() ? starts_[d + 1] : seq_) - starts_[d]);
  return out;
}

int64_t SequenceMask::doc_start(int64_t p) const {
  UNTIED_ASSERT(p >= 0 && p < seq_, "doc_start(", p, ") outside a sequence of ", seq_);
  return *(std::upper_bound(starts_.begin(), starts_.end(), p) - 1);
}

SequenceMask SequenceMask::attending_across_documents() const {
  SequenceMask m = *this;
  m.across_ = true;
  return m;
}

int64_t SequenceMask::key_lo(int64_t p) const {
  const int64_t lo = across_ ? 0 : doc_start(p);
  return window_ > 0 ? std::max(lo, p - window_ + 1) : lo;
}

bool SequenceMask::any_visible(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
  // The query that sees k0..k1 if any does: the first one at or after k0 (key_lo grows with p).
  const int64_t q = std::max(q0, k0);
  return q <= q1 && key_lo(q) <= k1;
}

std::vector<int64_t> SequenceMask::rope_positions(const std::vector<TokenSegment>& segments) const {
  std::vector<int64_t> out;
  for (const TokenSegment& s : segments) {
    if (static_cast<int64_t>(out.size()) < s.first_row + s.length) out.resize(s.first_row + s.length);
    for (int64_t i = 0; i < s.length; ++i) out[s.first_row + i] = rope_position(s.first_position + i);
  }
  return out;
}

double SequenceMask::visible_pairs() const {
  double pairs = 0;
  if (across_) {  // one causal sequence, windowed
    const int64_t w = window_ > 0 ? std::min(window_, seq_) : seq_;
    return static_cast<double>(w) * (w + 1) / 2 + static_cast<double>(seq_ - w) * w;
  }
  for (const int64_t n : lengths()) {
    const int64_t w = window_ > 0 ? std::min(window_, n) : n;
    // Rows 0..w-1 of a document see 1..w keys; the rest see w each.
    pairs += static_cast<double>(w) * (w + 1) / 2 + static_cast<double>(n - w) * w;
  }
  return pairs;
}

int64_t padded_seq(int64_t seq, int ranks, int64_t ring) {
  UNTIED_ASSERT(ranks >= 1 && ring >= 1 && ranks % ring == 0, "padded_seq: ", ring, " ring groups of ", ranks, " ranks");
  const int64_t unit = ring > 1 ? 2 * int64_t{ranks} : int64_t{ranks};
  return (seq + unit - 1) / unit * unit;
}

}  // namespace untied
