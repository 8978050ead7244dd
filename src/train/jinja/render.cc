#include "train/jinja/render.h"

#include <cmath>
#include <memory>
#include <unordered_map>

#include "train/jinja/builtins.h"
#include "train/jinja/value.h"

namespace untied::jinja {
namespace {

constexpr int kMaxMacroDepth = 100;
constexpr int64_t kMaxRange = 100000;  // Jinja2's sandbox limit on range()

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

Value int_value(int64_t i) { return Value::data(Json(i)); }
Value float_value(double d) { return Value::data(Json(d)); }
Value str_value(std::string s) { return Value::data(Json(std::move(s))); }

Value make_callable(std::string name, std::function<Value(const Args&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value::of_callable(std::move(c));
}

// A number's value (bool counts as int, as in Python).
struct Number {
  bool is_float;
  int64_t i;
  double f;
};

Number number_of(const Value& v, const std::string& op, const Value& other, bool left) {
  if (!v.is_number())
    fail("unsupported operand type(s) for " + op + ": '" + type_name(left ? v : other) + "' and '" +
         type_name(left ? other : v) + "'");
  const Json& j = v.j();
  if (j.is_boolean()) return {false, j.get<bool>() ? 1 : 0, j.get<bool>() ? 1.0 : 0.0};
  if (j.is_number_float()) return {true, 0, j.get<double>()};
  const int64_t i = j.is_number_unsigned() ? static_cast<int64_t>(j.get<uint64_t>()) : j.get<int64_t>();
  return {false, i, static_cast<double>(i)};
}

// a op b on 64-bit integers; Python's are unbounded, so an overflow is an error, not a wrap.
int64_t checked(char op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == '+' ? __builtin_add_overflow(a, b, &r)
                        : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) fail("integer overflow: this renderer's integers are 64-bit");
  return r;
}

Value arithmetic(const std::string& op, const Value& l, const Value& r) {
  if (op == "~") return str_value(py_str(l) + py_str(r));
  if (l.is_undefined()) fail(l.hint);
  if (r.is_undefined()) fail(r.hint);
  if (op == "+") {
    if (l.is_string() && r.is_string()) return str_value(l.str() + r.str());
    if (l.is_array() && r.is_array()) {
      Json out = l.j();
      for (const Json& e : r.j()) out.push_back(e);
      return Value::data(std::move(out));
    }
  }
  if (op == "%" && l.is_string()) return str_value(percent_format(l.str(), r));
  if (op == "*" && (l.is_string() || l.is_array() || r.is_string() || r.is_array())) {
    const Value& seq = l.is_string() || l.is_array() ? l : r;
    const Value& count = l.is_string() || l.is_array() ? r : l;
    if (!count.is_int() && !count.is_bool())
      fail("can't multiply sequence by non-int of type '" + type_name(count) + "'");
    const int64_t n = number_of(count, op, seq, false).i;
    if (seq.is_string()) {
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.str();
      return str_value(out);
    }
    Json out = Json::array();
    for (int64_t k = 0; k < n; ++k)
      for (const Json& e : seq.j()) out.push_back(e);
    return Value::data(std::move(out));
  }
  const Number a = number_of(l, op, r, true), b = number_of(r, op, l, false);
  const bool fl = a.is_float || b.is_float;
  if (op == "+") return fl ? float_value(a.f + b.f) : int_value(checked('+', a.i, b.i));
  if (op == "-") return fl ? float_value(a.f - b.f) : int_value(checked('-', a.i, b.i));
  if (op == "*") return fl ? float_value(a.f * b.f) : int_value(checked('*', a.i, b.i));
  if (op == "/") {
    if (b.f == 0) fail("division by zero");
    return float_value(a.f / b.f);
  }
  if (op == "//" || op == "%") {
    if (fl) {
      if (b.f == 0) fail("float division by zero");
      const double m = std::fmod(a.f, b.f);
      const double mod = (m != 0 && ((m < 0) != (b.f < 0))) ? m + b.f : m;
      return op == "%" ? float_value(mod) : float_value(std::floor((a.f - mod) / b.f + 0.5));
    }
    if (b.i == 0) fail("integer division or modulo by zero");
    int64_t q = a.i / b.i, m = a.i % b.i;
    if (m != 0 && ((m < 0) != (b.i < 0))) {
      q -= 1;
      m += b.i;
    }
    return int_value(op == "%" ? m : q);
  }
  if (op == "**") {
    if (!fl && b.i >= 0) {
      int64_t p = 1;
      for (int64_t k = 0; k < b.i; ++k) p = checked('*', p, a.i);
      return int_value(p);
    }
    return float_value(std::pow(a.f, b.f));
  }
  fail("unknown operator '" + op + "'");
}

class Renderer {
 public:
  explicit Renderer(std::time_t now) : now_(now) {}

  std::string run(const std::vector<Stmt>& body, const Json& context) {
    // The context is not copied: values refer into it while the render runs.
    std::shared_ptr<const Json> ctx(std::shared_ptr<const Json>(), &context);
    auto globals = std::make_shared<Scope>();
    add_globals(*globals);
    auto root = std::make_shared<Scope>();
    root->parent = globals;
    for (auto it = context.begin(); it != context.end(); ++it) root->vars[it.key()] = Value::ref(ctx, &it.value());
    std::string out;
    if (exec(body, root, out) != Flow::kNormal) fail("'break' or 'continue' outside a loop");
    return out;
  }

 private:
  void add_globals(Scope& g) {
    g.vars["range"] = make_callable("range", [](const Args& a) {
      a.check("range", 3, {});
      if (a.positional.empty()) fail("range expected at least 1 argument, got 0");
      std::vector<int64_t> p;
      for (const Value& v : a.positional) {
        if (!v.is_int() && !v.is_bool()) fail("range() arguments must be integers, not '" + type_name(v) + "'");
        p.push_back(number_of(v, "range", v, true).i);
      }
      const int64_t start = p.size() > 1 ? p[0] : 0, stop = p.size() > 1 ? p[1] : p[0], step = p.size() > 2 ? p[2] : 1;
      if (step == 0) fail("range() arg 3 must not be zero");
      Json out = Json::array();
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (static_cast<int64_t>(out.size()) >= kMaxRange) fail("range too big: at most 100000 items");
        out.push_back(i);
      }
      return Value::data(std::move(out));
    });
    g.vars["namespace"] = make_callable("namespace", [](const Args& a) {
      auto ns = std::make_shared<Object>();
      ns->type_name = "Namespace";
      ns->assignable = true;
      for (const Value& v : a.positional) {
        if (!v.is_dict()) fail("namespace() takes a dict or keyword arguments");
        for (auto it = v.j().begin(); it != v.j().end(); ++it) ns->set(it.key(), v.child(it.value()));
      }
      for (const auto& [k, v] : a.keyword) ns->set(k, v);
      for (const auto& [k, v] : ns->attrs)
        if (!k.empty() && k[0] == '_')
          fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + k + "'");
      return Value::of_object(ns);
    });
    g.vars["dict"] = make_callable("dict", [](const Args& a) {
      Json out = Json::object();
      for (const Value& v : a.positional) {
        if (!v.is_dict()) fail("dict() takes a dict or keyword arguments");
        for (auto it = v.j().begin(); it != v.j().end(); ++it) out[it.key()] = it.value();
      }
      for (const auto& [k, v] : a.keyword) out[k] = to_plain_json(v);
      return Value::data(std::move(out));
    });
    g.vars["raise_exception"] = make_callable("raise_exception", [](const Args& a) -> Value {
      throw TemplateError{a.positional.empty() ? std::string() : py_str(a.positional[0]), 0, true};
    });
    const std::time_t now = now_;
    g.vars["strftime_now"] = make_callable("strftime_now", [now](const Args& a) {
      a.check("strftime_now", 1, {});
      if (a.positional.empty() || !a.positional[0].is_string()) fail("strftime_now() takes a format string");
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[512];
      const size_t n = std::strftime(buf, sizeof buf, a.positional[0].str().c_str(), &tm);
      return str_value(std::string(buf, n));
    });
  }

  Args eval_args(const Expr& e, const ScopePtr& s) {
    Args a;
    for (const auto& item : e.items) a.positional.push_back(eval(*item, s));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v, s));
    return a;
  }

  Value eval(const Expr& e, const ScopePtr& s) {
    try {
      return eval_node(e, s);
    } catch (TemplateError& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  Value eval_node(const Expr& e, const ScopePtr& s) {
    switch (e.kind) {
      case ExprKind::kLiteral: return Value::ref(nullptr, &e.literal);
      case ExprKind::kName: {
        if (const Value* v = s->find(e.name)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case ExprKind::kList: {
        Json out = Json::array();
        for (const auto& item : e.items) out.push_back(to_plain_json(eval(*item, s)));
        return Value::data(std::move(out));
      }
      case ExprKind::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value k = eval(*e.items[i], s);
          if (!k.is_string()) fail("dict keys must be strings here, not '" + type_name(k) + "'");
          out[k.str()] = to_plain_json(eval(*e.items[i + 1], s));
        }
        return Value::data(std::move(out));
      }
      case ExprKind::kAttr: return get_attribute(eval(*e.a, s), e.name);
      case ExprKind::kItem: {
        const Value obj = eval(*e.a, s);
        return get_item(obj, eval(*e.b, s));
      }
      case ExprKind::kSlice: {
        const Value obj = eval(*e.a, s);
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.items[i]) parts[i] = eval(*e.items[i], s);
        return get_slice(obj, e.items[0] ? &parts[0] : nullptr, e.items[1] ? &parts[1] : nullptr,
                         e.items[2] ? &parts[2] : nullptr);
      }
      case ExprKind::kCall: {
        const Value callee = eval(*e.a, s);
        const Args args = eval_args(e, s);
        if (callee.kind == Value::Kind::kCallable) return callee.callable->fn(args);
        if (callee.is_undefined()) fail(callee.hint);
        fail("'" + type_name(callee) + "' object is not callable");
      }
      case ExprKind::kFilter: {
        const Value v = eval(*e.a, s);
        return apply_filter(e.name, v, eval_args(e, s));
      }
      case ExprKind::kTest: {
        const Value v = eval(*e.a, s);
        return Value::data(Json(apply_test(e.name, v, eval_args(e, s)) != e.negated));
      }
      case ExprKind::kNot: return Value::data(Json(!truthy(eval(*e.a, s))));
      case ExprKind::kNeg:
      case ExprKind::kPos: {
        const Value v = eval(*e.a, s);
        if (v.is_undefined()) fail(v.hint);
        const Number n = number_of(v, e.kind == ExprKind::kNeg ? "unary -" : "unary +", v, true);
        if (e.kind == ExprKind::kPos) return n.is_float ? float_value(n.f) : int_value(n.i);
        return n.is_float ? float_value(-n.f) : int_value(-n.i);
      }
      case ExprKind::kBinary: {
        const Value l = eval(*e.a, s);
        return arithmetic(e.name, l, eval(*e.b, s));
      }
      case ExprKind::kAnd: {
        Value l = eval(*e.a, s);
        return truthy(l) ? eval(*e.b, s) : l;
      }
      case ExprKind::kOr: {
        Value l = eval(*e.a, s);
        return truthy(l) ? l : eval(*e.b, s);
      }
      case ExprKind::kCompare: {
        Value left = eval(*e.a, s);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i], s);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") ok = equals(left, right);
          else if (op == "!=") ok = !equals(left, right);
          else if (op == "<") ok = less(left, right);
          else if (op == "<=") ok = !less(right, left);
          else if (op == ">") ok = less(right, left);
          else if (op == ">=") ok = !less(left, right);
          else if (op == "in") ok = contains(right, left);
          else ok = !contains(right, left);
          if (!ok) return Value::data(Json(false));
          left = std::move(right);
        }
        return Value::data(Json(true));
      }
      case ExprKind::kCond: {
        if (truthy(eval(*e.b, s))) return eval(*e.a, s);
        if (e.c) return eval(*e.c, s);
        return Value::undefined("the conditional expression on line " + std::to_string(e.line) + " has no else");
      }
    }
    fail("unknown expression");
  }

  void bind(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    const std::vector<Value> items = iterate(v);
    if (items.size() != targets.size())
      fail(std::string(items.size() < targets.size() ? "not enough" : "too many") + " values to unpack (expected " +
           std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")");
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Flow exec(const std::vector<Stmt>& body, const ScopePtr& s, std::string& out) {
    for (const Stmt& st : body) {
      try {
        const Flow f = exec_one(st, s, out);
        if (f != Flow::kNormal) return f;
      } catch (TemplateError& err) {
        if (err.line == 0) err.line = st.line;
        throw;
      }
    }
    return Flow::kNormal;
  }

  Flow exec_one(const Stmt& st, const ScopePtr& s, std::string& out) {
    switch (st.kind) {
      case StmtKind::kText: out += st.text; return Flow::kNormal;
      case StmtKind::kOutput: out += py_str(eval(*st.expr, s)); return Flow::kNormal;
      case StmtKind::kIf:
        for (const auto& [cond, body] : st.branches)
          if (!cond || truthy(eval(*cond, s))) return exec(body, s, out);
        return Flow::kNormal;
      case StmtKind::kFor: return exec_for(st, s, out);
      case StmtKind::kSet: bind(*s, st.targets, eval(*st.expr, s)); return Flow::kNormal;
      case StmtKind::kSetAttr: {
        const Value* target = s->find(st.targets[0]);
        if (!target || target->kind != Value::Kind::kObject || !target->object->assignable)
          fail("cannot set '" + st.targets[0] + "." + st.text + "': only namespace() objects take attributes");
        if (!st.text.empty() && st.text[0] == '_')
          fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + st.text + "'");
        target->object->set(st.text, eval(*st.expr, s));
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        std::string captured;
        if (exec(st.body, s, captured) != Flow::kNormal) fail("'break' or 'continue' inside '{% set %}'");
        s->vars[st.targets[0]] = str_value(std::move(captured));
        return Flow::kNormal;
      }
      case StmtKind::kMacro: s->vars[st.text] = make_macro(st, s); return Flow::kNormal;
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kBlock: return exec(st.body, s, out);
    }
    fail("unknown statement");
  }

  Flow exec_for(const Stmt& st, const ScopePtr& s, std::string& out) {
    std::vector<Value> items = iterate(eval(*st.expr, s));
    if (st.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        auto probe = std::make_shared<Scope>();
        probe->parent = s;
        bind(*probe, st.targets, item);
        if (truthy(eval(*st.filter, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      const Flow f = exec(st.else_body, s, out);
      return f == Flow::kNormal ? f : Flow::kNormal;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto iter = std::make_shared<Scope>();
      iter->parent = s;
      bind(*iter, st.targets, items[static_cast<size_t>(i)]);
      auto loop = std::make_shared<Object>();
      loop->type_name = "LoopContext";
      loop->attrs = {
          {"index", int_value(i + 1)},
          {"index0", int_value(i)},
          {"revindex", int_value(n - i)},
          {"revindex0", int_value(n - i - 1)},
          {"first", Value::data(Json(i == 0))},
          {"last", Value::data(Json(i == n - 1))},
          {"length", int_value(n)},
          {"depth", int_value(1)},
          {"depth0", int_value(0)},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item")},
      };
      loop->attrs.emplace_back("cycle", make_callable("loop.cycle", [i](const Args& a) {
                                 if (a.positional.empty()) fail("no items for cycling given");
                                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
                               }));
      iter->vars["loop"] = Value::of_object(loop);
      if (exec(st.body, iter, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Stmt& st, const ScopePtr& defining) {
    std::weak_ptr<Scope> weak = defining;
    const Stmt* macro = &st;
    return make_callable(st.text, [this, weak, macro](const Args& a) {
      ScopePtr parent = weak.lock();
      if (!parent) fail("macro '" + macro->text + "' called after its scope ended");
      if (a.positional.size() > macro->targets.size())
        fail("macro '" + macro->text + "' takes " + std::to_string(macro->targets.size()) + " argument(s), got " +
             std::to_string(a.positional.size()));
      auto scope = std::make_shared<Scope>();
      scope->parent = parent;
      for (const auto& [k, v] : a.keyword)
        if (std::find(macro->targets.begin(), macro->targets.end(), k) == macro->targets.end())
          fail("macro '" + macro->text + "' has no parameter '" + k + "'");
      for (size_t i = 0; i < macro->targets.size(); ++i) {
        const Value* given = a.get(i, macro->targets[i]);
        if (given) scope->vars[macro->targets[i]] = *given;
        else if (macro->defaults[i]) scope->vars[macro->targets[i]] = eval(*macro->defaults[i], scope);
        else scope->vars[macro->targets[i]] = Value::undefined("parameter '" + macro->targets[i] + "' was not provided");
      }
      if (++depth_ > kMaxMacroDepth) {
        depth_ = 0;
        fail("macro recursion deeper than " + std::to_string(kMaxMacroDepth));
      }
      std::string text;
      const Flow f = exec(macro->body, scope, text);
      --depth_;
      if (f != Flow::kNormal) fail("'break' or 'continue' outside a loop in macro '" + macro->text + "'");
      return str_value(std::move(text));
    });
  }

  std::time_t now_;
  int depth_ = 0;
};

}  // namespace

std::string render(const std::vector<Stmt>& body, const Json& context, std::time_t now) {
  return Renderer(now).run(body, context);
}

}  // namespace untied::jinja
