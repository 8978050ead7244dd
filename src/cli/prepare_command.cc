// `untied prepare`: text or JSON-lines files -> one token file, with a Hugging Face tokenizer
// (hf_tokenizer.h), for `untied train --data tokens --data-path OUT`.
//
// Streams: each input is read a block at a time (--block-bytes), split into documents as it
// arrives, tokenized document by document and appended to a TokenFileWriter, so memory holds
// one block and one document, not a file. An input is a file or "-" (standard input), plain or
// compressed with gzip or zstd (recognised by its first bytes: input_reader.h); binary input is
// refused before anything is written. A document longer than a block is tokenized in
// pieces, cut where the tokenizer promises the result is the same (HfTokenizer::safe_cut); where
// it cannot promise that, the document is kept whole. Each document starts a document of the
// token file (its BOS, when one is added, is the start); documents are [BOS] text [EOS].
//
// Text documents are those of `untied train --data text` (tokenizer.h): blocks between blank
// lines, single lines, or whole files. JSONL: one JSON object per line, the document's text in
// --field; blank lines are skipped, a document whose text is "" is dropped, and a line that is
// not an object with that string field stops the run naming file:line. Every input is checked
// to be readable before the output is created; on any error the temporary is removed and an
// existing output file is left as it was. Exit codes: 0 done, 1 a file could not be read,
// parsed or written, 2 bad usage.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <optional>
#include <filesystem>
#include <set>

#include "cli/args.h"
#include "untied/core/file_io.h"
#include "untied/core/input_reader.h"
#include "cli/prepare_sft.h"
#include "cli/commands.h"
#include "untied/core/allocator.h"
#include "untied/core/json.h"
#include "untied/train/hf_tokenizer.h"
#include "untied/train/token_file.h"
#include "untied/train/tokenizer.h"

namespace untied::cli {
namespace {

void add_prepare_flags(FlagSet& f) {
  f.add("tokenizer", FlagKind::kString, "",
        "tokenizer.json, or a Hugging Face model directory holding it (config.json and tokenizer_config.json beside "
        "it name BOS and EOS)");
  f.add("input", FlagKind::kString, "", "an input file, plain or .gz / .zst, or - for standard input (repeat --input, or name the files after the flags)");
  f.add("output", FlagKind::kString, "", "the token file to write (nothing is there until it is complete)");
  f.add_choice("format", {"text", "jsonl", "prompt-completion", "messages"}, "",
        "text or jsonl (default: by each file's extension, .jsonl and .json are jsonl, anything else text); for "
        "supervised fine-tuning, JSONL of prompt-completion ({\"prompt\", \"completion\"}) or messages "
        "({\"messages\": [{\"role\", \"content\"}, ...]}, rendered with the model's chat template): a token file "
        "with a loss mask, trained on the completion or the assistant's turns only");
  f.add("field", FlagKind::kString, "text", "jsonl: the field that holds each document's text");
  f.add_checked("split", "blank-lines",
                "text: documents are blocks between blank lines (blank-lines), single lines (lines) or whole files "
                "(file), as train's --text-split",
                [](const std::string& v) { return parse_document_split(v).status(); });
  f.add_choice("bos", {"auto", "yes", "no"}, "auto",
        "BOS before each document: auto (when the tokenizer adds it itself: Llama 3 yes, Qwen no), yes or no");
  f.add_choice("eos", {"auto", "yes", "no"}, "auto",
        "EOS after each document: auto (whenever the model names an EOS: Llama 3 <|end_of_text|>, Qwen base "
        "<|endoftext|>), yes or no");
  f.add("parse-special", FlagKind::kBool, "false",
        "special tokens written in the text (\"<|endoftext|>\") become their ids; by default they are tokenized as "
        "the text they are, so a document cannot end or split itself");
  f.add("progress", FlagKind::kBool, "true", "progress on stderr (--no-progress to turn off)");
  f.add("block-bytes", FlagKind::kBytes, "4M", "bytes read at a time; a longer document is tokenized in pieces");
}

// The flags that take a value, for telling positional inputs apart from flag values.
const std::set<std::string> kValueFlags = {"tokenizer", "output", "format", "field",
                                           "split",     "bos",    "eos",    "block-bytes"};

// Pulls --input F, --input=F and positional arguments out of args; the rest goes to the FlagSet.
Status take_inputs(const std::vector<std::string>& args, std::vector<std::string>* inputs,
                   std::vector<std::string>* rest) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--input") {
      if (i + 1 >= args.size()) return Status::invalid_argument("--input needs a value");
      inputs->push_back(args[++i]);
    } else if (a.rfind("--input=", 0) == 0) {
      inputs->push_back(a.substr(8));
    } else if (a.rfind("--", 0) != 0 && a != "-h") {
      inputs->push_back(a);
    } else {
      rest->push_back(a);
      if (kValueFlags.count(a.substr(2)) && i + 1 < args.size()) rest->push_back(args[++i]);
    }
  }
  return Status::ok_status();
}

enum class Choice { kAuto, kYes, kNo };  // --bos and --eos, in their declared order

bool is_blank_byte(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\n'; }
bool all_blank(std::string_view s) {
  for (char c : s)
    if (!is_blank_byte(c)) return false;
  return true;
}

// Progress on stderr: rewritten in place on a terminal, a line every 10 s otherwise.
class Progress {
 public:
  Progress(bool on, int64_t total) : on_(on), total_(total), tty_(::isatty(2) != 0), t0_(Clock::now()), last_(t0_) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  void update(int64_t bytes, int64_t docs, int64_t tokens, bool force = false) {
    if (!on_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < (tty_ ? std::chrono::milliseconds(500) : std::chrono::milliseconds(10000))) return;
    last_ = now;
    const double s = std::max(1e-9, seconds());
    std::fprintf(stderr, "%sprepare: %.1f / %.1f MB (%.0f%%) | %lld documents | %lld tokens | %.1f MB/s%s",
                 tty_ ? "\r" : "", bytes / 1e6, total_ / 1e6, total_ > 0 ? 100.0 * bytes / total_ : 100.0,
                 (long long)docs, (long long)tokens, bytes / 1e6 / s, tty_ ? "\x1b[K" : "\n");
    std::fflush(stderr);
  }
  void done() {
    if (on_ && tty_) std::fputs("\r\x1b[K", stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool on_;
  int64_t total_;
  bool tty_;
  Clock::time_point t0_, last_;
};

// One document at a time: its text arrives in pieces (text()) and end() closes it. Text beyond
// `piece_bytes` is tokenized up to the tokenizer's last safe cut; the rest waits for more.
class DocumentEncoder {
 public:
  DocumentEncoder(HfTokenizer* tok, TokenFileWriter* out, std::optional<int32_t> bos, std::optional<int32_t> eos,
                  bool parse_special, size_t piece_bytes)
      : tok_(tok), out_(out), bos_(bos), eos_(eos), piece_bytes_(piece_bytes), next_try_(piece_bytes) {
    options_ = HfEncodeOptions{.add_special_tokens = false, .parse_special = parse_special};
  }
  Status text(std::string_view piece) {
    pending_.append(piece);
    if (pending_.size() < next_try_) return Status::ok_status();
    const size_t cut = tok_->safe_cut(pending_);
    if (cut == 0) {  // no safe place yet: look again a block later
      next_try_ = pending_.size() + piece_bytes_;
      return Status::ok_status();
    }
    Status s = emit(std::string_view(pending_).substr(0, cut), false);
    pending_.erase(0, cut);
    next_try_ = piece_bytes_;
    return s;
  }
  Status end() {
    Status s = emit(pending_, true);
    pending_.clear();
    next_try_ = piece_bytes_;
    started_ = false;
    return s;
  }

 private:
  Status emit(std::string_view text, bool last) {
    ids_.clear();
    if (!started_ && bos_) ids_.push_back(*bos_);
    tok_->encode_append(text, options_, &ids_);
    if (last && eos_) ids_.push_back(*eos_);
    if (ids_.empty()) return Status::ok_status();
    if (!started_) out_->begin_document();
    started_ = true;
    return out_->append(ids_);
  }

  HfTokenizer* tok_;
  TokenFileWriter* out_;
  std::optional<int32_t> bos_, eos_;
  size_t piece_bytes_;
  size_t next_try_;
  HfEncodeOptions options_;
  std::string pending_;
  std::vector<int32_t> ids_;
  bool started_ = false;
};

// split_documents (tokenizer.h) over a stream: bytes arrive in any blocks (feed), finish() ends
// the file. The documents' text goes to the encoder as it is known, so a long line or document
// is never held here; only a line's leading blanks wait until the line shows it is not blank.
class TextSplitter {
 public:
  TextSplitter(DocumentSplit split, DocumentEncoder* doc) : split_(split), doc_(doc) {}

  Status feed(std::string_view bytes) {
    if (split_ == DocumentSplit::kWholeFile) {
      if (in_doc_) return doc_->text(bytes);
      if (all_blank(bytes)) {
        held_.append(bytes);
        return Status::ok_status();
      }
      in_doc_ = true;
      Status s = doc_->text(held_);
      held_.clear();
      return s.ok() ? doc_->text(bytes) : s;
    }
    for (size_t pos = 0; pos < bytes.size();) {
      const size_t nl = bytes.find('\n', pos);
      Status s = content(bytes.substr(pos, (nl == std::string_view::npos ? bytes.size() : nl) - pos));
      if (s.ok() && nl != std::string_view::npos) s = end_line();
      if (!s.ok()) return s;
      if (nl == std::string_view::npos) break;
      pos = nl + 1;
    }
    return Status::ok_status();
  }

  Status finish() {
    Status s;
    if (split_ == DocumentSplit::kWholeFile) {
      if (in_doc_) s = doc_->end();
    } else if (line_nonblank_ || in_doc_) {  // the last line has no terminator; a final '\r' is dropped
      s = doc_->end();
    }
    held_.clear();
    line_nonblank_ = cr_ = in_doc_ = term_cr_ = false;
    return s;
  }

 private:
  // Part of the current line (no '\n'). A '\r' at its end is held back: before '\n' it belongs
  // to the terminator.
  Status content(std::string_view seg) {
    if (seg.empty()) return Status::ok_status();
    if (cr_) {
      cr_ = false;
      if (Status s = put("\r"); !s.ok()) return s;
    }
    if (seg.back() == '\r') {
      cr_ = true;
      seg.remove_suffix(1);
    }
    return put(seg);
  }
  Status put(std::string_view seg) {
    if (seg.empty()) return Status::ok_status();
    if (line_nonblank_) return doc_->text(seg);
    if (all_blank(seg)) {
      held_.append(seg);
      return Status::ok_status();
    }
    line_nonblank_ = true;
    if (split_ == DocumentSplit::kBlankLines) {
      if (in_doc_) {
        if (Status s = doc_->text(term_cr_ ? "\r\n" : "\n"); !s.ok()) return s;
      }
      in_doc_ = true;
    }
    Status s = doc_->text(held_);
    held_.clear();
    return s.ok() ? doc_->text(seg) : s;
  }
  Status end_line() {
    Status s;
    if (line_nonblank_) {
      if (split_ == DocumentSplit::kLines)
        s = doc_->end();
      else
        term_cr_ = cr_;
    } else if (in_doc_) {  // a blank line ends the block
      s = doc_->end();
      in_doc_ = false;
    }
    held_.clear();
    line_nonblank_ = cr_ = false;
    return s;
  }

  DocumentSplit split_;
  DocumentEncoder* doc_;
  std::string held_;            // the current line while it is blank (kWholeFile: the leading blanks)
  bool line_nonblank_ = false;  // the current line has shown a non-blank byte (and is being sent)
  bool cr_ = false;             // a '\r' held back at the end of what was seen of the line
  bool in_doc_ = false;         // a document is open (blank-lines, file)
  bool term_cr_ = false;        // blank-lines: the last non-blank line ended with "\r\n"
};

// One JSON object per line; the document is its `field` string, or (with an SftEncoder) the
// supervised sample the encoder makes of the object, written with its loss mask.
class JsonlReader {
 public:
  JsonlReader(std::string path, std::string field, DocumentEncoder* doc, SftEncoder* sft = nullptr,
              TokenFileWriter* out = nullptr)
      : path_(std::move(path)), field_(std::move(field)), doc_(doc), sft_(sft), out_(out) {}
  Status feed(std::string_view bytes) {
    for (size_t pos = 0; pos < bytes.size();) {
      const size_t nl = bytes.find('\n', pos);
      if (nl == std::string_view::npos) {
        line_.append(bytes.substr(pos));
        break;
      }
      line_.append(bytes.substr(pos, nl - pos));
      if (Status s = line(); !s.ok()) return s;
      pos = nl + 1;
    }
    return Status::ok_status();
  }
  Status finish() { return line_.empty() ? Status::ok_status() : line(); }

 private:
  Status line() {
    ++number_;
    std::string text;
    if (!all_blank(line_)) {
      const std::string where = path_ + ":" + std::to_string(number_);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line_);
      } catch (const nlohmann::json::exception& e) {
        return Status::invalid_argument(where + ": not valid JSON (" + e.what() +
                                        "); each line must be one JSON object");
      }
      if (!j.is_object()) return Status::invalid_argument(where + ": not a JSON object; each line must be one object");
      if (sft_ != nullptr) {
        line_.clear();
        auto sample = sft_->encode(j, where);
        if (!sample.ok()) return sample.status();
        out_->begin_document();
        return out_->append(sample.value().tokens, sample.value().targets);
      }
      if (!j.contains(field_))
        return Status::invalid_argument(where + ": no field \"" + field_ + "\"; name the text's field with --field");
      if (!j[field_].is_string())
        return Status::invalid_argument(where + ": field \"" + field_ + "\" is " + j[field_].type_name() +
                                        ", not a string");
      text = j[field_].get<std::string>();
    }
    line_.clear();
    if (text.empty()) return Status::ok_status();
    Status s = doc_->text(text);
    return s.ok() ? doc_->end() : s;
  }

  std::string path_, field_;
  DocumentEncoder* doc_;
  SftEncoder* sft_;
  TokenFileWriter* out_;
  std::string line_;
  int64_t number_ = 0;
};

// By the name, a compression suffix (.gz, .zst, .zstd) set aside: data.jsonl.gz is JSONL.
bool is_jsonl(std::string path, const std::string& format) {
  if (!format.empty()) return format != "text";
  const auto ends_with = [&](const char* ext) {
    return path.size() >= std::strlen(ext) && path.compare(path.size() - std::strlen(ext), std::string::npos, ext) == 0;
  };
  for (const char* ext : {".gz", ".zst", ".zstd"})
    if (ends_with(ext)) {
      path.resize(path.size() - std::strlen(ext));
      break;
    }
  return ends_with(".jsonl") || ends_with(".json");
}

struct Input {
  std::string path;
  int64_t bytes = 0;                  // the file's size (compressed); 0 when unknown (a pipe)
  std::optional<InputReader> stdin_;  // "-" can be read once, so it stays open from the check on
};

// Opens and checks every input before anything is written: a regular file (a FIFO or a device
// is refused, never waited on) or "-" (standard input), compressed in a format it can read, and
// text (binary refused). Files are closed again and reopened by prepare_file, so that many inputs
// do not each hold a decompressor.
Status open_inputs(const std::vector<std::string>& paths, std::vector<Input>* out) {
  if (std::count(paths.begin(), paths.end(), "-") > 1)
    return Status::invalid_argument("standard input (-) is named more than once: name it once");
  for (const std::string& p : paths) {
    StatusOr<InputReader> r = InputReader::open(p);
    if (!r.ok()) return r.status();
    Input in{p, std::max<int64_t>(r.value().size_bytes(), 0), std::nullopt};
    if (p == "-") in.stdin_.emplace(std::move(r).value());
    out->push_back(std::move(in));
  }
  return Status::ok_status();
}

struct Run {
  HfTokenizer* tok;
  TokenFileWriter* out;
  DocumentEncoder* doc;
  SftEncoder* sft;  // --format prompt-completion or messages; else null
  Progress* progress;
  std::string format, field;
  DocumentSplit split;
  size_t block;
  int64_t done_bytes = 0;
};

Status prepare_file(Run& r, Input& in) {
  const bool jsonl = is_jsonl(in.path, r.format);
  TextSplitter text(r.split, r.doc);
  JsonlReader lines(in.path, r.field, r.doc, r.sft, r.out);
  std::optional<InputReader> opened;
  if (!in.stdin_) {
    StatusOr<InputReader> o = InputReader::open(in.path);
    if (!o.ok()) return o.status();
    opened.emplace(std::move(o).value());
  }
  InputReader& reader = in.stdin_ ? *in.stdin_ : *opened;
  std::vector<char> buf(r.block);
  const int64_t start = r.done_bytes;
  for (;;) {
    StatusOr<size_t> n = reader.read(buf.data(), buf.size());
    if (!n.ok()) return n.status();  // (names the file and the compressed offset)
    if (n.value() == 0) break;
    const std::string_view bytes(buf.data(), n.value());
    Status s = jsonl ? lines.feed(bytes) : text.feed(bytes);
    if (!s.ok()) return s;
    r.done_bytes = start + reader.compressed_bytes_read();  // the progress, against the files' sizes
    r.progress->update(r.done_bytes, r.out->documents(), r.out->tokens());
  }
  return jsonl ? lines.finish() : text.finish();
}

}  // namespace

int prepare_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied prepare",
                "Tokenizes text or JSONL files with a Hugging Face tokenizer (tokenizer.json: Llama 3, Qwen2/3, GPT-2 "
                "byte-level BPE)\ninto one token file for `untied train --data tokens --data-path OUT`: "
                "each document [BOS] text [EOS], a document of the file.\n"
                "Inputs: --input FILE (repeated) or files after the flags: untied prepare --tokenizer DIR --output "
                "OUT.tok a.txt b.jsonl");
  add_prepare_flags(flags);
  auto usage_error = [&](const std::string& msg) { return refuse(flags, Status::invalid_argument(msg)); };
  auto runtime_error = [](const std::string& msg) {
    std::fprintf(stderr, "untied prepare: %s\n", msg.c_str());
    return 1;
  };
  std::vector<std::string> paths, rest;
  if (Status s = take_inputs(args, &paths, &rest); !s.ok()) return usage_error(s.message());
  if (auto exit = parse_command_line(flags, rest, /*root=*/true)) return *exit;
  if (flags.get_string("tokenizer").empty())
    return usage_error("--tokenizer is missing: give tokenizer.json or a model directory");
  if (flags.get_string("output").empty()) return usage_error("--output is missing: name the token file to write");
  if (paths.empty()) return usage_error("no input: give files with --input or after the flags");
  if (flags.get_bytes("block-bytes") < 1) return usage_error("--block-bytes must be at least 1");
  const std::string format = flags.get_string("format");
  auto split = parse_document_split(flags.get_string("split"));
  const std::vector choices{Choice::kAuto, Choice::kYes, Choice::kNo};
  const Choice bos_choice = flags.get_choice("bos", choices), eos_choice = flags.get_choice("eos", choices);
  const std::string out_path = flags.get_string("output");
  struct stat out_st;
  if (::stat(out_path.c_str(), &out_st) == 0 && S_ISDIR(out_st.st_mode))
    return usage_error("--output " + out_path + " is a directory: name the token file to write");

  try {
    std::vector<Input> inputs;
    Status st = open_inputs(paths, &inputs);
    if (!st.ok()) return runtime_error(st.message());
    StatusOr<HfTokenizer> loaded = HfTokenizer::load(flags.get_string("tokenizer"));
    if (!loaded.ok()) return runtime_error(loaded.status().message());
    HfTokenizer tok = std::move(loaded).value();

    std::optional<int32_t> bos, eos;
    if (bos_choice == Choice::kYes && !tok.bos_id())
      return usage_error("--bos yes: " + tok.source() + " and the files beside it name no BOS token; use --bos no");
    if (eos_choice == Choice::kYes && !tok.eos_id())
      return usage_error("--eos yes: " + tok.source() + " and the files beside it name no EOS token; use --eos no");
    if (bos_choice == Choice::kYes || (bos_choice == Choice::kAuto && tok.adds_bos()))
      bos = tok.bos_id();
    if (eos_choice != Choice::kNo) eos = tok.eos_id();

    int64_t total = 0;
    for (const Input& in : inputs) total += in.bytes;
    const bool show = flags.get_bool("progress");
    const auto token_name = [&](std::optional<int32_t> id) {
      if (!id) return std::string("none");
      const std::string text = tok.decode(std::vector<int32_t>{*id});
      return text + " (" + std::to_string(*id) + ")";
    };
    if (show)
      std::fprintf(stderr, "untied prepare | %s | BOS %s, EOS %s | %zu inputs (%s) -> %s\n", tok.describe().c_str(),
                   token_name(bos).c_str(), token_name(eos).c_str(), inputs.size(), format_bytes(total).c_str(),
                   out_path.c_str());

    const bool supervised = format == "prompt-completion" || format == "messages";
    std::optional<SftEncoder> sft;
    if (supervised) {
      std::error_code ec;
      const std::string given = flags.get_string("tokenizer");
      const std::string model_dir = std::filesystem::is_directory(given, ec)
                                        ? given
                                        : std::filesystem::path(given).parent_path().string();
      auto e = SftEncoder::create(&tok, format == "messages" ? SftFormat::kMessages : SftFormat::kPromptCompletion,
                                  model_dir.empty() ? "." : model_dir, bos, eos_choice != Choice::kNo,
                                  flags.get_bool("parse-special"));
      if (!e.ok()) return runtime_error(e.status().message());
      sft.emplace(std::move(e).value());
      if (show) std::fprintf(stderr, "untied prepare: supervised samples: %s\n", sft->describe().c_str());
    }
    StatusOr<TokenFileWriter> created =
        TokenFileWriter::create(out_path, tok.vocab_size(), TokenFileWriter::Options{.loss_mask = supervised});
    if (!created.ok()) return runtime_error(created.status().message());
    TokenFileWriter out = std::move(created).value();
    const auto block = static_cast<size_t>(flags.get_bytes("block-bytes"));
    DocumentEncoder doc(&tok, &out, bos, eos, flags.get_bool("parse-special"), block);
    Progress progress(show, total);
    Run run{&tok, &out, &doc, sft ? &*sft : nullptr, &progress, format, flags.get_string("field"), split.value(), block};
    for (Input& in : inputs)
      if (Status s = prepare_file(run, in); !s.ok())
        return runtime_error(s.message() + "; nothing was written to " + out_path);
    progress.update(run.done_bytes, out.documents(), out.tokens(), true);
    progress.done();
    if (out.documents() == 0)
      return runtime_error("the inputs hold no document (no text, only whitespace): nothing was written to " +
                           out_path);
    const int64_t docs = out.documents(), tokens = out.tokens();
    const int width = out.width_bytes();
    if (Status s = out.finish(); !s.ok()) return runtime_error(s.message());
    const double secs = std::max(1e-9, progress.seconds());
    std::printf(
        "prepared %lld documents, %lld tokens (vocab %lld, %d-byte tokens) from %zu file%s (%s) in %.2f s "
        "(%.1f MB/s, %.0f tokens/s) -> %s\n",
        (long long)docs, (long long)tokens, (long long)tok.vocab_size(), width, inputs.size(),
        inputs.size() == 1 ? "" : "s", format_bytes(total).c_str(), secs, total / 1e6 / secs, tokens / secs,
        out_path.c_str());
    if (sft && sft->seam_mismatches() > 0)
      std::printf("note: in %lld samples the prompt's tokens are not the first tokens of prompt + completion (a "
                  "merge across the seam); they are trained on from where the two part, as TRL's are\n",
                  (long long)sft->seam_mismatches());
    if (tok.invalid_utf8_replaced() > 0)
      std::printf("note: %lld ill-formed UTF-8 sequences in the input were tokenized as U+FFFD\n",
                  (long long)tok.invalid_utf8_replaced());
    return 0;
  } catch (const Error& e) {
    return runtime_error(e.what());
  }
}

}  // namespace untied::cli
