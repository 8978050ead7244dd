// The built-in byte-level tokenizer for plain text, and text -> token file conversion.
//
// Ids 0..255 are the bytes of the text (so any byte sequence, UTF-8 or not, round-trips; UTF-8
// is not validated). Three special ids follow: kBos = 256 (begins a document), kEos = 257 (ends
// one) and kPad = 258 (never produced by encoding; free for trainers that pad). The vocab size
// is the constant kByteVocabSize = 259.
//
// A text becomes a token stream document by document: each document is BOS, its bytes, EOS, and
// documents follow each other in order. Documents are either the blocks of a text separated by
// blank lines (lines that are empty or hold only spaces, tabs or CR), each block keeping its
// inner newlines but not its final one, or lines (each non-blank line one document, without its
// terminator), or whole files (one document per file). Blocks or files
// with no non-whitespace byte are dropped.
//
// Everything here is a pure function of its arguments and safe to call from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "untied/core/status.h"

namespace untied {

inline constexpr int32_t kBos = 256;
inline constexpr int32_t kEos = 257;
inline constexpr int32_t kPad = 258;
inline constexpr int64_t kByteVocabSize = 259;

enum class DocumentSplit { kBlankLines, kLines, kWholeFile };
// "blank-lines", "lines" (one document per non-blank line) or "file"; invalid_argument otherwise.
StatusOr<DocumentSplit> parse_document_split(std::string_view s);
enum class SpecialTokens { kSkip, kShow };

// One id per byte of text, in order (ids 0..255; no BOS/EOS).
std::vector<int32_t> byte_encode(std::string_view text);

// The bytes of ids 0..255 in order. Specials are dropped (kSkip) or written as the markers
// "<bos>", "<eos>", "<pad>" (kShow); an id outside [0, kByteVocabSize) is always written as
// "<unk:ID>" so that a model's stray output stays visible.
std::string byte_decode(std::span<const int32_t> ids, SpecialTokens specials = SpecialTokens::kSkip);

// The documents of text under `split` (views into text), in order, empty ones dropped.
std::vector<std::string_view> split_documents(std::string_view text, DocumentSplit split);

// BOS doc EOS for each document of text, concatenated.
std::vector<int32_t> text_to_tokens(std::string_view text, DocumentSplit split);

// Reads each file and tokenizes it with text_to_tokens (kWholeFile: one document per file).
// Returns not_found naming a file that cannot be read, invalid_argument when the files hold no
// document at all.
StatusOr<std::vector<int32_t>> read_text_tokens(const std::vector<std::string>& text_paths, DocumentSplit split);

// The positions of the documents' BOS tokens in ids: the document index of a token file.
std::vector<int64_t> bos_positions(std::span<const int32_t> ids);
// read_text_tokens, then write_token_file(token_path, ..., kByteVocabSize, 2, bos_positions),
// atomically: a version 2 file with its documents.
Status text_files_to_token_file(const std::vector<std::string>& text_paths, const std::string& token_path,
                                DocumentSplit split);

}  // namespace untied
