// The training data layer: what the trainer includes.
//
// Three kinds of source behind one interface (DataSource, data_source.h):
//   "kv"     the synthetic key-value retrieval task (kv_task.h); no file. vocab 3 + K + V.
//   "tokens" a token file (token_file.h). Sample i is the S tokens starting at token i*S of the
//            file, wrapping around its end (token t of the stream is file token t mod N), so
//            every sample index is valid and consecutive samples tile the file. A fill of count
//            positions reads count + 1 tokens (count at the sequence's end) with pread, and
//            checks them against the vocab; nothing else of the file is read.
//   "text"   a plain text file, tokenized in memory at creation by the byte-level tokenizer
//            (tokenizer.h: BOS doc EOS per document, vocab 259), then sampled exactly like a
//            token file.
// For "tokens" and "text" every label is the next token (kIgnoreIndex only at the sequence's
// last position) and is_answer marks every labelled position, so the accuracy metric is top-1
// next-token accuracy. For "kv", see kv_task.h.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "untied/core/status.h"
#include "untied/train/data_source.h"
#include "untied/train/kv_task.h"
#include "untied/train/token_file.h"
#include "untied/train/tokenizer.h"

namespace untied {

struct DataOptions {
  KvTaskOptions kv = {};                                 // kind "kv"
  DocumentSplit text_split = DocumentSplit::kBlankLines;  // kind "text"
};

// The source of `kind` ("kv", "tokens" or "text") reading `path` (must be empty for "kv").
// Returns invalid_argument for an unknown kind, a path given to "kv" or missing for the others,
// or bad kv options; the file errors of TokenFile::open / read_text_tokens otherwise. Every
// message names what to change.
StatusOr<std::unique_ptr<DataSource>> make_data_source(std::string_view kind, const std::string& path,
                                                       const DataOptions& options);

}  // namespace untied
