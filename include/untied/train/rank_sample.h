// One sample of a data source as this rank's share of the decoder's input: the tokens and labels
// of the positions the rank holds (token_layout.h: one run, or two with a ring) and the sample's
// attention mask. The trainer and the evaluator both build their inputs this way.
//
// S real tokens are run as Sp >= S (padded so that the ranks divide it): rows at positions >= S
// get token 0, label kIgnoreIndex and no answer, and the mask makes the padding a document of
// its own. The mask holds the sample's documents (DataSource::document_starts) and the window;
// with doc_mask false, attention crosses the documents (RoPE positions still restart).
// Rows are in the rank's row order: segment by segment, as the decoder lays them out.
#pragma once

#include <cstdint>
#include <span>

#include "untied/attention/sequence_mask.h"
#include "untied/attention/token_layout.h"
#include "untied/core/status.h"
#include "untied/train/data_source.h"

namespace untied {

struct SampleShape {
  int64_t seq = 0;         // S, real tokens
  int64_t padded_seq = 0;  // Sp, what the decoder runs
  int64_t window = 0;      // 0: none
  bool doc_mask = true;
};

// tokens, labels, answer: the rank's rows (the segments' total length). *mask: over Sp tokens.
// Returns the data's error (a corrupt token, bad document starts), naming it.
Status fill_rank_sample(const DataSource& data, int64_t sample, const SampleShape& shape,
                        std::span<const TokenSegment> segments, int32_t* tokens, int32_t* labels, uint8_t* answer,
                        SequenceMask* mask);

}  // namespace untied
