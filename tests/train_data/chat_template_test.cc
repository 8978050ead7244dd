// Chat templates against transformers itself: reference/make_chat_fixtures.py rendered the real
// Llama 3.1, Llama 3.2, Qwen2.5 and Qwen3 templates with tokenizer.apply_chat_template on
// conversations with system prompts, several turns, empty and unicode content, surrounding
// whitespace, tools and tool calls, <think> blocks, reasoning_content and enable_thinking.
// Here: the same text byte for byte; then each construct of the subset alone (the expected
// strings are what Jinja2 3.1 renders under transformers' settings); then malformed templates,
// which return a Status naming the line instead of crashing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "untied/core/json.h"
#include "untied/train/chat_template.h"

namespace untied {
namespace {

const std::string kChat = std::string(UNTIED_FIXTURES) + "/chat";
constexpr std::time_t kNow = 1721995200;  // 2024-07-26 12:00 UTC, as the fixture's clock

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  UNTIED_CHECK(f.good(), "cannot read ", path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ChatTemplate parse_ok(const std::string& source) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse(source, "test");
  UNTIED_CHECK(t.ok(), t.status().to_string());
  return std::move(t).value();
}

// The template rendered over `context`, or "ERROR: <status>".
std::string render(const std::string& source, const Json& context = Json::object()) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse(source, "test");
  if (!t.ok()) return "ERROR: " + t.status().to_string();
  StatusOr<std::string> r = t.value().render(context, kNow);
  return r.ok() ? r.value() : "ERROR: " + r.status().to_string();
}

Status render_status(const std::string& source, const Json& context = Json::object()) {
  StatusOr<ChatTemplate> t = ChatTemplate::parse(source, "test");
  if (!t.ok()) return t.status();
  StatusOr<std::string> r = t.value().render(context, kNow);
  return r.ok() ? Status::ok_status() : r.status();
}

// The first byte where two strings differ, with context, for a readable failure.
std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return "first difference at byte " + std::to_string(i) + "\n  want: " + Json(want.substr(from, 120)).dump() +
         "\n  got:  " + Json(got.substr(from, 120)).dump();
}

TEST(ChatTemplateFixture, EveryCaseMatchesTransformers) {
  const Json doc = Json::parse(read_text(kChat + "/cases.json"));
  ASSERT_GE(doc["cases"].size(), 15u);
  int checked = 0;
  for (const Json& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string path = kChat + "/" + c["template"].get<std::string>();
    StatusOr<ChatTemplate> t = ChatTemplate::parse(read_text(path), path);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ChatTemplateTokens tokens;
    const Json& tk = c["tokens"];
    if (tk.contains("bos_token")) tokens.bos_token = tk["bos_token"].get<std::string>();
    if (tk.contains("eos_token")) tokens.eos_token = tk["eos_token"].get<std::string>();
    if (tk.contains("pad_token")) tokens.pad_token = tk["pad_token"].get<std::string>();
    if (tk.contains("unk_token")) tokens.unk_token = tk["unk_token"].get<std::string>();
    const Json ctx = chat_template_context(c["messages"], c["add_generation_prompt"].get<bool>(), tokens, c["extra"]);
    StatusOr<std::string> r = t.value().render(ctx, c["now"].get<std::time_t>());
    if (c.contains("error")) {
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find(c["error"].get<std::string>()), std::string::npos) << r.status().message();
      EXPECT_NE(r.status().message().find("raise_exception"), std::string::npos) << r.status().message();
    } else {
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      const std::string want = c["text"].get<std::string>();
      EXPECT_EQ(r.value(), want) << first_difference(want, r.value());
    }
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(doc["cases"].size()));
}

TEST(ChatTemplateFixture, LoadsFromAModelFolder) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("chat_template_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string qwen3 = read_text(kChat + "/qwen3.jinja");
  const Json messages = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  // tokenizer_config.json with the template as a string, and eos as {"content": ...}.
  Json tc = {{"chat_template", qwen3}, {"bos_token", nullptr}, {"eos_token", {{"content", "<|im_end|>"}}}};
  std::ofstream(dir / "tokenizer_config.json") << tc.dump();
  StatusOr<ChatTemplate> t = load_chat_template(dir.string());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t.value().source(), qwen3);
  StatusOr<ChatTemplateTokens> tokens = load_chat_template_tokens(dir.string());
  ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
  EXPECT_FALSE(tokens.value().bos_token.has_value());
  EXPECT_EQ(tokens.value().eos_token.value(), "<|im_end|>");
  EXPECT_EQ(t.value().render(chat_template_context(messages, true, tokens.value()), kNow).value(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // A list of named templates: "default" is taken.
  tc["chat_template"] = Json::array({{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}});
  std::ofstream(dir / "tokenizer_config.json") << tc.dump();
  EXPECT_EQ(load_chat_template(dir.string()).value().source(), "D");
  // chat_template.jinja wins over tokenizer_config.json.
  std::ofstream(dir / "chat_template.jinja") << "J{{ messages|length }}";
  EXPECT_EQ(load_chat_template(dir.string()).value().render(chat_template_context(messages, false, {})).value(), "J1");
  std::filesystem::remove(dir / "chat_template.jinja");
  // No template at all: not_found, naming the file.
  std::ofstream(dir / "tokenizer_config.json") << Json({{"eos_token", "x"}}).dump();
  StatusOr<ChatTemplate> none = load_chat_template(dir.string());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Status::Code::kNotFound);
  EXPECT_NE(none.status().message().find("tokenizer_config.json"), std::string::npos);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(load_chat_template(dir.string()).status().code(), Status::Code::kNotFound);
}

TEST(ChatTemplateContext, AliasesReasoningAsTransformersDoes) {
  const Json messages = Json::parse(R"([{"role": "assistant", "content": "a", "reasoning": "r"},
                                        {"role": "user", "content": "u"}])");
  ChatTemplateTokens tokens;
  tokens.bos_token = "<s>";
  const Json ctx = chat_template_context(messages, true, tokens, {{"enable_thinking", false}});
  EXPECT_EQ(ctx["messages"][0].dump(),
            R"({"thinking":"r","role":"assistant","content":"a","reasoning":"r","reasoning_content":"r"})");
  EXPECT_EQ(ctx["messages"][1].dump(), R"({"role":"user","content":"u"})");
  EXPECT_EQ(ctx["bos_token"], "<s>");
  EXPECT_FALSE(ctx.contains("eos_token"));
  EXPECT_TRUE(ctx["tools"].is_null());
  EXPECT_EQ(ctx["add_generation_prompt"], true);
  EXPECT_EQ(ctx["enable_thinking"], false);
}

// Whitespace control: trim_blocks, lstrip_blocks, "-" and "+" markers, the trailing newline.
TEST(ChatTemplateSyntax, Whitespace) {
  EXPECT_EQ(render("  {%- if true %}\n  a\n  {% endif %}\n  b {# c #}\n  {# d #}\nz\n"), "  a\n  b z");
  EXPECT_EQ(render("\n\n{% if true %}\n\nx\n\n{% endif %}\n\n"), "\n\n\nx\n\n");
  EXPECT_EQ(render("{%- if true -%}\n\n  x  \n\n{%- endif -%}\n\n"), "x");
  EXPECT_EQ(render("a  \n  {%+ if true %}x{% endif +%}\n  y\n{{- ' z ' -}}\n w"), "a  \n  x\n  y z w");
  EXPECT_EQ(render("a {{ 1 }}\n{{ 2 }} \n"), "a 1\n2 ");  // "}}" keeps the newline; one trailing \n dropped
  EXPECT_EQ(render("a\r\nb\rc{% if true %}\r\nd{% endif %}"), "a\nb\ncd");
  EXPECT_EQ(render("{% raw %} {{ x }} {% endraw %}"), " {{ x }} ");
}

TEST(ChatTemplateSyntax, ExpressionsPrintAsPython) {
  EXPECT_EQ(render("{{ [1,'a',none,true,1.5,{'k':[2]}] }}|{{ none }}|{{ 1e20 }}|{{ 1e-5 }}|{{ 3.0 }}"),
            "[1, 'a', None, True, 1.5, {'k': [2]}]|None|1e+20|1e-05|3.0");
  EXPECT_EQ(render("{{ 10/4 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 0.1+0.2 }} {{ 2**10 }}"),
            "2.5 3 -4 2 0.30000000000000004 1024");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }}"), "a1None abab [1, 2] xy");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ '1' == 1 }} {{ not 0 }}"),
            "True False True True False True");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 'k' in d }} {{ 2 not in [1, 2] }}", {{"d", {{"k", 1}}}}),
            "True True False");
  EXPECT_EQ(render("{{ 'x' if a else 'y' }}{{ 'z' if b }}|{{ a or 'd' }}|{{ b and 'e' }}", {{"a", 0}, {"b", 1}}),
            "yz|d|e");
  EXPECT_EQ(render("{{ \"a\\n\\t\\x41\\u00e9\" }}{{ 'x' 'y' }}"), "a\n\tA\xC3\xA9xy");
  EXPECT_EQ(render("{{ messages }}", {{"messages", Json::parse(R"([{"role": "user", "content": "it's \"q\""}])")}}),
            "[{'role': 'user', 'content': 'it\\'s \"q\"'}]");
}

TEST(ChatTemplateSyntax, SubscriptsAndSlices) {
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ [1,2,3][-1] }} {{ 'h\xC3\xA9llo'|length }} {{ 'h\xC3\xA9llo'[1:3] }}"),
            "cba 3 5 \xC3\xA9l");
  EXPECT_EQ(render("{{ [1,2,3,4,5][1:-1:2] }} {{ [1,2,3][::-2] }} {{ x.a[1].b }} {{ x['a'][0] }}",
                   {{"x", Json::parse(R"({"a": [1, {"b": 2}]})")}}),
            "[2, 4] [3, 1] 2 1");
  const Json m = {{"messages", Json::parse(R"([{"role":"a"},{"role":"b"},{"role":"c"}])")}};
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ loop.index0 }}{{ m.role }},{% endfor %}", m), "0c,1b,2a,");
}

TEST(ChatTemplateSyntax, LoopsScopesAndNamespaces) {
  const Json m = {{"messages", Json::parse(R"([{"role":"a"},{"role":"b"},{"role":"c"}])")}};
  EXPECT_EQ(render("{% for m in messages %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                   "{{ loop.revindex0 }}{% endfor %}", m),
            "1TrueFalse322FalseFalse313FalseTrue30");
  // Each iteration has its own scope; a namespace is shared.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"), "12121");
  EXPECT_EQ(render("{% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role == 'b' %}"
                   "{% set ns.found = true %}{% set ns.n = ns.n + loop.index %}{% endif %}{% endfor %}"
                   "{{ ns.found }} {{ ns.n }}", m),
            "True 2");
  EXPECT_EQ(render("{% for m in messages if m.role != 'b' %}{{ m.role }}{{ loop.index }}{% endfor %}"
                   "|{% for x in [] %}x{% else %}empty{% endfor %}", m),
            "a1c2|empty");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}"
                   "{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
                   {{"d", {{"a", 1}, {"b", 2}}}}),
            "a=1;b=2;ab");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}block {{ a }}{% endset %}[{{ c }}]"), "12[block 1]");
  EXPECT_EQ(render("{% macro f(a, b='x') %}<{{ a }}|{{ b }}>{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"), "<1|x><2|3>");
  EXPECT_EQ(render("{% generation %}g{% endgeneration %}"), "g");
}

TEST(ChatTemplateSyntax, FiltersTestsAndMethods) {
  EXPECT_EQ(render("{{ x|default('d') }}{{ y|default('d') }}{{ z|default('d', true) }}", {{"y", "v"}, {"z", ""}}),
            "dvd");
  EXPECT_EQ(render("{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 5|string + 'a' }}|{{ [1,2]|length }}|{{ u|length }}"),
            "x|hi|5a|2|0");
  EXPECT_EQ(render("{{ ['a','b']|join(', ') }}|{{ [3,1,2]|sort }}|{{ [1,2,3]|first }}{{ [1,2,3]|last }}|"
                   "{{ [1,2,3]|reverse|list }}|{{ 'Hi'|upper }}{{ 'Hi'|lower }}"),
            "a, b|[1, 2, 3]|13|[3, 2, 1]|HIhi");
  EXPECT_EQ(render("{{ x|tojson }}", {{"x", Json::parse(R"({"a": [1, 2.5, "\u00e9\n\"\u0001"], "b": {}, "c": null})")}}),
            "{\"a\": [1, 2.5, \"\xC3\xA9\\n\\\"\\u0001\"], \"b\": {}, \"c\": null}");
  EXPECT_EQ(render("{{ x|tojson(indent=2) }}", {{"x", Json::parse(R"({"a": [1], "b": {}})")}}),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ ['a','code_interpreter','b']|reject('equalto','code_interpreter')|join(', ') }}"), "a, b");
  EXPECT_EQ(render("{{ t|selectattr('type','equalto','f')|map(attribute='name')|join(',') }}",
                   {{"t", Json::parse(R"([{"type":"f","name":"a"},{"type":"x","name":"b"},{"type":"f","name":"c"}])")}}),
            "a,c");
  EXPECT_EQ(render("{{ m.content is string }}{{ m.content is none }}{{ m.c2 is mapping }}{{ m.c3 is iterable }}"
                   "{{ m.x is defined }}{{ 1 is number }}{{ true is integer }}{{ f is false }}",
                   {{"m", Json::parse(R"({"content": null, "c2": {"a": 1}, "c3": [1]})")}, {"f", false}}),
            "FalseTrueTrueTrueFalseTrueFalseTrue");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ '  a b  '.split() }} {{ 'a b c'.rsplit(' ', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a b', 'c']");
  EXPECT_EQ(render("{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ '\\na\\n'.rstrip('\\n') }}|"
                   "{{ 'ab'.startswith(('x', 'a')) }}{{ 'ab'.endswith('b') }}{{ 'a-b'.replace('-', '+') }}"),
            "a|a |\na|TrueTruea+b");
  EXPECT_EQ(render("{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
                   {{"c", "<think>\nr\n</think>\n\nx"}}),
            "r");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ '%s-%d' % ('a', 3) }}",
                   {{"d", {{"a", 1}}}}),
            "15['a']a-3");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
}

TEST(ChatTemplateErrors, MalformedTemplatesReturnAStatus) {
  struct Case {
    const char* source;
    Status::Code code;
    const char* says;
  };
  const Case cases[] = {
      {"{% if true %}x", Status::Code::kInvalidArgument, "unclosed '{% if %}'"},
      {"a\n{% for x in y %}", Status::Code::kInvalidArgument, "line 2"},
      {"{{ x ", Status::Code::kInvalidArgument, "unclosed tag"},
      {"{# x ", Status::Code::kInvalidArgument, "unclosed comment"},
      {"{{ 'abc }}", Status::Code::kInvalidArgument, "unterminated string"},
      {"{{ x | nosuch }}", Status::Code::kInvalidArgument, "unknown filter 'nosuch'"},
      {"{{ x is nosuch }}", Status::Code::kInvalidArgument, "unknown test 'nosuch'"},
      {"{% nosuch %}", Status::Code::kInvalidArgument, "unknown tag 'nosuch'"},
      {"{% endif %}", Status::Code::kInvalidArgument, "unexpected '{% endif %}'"},
      {"{% if %}{% endif %}", Status::Code::kInvalidArgument, "expected an expression"},
      {"{{ (1 }}", Status::Code::kInvalidArgument, "line 1"},
      {"{{ 1 ) }}", Status::Code::kInvalidArgument, "unexpected ')'"},
      {"{{ 1 $ 2 }}", Status::Code::kInvalidArgument, "unexpected character '$'"},
      {"{% include 'x' %}", Status::Code::kUnsupported, "include"},
      {"{% for x in y recursive %}{% endfor %}", Status::Code::kUnsupported, "recursive"},
      {"{{ f(*a) }}", Status::Code::kUnsupported, "*args"},
      {"\n\n{{ raise_exception('no system message') }}", Status::Code::kInvalidArgument,
       "line 3: raise_exception: no system message"},
      {"{{ x.y }}", Status::Code::kInvalidArgument, "'x' is undefined"},
      {"{{ d.y + 'a' }}", Status::Code::kInvalidArgument, "'dict object' has no attribute 'y'"},
      {"{{ messages[0]['role'] }}", Status::Code::kInvalidArgument, "'list object' has no element 0"},
      {"{{ 'a' + 1 }}", Status::Code::kInvalidArgument, "unsupported operand type(s) for +: 'str' and 'int'"},
      {"{{ 1 // 0 }}", Status::Code::kInvalidArgument, "by zero"},
      {"{% for x in 5 %}{% endfor %}", Status::Code::kInvalidArgument, "'int' object is not iterable"},
      {"{% set s = 'x' %}{% set s.a = 1 %}", Status::Code::kInvalidArgument, "namespace"},
      {"{{ u|tojson }}", Status::Code::kInvalidArgument, "not JSON serializable"},
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", Status::Code::kInvalidArgument, "recursion"},
      {"{{ range(1000000)|length }}", Status::Code::kInvalidArgument, "range too big"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.source);
    const Status s = render_status(c.source, {{"d", Json::object()}, {"messages", Json::array()}});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("chat template test"), std::string::npos) << s.to_string();
  }
  // Deep nesting is refused, not recursed into until the stack runs out.
  const Status deep = render_status("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  EXPECT_NE(deep.message().find("nested deeper than"), std::string::npos) << deep.to_string();
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_NE(render_status(blocks).message().find("nested deeper than"), std::string::npos);
  // A context that is not an object.
  EXPECT_FALSE(parse_ok("x").render(Json::array(), kNow).ok());
}

// Random bytes and truncations of real templates never crash the parser or the renderer.
TEST(ChatTemplateErrors, TruncatedTemplatesNeverCrash) {
  const std::string qwen3 = read_text(kChat + "/qwen3.jinja");
  const Json ctx = chat_template_context(Json::parse(R"([{"role": "user", "content": "Hi"}])"), true, {});
  int parsed = 0;
  for (size_t n = 0; n <= qwen3.size(); n += 7) {
    StatusOr<ChatTemplate> t = ChatTemplate::parse(qwen3.substr(0, n), "cut");
    if (!t.ok()) continue;
    ++parsed;
    (void)t.value().render(ctx, kNow);
  }
  EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace untied
