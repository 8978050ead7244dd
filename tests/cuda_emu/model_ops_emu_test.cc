// The token embedding and the fused LM head loss (src/kernels/cuda/{embedding,lm_head_loss}.cu),
// compiled for the host and run in the CPU emulator of emu_runtime.h, against the CPU kernels of
// src/kernels/cpu/ on the same inputs; emu_runtime.h says what the emulator cannot check.
//
// Stand-ins in this build (so what is NOT checked here):
//   - cub::DeviceRadixSort::SortPairs (embedding backward) is emu_cub_radix_sort.h, a host stable
//     sort over the same key bits; CUB itself is not checked, only the kernel's use of it (size
//     query, bit range, reading the result from DoubleBuffer::Current()).
//   - cuBLAS, under the backend's own untied::cuda::gemm (src/kernels/cuda/gemm.cc), is
//     emu_cublas.cc: cuBLAS's column-major semantics and argument checks, OpenBLAS underneath.
//     So the GEMM mapping is checked, and the loss's own work: the label check, the chunking and its
//     ragged last chunk, the skipped chunks, the widening of bf16 operands (cuda::convert of
//     tensor_ops.cu, emulated too) and the weight-block loop with its beta, the GEMMs' operands
//     and leading dimensions, the row kernel (max, first argmax, fp64 sum of exponentials, loss,
//     G in place, ignored rows) and the loss sums.
//
// Checks:
//   embedding forward: bit for bit (a copy or one rounding, as on the CPU), every byte of the
//     output buffer (the element before a skewed pointer included);
//   embedding backward: bit for bit (the kernel adds each id's dout rows in token order, the
//     CPU's order), every byte of dtable;
//   loss: count exact; argmax exact (the same logits up to the GEMM's summation order; random
//     inputs have no near ties); loss_sum to 1e-6 relative and dh (f32) / dw increments to 1e-5
//     of their largest magnitude (the row sums are fp64 in another order, so G may differ from
//     the CPU's in the last fp32 bit; the GEMMs on the two sides may sum in different orders);
//     a bf16 dh element additionally one bf16 rounding (2^-8 relative); ignored rows' dh exactly 0;
//   bad ids / labels: Error(kInvalidArgument) with the CPU's message (after the file:line
//     prefix), and every output byte (and the loss sums) untouched.
// All f32/bf16 storage combinations the headers allow, ragged sizes on both the 4-wide vector
// path and the scalar path, repeated ids (runs longer than the backward's 8-row unroll, one
// id only), 1- and 2-digit-pass sort bit ranges (the sorted data in either DoubleBuffer half),
// ragged chunks, a chunk without labels, a bf16 LM head in two widened blocks.
//
// Default run (ctest, label "emu"): every case under three schedules (lanes in reverse order;
// warps one at a time in a random order; warps one at a time in order). UNTIED_EMU_SWEEP=1 runs
// every schedule. Exit status 0 when every comparison passes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "device/cuda/cuda_device.h"  // the emulator's host_device/ version
#include "emu_test_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/model_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "untied/core/check.h"

namespace {

using namespace untied;

constexpr DType kB = DType::kBF16, kF = DType::kF32;
const char* tname(DType t) { return t == kF ? "f32" : "bf16"; }

int g_failures = 0, g_checks = 0;

void report(const char* what, bool ok, const std::string& detail) {
  ++g_checks;
  std::printf("    %-8s %s%s\n", what, detail.c_str(), ok ? "" : "  FAIL");
  if (!ok) ++g_failures;
}

double get(DType t, const unsigned char* raw, int64_t i) {
  float f;
  load_f32(&f, raw + i * dtype_size(t), t, 1);
  return f;
}
void set(DType t, unsigned char* raw, int64_t i, float f) { store_f32(raw + i * dtype_size(t), t, &f, 1); }

// `elems` elements of type t, `skew` elements past the start of the allocation (skew 1 takes the
// kernels off their vector path). `host` is the CPU op's copy, `buf` the CUDA op's (emulated GPU
// memory), `init` the bytes both started from.
struct Arr {
  DType t;
  int64_t skew;
  std::vector<unsigned char> host, init;
  Buffer buf;
  Arr(Device& dev, DType type, int64_t elems, int64_t skew_elems = 0, float lo = -1.0f, float hi = 1.0f)
      : t(type), skew(skew_elems), host(static_cast<size_t>((elems + skew_elems) * dtype_size(type))) {
    for (int64_t i = 0; i < elems + skew; ++i) set(t, host.data(), i, lo + (hi - lo) * 0.5f * (uniform_pm1() + 1.0f));
    init = host;
    buf = dev.allocator().allocate(static_cast<int64_t>(host.size()), Tag::kOther, "emu array");
    std::memcpy(buf.data(), host.data(), host.size());
  }
  void* h() { return host.data() + skew * dtype_size(t); }
  void* d() { return static_cast<char*>(buf.data()) + skew * dtype_size(t); }
  float* hf() { return static_cast<float*>(h()); }
  float* df() { return static_cast<float*>(d()); }
  const unsigned char* got() const { return static_cast<const unsigned char*>(buf.data()); }
  int64_t n() const { return static_cast<int64_t>(host.size()) / dtype_size(t); }
};

// int32 ids / labels / argmax, on both sides.
struct Ints {
  std::vector<int32_t> host;
  Buffer buf;
  Ints(Device& dev, std::vector<int32_t> v) : host(std::move(v)) {
    buf = dev.allocator().allocate(static_cast<int64_t>(std::max<size_t>(host.size(), 1) * 4), Tag::kOther, "emu ints");
    std::memcpy(buf.data(), host.data(), host.size() * 4);
  }
  int32_t* h() { return host.data(); }
  int32_t* d() { return buf.as<int32_t>(); }
};

void check_exact(const char* what, const Arr& a) {
  int64_t diff_at = -1;
  const int64_t es = dtype_size(a.t);
  for (int64_t i = 0; i < a.n() && diff_at < 0; ++i)
    if (std::memcmp(a.got() + i * es, a.host.data() + i * es, es) != 0) diff_at = i - a.skew;
  report(what, diff_at < 0, diff_at < 0 ? "bit-exact" : "differs at element " + std::to_string(diff_at));
}

void check_untouched(const char* what, const Arr& a) {
  const bool ok = std::memcmp(a.got(), a.init.data(), a.init.size()) == 0 && a.host == a.init;
  report(what, ok, ok ? "untouched" : "written");
}

// max |got - want| <= rel * max |want - init| + slack(element), where the CUDA and CPU results
// are compared as increments over the initial contents when `increment` (dw), else as values;
// `bf16_ulp`: plus one bf16 rounding of the element. Also requires exact 0 in the `zero_rows`.
void check_close(const char* what, const Arr& a, double rel, bool increment, bool bf16_ulp, int64_t row_len = 0,
                 const std::vector<char>& zero_rows = {}) {
  double ref_max = 0, err = 0;
  bool ok = true;
  int64_t bad_at = -1;
  for (int64_t i = 0; i < a.n(); ++i) {
    const double base = increment ? get(a.t, a.init.data(), i) : 0.0;
    ref_max = std::max(ref_max, std::fabs(get(a.t, a.host.data(), i) - base));
  }
  for (int64_t i = 0; i < a.n(); ++i) {
    const double g = get(a.t, a.got(), i), w = get(a.t, a.host.data(), i);
    const double base = increment ? get(a.t, a.init.data(), i) : 0.0;
    double tol = rel * ref_max + (increment ? std::ldexp(std::fabs(base), -22) : 0.0);
    if (bf16_ulp) tol += std::ldexp(std::fabs(w), -8);
    const double e = std::fabs(g - w);
    if (!(e <= tol) && bad_at < 0) bad_at = i - a.skew;
    err = std::max(err, e / (ref_max > 0 ? ref_max : 1.0));
    if (row_len > 0 && !zero_rows.empty()) {
      const int64_t r = (i - a.skew) / row_len;
      if (i >= a.skew && zero_rows[static_cast<size_t>(r)] && (g != 0.0 || w != 0.0) && bad_at < 0) bad_at = i - a.skew;
    }
  }
  ok = bad_at < 0;
  char msg[160];
  std::snprintf(msg, sizeof msg, "max err %.2e of max |ref| (tol %.0e%s)%s", err, rel, bf16_ulp ? " + bf16 ulp" : "",
                ok ? "" : (" first bad at element " + std::to_string(bad_at)).c_str());
  report(what, ok, msg);
}

// The Error an op throws: "kind|message after the file:line prefix and the condition", or "" if
// it returns.
std::string error_of(const std::function<void()>& op) {
  try {
    op();
  } catch (const Error& e) {
    const std::string w = e.what();
    const size_t at = w.find("failed: ");
    return std::to_string(static_cast<int>(e.kind())) + "|" + (at == std::string::npos ? w : w.substr(at + 8));
  }
  return "";
}

void check_same_error(const char* what, const std::string& got, const std::string& want) {
  const bool ok = !want.empty() && got == want && want[0] == '0' + static_cast<int>(ErrorKind::kInvalidArgument);
  std::string msg = ok ? "\"" : "got \"";
  msg += ok ? want.substr(2) : got;
  if (!ok) msg += "\", want \"" + want;
  msg += "\"";
  report(what, ok, msg);
}

// ---- embedding ---------------------------------------------------------------------------------

std::vector<int32_t> random_ids(int64_t tokens, int64_t vocab) {
  std::vector<int32_t> v(static_cast<size_t>(tokens));
  for (auto& x : v) x = std::min<int32_t>(static_cast<int32_t>(vocab) - 1, static_cast<int32_t>(0.5f * (uniform_pm1() + 1.0f) * vocab));
  return v;
}

void embedding_case(Device& dev, int64_t tokens, int64_t vocab, int64_t dim, DType dt, DType tt, int64_t skew) {
  std::printf("  embedding tokens=%ld vocab=%ld dim=%ld out %s table %s skew %ld\n", static_cast<long>(tokens),
              static_cast<long>(vocab), static_cast<long>(dim), tname(dt), tname(tt), static_cast<long>(skew));
  const EmbeddingShape s{.tokens = tokens, .vocab = vocab, .dim = dim, .dtype = dt, .table_dtype = tt};
  Ints ids(dev, random_ids(tokens, vocab));
  if (tokens > 2) {  // the first and last ids of the vocabulary appear
    ids.host[0] = 0;
    ids.host[static_cast<size_t>(tokens - 1)] = static_cast<int32_t>(vocab - 1);
    std::memcpy(ids.d(), ids.h(), static_cast<size_t>(tokens) * 4);
  }
  Arr table(dev, tt, vocab * dim, skew), out(dev, dt, tokens * dim, skew);
  cuda::embedding_forward(dev, s, out.d(), ids.d(), table.d());
  cpu::embedding_forward(dev, s, out.h(), ids.h(), table.h());
  check_exact("forward", out);

  Arr dtable(dev, kF, vocab * dim, skew), dout(dev, dt, tokens * dim, skew);
  cuda::embedding_backward(dev, s, dtable.df(), ids.d(), dout.d());
  cpu::embedding_backward(dev, s, dtable.hf(), ids.h(), dout.h());
  check_exact("backward", dtable);
}

// Bad ids at positions `first` (value `bad`, the one named) and `second` (-7).
void embedding_bad_id_case(Device& dev, DType dt, DType tt, int32_t bad, int64_t tokens = 40, int64_t first = 13,
                           int64_t second = 29) {
  const int64_t vocab = 9, dim = 12;
  std::printf("  embedding bad id %d at %ld of %ld (out %s table %s)\n", bad, static_cast<long>(first),
              static_cast<long>(tokens), tname(dt), tname(tt));
  const EmbeddingShape s{.tokens = tokens, .vocab = vocab, .dim = dim, .dtype = dt, .table_dtype = tt};
  std::vector<int32_t> v = random_ids(tokens, vocab);
  v[static_cast<size_t>(first)] = bad;
  v[static_cast<size_t>(second)] = -7;
  Ints ids(dev, v);
  Arr table(dev, tt, vocab * dim), out(dev, dt, tokens * dim), dtable(dev, kF, vocab * dim), dout(dev, dt, tokens * dim);
  const std::string want_f = error_of([&] { cpu::embedding_forward(dev, s, out.h(), ids.h(), table.h()); });
  const std::string got_f = error_of([&] { cuda::embedding_forward(dev, s, out.d(), ids.d(), table.d()); });
  check_same_error("fwd err", got_f, want_f);
  check_untouched("out", out);
  const std::string want_b = error_of([&] { cpu::embedding_backward(dev, s, dtable.hf(), ids.h(), dout.h()); });
  const std::string got_b = error_of([&] { cuda::embedding_backward(dev, s, dtable.df(), ids.d(), dout.d()); });
  check_same_error("bwd err", got_b, want_b);
  check_untouched("dtable", dtable);
}

// ---- LM head loss ------------------------------------------------------------------------------

struct LossCase {
  int64_t tokens, dim, vocab, chunk;
  bool backward, with_argmax;
  bool ignore_chunk;  // every label of the second chunk is ignore_index
};

std::vector<int32_t> random_labels(const LossCase& c, int32_t ignore) {
  std::vector<int32_t> v = random_ids(c.tokens, c.vocab);
  for (int64_t t = 0; t < c.tokens; ++t)
    if (uniform_pm1() > 0.6f) v[static_cast<size_t>(t)] = ignore;  // ~20% ignored
  if (c.tokens > 3) {  // the vocabulary's edges as labels
    v[1] = 0;
    v[2] = static_cast<int32_t>(c.vocab - 1);
  }
  const int64_t chunk = c.chunk > 0 ? c.chunk : c.tokens;
  if (c.ignore_chunk)
    for (int64_t t = chunk; t < std::min(2 * chunk, c.tokens); ++t) v[static_cast<size_t>(t)] = ignore;
  return v;
}

void loss_case(Device& dev, const LossCase& c, DType dt, DType wt) {
  const int32_t ignore = -100;
  std::printf("  lm_head_loss tokens=%ld E=%ld V=%ld chunk=%ld h %s w %s %s%s%s\n", static_cast<long>(c.tokens),
              static_cast<long>(c.dim), static_cast<long>(c.vocab), static_cast<long>(c.chunk), tname(dt), tname(wt),
              c.backward ? "forward+backward" : "forward", c.with_argmax ? " argmax" : "",
              c.ignore_chunk ? " (a chunk without labels)" : "");
  Ints labels(dev, random_labels(c, ignore));
  int64_t labelled = 0;
  for (int32_t l : labels.host) labelled += l != ignore;
  const LmHeadLossShape s{.tokens = c.tokens, .dim = c.dim, .vocab = c.vocab, .chunk_tokens = c.chunk,
                          .ignore_index = ignore, .grad_scale = 1.0f / static_cast<float>(std::max<int64_t>(labelled, 1)),
                          .dtype = dt, .weight_dtype = wt};
  Arr h(dev, dt, c.tokens * c.dim), w(dev, wt, c.vocab * c.dim);
  Arr argmax(dev, kF, c.tokens);  // int32 results in a 4-byte array (compared as bytes)
  Arr dh(dev, dt, c.tokens * c.dim), dw(dev, kF, c.vocab * c.dim);
  auto* am_h = reinterpret_cast<int32_t*>(argmax.h());
  auto* am_d = reinterpret_cast<int32_t*>(argmax.d());
  LossSums got{0.25, 3}, want{0.25, 3};
  cuda::lm_head_loss(dev, s, c.backward, &got, c.with_argmax ? am_d : nullptr, c.backward ? dh.d() : nullptr,
                     c.backward ? dw.df() : nullptr, h.d(), labels.d(), w.d());
  cpu::lm_head_loss(dev, s, c.backward, &want, c.with_argmax ? am_h : nullptr, c.backward ? dh.h() : nullptr,
                    c.backward ? dw.hf() : nullptr, h.h(), labels.h(), w.h());
  {
    const bool ok = got.count == want.count;
    report("count", ok, std::to_string(got.count) + " vs " + std::to_string(want.count));
    const double e = std::fabs(got.loss_sum - want.loss_sum) / std::max(std::fabs(want.loss_sum), 1e-300);
    char msg[96];
    std::snprintf(msg, sizeof msg, "%.9g vs %.9g (rel err %.1e, tol 1e-6)", got.loss_sum, want.loss_sum, e);
    report("loss_sum", e <= 1e-6, msg);
  }
  if (c.with_argmax)
    check_exact("argmax", argmax);
  else
    check_untouched("argmax", argmax);
  if (c.backward) {
    std::vector<char> ignored(static_cast<size_t>(c.tokens));
    for (int64_t t = 0; t < c.tokens; ++t) ignored[static_cast<size_t>(t)] = labels.host[static_cast<size_t>(t)] == ignore;
    check_close("dh", dh, 1e-5, false, dt == kB, c.dim, ignored);
    check_close("dw", dw, 1e-5, true, false);
  }
}

void loss_bad_label_case(Device& dev, DType dt, DType wt, int32_t bad) {
  const LossCase c{.tokens = 21, .dim = 8, .vocab = 50, .chunk = 6, .backward = true, .with_argmax = true,
                   .ignore_chunk = false};
  std::printf("  lm_head_loss bad label %d (h %s w %s)\n", bad, tname(dt), tname(wt));
  std::vector<int32_t> v = random_labels(c, -100);
  v[11] = bad;  // in the second chunk: nothing of the first may be written either
  v[17] = 50;
  Ints labels(dev, v);
  const LmHeadLossShape s{.tokens = c.tokens, .dim = c.dim, .vocab = c.vocab, .chunk_tokens = c.chunk,
                          .ignore_index = -100, .dtype = dt, .weight_dtype = wt};
  Arr h(dev, dt, c.tokens * c.dim), w(dev, wt, c.vocab * c.dim), argmax(dev, kF, c.tokens);
  Arr dh(dev, dt, c.tokens * c.dim), dw(dev, kF, c.vocab * c.dim);
  LossSums got{0.5, 2}, want{0.5, 2};
  for (const bool backward : {false, true}) {
    const std::string want_e = error_of([&] {
      cpu::lm_head_loss(dev, s, backward, &want, reinterpret_cast<int32_t*>(argmax.h()), dh.h(), dw.hf(), h.h(),
                        labels.h(), w.h());
    });
    const std::string got_e = error_of([&] {
      cuda::lm_head_loss(dev, s, backward, &got, reinterpret_cast<int32_t*>(argmax.d()), dh.d(), dw.df(), h.d(),
                         labels.d(), w.d());
    });
    check_same_error(backward ? "bwd err" : "fwd err", got_e, want_e);
  }
  const bool sums_ok = got.loss_sum == 0.5 && got.count == 2 && want.loss_sum == 0.5 && want.count == 2;
  report("sums", sums_ok, sums_ok ? "untouched" : "written");
  check_untouched("argmax", argmax);
  check_untouched("dh", dh);
  check_untouched("dw", dw);
}

void run_all(Device& dev) {
  const DType combos[4][2] = {{kF, kF}, {kB, kB}, {kB, kF}, {kF, kB}};  // (out / h, table / w)
  for (const auto& d : combos) {
    embedding_case(dev, 37, 11, 20, d[0], d[1], 0);   // vector path (E % 4 == 0), repeated ids, 1 sort pass
    embedding_case(dev, 29, 300, 13, d[0], d[1], 0);  // scalar path (E odd), 2 sort passes
    embedding_case(dev, 23, 7, 24, d[0], d[1], 1);    // scalar path (pointers one element off)
    embedding_bad_id_case(dev, d[0], d[1], d[0] == kF ? 9 : -1);
  }
  embedding_case(dev, 45, 5, 516, kF, kB, 0);   // two column blocks (512 columns per vector block)
  embedding_case(dev, 31, 70000, 130, kB, kF, 0);  // two column blocks on the scalar path, 3 sort passes (odd)
  embedding_case(dev, 300, 2, 8, kF, kF, 0);   // runs of ~150 tokens: gallop, unrolled rows, tail
  embedding_case(dev, 19, 1, 5, kB, kB, 0);    // one id (a 1-bit sort), every token in one run
  embedding_bad_id_case(dev, kF, kF, 12, 700, 333, 610);  // bad ids in the 2nd and 3rd blocks of the check

  for (const auto& d : combos) {
    // V % 4 == 0 (vector row kernel); ragged chunks 7, 7, 7, 2; the second chunk without labels.
    loss_case(dev, {.tokens = 23, .dim = 24, .vocab = 100, .chunk = 7, .backward = true, .with_argmax = true,
                    .ignore_chunk = true}, d[0], d[1]);
    // The same chunk skipped (no label, no argmax): its dh rows zeroed, no GEMM.
    loss_case(dev, {.tokens = 23, .dim = 24, .vocab = 100, .chunk = 7, .backward = true, .with_argmax = false,
                    .ignore_chunk = true}, d[0], d[1]);
    // Scalar row kernel (V odd), chunks 5, 5, 5, 2; forward only.
    loss_case(dev, {.tokens = 17, .dim = 13, .vocab = 37, .chunk = 5, .backward = false, .with_argmax = true,
                    .ignore_chunk = false}, d[0], d[1]);
    loss_bad_label_case(dev, d[0], d[1], d[0] == kF ? -1 : 1000);
  }
  // Rows longer than one pass of the block: vector (V / 4 = 513 groups) and scalar (V = 1031).
  loss_case(dev, {.tokens = 6, .dim = 8, .vocab = 2052, .chunk = 4, .backward = true, .with_argmax = true,
                  .ignore_chunk = false}, kF, kF);
  loss_case(dev, {.tokens = 5, .dim = 9, .vocab = 1031, .chunk = 0, .backward = true, .with_argmax = true,
                  .ignore_chunk = false}, kB, kB);
  // A bf16 w of 1030 * 4096 elements: two widened blocks (1024 + 6 vocab rows) per GEMM.
  loss_case(dev, {.tokens = 5, .dim = 4096, .vocab = 1030, .chunk = 3, .backward = true, .with_argmax = true,
                  .ignore_chunk = false}, kF, kB);
  loss_case(dev, {.tokens = 5, .dim = 4096, .vocab = 1030, .chunk = 3, .backward = true, .with_argmax = false,
                  .ignore_chunk = false}, kB, kB);
}

}  // namespace

int main() {
  CudaDevice dev;
  return run_under_schedules([&] { run_all(dev); }, g_failures, g_checks);
}
