// Needle in a haystack (passkey retrieval): can the model find a fact anywhere in a long context?
// The test long-context papers and users run first, here scored without generation.
//
// For each context length Lx of a grid (lengths) and each depth d of a grid (depths, percent of
// the haystack), `trials` sequences of exactly Lx tokens:
//     [BOS] haystack[0, a) NEEDLE haystack[a, H) QUESTION KEY
// NEEDLE is "\n\nThe special magic number is: KEY.\n\n" (multi-key: `keys` needles "... for NAME
// is: KEY.", each a different name and key, the asked one at depth d and the others at seeded
// depths; RULER's MK-NIAH); QUESTION is "\n\nWhat is the special magic number (for NAME)? The
// special magic number (for NAME) is: ", followed by the asked KEY's tokens (7 random digits, or a
// word with key_kind "word"). The haystack is H tokens of the user's data (trial t reads sample t
// of it at length H: its own stretch) or of a built-in English filler; a = round(d/100 * H).
// Keys, names and depths come from `seed` and the cell, the same on every rank and every run.
//
// Scoring (teacher-forced, so every rank layout gives the same numbers within fp32 order): at
// each KEY token the model predicts the next token; per cell, `accuracy` is the share of KEY
// tokens predicted right (top-1), `exact` the share of trials whose KEY tokens are all right,
// and `loglik` the mean over trials of the KEY tokens' summed log-likelihood (nats). No decode
// loop is involved.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/json.h"
#include "untied/core/status.h"
#include "untied/train/data_source.h"

namespace untied {

struct NeedleOptions {
  std::vector<int64_t> lengths;  // context lengths, each >= 64
  std::vector<int64_t> depths;   // percent, 0..100
  int64_t trials = 4;
  int64_t keys = 1;              // needles per sequence (one asked)
  std::string key_kind = "digits";
  uint64_t seed = 0;
};

// Text to ids (the model's tokenizer, no special tokens added) and the BOS to put first, if any.
struct NeedleTokenizer {
  std::function<std::vector<int32_t>(std::string_view)> encode;
  std::optional<int32_t> bos;
};

// One cell's sequences, a DataSource: sample k (k < trials) is trial k; only the KEY tokens are
// labelled (is_answer marks them); one document.
struct NeedleSequence {
  std::vector<int32_t> tokens;
  int64_t answer_begin = 0, answer_end = 0;  // the KEY tokens [answer_begin, answer_end)
  int64_t needle_at = 0;                     // where the asked needle begins
  std::string key, name;
};

// The trials of cell (length, depth): `haystack` (null: the built-in filler) gives trial t's
// haystack as its sample t at the needed length. invalid_argument when the needle and question
// do not fit in `length` with 16 tokens of haystack, or a haystack read fails.
StatusOr<std::vector<NeedleSequence>> make_needle_cell(const NeedleTokenizer& tok, const DataSource* haystack,
                                                       const NeedleOptions& o, int64_t length, int64_t depth);

class NeedleCellSource final : public DataSource {
 public:
  NeedleCellSource(std::vector<NeedleSequence> sequences, int64_t vocab)
      : sequences_(std::move(sequences)), vocab_(vocab) {}
  std::string_view kind() const override { return "needle"; }
  int64_t vocab_size() const override { return vocab_; }
  Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens, int32_t* labels,
              uint8_t* is_answer) const override;
  const std::vector<NeedleSequence>& sequences() const { return sequences_; }

 private:
  std::vector<NeedleSequence> sequences_;
  int64_t vocab_;
};

struct NeedleCell {
  int64_t length = 0, depth = 0, trials = 0, key_tokens = 0;
  double accuracy = 0, exact = 0, loglik = 0;
};

// The JSON table: {"lengths", "depths", "keys", "key_kind", "trials", "cells": [{length, depth,
// accuracy, exact, loglik, key_tokens}], "accuracy": mean over cells}.
Json needle_json(const std::vector<NeedleCell>& cells, const NeedleOptions& o, const std::string& label);
// The heatmap(s): depth (rows, 0% at the top) x length (columns), colour = accuracy (red 0 to
// green 1) with the value written in each cell; one panel per table (before and after side by
// side with --compare). Self-contained SVG.
std::string needle_svg(const std::vector<Json>& tables, const std::string& title);

}  // namespace untied
