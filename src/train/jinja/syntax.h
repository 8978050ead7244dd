// The syntax of the Jinja subset: tokens (lexer.cc) and the tree the parser builds (parser.cc).
//
// The lexer follows Jinja2's lexer with the settings transformers uses (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False): whitespace control is resolved here, so the
// tree's text nodes hold exactly the bytes the template writes. The tree is immutable once built
// and rendered by render.cc; nodes carry the template line they start on, for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "untied/core/json.h"

namespace untied::jinja {

enum class Tok { kData, kVariableBegin, kVariableEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // kData: the text; kString: the decoded literal; kOp: the operator; else the source
  int line;
};

// Source to tokens. Throws TemplateError (unclosed tags, unexpected characters).
std::vector<Token> lex(const std::string& source);

enum class ExprKind {
  kLiteral,    // literal
  kName,       // name
  kList,       // items (also tuples)
  kDict,       // items: key, value, key, value, ...
  kAttr,       // a.name
  kItem,       // a[b]
  kSlice,      // a[items[0]:items[1]:items[2]] (null parts omitted)
  kCall,       // a(items..., kwargs...)
  kFilter,     // a | name(items..., kwargs...)
  kTest,       // a is [not] name(items...)
  kNot,        // not a
  kNeg,        // -a
  kPos,        // +a
  kBinary,     // a name b: + - * / // % ** ~
  kAnd,        // a and b
  kOr,         // a or b
  kCompare,    // a ops[0] items[0] ops[1] items[1] ...
  kCond,       // a if b else c
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Json literal;
  std::unique_ptr<Expr> a, b, c;
  std::vector<std::unique_ptr<Expr>> items;  // nullptr entries: omitted slice parts
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;  // kTest: "is not"
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (cond, body); a null cond is the else
  kFor,       // for targets in expr [if filter]: body [else else_body]
  kSet,       // set targets = expr
  kSetAttr,   // set targets[0].name = expr
  kSetBlock,  // set targets[0] %}body{% endset
  kMacro,     // macro name(targets = defaults...): body
  kBreak,
  kContinue,
  kBlock,     // a body rendered in place ({% generation %})
};

struct Stmt {
  explicit Stmt(StmtKind k, int l = 0) : kind(k), line(l) {}
  StmtKind kind;
  int line = 0;
  std::string text;  // kText; kSetAttr / kMacro: the name
  std::unique_ptr<Expr> expr;
  std::unique_ptr<Expr> filter;
  std::vector<std::string> targets;
  std::vector<std::unique_ptr<Expr>> defaults;  // kMacro: one per target, nullptr without a default
  std::vector<std::pair<std::unique_ptr<Expr>, std::vector<Stmt>>> branches;
  std::vector<Stmt> body, else_body;
};

// Tokens to the statement list of the whole template. Throws TemplateError: unclosed blocks,
// unknown tags, filters and tests (checked here, as Jinja2 does when it compiles), bad syntax.
std::vector<Stmt> parse(const std::vector<Token>& tokens);

}  // namespace untied::jinja
