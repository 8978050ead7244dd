// The buffers, regions, rules and helpers of op_case.h, and the registry of every case.
#include "ops/op_case.h"

#include <cstdio>
#include <cstring>

namespace untied::ops {

int64_t elem_size(Elem e) {
  switch (e) {
    case Elem::kF32:
      return 4;
    case Elem::kBF16:
      return 2;
    case Elem::kF64:
      return 8;
    case Elem::kI32:
      return 4;
    case Elem::kI64:
      return 8;
    case Elem::kU8:
      return 1;
  }
  return 1;
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kF32:
      return "f32";
    case Elem::kBF16:
      return "bf16";
    case Elem::kF64:
      return "f64";
    case Elem::kI32:
      return "i32";
    case Elem::kI64:
      return "i64";
    case Elem::kU8:
      return "u8";
  }
  return "?";
}

HostBuffer::HostBuffer(Elem e, int64_t n, int64_t skew_elems)
    : elem(e), skew(skew_elems), elems(n), bytes(static_cast<size_t>((n + skew_elems) * elem_size(e))) {}

double HostBuffer::get(int64_t i) const {
  const unsigned char* p = bytes.data() + (skew + i) * elem_size(elem);
  switch (elem) {
    case Elem::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case Elem::kBF16: {
      bf16 b;
      std::memcpy(&b.bits, p, 2);
      return bf16_to_float(b);
    }
    case Elem::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case Elem::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case Elem::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    case Elem::kU8:
      return *p;
  }
  return 0;
}

void HostBuffer::set(int64_t i, double v) {
  unsigned char* p = bytes.data() + (skew + i) * elem_size(elem);
  switch (elem) {
    case Elem::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case Elem::kBF16: {
      const bf16 b = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &b.bits, 2);
      return;
    }
    case Elem::kF64:
      std::memcpy(p, &v, 8);
      return;
    case Elem::kI32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      return;
    }
    case Elem::kI64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      return;
    }
    case Elem::kU8:
      *p = static_cast<unsigned char>(v);
      return;
  }
}

bool Region::contains(int64_t i) const {
  if (i < 0) return false;
  if (rows < 0) return true;
  if (cols <= 0 || rows == 0) return false;
  const int64_t r = stride > 0 ? i / stride : 0, c = stride > 0 ? i % stride : i;
  return r < rows && c < cols;
}

int64_t Region::count(int64_t elems) const {
  if (rows < 0) return elems;
  int64_t n = 0;
  for (int64_t i = 0; i < elems; ++i) n += contains(i);
  return n;
}

std::string Rule::describe() const {
  char buf[160];
  switch (kind) {
    case Kind::kBits:
      return "bit for bit";
    case Kind::kSameValues:
      return "the same values (NaN matches NaN)";
    case Kind::kCustom:
      return "the case's own check";
    case Kind::kClose:
      std::snprintf(buf, sizeof buf, "%g x %s%s%s%s", rel,
                    absolute ? "1 (absolute)" : (increment ? "max |want - init|" : "max |want|"),
                    min_scale > 0 && !absolute ? " (at least the terms' size)" : "",
                    per_elem_rel > 0 ? " + per element" : "", init_rel > 0 ? " + |init| part" : "");
      return buf;
  }
  return "?";
}

void Ctx::step(const std::string& name) {
  if (!mma_) return;
  const long long now = mma_();
  steps_.push_back(Step{name, now > last_});
  last_ = now;
}

BufferSpec input(std::string name, DType t, int64_t elems, int64_t skew, double lo, double hi) {
  return BufferSpec{.name = std::move(name), .elem = elem_of(t), .elems = elems, .skew = skew, .lo = lo, .hi = hi};
}

BufferSpec output(std::string name, DType t, int64_t elems, int64_t skew, Region region, Compare cmp) {
  BufferSpec b = input(std::move(name), t, elems, skew);
  b.output = true;
  b.region = region;
  b.cmp = cmp;
  return b;
}

std::function<void(HostBuffer&, test::Rng&)> fill_value(double v) {
  return [v](HostBuffer& b, test::Rng&) {
    for (int64_t i = -b.skew; i < b.elems; ++i) b.set(i, v);
  };
}

std::function<void(HostBuffer&, test::Rng&)> fill_byte(unsigned char byte) {
  return [byte](HostBuffer& b, test::Rng&) { b.fill_bytes(byte); };
}

std::string dt(DType t) { return std::string(dtype_name(t)); }

std::string case_name(std::initializer_list<std::string> parts) {
  std::string s;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!s.empty()) s += '_';
    s += p;
  }
  for (char& c : s)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) c = '_';
  return s;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> all;
    for (auto&& part : {elementwise_cases(), model_cases(), attention_cases()})
      for (const OpCase& c : part) all.push_back(c);
    return all;
  }();
  return cases;
}

}  // namespace untied::ops
