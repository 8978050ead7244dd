// Supervised fine-tuning samples for `untied prepare --format prompt-completion | messages`: one
// JSON object per line becomes one document of the token file, its tokens and its loss mask
// (token_file.h, version 3: which tokens are trained on), so that training counts the loss on
// the completion or the assistant's turns only.
//
// prompt-completion: {"prompt": P, "completion": C}, strings. As TRL's SFTTrainer does: the
//   prompt's ids are [BOS] + ids(P); the sample is [BOS] + ids(P + C) + [EOS], tokenized as one
//   text; the mask is 0 on the ids the sample shares with the prompt's from the start and 1
//   after, EOS included: after len(prompt ids) tokens, or earlier where a merge across the seam
//   changed the prompt's last tokens (TRL's rule; such samples are counted).
// messages: {"messages": [{"role": R, "content": C}, ...]}, rendered with the model's chat
//   template (chat_template.h) as transformers' apply_chat_template(messages) renders it, and
//   tokenized as one text without BOS/EOS added (the template writes them). For each assistant
//   turn i, its span starts where render(messages[:i], add_generation_prompt=True) ends (its ids
//   must be the sample's first ids: the template is prefix-stable there, or the sample is
//   refused naming the line) and runs through the first special token after that (the end of
//   the turn: <|eot_id|>, <|im_end|>) and the non-special tokens that follow it up to the next
//   special token; the mask is 1 on those spans, 0 elsewhere. With one user turn and a last
//   assistant turn this is TRL's completion mask of the same conversation split into prompt and
//   completion.
// EOS of prompt-completion: tokenizer_config.json's eos_token (TRL appends the tokenizer's EOS),
// else the model's (HfTokenizer::eos_id), or none when --eos no.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "untied/core/json.h"
#include "untied/core/status.h"
#include "untied/train/chat_template.h"
#include "untied/train/hf_tokenizer.h"

namespace untied::cli {

enum class SftFormat { kPromptCompletion, kMessages };

struct SftSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> targets;  // 1: the token is trained on
};

class SftEncoder {
 public:
  // tok: the tokenizer; model_dir: the directory holding tokenizer_config.json and the chat
  // template ("" when the tokenizer was given as a file: messages then need a template file
  // beside it). bos: prompt-completion's BOS (none: no BOS); use_eos: append EOS there.
  static StatusOr<SftEncoder> create(HfTokenizer* tok, SftFormat format, const std::string& model_dir,
                                     std::optional<int32_t> bos, bool use_eos, bool parse_special);
  // One sample from one JSONL object; `where` (file:line) names it in errors.
  StatusOr<SftSample> encode(const nlohmann::json& line, const std::string& where);
  // Samples whose prompt ids were not all a prefix of the sample's (prompt-completion).
  int64_t seam_mismatches() const { return seam_mismatches_; }
  std::string describe() const;

 private:
  SftEncoder() = default;
  StatusOr<SftSample> prompt_completion(const nlohmann::json& line, const std::string& where);
  StatusOr<SftSample> messages(const nlohmann::json& line, const std::string& where);
  StatusOr<std::string> render(const Json& messages, bool add_generation_prompt, const std::string& where) const;

  HfTokenizer* tok_ = nullptr;
  SftFormat format_ = SftFormat::kPromptCompletion;
  std::optional<int32_t> bos_, eos_;
  HfEncodeOptions encode_;
  std::optional<ChatTemplate> chat_;
  ChatTemplateTokens tokens_;  // the template's bos_token, eos_token, ...
  int64_t seam_mismatches_ = 0;
};

}  // namespace untied::cli
