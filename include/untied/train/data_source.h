// DataSource: where the trainer's tokens and next-token labels come from.
//
// A source defines, for every sample index i >= 0 and sequence length S, one sequence of S
// tokens. The trainer asks for a range of positions of it: with context parallelism, rank r of
// C asks for [r*L, (r+1)*L), L = S / C, and never sees the rest. Because a label is the NEXT
// token, the last position of rank r's range is labelled with the first token of rank r+1's
// range; fill() reads that one extra token itself, so ranks need no communication for labels.
//
// Thread safety: fill() is const and may be called concurrently from several threads (in-process
// ranks share one source). Ownership: a source owns whatever it reads (an open file, a token
// array); the caller owns the buffers it passes in.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/status.h"

namespace untied {

// The label of a position whose next token is not to be predicted (cross-entropy skips it).
inline constexpr int32_t kIgnoreIndex = -100;

class DataSource {
 public:
  virtual ~DataSource() = default;

  virtual std::string_view kind() const = 0;  // "kv", "tokens", "text"
  // Tokens are in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  // The tokens of the stream the samples tile (a token file's, a text's) before they wrap around
  // it; 0 for a synthetic source without end.
  virtual int64_t stream_tokens() const { return 0; }
  // The samples of seq_len tokens that one pass over the data makes (what eval reads by default):
  // stream_tokens() / seq_len, or the packed sequences of supervised samples (data.h); 0 for a
  // synthetic source.
  virtual int64_t samples_per_pass(int64_t seq_len) const { return stream_tokens() / seq_len; }

  // Positions [start, start + count) of sample `sample_index`, a sequence of seq_len tokens:
  //   tokens[i]    = the token at position p = start + i;
  //   labels[i]    = the token at p + 1 of the same sample, or kIgnoreIndex where p = seq_len - 1
  //                  or where the source documents the next token as unpredictable;
  //   is_answer[i] = 1 where position p counts for the accuracy metric, else 0 (not written when
  //                  is_answer is null).
  // Overwrites tokens[0, count), labels[0, count) and is_answer[0, count). Every value is a pure
  // function of (source, sample_index, seq_len, p): any split of [0, seq_len) into ranges gives
  // exactly what one call over the whole sequence gives.
  // REQUIRES: sample_index >= 0, seq_len >= 1, start >= 0, count >= 0, start + count <= seq_len;
  //           tokens and labels hold count values (is_answer too when not null).
  // Returns a non-ok Status for conditions the user can fix (a corrupt token in a file, a
  // seq_len too short for a synthetic task), naming what to change.
  virtual Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens,
                      int32_t* labels, uint8_t* is_answer) const = 0;

  // The documents packed into sample `sample_index` (seq_len tokens): the positions where each
  // one starts, increasing, the first 0 (the attention mask, sequence_mask.h). A source without
  // boundaries (a version 1 token file) returns {0}. Like fill(), a pure function of the data:
  // every rank computes the same, with no communication. fill() gives kIgnoreIndex to a position
  // whose next token starts a document (no label crosses one).
  virtual StatusOr<std::vector<int64_t>> document_starts(int64_t sample_index, int64_t seq_len) const {
    (void)sample_index;
    (void)seq_len;
    return std::vector<int64_t>{0};
  }

  // How many tokens of the sample's first document come before the sample (0 when the sample
  // begins with a document, or for a source without documents): with document_starts, a
  // token's position in its document. A pure function, like fill().
  virtual int64_t first_document_offset(int64_t sample_index, int64_t seq_len) const {
    (void)sample_index;
    (void)seq_len;
    return 0;
  }
  // The source has document boundaries (a token file with an index, text, packed samples).
  virtual bool has_documents() const { return false; }
  // Supervised samples (packed whole, data.h) longer than seq_len, which are cut at seq_len.
  virtual int64_t samples_cut(int64_t seq_len) const {
    (void)seq_len;
    return 0;
  }

  // How far the first `samples` samples (indices 0 .. samples - 1) of seq_len tokens have gone
  // through each stream of the data: one entry per stream (a file, a group of files, a text),
  // `passes` the sequences' tokens drawn from it over its size (2.5: the middle of the third
  // pass). Empty for a synthetic source without end. A pure function, like fill().
  struct Pass {
    std::string name;
    double passes = 0;
  };
  virtual std::vector<Pass> passes(int64_t samples, int64_t seq_len) const {
    (void)samples;
    (void)seq_len;
    return {};
  }
};

}  // namespace untied
