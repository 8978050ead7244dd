#include "untied/train/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "untied/core/file_io.h"
#include "untied/train/token_file.h"

namespace untied {
namespace {

bool is_blank_char(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\n'; }

bool all_blank(std::string_view s) {
  for (char c : s)
    if (!is_blank_char(c)) return false;
  return true;
}

}  // namespace

std::vector<int32_t> byte_encode(std::string_view text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string byte_decode(std::span<const int32_t> ids, SpecialTokens specials) {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out += static_cast<char>(static_cast<unsigned char>(id));
    } else if (id == kBos || id == kEos || id == kPad) {
      if (specials == SpecialTokens::kShow) out += id == kBos ? "<bos>" : id == kEos ? "<eos>" : "<pad>";
    } else {
      out += "<unk:" + std::to_string(id) + ">";
    }
  }
  return out;
}

StatusOr<DocumentSplit> parse_document_split(std::string_view s) {
  if (s == "blank-lines") return DocumentSplit::kBlankLines;
  if (s == "lines") return DocumentSplit::kLines;
  if (s == "file") return DocumentSplit::kWholeFile;
  return Status::invalid_argument("unknown document split '" + std::string(s) + "': use blank-lines, lines or file");
}

std::vector<int64_t> bos_positions(std::span<const int32_t> ids) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == kBos) out.push_back(static_cast<int64_t>(i));
  return out;
}

std::vector<std::string_view> split_documents(std::string_view text, DocumentSplit split) {
  std::vector<std::string_view> docs;
  if (split == DocumentSplit::kWholeFile) {
    if (!all_blank(text)) docs.push_back(text);
    return docs;
  }
  // Walk the lines; a document runs from the start of its first non-blank line to the end of
  // its last one (without that line's terminator).
  size_t doc_begin = std::string_view::npos, doc_end = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    size_t content_end = eol;
    if (content_end > pos && text[content_end - 1] == '\r') --content_end;
    const std::string_view line = text.substr(pos, content_end - pos);
    if (split == DocumentSplit::kLines) {
      if (!all_blank(line)) docs.push_back(line);
    } else if (all_blank(line)) {
      if (doc_begin != std::string_view::npos) docs.push_back(text.substr(doc_begin, doc_end - doc_begin));
      doc_begin = std::string_view::npos;
    } else {
      if (doc_begin == std::string_view::npos) doc_begin = pos;
      doc_end = content_end;
    }
    pos = eol + 1;
  }
  if (doc_begin != std::string_view::npos) docs.push_back(text.substr(doc_begin, doc_end - doc_begin));
  return docs;
}

std::vector<int32_t> text_to_tokens(std::string_view text, DocumentSplit split) {
  std::vector<int32_t> ids;
  for (std::string_view doc : split_documents(text, split)) {
    ids.push_back(kBos);
    for (char c : doc) ids.push_back(static_cast<unsigned char>(c));
    ids.push_back(kEos);
  }
  return ids;
}

StatusOr<std::vector<int32_t>> read_text_tokens(const std::vector<std::string>& text_paths, DocumentSplit split) {
  if (text_paths.empty()) return Status::invalid_argument("no text files given: name at least one");
  std::vector<int32_t> ids;
  for (const std::string& path : text_paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      return Status::invalid_argument(path + " is a directory: name the text files in it");
    // (Read whole, one byte a token: beyond 4 GiB `untied prepare` makes a token file instead.)
    auto text = read_regular_file(path, int64_t{4} << 30, "text file");
    if (!text.ok()) return text.status();
    const std::vector<int32_t> part = text_to_tokens(text.value(), split);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  if (ids.empty()) {
    std::string names = text_paths[0];
    if (text_paths.size() > 1) names += " and " + std::to_string(text_paths.size() - 1) + " more";
    return Status::invalid_argument("the text files (" + names + ") hold no text, only whitespace: give files with text");
  }
  return ids;
}

Status text_files_to_token_file(const std::vector<std::string>& text_paths, const std::string& token_path,
                                DocumentSplit split) {
  StatusOr<std::vector<int32_t>> ids = read_text_tokens(text_paths, split);
  if (!ids.ok()) return ids.status();
  return write_token_file(token_path, ids.value(), kByteVocabSize, 2, bos_positions(ids.value()));
}

}  // namespace untied
