#include "untied/train/chat_template.h"

#include <filesystem>
#include <vector>

#include "train/jinja/render.h"
#include "train/jinja/syntax.h"
#include "train/jinja/value.h"
#include "untied/core/file_io.h"

namespace untied {

struct ChatTemplate::Impl {
  std::string source;
  std::string where;
  std::vector<jinja::Stmt> body;
};

namespace {

std::string at_line(const std::string& where, int line) {
  return "chat template " + where + (line > 0 ? ", line " + std::to_string(line) : std::string()) + ": ";
}

// The message for a failure inside the renderer or parser.
Status to_status(const jinja::TemplateError& e, const std::string& where, bool parsing) {
  if (e.raised) return Status::invalid_argument(at_line(where, e.line) + "raise_exception: " + e.message);
  // Constructs outside the subset say so first ("unsupported: the '{% include %}' tag ...").
  static const std::string kUnsupported = "unsupported: ";
  if (e.message.rfind(kUnsupported, 0) == 0)
    return Status::unsupported(at_line(where, e.line) + e.message.substr(kUnsupported.size()));
  std::string msg = at_line(where, e.line) + e.message;
  if (parsing) msg += " (fix the template, or pass one that Jinja2 accepts)";
  return Status::invalid_argument(msg);
}

// A model's small JSON file (tokenizer_config.json is ~50 KB; chat templates a few KB).
StatusOr<std::string> read_model_file(const std::string& path) {
  return read_regular_file(path, int64_t{64} << 20, "the model's chat template file");
}

StatusOr<Json> read_tokenizer_config(const std::string& path) {
  StatusOr<std::string> text = read_model_file(path);
  if (!text.ok()) return text.status();
  try {
    Json j = Json::parse(text.value());
    if (!j.is_object()) return Status::invalid_argument(path + ": must hold a JSON object");
    return j;
  } catch (const Json::exception& e) {
    return Status::invalid_argument(path + " is not valid JSON: " + e.what());
  }
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::parse(std::string source, std::string where) {
  auto impl = std::make_shared<Impl>();
  impl->where = std::move(where);
  try {
    impl->body = jinja::parse(jinja::lex(source));
  } catch (const jinja::TemplateError& e) {
    return to_status(e, impl->where, true);
  } catch (const std::exception& e) {
    return Status::invalid_argument(at_line(impl->where, 0) + e.what());
  }
  impl->source = std::move(source);
  return ChatTemplate(std::move(impl));
}

StatusOr<std::string> ChatTemplate::render(const Json& context) const { return render(context, std::time(nullptr)); }

StatusOr<std::string> ChatTemplate::render(const Json& context, std::time_t now) const {
  if (!context.is_object())
    return Status::invalid_argument(at_line(impl_->where, 0) + "the context must be a JSON object of variables");
  try {
    return jinja::render(impl_->body, context, now);
  } catch (const jinja::TemplateError& e) {
    return to_status(e, impl_->where, false);
  } catch (const std::exception& e) {
    return Status::invalid_argument(at_line(impl_->where, 0) + e.what());
  }
}

const std::string& ChatTemplate::source() const { return impl_->source; }
const std::string& ChatTemplate::where() const { return impl_->where; }

StatusOr<ChatTemplate> load_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  if (fs::exists(jinja_path, ec)) {
    StatusOr<std::string> text = read_model_file(jinja_path);
    if (!text.ok()) return text.status();
    return ChatTemplate::parse(std::move(text).value(), jinja_path);
  }
  const std::string tc_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  if (!fs::exists(tc_path, ec))
    return Status::not_found(model_dir + " has neither chat_template.jinja nor tokenizer_config.json: point at a "
                             "Hugging Face model folder that has a chat template");
  StatusOr<Json> tc = read_tokenizer_config(tc_path);
  if (!tc.ok()) return tc.status();
  const Json& c = tc.value();
  if (!c.contains("chat_template") || c["chat_template"].is_null())
    return Status::not_found(tc_path + " has no chat_template (and there is no chat_template.jinja): this is not a "
                             "chat model; use a plain-text data set or a model with a chat template");
  const Json& t = c["chat_template"];
  if (t.is_string()) return ChatTemplate::parse(t.get<std::string>(), tc_path);
  if (t.is_array()) {
    for (const Json& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string())
        return ChatTemplate::parse(named["template"].get<std::string>(), tc_path + " (template 'default')");
    return Status::not_found(tc_path + ": chat_template is a list without a {\"name\": \"default\", \"template\": "
                             "...} entry");
  }
  return Status::invalid_argument(tc_path + ": chat_template must be a string or a list of {\"name\", \"template\"}");
}

StatusOr<ChatTemplateTokens> load_chat_template_tokens(const std::string& model_dir) {
  const std::string tc_path = (std::filesystem::path(model_dir) / "tokenizer_config.json").string();
  StatusOr<Json> tc = read_tokenizer_config(tc_path);
  if (!tc.ok()) return tc.status();
  const Json& c = tc.value();
  ChatTemplateTokens t;
  for (auto [key, dst] : {std::pair{"bos_token", &t.bos_token}, {"eos_token", &t.eos_token},
                          {"unk_token", &t.unk_token}, {"pad_token", &t.pad_token}}) {
    if (!c.contains(key) || c[key].is_null()) continue;
    const Json& v = c[key].is_object() && c[key].contains("content") ? c[key]["content"] : c[key];
    if (!v.is_string())
      return Status::invalid_argument(tc_path + ": " + key + " must be a string, {\"content\": ...} or null");
    *dst = v.get<std::string>();
  }
  return t;
}

Json chat_template_context(const Json& messages, bool add_generation_prompt, const ChatTemplateTokens& tokens,
                           const Json& extra) {
  UNTIED_CHECK(messages.is_array(), "chat_template_context: messages must be a JSON array");
  UNTIED_CHECK(extra.is_null() || extra.is_object(), "chat_template_context: extra must be a JSON object");
  Json ctx = Json::object();
  for (auto [key, value] : {std::pair{"bos_token", &tokens.bos_token}, {"eos_token", &tokens.eos_token},
                            {"unk_token", &tokens.unk_token}, {"pad_token", &tokens.pad_token}})
    if (*value) ctx[key] = **value;
  // transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}.
  Json aliased = Json::array();
  for (const Json& m : messages) {
    const Json* reasoning = nullptr;
    if (m.is_object())
      for (const char* key : {"reasoning_content", "thinking", "reasoning"})
        if (m.contains(key) && !m[key].is_null()) {
          reasoning = &m[key];
          break;
        }
    if (!reasoning) {
      aliased.push_back(m);
      continue;
    }
    Json out = Json::object();
    out["thinking"] = *reasoning;
    for (auto it = m.begin(); it != m.end(); ++it) out[it.key()] = it.value();
    out["reasoning_content"] = *reasoning;
    aliased.push_back(std::move(out));
  }
  ctx["messages"] = std::move(aliased);
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

}  // namespace untied
