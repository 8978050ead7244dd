// The cross-backend op test's vocabulary (tests/ops): an op case is a name, its buffers (element
// type, size, how each is filled, a pointer skew, which elements an output's op writes and how
// they are compared), the op call through the public API (include/untied/kernels/*.h,
// Device::copy_2d) and the properties beyond the values (refusals that write nothing, run-twice
// determinism, the scratch the call allocates, the attention kernel path). One generic driver
// (backend_ops_test.cc) fills identical inputs, runs each case on the CPU device and on the
// device under test (a GPU, or the emulated GPU of emu/), and compares every buffer:
// outputs by their rule inside the region the op writes, every other byte (inputs, stride gaps,
// the skew) bit for bit. The cases are registered in cases_*.cc, ported from the per-op GPU and
// emulator tests they replace; their tolerances and the reasons for them are written there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/random_inputs.h"
#include "untied/core/check.h"
#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied::ops {

// ---- buffers ---------------------------------------------------------------------------------

enum class Elem { kF32, kBF16, kF64, kI32, kI64, kU8 };
int64_t elem_size(Elem e);
const char* elem_name(Elem e);
inline Elem elem_of(DType t) {
  switch (t) {
    case DType::kF32:
      return Elem::kF32;
    case DType::kBF16:
      return Elem::kBF16;
    case DType::kF64:
      return Elem::kF64;
    case DType::kI32:
      return Elem::kI32;
    case DType::kI64:
      return Elem::kI64;
  }
  return Elem::kU8;
}

// A buffer's bytes on the host: `skew` elements, then the `elems` elements the op's pointer sees.
// Element indices are relative to the op's pointer (the skew is at -skew..-1).
struct HostBuffer {
  Elem elem = Elem::kF32;
  int64_t skew = 0, elems = 0;
  std::vector<unsigned char> bytes;

  HostBuffer() = default;
  HostBuffer(Elem e, int64_t n, int64_t skew_elems);
  int64_t total() const { return skew + elems; }
  void* data() { return bytes.data() + skew * elem_size(elem); }
  const void* data() const { return bytes.data() + skew * elem_size(elem); }
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data());
  }
  double get(int64_t i) const;    // element i as a double (integers exactly)
  void set(int64_t i, double v);  // element i, rounded to the element type
  void fill_bytes(unsigned char b) { std::fill(bytes.begin(), bytes.end(), b); }
};

// The elements an output's op writes: `rows` rows of `cols` elements, `stride` apart, from the op's
// pointer; rows < 0: every element after the skew.
struct Region {
  int64_t rows = -1, cols = 0, stride = 0;
  bool contains(int64_t i) const;
  int64_t count(int64_t elems) const;
};
inline Region everything() { return Region{}; }
inline Region rows_of(int64_t rows, int64_t cols, int64_t stride) { return Region{rows, cols, stride}; }

// How the elements of an output region are compared with the CPU's (tests/common/compare.h's rule
// for NaN and infinities throughout):
//   kBits:       the same bytes;
//   kSameValues: the same value (NaN matches NaN with any payload; +0 and -0 differ);
//   kClose:      |got_i - want_i| <= rel * scale + per_elem_rel * |want_i| + init_rel * |init_i|,
//                scale = max |want| over the region (of want - init with `increment`; 1 where it is
//                0), at least `min_scale`, or 1 with `absolute`;
//   kCustom:     not compared here (the case's own check does it).
struct Rule {
  enum class Kind { kBits, kSameValues, kClose, kCustom };
  Kind kind = Kind::kBits;
  double rel = 0;
  double per_elem_rel = 0;
  double init_rel = 0;
  bool increment = false;
  bool absolute = false;
  // A floor for the scale, for outputs that are a cancellation (0 in exact arithmetic): there
  // max |want| is itself rounding, and the error is measured against the size of the terms.
  double min_scale = 0;
  std::string describe() const;
};
inline Rule bits() { return Rule{}; }
inline Rule same_values() { return Rule{.kind = Rule::Kind::kSameValues}; }
inline Rule close(double rel) { return Rule{.kind = Rule::Kind::kClose, .rel = rel}; }
inline Rule close_abs(double tol) { return Rule{.kind = Rule::Kind::kClose, .rel = tol, .absolute = true}; }
inline Rule custom() { return Rule{.kind = Rule::Kind::kCustom}; }

// A rule per kind of device under test: the emulated GPU runs the real kernel source with the
// host's libm and exactly rounded fp32 intrinsics, so some ops are bit for bit there and only
// within a tolerance on a GPU (expf, sincos, pow may differ in the last bit).
struct Compare {
  Rule emu, gpu;
};
inline Compare both(Rule r) { return Compare{r, r}; }
inline Compare emu_else(Rule on_emu, Rule on_gpu) { return Compare{on_emu, on_gpu}; }

struct BufferSpec {
  std::string name{};
  Elem elem = Elem::kF32;
  int64_t elems = 0;  // after the skew
  int64_t skew = 0;   // elements before the op's pointer (1: off the 16-byte alignment)
  // How it is filled (the same bytes on both devices): uniform in [lo, hi] by default, or `fill`.
  double lo = -1.0, hi = 1.0;
  std::function<void(HostBuffer&, test::Rng&)> fill{};
  bool host = false;  // lives in host memory on both devices (the loss's LossSums)
  // An output: its region is compared by `cmp`; the rest of its bytes must be untouched.
  bool output = false;
  Region region{};
  Compare cmp = both(bits());
  Rule repeat = bits();  // the second of two runs against the first (case.repeat)
};

// ---- the case --------------------------------------------------------------------------------

// What the op call sees: the device and every buffer's pointer (at its skew), in spec order.
class Ctx {
 public:
  Ctx(Device& dev, std::vector<void*> ptrs, std::function<long long()> tensor_core_ops)
      : dev(dev), ptrs_(std::move(ptrs)), mma_(std::move(tensor_core_ops)), last_(mma_ ? mma_() : -1) {}
  Device& dev;
  void* operator[](size_t i) const { return ptrs_.at(i); }
  template <typename T>
  T* as(size_t i) const {
    return static_cast<T*>(ptrs_.at(i));
  }
  // After each step of a case that checks the attention kernel path: records whether tensor-core
  // (mma) instructions ran since the previous step (only countable on the emulated GPU).
  void step(const std::string& name);
  struct Step {
    std::string name;
    bool tensor_cores;
  };
  const std::vector<Step>& steps() const { return steps_; }

 private:
  std::vector<void*> ptrs_;
  std::function<long long()> mma_;
  long long last_ = -1;
  std::vector<Step> steps_;
};

// A call that must be refused: Error of `kind` whose message contains `message`, raised before
// anything is written.
struct Refusal {
  ErrorKind kind = ErrorKind::kInvalidArgument;
  std::string message{};
};

enum class Path { kAny, kTensorCores, kPortable };

// What a run left: every buffer's bytes and the call's host results.
struct RunResult {
  std::vector<HostBuffer> buffers;
  std::vector<double> scalars;
};

struct OpCase {
  std::string name;  // unique; letters, digits and '_' (a GTest name)
  std::vector<BufferSpec> buffers;
  // After the fills, before the copies to the devices: derives inputs from others on the CPU
  // (the saved rstd of a norm, attention's out and lse from the CPU forward).
  std::function<void(Device& cpu, std::vector<HostBuffer>& b)> prepare;
  // The op through the public API; returns the call's host results (a sum, a count).
  std::function<std::vector<double>(Ctx& c)> run;
  std::vector<std::pair<std::string, Compare>> scalars;  // names and rules of run's results
  std::optional<Refusal> refused_on_cpu, refused_on_dut;
  bool dut_only = false;  // the CPU does not run the call (a refusal only the device under test makes)
  bool repeat = false;    // the device under test runs twice from identical inputs (determinism)
  // The scratch the device under test allocates during the call (Tag::kOther peak over what was
  // live, all freed by its end), and whether it allocates nothing at all (no allocation call).
  std::optional<int64_t> dut_scratch_bytes;
  bool dut_allocates_nothing = false;
  int cc_major = 0;           // the compute capability the emulated GPU presents (0: its own, 9)
  Path path = Path::kAny;     // the attention kernel path every step must take (emulated GPU)
  bool slow_on_emu = false;   // run on the emulated GPU only with -DUNTIED_EMU_SLOW_TESTS=ON
  bool sweep_only = false;    // run on the emulated GPU only under UNTIED_EMU_SWEEP=1
  bool one_schedule = false;  // on the emulated GPU, one schedule instead of the default three
  // Checks beyond the element rules (an fp64 reference, exact zeros, argmax), on both results
  // and the initial contents; `emulated`: the device under test is the emulated GPU.
  std::function<void(const RunResult& init, const RunResult& cpu, const RunResult& dut, bool emulated)> check;
};

// The registry: every case of every op (cases_*.cc).
std::vector<OpCase> elementwise_cases();  // rope, rmsnorm, swiglu, row_dot, add_into, convert, copy_2d
std::vector<OpCase> model_cases();        // embedding, adamw and the clipping helpers, lm_head_loss
std::vector<OpCase> attention_cases();
const std::vector<OpCase>& all_cases();

// ---- helpers for the case files ----------------------------------------------------------------

// A buffer of `elems` elements of `t`, uniform in [lo, hi].
BufferSpec input(std::string name, DType t, int64_t elems, int64_t skew = 0, double lo = -1.0, double hi = 1.0);
// An output with prior contents uniform in [-1, 1] (which must survive outside `region`).
BufferSpec output(std::string name, DType t, int64_t elems, int64_t skew, Region region, Compare cmp);
// Fills every element with `v`, or every byte with `byte`.
std::function<void(HostBuffer&, test::Rng&)> fill_value(double v);
std::function<void(HostBuffer&, test::Rng&)> fill_byte(unsigned char byte);

std::string dt(DType t);  // "f32", "bf16"
// "a_b_c" from parts; every character outside [A-Za-z0-9_] becomes '_'.
std::string case_name(std::initializer_list<std::string> parts);

}  // namespace untied::ops
