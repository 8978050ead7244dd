// Chat templates: a model's Jinja template that turns a conversation into the text it was
// trained on, rendered byte for byte as transformers' tokenizer.apply_chat_template(messages,
// tokenize=False, add_generation_prompt=...) renders it with Jinja2.
//
//   ChatTemplate t = load_chat_template(model_dir).value();
//   ChatTemplateTokens tokens = load_chat_template_tokens(model_dir).value();
//   Json context = chat_template_context(line["messages"], /*add_generation_prompt=*/false, tokens);
//   std::string text = t.render(context).value();
//
// The subset of Jinja2 (what the Llama 3.x, Qwen2.5 and Qwen3 templates use, and more):
//   tags        {{ }}, {% if/elif/else/endif %}, {% for x in xs [if cond] %}...{% else %}...
//               {% endfor %} (with loop.index, index0, revindex, revindex0, first, last, length,
//               previtem, nextitem, cycle), {% set x = ... %}, {% set a, b = ... %},
//               {% set ns.attr = ... %}, {% set x %}...{% endset %}, {% macro %}, {% break %},
//               {% continue %}, {% generation %} (rendered in place), {% raw %}, {# comments #}
//   expressions literals (strings with Python escapes, integers, floats, true/false/none, lists,
//               dicts), a.b, a[i], slices a[x:y:z] (messages[::-1]), calls, `if`-`else`
//               expressions, and/or/not, == != < <= > >=, in / not in, + - * / // % **, ~
//   filters     abs capitalize count default/d dictsort escape/e first float format indent int
//               items join last length list lower map max min reject rejectattr replace reverse
//               round safe select selectattr sort string sum title tojson trim unique upper
//   tests       defined undefined none boolean true false integer float number string mapping
//               iterable sequence callable sameas eq/equalto ne lt le gt ge in odd even
//               divisibleby lower upper escaped
//   methods     str: startswith endswith strip lstrip rstrip split rsplit upper lower replace
//               title capitalize join find count; dict: items keys values get
//   globals     range, namespace, dict, raise_exception(msg), strftime_now(format)
// Semantics are Python's and Jinja2's: str() of values (None, True, ['a', 1]), json.dumps for
// tojson (transformers' tojson: ensure_ascii=False, indent, separators, sort_keys), undefined
// values that print as "" and fail when used as a string or an object, one scope per loop
// iteration and per macro call, namespaces shared by reference.
//
// Whitespace, as transformers sets Jinja2 up (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False): "\r\n" and "\r" in the template read as "\n", and one trailing
// newline of the template is dropped; the newline right after "%}" or "#}" is removed; spaces
// and tabs from the start of a line up to "{%" or "{#" are removed; "{%-", "{{-", "{#-" strip all
// whitespace before the tag and "-%}", "-}}", "-#}" all whitespace after it; "{%+" and "+%}" turn
// the two trims off for that tag. Text and "{{ }}" output are otherwise kept byte for byte.
//
// Outside the subset: template inheritance and includes (extends, block, include, import),
// {% call %}, {% filter %}, {% with %}, {% do %}, recursive loops, *args/**kwargs, tuples (they
// are lists: a printed tuple shows [..]), non-string dict keys, str.format, Unicode case mapping
// (upper/lower/title change ASCII letters only), integers beyond 64 bits.
//
// Errors: parse() returns invalid_argument naming the template and line for bad syntax, unclosed
// tags or blocks, unknown tags, filters and tests, and unsupported for a known Jinja2 construct
// outside the subset. render() returns invalid_argument for a template error at render time (an
// undefined value used as an object, a type error, raise_exception('msg'), whose message it
// carries), with the template's line. Neither throws.
//
// A ChatTemplate is immutable once parsed; copies share the parsed tree, and render() may run
// on several threads at once.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include "untied/core/json.h"
#include "untied/core/status.h"

namespace untied {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  // Parses `source`; `where` names it in messages ("Qwen3-8B/tokenizer_config.json").
  static StatusOr<ChatTemplate> parse(std::string source, std::string where);

  // The text for `context`, a JSON object whose keys are the template's variables (messages,
  // add_generation_prompt, bos_token, eos_token, tools, enable_thinking, ...; see
  // chat_template_context). strftime_now() formats the current local time.
  StatusOr<std::string> render(const Json& context) const;
  // The same with strftime_now() formatting `now` (local time): reproducible text.
  StatusOr<std::string> render(const Json& context, std::time_t now) const;

  const std::string& source() const;
  const std::string& where() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// A model's template: `model_dir`/chat_template.jinja when it exists, otherwise the
// "chat_template" of `model_dir`/tokenizer_config.json (a string, or a list of {"name",
// "template"} from which the one named "default" is taken). not_found when neither has one.
StatusOr<ChatTemplate> load_chat_template(const std::string& model_dir);

// The special tokens transformers passes to the template (its special_tokens_map): each is the
// tokenizer_config.json entry, a string or {"content": ...}; absent or null ones are unset.
struct ChatTemplateTokens {
  std::optional<std::string> bos_token, eos_token, unk_token, pad_token;
};
StatusOr<ChatTemplateTokens> load_chat_template_tokens(const std::string& model_dir);

// The context apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
// **extra) gives the template in transformers 5: the special tokens that are set, then
// messages (each message with reasoning_content, thinking or reasoning gets "thinking" first and
// "reasoning_content" last, both set to that text, as transformers aliases them), tools and
// documents (null unless `extra` sets them), add_generation_prompt, then the keys of `extra`
// (enable_thinking, date_string, ...), which override earlier ones.
// REQUIRES: messages is an array; extra is an object or null.
Json chat_template_context(const Json& messages, bool add_generation_prompt, const ChatTemplateTokens& tokens,
                           const Json& extra = Json::object());

}  // namespace untied
