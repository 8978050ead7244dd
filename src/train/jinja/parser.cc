// The parser: Jinja2's grammar (jinja2/parser.py) for the supported tags and expressions.
//
//   expression := or ["if" or ["else" expression]]
//   or := and ("or" and)*           and := not ("and" not)*        not := "not" not | compare
//   compare := sum (("=="|"!="|"<"|"<="|">"|">="|"in"|"not in") sum)*
//   sum := concat (("+"|"-") concat)*                concat := product ("~" product)*
//   product := power (("*"|"/"|"//"|"%") power)*     power := unary ("**" unary)*
//   unary := ("-"|"+") unary-without-filters | primary postfix* ; then ("|" filter | "is" test | call)*
//   primary := name | string+ | integer | float | "(" tuple ")" | "[" list "]" | "{" dict "}"
//   postfix := "." name | "." integer | "[" subscript-or-slice "]" | "(" arguments ")"
#include <set>

#include "train/jinja/builtins.h"
#include "train/jinja/syntax.h"
#include "train/jinja/value.h"

namespace untied::jinja {
namespace {

using ExprPtr = std::unique_ptr<Expr>;

// Nesting deeper than this (brackets, blocks) is refused rather than recursed into: real
// templates nest a few levels; the limit keeps a hostile template from exhausting the stack.
constexpr int kMaxDepth = 256;

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  std::vector<Stmt> parse_template() {
    std::vector<Stmt> body = parse_statements({}, "", 0);
    if (cur().type != Tok::kEof) fail("unexpected '" + cur().text + "'", cur().line);
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVariableEnd: return "'}}'";
      case Tok::kBlockBegin: return "'{%'";
      case Tok::kVariableBegin: return "'{{'";
      case Tok::kData: return "text";
      case Tok::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', found " + describe(cur()), cur().line);
  }
  std::string expect_name(const char* what) {
    if (cur().type != Tok::kName) fail(std::string("expected ") + what + ", found " + describe(cur()), cur().line);
    return next().text;
  }
  void expect_block_end(const char* tag) {
    if (cur().type != Tok::kBlockEnd)
      fail(std::string("expected '%}' to end '{% ") + tag + " %}', found " + describe(cur()), cur().line);
    next();
  }

  // Statements up to "{% <one of ends> ...": returns with the end tag's name as the current token.
  std::vector<Stmt> parse_statements(const std::set<std::string>& ends, const std::string& opener, int open_line) {
    std::vector<Stmt> body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.empty()) return body;
        std::string names;
        for (const auto& e : ends) names += (names.empty() ? "" : " or ") + std::string("'{% ") + e + " %}'";
        fail("unclosed '{% " + opener + " %}' (opened on line " + std::to_string(open_line) + "): add " + names,
             open_line);
      }
      if (t.type == Tok::kData) {
        Stmt s{StmtKind::kText};
        s.line = t.line;
        s.text = t.text;
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kVariableBegin) {
        Stmt s{StmtKind::kOutput};
        s.line = t.line;
        next();
        s.expr = parse_tuple(true);
        if (cur().type != Tok::kVariableEnd) fail("expected '}}', found " + describe(cur()), cur().line);
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const Token& name = peek();
        if (name.type != Tok::kName) fail("expected a tag name after '{%', found " + describe(name), name.line);
        if (ends.count(name.text)) {
          next();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t), t.line);
      }
    }
  }

  // Counts one level of nesting for the life of the guard.
  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels", p_->cur().line);
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  Stmt parse_statement() {
    DepthGuard guard(this);
    const Token& tag = next();
    const int line = tag.line;
    const std::string& name = tag.text;
    if (name == "if") return parse_if(line);
    if (name == "for") return parse_for(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "break" || name == "continue") {
      Stmt s{name == "break" ? StmtKind::kBreak : StmtKind::kContinue};
      s.line = line;
      expect_block_end(name.c_str());
      return s;
    }
    if (name == "generation") {
      Stmt s{StmtKind::kBlock};
      s.line = line;
      expect_block_end("generation");
      s.body = parse_statements({"endgeneration"}, "generation", line);
      next();
      expect_block_end("endgeneration");
      return s;
    }
    static const std::set<std::string> kJinjaTags = {"include", "extends", "block", "import", "from", "call",
                                                     "filter", "with", "autoescape", "do", "trans", "raw"};
    if (kJinjaTags.count(name))
      fail("unsupported: the '{% " + name + " %}' tag is outside the supported subset (if, for, set, macro, "
           "break, continue, generation, raw)", line);
    static const std::set<std::string> kEnds = {"endif", "elif", "else", "endfor", "endset", "endmacro",
                                                "endgeneration", "endraw"};
    if (kEnds.count(name)) fail("unexpected '{% " + name + " %}': no open block takes it", line);
    fail("unknown tag '" + name + "'", line);
  }

  Stmt parse_if(int line) {
    Stmt s{StmtKind::kIf};
    s.line = line;
    ExprPtr cond = parse_expression(false);
    expect_block_end("if");
    while (true) {
      std::vector<Stmt> body = parse_statements({"elif", "else", "endif"}, "if", line);
      const std::string tag = next().text;
      s.branches.emplace_back(std::move(cond), std::move(body));
      if (tag == "endif") {
        expect_block_end("endif");
        return s;
      }
      if (tag == "else") {
        expect_block_end("else");
        std::vector<Stmt> else_body = parse_statements({"endif"}, "if", line);
        next();
        expect_block_end("endif");
        s.branches.emplace_back(nullptr, std::move(else_body));
        return s;
      }
      cond = parse_expression(false);  // elif
      expect_block_end("elif");
    }
  }

  std::vector<std::string> parse_targets(const char* what) {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      names.push_back(expect_name(what));
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  Stmt parse_for(int line) {
    Stmt s{StmtKind::kFor};
    s.line = line;
    s.targets = parse_targets("a loop variable");
    if (!skip_name("in")) fail("expected 'in' in '{% for %}', found " + describe(cur()), cur().line);
    s.expr = parse_tuple(false);
    if (skip_name("if")) s.filter = parse_expression(true);
    if (is_name("recursive")) fail("unsupported: recursive loops are outside the supported subset", line);
    expect_block_end("for");
    s.body = parse_statements({"endfor", "else"}, "for", line);
    if (next().text == "else") {
      expect_block_end("else");
      s.else_body = parse_statements({"endfor"}, "for", line);
      next();
    }
    expect_block_end("endfor");
    return s;
  }

  Stmt parse_set(int line) {
    Stmt s{StmtKind::kSet};
    s.line = line;
    if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == ".") {
      s.kind = StmtKind::kSetAttr;
      s.targets.push_back(next().text);
      next();
      s.text = expect_name("an attribute name");
      expect_op("=");
      s.expr = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    s.targets = parse_targets("a variable name");
    if (skip_op("=")) {
      s.expr = parse_tuple(true);
      expect_block_end("set");
      return s;
    }
    if (s.targets.size() != 1) fail("a block '{% set %}' takes one name", line);
    if (is_op("|")) fail("unsupported: filtered block '{% set %}' is outside the supported subset", line);
    expect_block_end("set");
    s.kind = StmtKind::kSetBlock;
    s.body = parse_statements({"endset"}, "set", line);
    next();
    expect_block_end("endset");
    return s;
  }

  Stmt parse_macro(int line) {
    Stmt s{StmtKind::kMacro};
    s.line = line;
    s.text = expect_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      if (!s.targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s.targets.push_back(expect_name("a parameter name"));
      s.defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
    expect_block_end("macro");
    s.body = parse_statements({"endmacro"}, "macro", line);
    next();
    if (cur().type == Tok::kName) next();  // {% endmacro name %}
    expect_block_end("endmacro");
    return s;
  }

  // expression ("," expression)*: a list when there is a comma.
  ExprPtr parse_tuple(bool with_condexpr) {
    const int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    ExprPtr list = make(ExprKind::kList, line);
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kBlockEnd || cur().type == Tok::kVariableEnd || is_op(")")) break;
      list->items.push_back(parse_expression(with_condexpr));
    }
    return list;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(this);
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      const int line = next().line;
      ExprPtr c = make(ExprKind::kCond, line);
      c->b = parse_or();
      c->a = std::move(e);
      if (skip_name("else")) c->c = parse_expression(true);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      ExprPtr o = make(ExprKind::kOr, next().line);
      o->a = std::move(e);
      o->b = parse_and();
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      ExprPtr o = make(ExprKind::kAnd, next().line);
      o->a = std::move(e);
      o->b = parse_not();
      e = std::move(o);
    }
    return e;
  }

  ExprPtr parse_not() {
    DepthGuard guard(this);
    if (is_name("not")) {
      ExprPtr n = make(ExprKind::kNot, next().line);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr e = parse_sum();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, line);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_sum());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
    ExprPtr e = make(ExprKind::kBinary, line);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_sum() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_product();
    while (is_op("~")) {
      const Token& t = next();
      e = binary("~", std::move(e), parse_product(), t.line);
    }
    return e;
  }

  ExprPtr parse_product() {
    ExprPtr e = parse_power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.text, std::move(e), parse_power(), t.line);
    }
    return e;
  }

  ExprPtr parse_power() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary("**", std::move(e), parse_unary(true), t.line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(t.text == "-" ? ExprKind::kNeg : ExprKind::kPos, t.line);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      next();
      ExprPtr e = make(ExprKind::kLiteral, line);
      if (t.text == "true" || t.text == "True") e->literal = true;
      else if (t.text == "false" || t.text == "False") e->literal = false;
      else if (t.text == "none" || t.text == "None") e->literal = nullptr;
      else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += next().text;
      ExprPtr e = make(ExprKind::kLiteral, line);
      e->literal = s;
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      next();
      ExprPtr e = make(ExprKind::kLiteral, line);
      try {
        if (t.type == Tok::kInt) e->literal = static_cast<int64_t>(std::stoll(t.text));
        else e->literal = std::stod(t.text);
      } catch (const std::exception&) {
        fail("number out of range: " + t.text, line);
      }
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(ExprKind::kList, line);
      ExprPtr e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      ExprPtr e = make(ExprKind::kList, line);
      while (!is_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (skip_op("{")) {
      ExprPtr e = make(ExprKind::kDict, line);
      while (!is_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op("}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail("expected an expression, found " + describe(t), line);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (cur().type == Tok::kName) {
          ExprPtr a = make(ExprKind::kAttr, line);
          a->a = std::move(e);
          a->name = next().text;
          e = std::move(a);
        } else if (cur().type == Tok::kInt) {
          ExprPtr a = make(ExprKind::kItem, line);
          a->a = std::move(e);
          a->b = make(ExprKind::kLiteral, line);
          a->b->literal = static_cast<int64_t>(std::stoll(next().text));
          e = std::move(a);
        } else {
          fail("expected an attribute name after '.', found " + describe(cur()), cur().line);
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const int line = next().line;  // '['
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (!is_op(":") && !is_op("]")) parts[n] = parse_expression(true);
      if (skip_op(":")) {
        slice = true;
        if (++n > 2) fail("a slice has at most start:stop:step", line);
        continue;
      }
      break;
    }
    expect_op("]");
    ExprPtr e = make(slice ? ExprKind::kSlice : ExprKind::kItem, line);
    e->a = std::move(obj);
    if (slice) {
      for (auto& p : parts) e->items.push_back(std::move(p));
    } else {
      if (!parts[0]) fail("empty subscript '[]'", line);
      e->b = std::move(parts[0]);
    }
    return e;
  }

  // "(" args ")" into e->items / e->kwargs.
  void parse_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("unsupported: *args and **kwargs in calls", cur().line);
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = next().text;
        next();
        e->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e->kwargs.empty()) fail("a positional argument follows a keyword argument", cur().line);
        e->items.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make(ExprKind::kCall, cur().line);
    e->a = std::move(callee);
    parse_args(e.get());
    return e;
  }

  std::string dotted_name(const char* what) {
    std::string name = expect_name(what);
    while (is_op(".") && peek().type == Tok::kName) {
      next();
      name += "." + next().text;
    }
    return name;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        ExprPtr f = make(ExprKind::kFilter, line);
        f->name = dotted_name("a filter name");
        if (!is_known_filter(f->name)) fail("unknown filter '" + f->name + "' (" + known_filters_hint() + ")", line);
        f->a = std::move(e);
        if (is_op("(")) parse_args(f.get());
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        ExprPtr t = make(ExprKind::kTest, line);
        t->negated = skip_name("not");
        t->name = dotted_name("a test name");
        if (!is_known_test(t->name)) fail("unknown test '" + t->name + "' (" + known_tests_hint() + ")", line);
        t->a = std::move(e);
        if (is_op("(")) {
          parse_args(t.get());
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                    cur().type == Tok::kFloat || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("tests cannot be chained with 'is'", cur().line);
          t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<Stmt> parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace untied::jinja
