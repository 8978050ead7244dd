#include "cli/prepare_sft.h"

#include <filesystem>

#include "untied/core/file_io.h"

namespace untied::cli {
namespace {

// tokenizer_config.json's eos_token as an id, when the file names one that the tokenizer has.
std::optional<int32_t> config_eos(const HfTokenizer& tok, const std::string& model_dir) {
  if (model_dir.empty()) return std::nullopt;
  auto tokens = load_chat_template_tokens(model_dir);
  if (!tokens.ok() || !tokens.value().eos_token) return std::nullopt;
  return tok.token_to_id(*tokens.value().eos_token);
}

}  // namespace

StatusOr<SftEncoder> SftEncoder::create(HfTokenizer* tok, SftFormat format, const std::string& model_dir,
                                        std::optional<int32_t> bos, bool use_eos, bool parse_special) {
  SftEncoder e;
  e.tok_ = tok;
  e.format_ = format;
  e.bos_ = bos;
  if (use_eos) {
    e.eos_ = config_eos(*tok, model_dir);
    if (!e.eos_) e.eos_ = tok->eos_id();
  }
  e.encode_ = HfEncodeOptions{.add_special_tokens = false, .parse_special = parse_special};
  if (format == SftFormat::kMessages) {
    if (model_dir.empty())
      return Status::invalid_argument("--format messages renders each conversation with the model's chat template: "
                                      "give --tokenizer the model directory (with tokenizer_config.json or "
                                      "chat_template.jinja), not a tokenizer.json file");
    auto chat = load_chat_template(model_dir);
    if (!chat.ok()) return chat.status();
    e.chat_ = std::move(chat).value();
    auto tokens = load_chat_template_tokens(model_dir);
    if (!tokens.ok()) return tokens.status();
    e.tokens_ = tokens.value();
    // The template writes the special tokens itself: they are parsed as the tokens they are, as
    // apply_chat_template's tokenization does.
    e.encode_.parse_special = true;
  }
  return e;
}

std::string SftEncoder::describe() const {
  if (format_ == SftFormat::kMessages) return "messages, rendered with " + chat_->where();
  return std::string("prompt-completion, BOS ") + (bos_ ? std::to_string(*bos_) : "none") + ", EOS " +
         (eos_ ? std::to_string(*eos_) : "none");
}

StatusOr<SftSample> SftEncoder::encode(const nlohmann::json& line, const std::string& where) {
  return format_ == SftFormat::kMessages ? messages(line, where) : prompt_completion(line, where);
}

StatusOr<SftSample> SftEncoder::prompt_completion(const nlohmann::json& line, const std::string& where) {
  for (const char* field : {"prompt", "completion"})
    if (!line.contains(field) || !line[field].is_string())
      return Status::invalid_argument(where + ": --format prompt-completion needs string fields \"prompt\" and "
                                              "\"completion\"" +
                                      (line.contains(field) ? std::string(" (\"") + field + "\" is " +
                                                                  line[field].type_name() + ")"
                                                            : std::string(" (no \"") + field + "\")"));
  const std::string prompt = line["prompt"].get<std::string>(), completion = line["completion"].get<std::string>();
  SftSample s;
  std::vector<int32_t> prompt_ids;
  if (bos_) prompt_ids.push_back(*bos_);
  tok_->encode_append(prompt, encode_, &prompt_ids);
  if (bos_) s.tokens.push_back(*bos_);
  tok_->encode_append(prompt + completion, encode_, &s.tokens);
  if (eos_) s.tokens.push_back(*eos_);
  // Trained on from where the sample's ids part from the prompt's (TRL's rule): the prompt's
  // length, unless a merge across the seam changed its last tokens.
  size_t cut = 0;
  while (cut < prompt_ids.size() && cut < s.tokens.size() && prompt_ids[cut] == s.tokens[cut]) ++cut;
  if (cut != prompt_ids.size()) ++seam_mismatches_;
  s.targets.assign(s.tokens.size(), 1);
  std::fill_n(s.targets.begin(), cut, uint8_t{0});
  return s;
}

StatusOr<std::string> SftEncoder::render(const Json& messages, bool add_generation_prompt,
                                         const std::string& where) const {
  const Json context = chat_template_context(messages, add_generation_prompt, tokens_, Json::object());
  auto text = chat_->render(context);
  if (!text.ok()) return Status::invalid_argument(where + ": the chat template: " + text.status().message());
  return text;
}

StatusOr<SftSample> SftEncoder::messages(const nlohmann::json& line, const std::string& where) {
  if (!line.contains("messages") || !line["messages"].is_array() || line["messages"].empty())
    return Status::invalid_argument(where + ": --format messages needs a non-empty list \"messages\" of "
                                            "{\"role\": ..., \"content\": ...} objects");
  const Json messages = Json::parse(line["messages"].dump());
  for (const Json& m : messages)
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status::invalid_argument(where + ": each message needs a string \"role\"");
  auto full = render(messages, false, where);
  if (!full.ok()) return full.status();
  SftSample s;
  tok_->encode_append(full.value(), encode_, &s.tokens);
  s.targets.assign(s.tokens.size(), 0);
  int assistant_turns = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    ++assistant_turns;
    Json before = Json::array();
    for (size_t k = 0; k < i; ++k) before.push_back(messages[k]);
    auto prefix = render(before, true, where);
    if (!prefix.ok()) return prefix.status();
    std::vector<int32_t> prefix_ids;
    tok_->encode_append(prefix.value(), encode_, &prefix_ids);
    if (full.value().compare(0, prefix.value().size(), prefix.value()) != 0 || prefix_ids.size() > s.tokens.size() ||
        !std::equal(prefix_ids.begin(), prefix_ids.end(), s.tokens.begin()))
      return Status::invalid_argument(where + ": the chat template renders the conversation before assistant turn " +
                                      std::to_string(assistant_turns) +
                                      " (with its generation prompt) differently from the start of the whole "
                                      "conversation, so the turn cannot be located; this template cannot be used "
                                      "for --format messages");
    // The turn: from its generation prompt's end through its first special token (the end of the
    // turn), and what follows that up to the next special token.
    size_t t = prefix_ids.size();
    while (t < s.tokens.size() && !tok_->is_special(s.tokens[t])) s.targets[t++] = 1;
    if (t < s.tokens.size()) s.targets[t++] = 1;
    while (t < s.tokens.size() && !tok_->is_special(s.tokens[t])) s.targets[t++] = 1;
  }
  if (assistant_turns == 0)
    return Status::invalid_argument(where + ": the conversation has no assistant turn, so nothing in it is trained on");
  return s;
}

}  // namespace untied::cli
