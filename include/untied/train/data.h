// The training data layer: what the trainer includes.
//
// Three kinds of source behind one interface (DataSource, data_source.h):
//   "kv"     the synthetic key-value retrieval task (kv_task.h); no file. vocab 3 + K + V.
//   "tokens" token files (token_file.h); "text" plain text files, tokenized in memory at creation
//            by the byte-level tokenizer (tokenizer.h: BOS doc EOS per document, vocab 259).
// The path of "tokens" and "text" lists one or more files, comma-separated, each a path or a glob
// pattern (`data/*.tok`, expanded in name order; a pattern that matches nothing is an error).
// Without weights the files are one stream, in the order given (a file's end is a document
// boundary); with weights (DataOptions::weights, one per entry of the path) each entry is its own
// stream and sample i is drawn from stream g with probability weights[g] / sum, by a
// low-discrepancy sequence (the shares of any n consecutive samples are within a few samples of
// the weights'), seeded by DataOptions::seed.
// Sample k of a stream of N tokens (its k-th sequence of S tokens):
//   in order (shuffle false): the S tokens from stream token k*S, wrapping around the end (token t
//            of the stream is token t mod N); so with one stream sample i is token i*S onwards,
//            consecutive samples tile the data;
//   shuffled: pass e = k / P of the P = max(1, N / S) whole sequences of the stream, taken in a
//            seeded random order (a bijection of [0, P) per pass: no sequence twice in a pass),
//            from an offset that the pass draws in [0, N - P*S] (so the tail is read too).
// Every sample is a pure function of (options, paths, i): deterministic, the same on every rank,
// and a resumed run reads what an uninterrupted one would.
// Labels: the next token (kIgnoreIndex at the sequence's last position, before a document's
// first token, and, in a token file with a loss mask (version 3: supervised fine-tuning), before
// a token that is not a target); is_answer marks every labelled position, so the accuracy metric is top-1
// next-token accuracy. For "kv", see kv_task.h.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/status.h"
#include "untied/train/data_source.h"
#include "untied/train/kv_task.h"
#include "untied/train/token_file.h"
#include "untied/train/tokenizer.h"

namespace untied {

struct DataOptions {
  KvTaskOptions kv = {};                                 // kind "kv"
  DocumentSplit text_split = DocumentSplit::kBlankLines;  // kind "text"
  // "tokens" and "text":
  std::vector<double> weights;  // one per entry of the path (a mix), or empty (one stream)
  bool shuffle = false;         // sequences in a seeded random order within each pass
  uint64_t seed = 0;            // the mix's and the shuffle's
  // When > 0: a stream shorter than one sequence of seq_len tokens is refused, unless repeat (its
  // tokens then repeat within a sequence).
  int64_t seq_len = 0;
  bool repeat = false;
};

// The files a data path names: comma-separated entries, each a file or a glob pattern (its
// matches in name order). invalid_argument for an empty entry or a pattern matching nothing.
StatusOr<std::vector<std::vector<std::string>>> expand_data_path(const std::string& path);

// The source of `kind` ("kv", "tokens" or "text") reading `path` (must be empty for "kv").
// Returns invalid_argument for an unknown kind, a path given to "kv" or missing for the others,
// or bad kv options; the file errors of TokenFile::open / read_text_tokens otherwise. Every
// message names what to change.
StatusOr<std::unique_ptr<DataSource>> make_data_source(std::string_view kind, const std::string& path,
                                                       const DataOptions& options);

}  // namespace untied
