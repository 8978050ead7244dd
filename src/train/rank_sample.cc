// A sample's rows on this rank and its mask (rank_sample.h).
#include "untied/train/rank_sample.h"

#include <algorithm>
#include <utility>

namespace untied {

Status fill_rank_sample(const DataSource& data, int64_t sample, const SampleShape& shape,
                        std::span<const TokenSegment> segments, int32_t* tokens, int32_t* labels, uint8_t* answer,
                        SequenceMask* mask) {
  const int64_t S = shape.seq;
  for (const TokenSegment& seg : segments) {
    const int64_t at = seg.first_row;
    const int64_t real = std::clamp<int64_t>(S - seg.first_position, 0, seg.length);  // the rest is padding
    if (real > 0) {
      Status s = data.fill(sample, S, seg.first_position, real, tokens + at, labels + at, answer + at);
      if (!s.ok()) return s;
    }
    std::fill(tokens + at + real, tokens + at + seg.length, 0);
    std::fill(labels + at + real, labels + at + seg.length, kIgnoreIndex);
    std::fill(answer + at + real, answer + at + seg.length, 0);
  }
  // The sample's documents, from the data alone (every rank gets the same).
  auto starts = data.document_starts(sample, S);
  if (!starts.ok()) return starts.status();
  auto m = SequenceMask::from_starts(S, std::move(starts).value(), shape.window);
  if (!m.ok()) return m.status();
  *mask = shape.doc_mask ? m.value().padded_to(shape.padded_seq)
                         : m.value().padded_to(shape.padded_seq).attending_across_documents();
  return Status::ok_status();
}

}  // namespace untied
