// The element-wise CUDA kernels (src/kernels/cuda/{rope,rmsnorm,swiglu,tensor_ops,adamw}.cu),
// compiled for the host and run in the CPU emulator of emu_runtime.h, against the CPU kernels of
// src/kernels/cpu/ on the same inputs. It checks the kernels' index arithmetic, ragged edges,
// strides, the choice between the 16-byte vector path (aligned pointers, sizes and strides
// multiples of the vector) and the scalar path (a pointer one element off, or a size or stride
// that is not a multiple), barrier placement (under the schedules tried) and the fixed-order
// reductions, on a machine without a GPU; emu_runtime.h says what it cannot check.
//
// Every case starts the CUDA op and the CPU op from byte-identical buffers; every element
// outside the region an op may write (stride gaps, the element before a misaligned pointer)
// must come out bit-identical, i.e. untouched. Inside the region:
//   - exact (bit for bit): rope, swiglu, add_into, convert, adamw_step, scale_in_place. The
//     kernels perform the CPU's fp32 operations in its order, one rounding each (__fmul_rn ...),
//     and the CPU sources are compiled here with -ffp-contract=off, so every operation rounds
//     as written; in the emulator expf / sincos / pow are the same libm calls on both sides.
//     On a GPU, expf (swiglu) and the double sincos / pow (rope) may differ in the last bit.
//   - tolerances (different summation orders, see tolerance()): rmsnorm, row_dot,
//     grad_sum_squares.
//
// Default run (ctest, label "emu"; under a second): every case under three schedules (lanes in
// reverse order; warps one at a time in a random order; warps one at a time in order: the
// warp-at-a-time ones catch a missing __syncthreads). UNTIED_EMU_SWEEP=1 runs every schedule.
// Exit status 0 when every comparison passes; the emulator aborts on a deadlock.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/cuda/cuda_device.h"  // the emulator's host_device/ version
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/model_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "emu_test_util.h"

namespace {

using namespace untied;

constexpr DType kB = DType::kBF16, kF = DType::kF32;
const char* tname(DType t) { return t == kF ? "f32" : "bf16"; }


// Element i of a raw f32/bf16 buffer, as float (through core/dtype.h's conversions).
double get(DType t, const std::vector<unsigned char>& raw, int64_t i) {
  float f;
  load_f32(&f, raw.data() + i * dtype_size(t), t, 1);
  return f;
}
void set(DType t, std::vector<unsigned char>& raw, int64_t i, float f) { store_f32(raw.data() + i * dtype_size(t), t, &f, 1); }

// An array of `elems` elements of type t, `skew` elements past the start of its allocation (skew
// 1: the pointer is off the 16-byte alignment of the allocation, so the kernels take their scalar
// path). `host` is the CPU op's copy, `buf` the CUDA op's (emulated GPU memory); both start from
// the same bytes: random values in [lo, hi) everywhere, stride gaps and the skew included.
struct Arr {
  DType t;
  int64_t skew;
  std::vector<unsigned char> host;
  Buffer buf;
  Arr(Device& dev, DType type, int64_t elems, int64_t skew_elems, float lo = -1.0f, float hi = 1.0f)
      : t(type), skew(skew_elems), host(static_cast<size_t>((elems + skew_elems) * dtype_size(type))) {
    for (int64_t i = 0; i < elems + skew; ++i) set(t, host, i, lo + (hi - lo) * 0.5f * (uniform_pm1() + 1.0f));
    buf = dev.allocator().allocate(static_cast<int64_t>(host.size()), Tag::kOther, "emu array");
    if (reinterpret_cast<uintptr_t>(buf.data()) % 16 != 0) emu::die("an emulated allocation is not 16-byte aligned");
    std::memcpy(buf.data(), host.data(), host.size());
  }
  void* h() { return host.data() + skew * dtype_size(t); }
  void* d() { return static_cast<char*>(buf.data()) + skew * dtype_size(t); }
  float* hf() { return static_cast<float*>(h()); }
  float* df() { return static_cast<float*>(d()); }
  std::vector<unsigned char> got() const {
    std::vector<unsigned char> g(host.size());
    std::memcpy(g.data(), buf.data(), g.size());
    return g;
  }
};

// The elements an op writes: `rows` rows of `cols` elements, `stride` apart (from the array's
// pointer).
struct Region {
  int64_t rows, cols, stride;
};

int g_failures = 0, g_checks = 0;

// Compares the CUDA result (a.buf) with the CPU result (a.host). rel < 0: bit for bit; else
// max |got - want| over the region <= rel * max |want|. Outside the region: bit for bit.
void check(const char* what, const Arr& a, Region r, double rel) {
  ++g_checks;
  const std::vector<unsigned char> got = a.got();
  const int64_t es = dtype_size(a.t), n = static_cast<int64_t>(got.size()) / es;
  std::vector<char> in(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < r.rows; ++i)
    for (int64_t c = 0; c < r.cols; ++c) in[static_cast<size_t>(a.skew + i * r.stride + c)] = 1;
  double err = 0, ref_max = 0;
  int64_t outside_at = -1, diff_at = -1, nan_at = -1;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = std::memcmp(got.data() + i * es, a.host.data() + i * es, es) == 0;
    if (!in[i]) {
      if (!same && outside_at < 0) outside_at = i - a.skew;
      continue;
    }
    const double g = get(a.t, got, i), w = get(a.t, a.host, i);
    if (std::isnan(g) && !std::isnan(w) && nan_at < 0) nan_at = i - a.skew;
    if (!same && diff_at < 0) diff_at = i - a.skew;
    err = std::max(err, std::fabs(g - w));
    ref_max = std::max(ref_max, std::fabs(w));
  }
  bool ok = outside_at < 0 && nan_at < 0;
  if (rel < 0) {
    ok = ok && diff_at < 0;
    std::printf("    %-6s %s", what, diff_at < 0 ? "bit-exact" : "differs");
    if (diff_at >= 0) std::printf(" (first at element %ld, max abs err %.2e)", static_cast<long>(diff_at), err);
  } else {
    const double e = err / (ref_max > 0 ? ref_max : 1.0);
    ok = ok && e <= rel;
    std::printf("    %-6s rel err %.2e (tol %.0e)", what, e, rel);
  }
  if (nan_at >= 0) std::printf(", NaN at element %ld", static_cast<long>(nan_at));
  if (outside_at >= 0) std::printf(", element %ld outside the output written", static_cast<long>(outside_at));
  std::printf("%s\n", ok ? "" : "  FAIL");
  if (!ok) ++g_failures;
}

void check_value(const char* what, double got, double want, double rel) {
  ++g_checks;
  const double e = std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
  const bool ok = e <= rel;
  std::printf("    %-6s %.17g vs %.17g, rel err %.2e (tol %.0e)%s\n", what, got, want, e, rel, ok ? "" : "  FAIL");
  if (!ok) ++g_failures;
}

// Tolerances, relative to the largest reference element of the output.
//  f32 outputs: the CUDA and CPU ops differ only in the order of fp32 sums (rmsnorm's sum of
//    squares and sum_j w dy x, row_dot's dot product) over at most a few thousand terms of size
//    <= 1: a few fp32 ulps of the result in practice, well under 1e-5; an indexing error is O(1).
//  bf16 outputs: the same fp32 values rounded to bf16 may land one bf16 ulp apart (2^-8
//    relative): 2^-7 relative to the largest element covers that.
//  rmsnorm's dw: fp64 sums of the same fp32 terms in another order, one fp32 rounding: 1e-6.
double tolerance(DType t) { return t == kF ? 1e-5 : 1.0 / 128; }
constexpr double kExact = -1;

// ---- rope ----------------------------------------------------------------------------------

void rope_case(Device& dev, DType t, int64_t tokens, int64_t heads, int64_t dim, int64_t pad, int64_t skew,
               bool positions, bool inverse) {
  const int64_t rs = heads * dim + pad;
  std::printf("  rope %s tokens=%ld heads=%ld D=%ld stride=%ld skew=%ld positions=%d inverse=%d\n", tname(t),
              static_cast<long>(tokens), static_cast<long>(heads), static_cast<long>(dim), static_cast<long>(rs),
              static_cast<long>(skew), positions ? 1 : 0, inverse ? 1 : 0);
  Arr x(dev, t, tokens * rs, skew, -2.0f, 2.0f);
  std::vector<int64_t> pos(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) pos[i] = (i * 7919 + 13) % 100000;  // scattered, some large
  Buffer dpos = dev.allocator().allocate(tokens * 8, Tag::kOther, "emu positions");
  std::memcpy(dpos.data(), pos.data(), pos.size() * 8);
  const RopeShape s{.tokens = tokens, .heads = heads, .head_dim = dim, .row_stride = pad > 0 ? rs : 0,
                    .theta = 500000.0, .dtype = t, .first_position = 3000};
  cuda::rope_apply(dev, s, x.d(), positions ? dpos.as<int64_t>() : nullptr, inverse);
  cpu::rope_apply(dev, s, x.h(), positions ? pos.data() : nullptr, inverse);
  check("x", x, {tokens, heads * dim, rs}, kExact);
}

// ---- rmsnorm -------------------------------------------------------------------------------

void rmsnorm_case(Device& dev, DType t, DType wt, int64_t rows, int64_t dim, int64_t pad, int64_t skew) {
  const int64_t rs = dim + pad;
  std::printf("  rmsnorm %s weights %s rows=%ld dim=%ld stride=%ld skew=%ld\n", tname(t), tname(wt),
              static_cast<long>(rows), static_cast<long>(dim), static_cast<long>(rs), static_cast<long>(skew));
  const RmsNormShape s{.rows = rows, .dim = dim, .eps = 1e-5f, .row_stride = pad > 0 ? rs : 0, .dtype = t,
                       .weight_dtype = wt};
  Arr x(dev, t, rows * rs, skew, -2.0f, 2.0f), w(dev, wt, dim, skew, 0.5f, 1.5f), y(dev, t, rows * rs, skew);
  Arr rstd(dev, kF, rows, 0), dy(dev, t, rows * rs, skew), dx(dev, t, rows * rs, skew);
  Arr dw(dev, kF, dim, skew);
  cuda::rmsnorm_forward(dev, s, y.d(), rstd.df(), x.d(), w.d());
  cpu::rmsnorm_forward(dev, s, y.h(), rstd.hf(), x.h(), w.h());
  check("y", y, {rows, dim, rs}, tolerance(t));
  check("rstd", rstd, {1, rows, rows}, 1e-6);  // fp32 of an fp64 mean over a different fp32 order
  // The backward from the same rstd on both sides (the CPU's), so dx and dw compare the backward only.
  std::memcpy(rstd.buf.data(), rstd.host.data(), rstd.host.size());
  cuda::rmsnorm_backward(dev, s, dx.d(), dw.df(), x.d(), rstd.df(), w.d(), dy.d());
  cpu::rmsnorm_backward(dev, s, dx.h(), dw.hf(), x.h(), rstd.hf(), w.h(), dy.h());
  check("dx", dx, {rows, dim, rs}, tolerance(t));
  check("dw", dw, {1, dim, dim}, 1e-6);
}

// ---- swiglu --------------------------------------------------------------------------------

void swiglu_case(Device& dev, DType t, int64_t rows, int64_t dim, int64_t in_pad, int64_t out_pad, int64_t skew,
                 bool in_place) {
  const int64_t irs = dim + in_pad, ors = dim + out_pad;
  std::printf("  swiglu %s rows=%ld F=%ld strides=%ld/%ld skew=%ld%s\n", tname(t), static_cast<long>(rows),
              static_cast<long>(dim), static_cast<long>(irs), static_cast<long>(ors), static_cast<long>(skew),
              in_place ? " in place" : "");
  const SwigluShape s{.rows = rows, .dim = dim, .in_row_stride = in_pad > 0 ? irs : 0,
                      .out_row_stride = out_pad > 0 ? ors : 0, .dtype = t};
  Arr gate(dev, t, rows * irs, skew, -6.0f, 6.0f), up(dev, t, rows * irs, skew, -2.0f, 2.0f);
  Arr out(dev, t, rows * ors, skew), dout(dev, t, rows * ors, skew);
  if (in_place) {  // out = gate (the header allows it when the strides agree)
    cuda::swiglu_forward(dev, s, gate.d(), gate.d(), up.d());
    cpu::swiglu_forward(dev, s, gate.h(), gate.h(), up.h());
    check("out", gate, {rows, dim, irs}, kExact);
    // dgate = gate, dup = up (in place), dout the other array.
    cuda::swiglu_backward(dev, s, gate.d(), up.d(), gate.d(), up.d(), dout.d());
    cpu::swiglu_backward(dev, s, gate.h(), up.h(), gate.h(), up.h(), dout.h());
    check("dgate", gate, {rows, dim, irs}, kExact);
    check("dup", up, {rows, dim, irs}, kExact);
    return;
  }
  Arr dgate(dev, t, rows * irs, skew), dup(dev, t, rows * irs, skew);
  cuda::swiglu_forward(dev, s, out.d(), gate.d(), up.d());
  cpu::swiglu_forward(dev, s, out.h(), gate.h(), up.h());
  check("out", out, {rows, dim, ors}, kExact);
  cuda::swiglu_backward(dev, s, dgate.d(), dup.d(), gate.d(), up.d(), dout.d());
  cpu::swiglu_backward(dev, s, dgate.h(), dup.h(), gate.h(), up.h(), dout.h());
  check("dgate", dgate, {rows, dim, irs}, kExact);
  check("dup", dup, {rows, dim, irs}, kExact);
}

// ---- tensor ops ----------------------------------------------------------------------------

void row_dot_case(Device& dev, DType t, int64_t rows, int64_t dim, int64_t lda, int64_t ldb, int64_t out_stride,
                  int64_t skew) {
  std::printf("  row_dot %s rows=%ld dim=%ld lda=%ld ldb=%ld out_stride=%ld skew=%ld\n", tname(t),
              static_cast<long>(rows), static_cast<long>(dim), static_cast<long>(lda), static_cast<long>(ldb),
              static_cast<long>(out_stride), static_cast<long>(skew));
  Arr a(dev, t, rows * lda, skew), b(dev, t, rows * ldb, 0), out(dev, kF, rows * out_stride, skew);
  cuda::row_dot(dev, rows, dim, t, a.d(), lda, b.d(), ldb, out.df(), out_stride);
  cpu::row_dot(dev, rows, dim, t, a.h(), lda, b.h(), ldb, out.hf(), out_stride);
  check("out", out, {rows, 1, out_stride}, tolerance(kF));
}

void add_into_case(Device& dev, DType acc_t, DType t, int64_t n, int64_t acc_skew, int64_t x_skew) {
  std::printf("  add_into %s += %s n=%ld skews=%ld/%ld\n", tname(acc_t), tname(t), static_cast<long>(n),
              static_cast<long>(acc_skew), static_cast<long>(x_skew));
  Arr acc(dev, acc_t, n, acc_skew), x(dev, t, n, x_skew);
  cuda::add_into(dev, acc.d(), acc_t, x.d(), t, n);
  cpu::add_into(dev, acc.h(), acc_t, x.h(), t, n);
  check("acc", acc, {1, n, n}, kExact);
}

void convert_case(Device& dev, DType dst_t, DType src_t, int64_t n, int64_t dst_skew, int64_t src_skew) {
  std::printf("  convert %s -> %s n=%ld skews=%ld/%ld\n", tname(src_t), tname(dst_t), static_cast<long>(n),
              static_cast<long>(dst_skew), static_cast<long>(src_skew));
  Arr src(dev, src_t, n, src_skew, -300.0f, 300.0f), dst(dev, dst_t, n, dst_skew);
  cuda::convert(dev, dst.d(), dst_t, src.d(), src_t, n);
  cpu::convert(dev, dst.h(), dst_t, src.h(), src_t, n);
  check("dst", dst, {1, n, n}, kExact);
}

// ---- adamw and the clipping helpers --------------------------------------------------------

void adamw_case(Device& dev, int64_t n, int64_t skew, bool decay) {
  std::printf("  adamw n=%ld skew=%ld decay=%d\n", static_cast<long>(n), static_cast<long>(skew), decay ? 1 : 0);
  Arr p(dev, kF, n, skew), m(dev, kF, n, skew, -0.1f, 0.1f), v(dev, kF, n, 0, 0.0f, 0.01f), g(dev, kF, n, skew);
  const AdamWParams a{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 7,
                      .decay = decay};
  for (int step = 0; step < 2; ++step) {  // twice: the second step reads the first's m and v
    cuda::adamw_step(dev, p.df(), m.df(), v.df(), g.df(), n, a);
    cpu::adamw_step(dev, p.hf(), m.hf(), v.hf(), g.hf(), n, a);
  }
  check("p", p, {1, n, n}, kExact);
  check("m", m, {1, n, n}, kExact);
  check("v", v, {1, n, n}, kExact);
}

void sum_squares_case(Device& dev, int64_t n, int64_t skew) {
  std::printf("  grad_sum_squares n=%ld skew=%ld\n", static_cast<long>(n), static_cast<long>(skew));
  Arr g(dev, kF, n, skew);
  // fp64 sums of the same exact fp64 squares in other orders: ~1e-16 relative each.
  check_value("sum", cuda::grad_sum_squares(dev, g.df(), n), cpu::grad_sum_squares(dev, g.hf(), n), 1e-12);
}

void scale_case(Device& dev, int64_t n, int64_t skew) {
  std::printf("  scale_in_place n=%ld skew=%ld\n", static_cast<long>(n), static_cast<long>(skew));
  Arr x(dev, kF, n, skew);
  cuda::scale_in_place(dev, x.df(), n, 0.37f);
  cpu::scale_in_place(dev, x.hf(), n, 0.37f);
  check("x", x, {1, n, n}, kExact);
}

// Vector paths: pointers 16-byte aligned (skew 0) and sizes / strides multiples of 16 bytes'
// elements (4 f32, 8 bf16); scalar paths: skew 1 or a size or stride that is not.
void run_all(Device& dev) {
  // rope: vector when D/2 and the row stride are multiples of the vector and x is aligned.
  rope_case(dev, kF, 5, 3, 64, 0, 0, true, false);     // vector (4)
  rope_case(dev, kB, 4, 2, 128, 0, 0, true, true);     // vector (8), inverse
  rope_case(dev, kB, 3, 3, 48, 8, 0, false, false);    // vector, padded stride, first_position
  rope_case(dev, kF, 4, 2, 20, 0, 0, true, false);     // scalar: D/2 = 10
  rope_case(dev, kF, 3, 2, 64, 0, 1, false, true);     // scalar: misaligned
  rope_case(dev, kB, 3, 2, 64, 3, 0, true, false);     // scalar: stride not a multiple of 8
  rope_case(dev, kF, 2, 9, 128, 5, 0, true, false);    // scalar, 576 pairs per token > 256 threads
  // rmsnorm: a warp per row (dim <= 1024), 256 threads (<= 4096), 512 threads per row.
  rmsnorm_case(dev, kF, kF, 13, 1000, 0, 0);   // vector
  rmsnorm_case(dev, kB, kB, 11, 264, 8, 0);    // vector, padded stride
  rmsnorm_case(dev, kB, kF, 9, 40, 0, 0);      // vector (4 of the wider f32 weights)
  rmsnorm_case(dev, kF, kB, 10, 37, 0, 0);     // scalar: dim 37
  rmsnorm_case(dev, kB, kB, 7, 96, 0, 1);      // scalar: misaligned
  rmsnorm_case(dev, kF, kF, 3, 1500, 4, 0);    // 256 threads per row, vector
  rmsnorm_case(dev, kB, kF, 3, 1501, 0, 0);    // 256 threads per row, scalar
  rmsnorm_case(dev, kF, kB, 2, 4100, 0, 0);    // 512 threads per row, vector
  rmsnorm_case(dev, kF, kF, 2, 4099, 0, 1);    // 512 threads per row, scalar
  rmsnorm_case(dev, kF, kF, 2100, 40, 0, 0);   // dw over two row blocks of 2048
  // swiglu: vector when F and both strides are multiples of the vector and all pointers aligned.
  swiglu_case(dev, kF, 7, 100, 0, 0, 0, false);    // vector
  swiglu_case(dev, kB, 5, 200, 8, 16, 0, false);   // vector, two strides
  swiglu_case(dev, kF, 6, 37, 3, 0, 0, false);     // scalar: F 37
  swiglu_case(dev, kB, 4, 64, 0, 0, 1, false);     // scalar: misaligned
  swiglu_case(dev, kF, 3, 601, 0, 0, 0, false);    // scalar, a row over 3 blocks in x
  swiglu_case(dev, kB, 5, 72, 0, 0, 0, true);      // in place, vector
  swiglu_case(dev, kF, 5, 33, 2, 2, 0, true);      // in place, scalar
  // tensor ops.
  row_dot_case(dev, kF, 19, 96, 96, 100, 1, 0);    // vector
  row_dot_case(dev, kB, 17, 136, 144, 136, 3, 0);  // vector, strides
  row_dot_case(dev, kF, 9, 67, 70, 67, 2, 0);      // scalar: dim 67
  row_dot_case(dev, kB, 10, 64, 64, 64, 1, 1);     // scalar: misaligned
  add_into_case(dev, kF, kF, 1037, 0, 0);          // vector + tail
  add_into_case(dev, kF, kB, 1030, 0, 0);          // vector (8-byte bf16 loads) + tail
  add_into_case(dev, kF, kF, 1029, 1, 0);          // scalar
  add_into_case(dev, kF, kB, 515, 0, 1);           // scalar
  add_into_case(dev, kB, kB, 1031, 0, 0);          // bf16 sums rounded: vector + tail
  add_into_case(dev, kB, kF, 1028, 0, 0);          // vector
  add_into_case(dev, kB, kB, 517, 1, 0);           // scalar
  add_into_case(dev, kB, kF, 519, 0, 1);           // scalar
  convert_case(dev, kB, kF, 1027, 0, 0);           // vector + tail
  convert_case(dev, kF, kB, 1026, 0, 0);           // vector + tail
  convert_case(dev, kB, kF, 517, 1, 0);            // scalar
  convert_case(dev, kF, kB, 518, 0, 1);            // scalar
  convert_case(dev, kB, kB, 101, 1, 0);            // same type: a copy
  convert_case(dev, kF, kF, 99, 0, 1);             // same type: a copy
  // adamw and the clipping helpers.
  adamw_case(dev, 1031, 0, true);                  // vector + tail
  adamw_case(dev, 1030, 1, false);                 // scalar
  sum_squares_case(dev, 2 * 65536 + 1001, 0);      // three blocks of 65536, vector
  sum_squares_case(dev, 65536 + 3, 1);             // scalar
  sum_squares_case(dev, 5, 0);
  scale_case(dev, 1031, 0);                        // vector + tail
  scale_case(dev, 1029, 1);                        // scalar
}

}  // namespace

int main() {
  CudaDevice dev;
  return run_under_schedules([&] { run_all(dev); }, g_failures, g_checks);
}
