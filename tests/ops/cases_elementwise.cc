// The element-wise and row ops of the cross-backend op test (op_case.h): RoPE, RMSNorm (forward,
// backward with accumulated dw), SwiGLU (and the in-place forms the header allows), row_dot,
// add_into, convert, add_bias, bias_grad, the mixture of experts' gather and combine, Device::copy_2d, and the refusal of bad arguments. Ported from the GPU suite
// (tests/cuda/cuda_ops_test.cc: "gpu" cases) and the older emulator test
// (tests/cuda_emu/ops_emu_test.cc: "emu" cases), with their shapes, strides, skews and rules:
// f32 and bf16 storage, ragged sizes that are not multiples of the vector widths (so both the
// 16-byte and the one-element paths run: pointers 16-byte aligned with sizes and strides
// multiples of 16 bytes' elements take the vector path; a skew of one element or a size or
// stride that is not takes the scalar path), row strides with gaps (which must come back
// untouched), pointers one element off.
//
// Tolerances, relative to the largest |CPU value| of the region:
//   On a GPU (the GPU suite's reasoning):
//   fp32 results: 1e-5. The kernels do the CPU's per-element arithmetic in the same order
//     without fused multiply-adds; what differs is the order of row sums (fp32 partial sums of
//     up to 1024 terms on the CPU, 32 on the GPU: for 16384 squares of uniform values the two
//     sums differ by <= 4e-7 relative over 300 random rows, a random-walk sqrt(1024) * 2^-24
//     at most) and the last bits of the device's double pow/sincos and float expf (<= 2 ulp,
//     ~2.4e-7 relative). 1e-5 is >= 25 times that and still 10^4 below what a wrong index or
//     formula produces (O(1)).
//   bf16 results: 2^-7 + 1e-5. Both sides compute in fp32 and round once; where their fp32
//     values differ in the last bit near a rounding midpoint, the two roundings land on
//     neighbouring bf16 values, one bf16 ulp apart: at most 2^-7 of the value.
//   add_into, copy_2d: exact (one IEEE operation or a copy per element); convert: the same
//     values (a NaN stays a NaN, whatever its payload).
//   On the emulated GPU (the emulator test's reasoning):
//   exact (bit for bit): rope, swiglu, add_into, convert, copy_2d. The kernels perform the CPU's
//     fp32 operations in its order, one rounding each (__fmul_rn ...); the emulated build of this
//     test compiles those CPU kernels with -ffp-contract=off (tests/cuda_emu/CMakeLists.txt), so
//     every operation rounds as written there too (g++ fuses multiply-adds by default in C++);
//     and in the emulator expf / sincos / pow are the same libm calls on both sides.
//   tolerances (different summation orders): rmsnorm, row_dot. f32 outputs: the CUDA and CPU
//     ops differ only in the order of fp32 sums (rmsnorm's sum of squares and sum_j w dy x,
//     row_dot's dot product) over at most a few thousand terms of size <= 1: a few fp32 ulps of
//     the result in practice, well under 1e-5; an indexing error is O(1). bf16 outputs: the same
//     fp32 values rounded to bf16 may land one bf16 ulp apart (2^-8 relative): 2^-7 relative to
//     the largest element covers that. rmsnorm's rstd and dw: fp64 sums of the same fp32 terms
//     in another order, one fp32 rounding: 1e-6.
//   The GPU suite's cases keep their GPU tolerances on the emulated GPU where the emulator test
//   had no rule for the op (rmsnorm, row_dot); their rope, swiglu, add_into and convert follow the
//   emulator test's rules (convert: the same values, as the GPU suite checked: the f32 NaN among
//   its special values becomes a bf16 NaN with another payload on the device).
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/op_case.h"
#include "untied/kernels/moe.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/rope.h"
#include "untied/kernels/swiglu.h"
#include "untied/kernels/tensor_ops.h"

namespace untied::ops {
namespace {

constexpr DType kF = DType::kF32, kB = DType::kBF16;
constexpr double kF32Tol = 1e-5;               // GPU: see the top of the file
constexpr double kBf16Tol = 1.0 / 128 + 1e-5;  // GPU: one bf16 ulp plus the fp32 tolerance
double gpu_tol(DType t) { return t == kB ? kBf16Tol : kF32Tol; }
double emu_tol(DType t) { return t == kB ? 1.0 / 128 : 1e-5; }  // emulated GPU, summation order only

// Exact on the emulated GPU, the GPU suite's tolerance on a GPU.
Compare exact_on_emu(DType t) { return emu_else(bits(), close(gpu_tol(t))); }

std::string n(int64_t v) { return std::to_string(v); }

// ---- RoPE -------------------------------------------------------------------------------------

struct RopeCase {
  int64_t tokens, heads, head_dim;
  int64_t pad;              // row stride = heads * D + pad (0: the default stride)
  bool explicit_positions;  // else first_position + t
  int64_t first_position;
  double theta;
  int64_t skew = 0;
  RopeScaling scaling = {};
};

OpCase rope_case(const std::string& origin, DType t, const RopeCase& c, bool inverse,
                 const std::function<int64_t(int64_t)>& position, double lo, double hi) {
  const int64_t rs = c.heads * c.head_dim + c.pad;
  const RopeShape s{.tokens = c.tokens,
                    .heads = c.heads,
                    .head_dim = c.head_dim,
                    .row_stride = c.pad ? rs : 0,
                    .theta = c.theta,
                    .dtype = t,
                    .first_position = c.first_position,
                    .scaling = c.scaling};
  OpCase k;
  const char* scaled = c.scaling.type == RopeScalingType::kLlama3   ? "llama3"
                       : c.scaling.type == RopeScalingType::kLinear ? "linear"
                                                                   : "";
  k.name = case_name({"rope", origin, dt(t), "t" + n(c.tokens), "h" + n(c.heads), "d" + n(c.head_dim), "rs" + n(rs),
                      "skew" + n(c.skew), c.explicit_positions ? "positions" : "first" + n(c.first_position),
                      inverse ? "backward" : "forward", scaled});
  BufferSpec x = output("x", t, std::max<int64_t>(1, c.tokens * rs), c.skew,
                        rows_of(c.tokens, c.heads * c.head_dim, rs), exact_on_emu(t));
  x.lo = lo, x.hi = hi;
  BufferSpec pos{.name = "positions", .elem = Elem::kI64, .elems = c.tokens};
  pos.fill = [position](HostBuffer& b, test::Rng&) {
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, static_cast<double>(position(i)));
  };
  k.buffers = {x, pos};
  const bool ex = c.explicit_positions;
  k.run = [=](Ctx& ctx) {
    const int64_t* p = ex ? ctx.as<const int64_t>(1) : nullptr;
    if (inverse)
      rope_backward(ctx.dev, s, ctx[0], p);
    else
      rope_forward(ctx.dev, s, ctx[0], p);
    return std::vector<double>{};
  };
  k.dut_scratch_bytes = 0;  // RoPE allocates nothing on the device
  k.dut_allocates_nothing = true;
  // More tokens than blocks: a fiber switch per thread, token and barrier, tens of seconds per
  // schedule on the emulated GPU; the small cases run the barriers under all three.
  k.one_schedule = c.tokens > 100000;
  return k;
}

void add_rope(std::vector<OpCase>& out) {
  // GPU suite: positions of a large sequence, out of order (a zig-zag shard), up to ~5e6.
  const auto gpu_position = [](int64_t i) { return 1'000'000 + (i * 2'654'435'761LL) % 4'000'000; };
  const RopeCase gpu[] = {
      {37, 3, 128, 0, false, 1'000'003, 10000.0},            // 16-byte path, a rank's slice far into the sequence
      {29, 5, 6, 3, true, 0, 10000.0},                       // one pair per thread, odd stride
      {19, 2, 64, 16, true, 0, 1e6},                         // 16-byte path with padding between tokens
      {5, 1, 2048, 0, true, 0, 500000.0},                    // the largest head dim: 1024 pairs
      {3, 4, 72, 0, false, 4'000'000, 10000.0},              // D/2 = 36: f32 vectors, bf16 one pair at a time
      {0, 4, 64, 0, false, 0, 10000.0},                      // nothing to do
      {(int64_t{1} << 20) + 5, 1, 2, 0, false, 0, 10000.0},  // more tokens than blocks: grid-stride
  };
  for (DType t : {kF, kB})
    for (const RopeCase& c : gpu)
      for (bool inverse : {false, true}) {
        if (c.tokens > (1 << 20) && t == kB) continue;  // the f32 run covers the grid-stride loop
        out.push_back(rope_case("gpu", t, c, inverse, gpu_position, -1.0, 1.0));
      }
  // GPU suite: the call allocates nothing on the device (the check every rope case makes).
  OpCase none = rope_case("gpu", kF, {64, 4, 128, 0, false, 0, 10000.0}, false, gpu_position, -1.0, 1.0);
  none.name = "rope_allocates_nothing_on_the_device";
  out.push_back(none);
  // Emulator test: vector when D/2 and the row stride are multiples of the vector and x is
  // aligned; positions scattered, some large; theta 500000, first_position 3000.
  struct E {
    DType t;
    RopeCase c;
    bool inverse;
  };
  const E emu[] = {
      {kF, {5, 3, 64, 0, true, 3000, 500000.0}, false},     // vector (4)
      {kB, {4, 2, 128, 0, true, 3000, 500000.0}, true},     // vector (8), inverse
      {kB, {3, 3, 48, 8, false, 3000, 500000.0}, false},    // vector, padded stride, first_position
      {kF, {4, 2, 20, 0, true, 3000, 500000.0}, false},     // scalar: D/2 = 10
      {kF, {3, 2, 64, 0, false, 3000, 500000.0, 1}, true},  // scalar: misaligned
      {kB, {3, 2, 64, 3, true, 3000, 500000.0}, false},     // scalar: stride not a multiple of 8
      {kF, {2, 9, 128, 5, true, 3000, 500000.0}, false},    // scalar, 576 pairs per token > 256 threads
  };
  // Frequency scaling (llama3: Llama 3.1's factors; linear), both directions and dtypes.
  const RopeScaling llama3{.type = RopeScalingType::kLlama3, .factor = 8.0, .low_freq_factor = 1.0,
                           .high_freq_factor = 4.0, .original_max_position = 8192.0};
  const RopeScaling linear{.type = RopeScalingType::kLinear, .factor = 4.0};
  for (DType t : {kF, kB})
    for (bool inverse : {false, true}) {
      out.push_back(rope_case("emu", t, {6, 2, 128, 0, true, 0, 500000.0, 0, llama3}, inverse,
                              [](int64_t i) { return (i * 7919 + 13) % 100000; }, -2.0, 2.0));
      out.push_back(rope_case("emu", t, {5, 3, 64, 0, false, 20000, 10000.0, 0, linear}, inverse,
                              [](int64_t i) { return i; }, -2.0, 2.0));
    }
  const auto emu_position = [](int64_t i) { return (i * 7919 + 13) % 100000; };
  for (const E& e : emu) out.push_back(rope_case("emu", e.t, e.c, e.inverse, emu_position, -2.0, 2.0));
}

// ---- RMSNorm ----------------------------------------------------------------------------------

struct NormCase {
  int64_t rows, dim;
  int64_t pad;     // row stride = dim + pad (0: the default stride)
  int64_t offset;  // elements before row 0 in x, y, dy, dx (1: unaligned, one element per step)
};

RmsNormShape norm_shape(const NormCase& c, DType t, DType wt, float eps) {
  return RmsNormShape{.rows = c.rows,
                      .dim = c.dim,
                      .eps = eps,
                      .row_stride = c.pad ? c.dim + c.pad : 0,
                      .dtype = t,
                      .weight_dtype = wt};
}

std::string norm_name(const char* what, const std::string& origin, DType t, DType wt, const NormCase& c) {
  return case_name({"rmsnorm", what, origin, "x" + dt(t), "w" + dt(wt), "rows" + n(c.rows), "dim" + n(c.dim),
                    "pad" + n(c.pad), "skew" + n(c.offset)});
}

// The saved rstd the backward reads: the CPU forward's, the same on both devices.
void prepare_rstd(Device& cpu, std::vector<HostBuffer>& b, const RmsNormShape& s, int x, int w, int rstd) {
  HostBuffer y(b[x].elem, b[x].elems, b[x].skew);
  rmsnorm_forward(cpu, s, y.data(), b[rstd].as<float>(), b[x].data(), b[w].data());
}

// GPU suite: one warp per row (dim <= 1024), 256 threads per row (<= 4096), 512 (larger);
// vectors where dim, stride and offset allow; several 2048-row blocks of dw with a ragged last one.
const NormCase kNormCases[] = {
    {37, 64, 0, 0},   {13, 1001, 2, 0}, {7, 3000, 24, 0},   {5, 16384, 0, 0},  {3, 5003, 0, 0}, {9, 128, 0, 1},
    {11, 2048, 8, 0}, {4100, 64, 0, 0}, {2049, 1001, 2, 0}, {2050, 256, 0, 1}, {0, 64, 0, 0},
};

void add_rmsnorm(std::vector<OpCase>& out) {
  for (DType t : {kF, kB})
    for (DType wt : {kF, kB})
      for (const NormCase& c : kNormCases) {
        const int64_t rs = c.dim + c.pad, elems = std::max<int64_t>(1, c.rows * rs),
                      rows1 = std::max<int64_t>(1, c.rows);
        const RmsNormShape s = norm_shape(c, t, wt, 1e-6f);
        if (c.rows <= 2048) {  // the long cases are for dw
          OpCase k;
          k.name = norm_name("forward", "gpu", t, wt, c);
          k.buffers = {input("x", t, elems, c.offset, -2.0, 2.0),
                       output("y", t, elems, c.offset, rows_of(c.rows, c.dim, rs), both(close(gpu_tol(t)))),
                       input("w", wt, c.dim),
                       output("rstd", kF, rows1, 0, rows_of(1, c.rows, c.rows), both(close(kF32Tol)))};
          k.run = [s](Ctx& x) {
            rmsnorm_forward(x.dev, s, x[1], x.as<float>(3), x[0], x[2]);
            return std::vector<double>{};
          };
          k.dut_scratch_bytes = 0;
          out.push_back(k);
        }
        OpCase k;
        k.name = norm_name("backward", "gpu", t, wt, c);
        k.buffers = {input("x", t, elems, c.offset, -2.0, 2.0),
                     input("dy", t, elems, c.offset),
                     input("w", wt, c.dim),
                     output("dx", t, elems, c.offset, rows_of(c.rows, c.dim, rs), both(close(gpu_tol(t)))),
                     output("dw", kF, c.dim, 0, everything(), both(close(kF32Tol))),  // accumulates onto its contents
                     input("rstd", kF, rows1)};
        k.prepare = [s](Device& cpu, std::vector<HostBuffer>& b) { prepare_rstd(cpu, b, s, 0, 2, 5); };
        k.run = [s](Ctx& x) {
          rmsnorm_backward(x.dev, s, x[3], x.as<float>(4), x[0], x.as<const float>(5), x[2], x[1]);
          return std::vector<double>{};
        };
        // The scratch the header names: ceil(rows / 2048) * dim fp64 block sums, kOther, freed.
        k.dut_scratch_bytes = (c.rows + 2047) / 2048 * c.dim * 8;
        k.repeat = true;                                 // run to run: the same bits
        k.one_schedule = c.rows > 2048 || c.dim > 4096;  // the emulator's time; the small cases take all three
        out.push_back(k);
      }
  // Emulator test: a warp per row (dim <= 1024), 256 threads (<= 4096), 512 threads per row;
  // forward, then the backward from the CPU forward's rstd (so dx and dw compare the backward only).
  struct E {
    DType t, wt;
    NormCase c;
  };
  const E emu[] = {
      {kF, kF, {13, 1000, 0, 0}},  // vector
      {kB, kB, {11, 264, 8, 0}},   // vector, padded stride
      {kB, kF, {9, 40, 0, 0}},     // vector (4 of the wider f32 weights)
      {kF, kB, {10, 37, 0, 0}},    // scalar: dim 37
      {kB, kB, {7, 96, 0, 1}},     // scalar: misaligned
      {kF, kF, {3, 1500, 4, 0}},   // 256 threads per row, vector
      {kB, kF, {3, 1501, 0, 0}},   // 256 threads per row, scalar
      {kF, kB, {2, 4100, 0, 0}},   // 512 threads per row, vector
      {kF, kF, {2, 4099, 0, 1}},   // 512 threads per row, scalar
      {kF, kF, {2100, 40, 0, 0}},  // dw over two row blocks of 2048
  };
  for (const E& e : emu) {
    const NormCase& c = e.c;
    const int64_t rs = c.dim + c.pad, elems = c.rows * rs, sk = c.offset;
    const RmsNormShape s = norm_shape(c, e.t, e.wt, 1e-5f);
    const Compare y_rule = emu_else(close(emu_tol(e.t)), close(gpu_tol(e.t)));
    const Compare f32_rule = emu_else(close(1e-6), close(kF32Tol));
    OpCase k;
    k.name = norm_name("forward_backward", "emu", e.t, e.wt, c);
    k.buffers = {input("x", e.t, elems, sk, -2.0, 2.0),
                 input("w", e.wt, c.dim, sk, 0.5, 1.5),
                 output("y", e.t, elems, sk, rows_of(c.rows, c.dim, rs), y_rule),
                 output("rstd", kF, c.rows, 0, everything(), f32_rule),
                 input("dy", e.t, elems, sk),
                 output("dx", e.t, elems, sk, rows_of(c.rows, c.dim, rs), y_rule),
                 output("dw", kF, c.dim, sk, everything(), f32_rule),
                 input("rstd_saved", kF, c.rows)};
    k.prepare = [s](Device& cpu, std::vector<HostBuffer>& b) { prepare_rstd(cpu, b, s, 0, 1, 7); };
    k.run = [s](Ctx& x) {
      rmsnorm_forward(x.dev, s, x[2], x.as<float>(3), x[0], x[1]);
      rmsnorm_backward(x.dev, s, x[5], x.as<float>(6), x[0], x.as<const float>(7), x[1], x[4]);
      return std::vector<double>{};
    };
    out.push_back(k);
  }
}

// ---- SwiGLU -----------------------------------------------------------------------------------

struct SwigluCase {
  int64_t rows, dim;
  int64_t in_pad, out_pad;  // strides = dim + pad (0: the default stride)
  int64_t offset;           // elements before row 0 of every tensor
};

OpCase swiglu_case(const std::string& origin, DType t, const SwigluCase& c, double up_range) {
  const int64_t irs = c.dim + c.in_pad, ors = c.dim + c.out_pad, o = c.offset;
  const int64_t n_in = std::max<int64_t>(1, c.rows * irs), n_out = std::max<int64_t>(1, c.rows * ors);
  const SwigluShape s{.rows = c.rows,
                      .dim = c.dim,
                      .in_row_stride = c.in_pad ? irs : 0,
                      .out_row_stride = c.out_pad ? ors : 0,
                      .dtype = t};
  OpCase k;
  k.name = case_name(
      {"swiglu", origin, dt(t), "rows" + n(c.rows), "f" + n(c.dim), "strides" + n(irs) + "x" + n(ors), "skew" + n(o)});
  const Region in_region = rows_of(c.rows, c.dim, irs);
  k.buffers = {input("gate", t, n_in, o, -6.0, 6.0),  // gate over the sigmoid's range
               input("up", t, n_in, o, -up_range, up_range),
               output("out", t, n_out, o, rows_of(c.rows, c.dim, ors), exact_on_emu(t)),
               input("dout", t, n_out, o),
               output("dgate", t, n_in, o, in_region, exact_on_emu(t)),
               output("dup", t, n_in, o, in_region, exact_on_emu(t))};
  k.run = [s](Ctx& x) {
    swiglu_forward(x.dev, s, x[2], x[0], x[1]);
    swiglu_backward(x.dev, s, x[4], x[5], x[0], x[1], x[3]);
    return std::vector<double>{};
  };
  return k;
}

// The fused gate_up buffer (rows, 2F): gate = buf, up = buf + F, in stride 2F. Forward writes out
// over gate (out stride 2F); backward writes dgate over gate and dup over up.
void add_swiglu_fused(std::vector<OpCase>& out, DType t, int64_t f) {
  const int64_t rows = 13;
  const SwigluShape fwd{.rows = rows, .dim = f, .in_row_stride = 2 * f, .out_row_stride = 2 * f, .dtype = t};
  OpCase a;
  a.name = case_name({"swiglu_in_place_forward", "gpu", dt(t), "f" + n(f)});
  BufferSpec buf = output("gate_up", t, rows * 2 * f, 0, rows_of(rows, f, 2 * f), exact_on_emu(t));
  buf.lo = -6.0, buf.hi = 6.0;
  a.buffers = {buf};
  a.run = [fwd, f, t](Ctx& x) {
    swiglu_forward(x.dev, fwd, x[0], x[0], static_cast<char*>(x[0]) + f * dtype_size(t));
    return std::vector<double>{};
  };
  out.push_back(a);
  const SwigluShape bwd{.rows = rows, .dim = f, .in_row_stride = 2 * f, .out_row_stride = 0, .dtype = t};
  OpCase b;
  b.name = case_name({"swiglu_in_place_backward", "gpu", dt(t), "f" + n(f)});
  buf.region = everything();
  buf.cmp = exact_on_emu(t);
  b.buffers = {buf, input("dout", t, rows * f)};
  b.run = [bwd, f, t](Ctx& x) {
    void* up = static_cast<char*>(x[0]) + f * dtype_size(t);
    swiglu_backward(x.dev, bwd, x[0], up, x[0], up, x[1]);
    return std::vector<double>{};
  };
  out.push_back(b);
}

void add_swiglu(std::vector<OpCase>& out) {
  const SwigluCase gpu[] = {
      {37, 1000, 0, 0, 0},  // 16-byte path
      {11, 37, 4, 2, 0},    // one element per step, padded strides
      {9, 256, 8, 16, 0},   // 16-byte path, padded strides
      {7, 64, 0, 0, 1},     // unaligned pointers: one element per step
      {3, 3000, 0, 0, 0},   // several blocks across a row
      {0, 64, 0, 0, 0},     // nothing to do
  };
  for (DType t : {kF, kB}) {
    for (const SwigluCase& c : gpu) out.push_back(swiglu_case("gpu", t, c, 1.0));
    for (int64_t f : {512, 37}) add_swiglu_fused(out, t, f);
  }
  // F = 1: 8 rows per block, 65535 blocks in y cover 524280 rows; the rest by the grid-stride loop.
  {
    const int64_t rows = 600'000;
    const SwigluShape s{.rows = rows, .dim = 1};
    OpCase k;
    k.name = "swiglu_gpu_f32_rows600000_f1_more_rows_than_the_grid_covers";
    k.buffers = {input("gate", kF, rows, 0, -6.0, 6.0), input("up", kF, rows),
                 output("out", kF, rows, 0, everything(), emu_else(bits(), close(kF32Tol)))};
    k.run = [s](Ctx& x) {
      swiglu_forward(x.dev, s, x[2], x[0], x[1]);
      return std::vector<double>{};
    };
    k.one_schedule = true;  // element-wise, no barrier: the emulator's time
    out.push_back(k);
  }
  // Emulator test: vector when F and both strides are multiples of the vector and all pointers aligned.
  struct E {
    DType t;
    SwigluCase c;
  };
  const E emu[] = {
      {kF, {7, 100, 0, 0, 0}},   // vector
      {kB, {5, 200, 8, 16, 0}},  // vector, two strides
      {kF, {6, 37, 3, 0, 0}},    // scalar: F 37
      {kB, {4, 64, 0, 0, 1}},    // scalar: misaligned
      {kF, {3, 601, 0, 0, 0}},   // scalar, a row over 3 blocks in x
  };
  for (const E& e : emu) out.push_back(swiglu_case("emu", e.t, e.c, 2.0));
  // In place (out = gate, then dgate = gate and dup = up): the header allows it when the strides agree.
  struct P {
    DType t;
    int64_t rows, dim, pad;
  };
  for (const P& p : {P{kB, 5, 72, 0}, P{kF, 5, 33, 2}}) {  // vector; scalar
    const int64_t rs = p.dim + p.pad;
    const SwigluShape s{
        .rows = p.rows, .dim = p.dim, .in_row_stride = p.pad ? rs : 0, .out_row_stride = p.pad ? rs : 0, .dtype = p.t};
    OpCase k;
    k.name = case_name({"swiglu_in_place", "emu", dt(p.t), "rows" + n(p.rows), "f" + n(p.dim), "stride" + n(rs)});
    BufferSpec gate = output("gate", p.t, p.rows * rs, 0, rows_of(p.rows, p.dim, rs), exact_on_emu(p.t));
    gate.lo = -6.0, gate.hi = 6.0;
    BufferSpec up = output("up", p.t, p.rows * rs, 0, rows_of(p.rows, p.dim, rs), exact_on_emu(p.t));
    up.lo = -2.0, up.hi = 2.0;
    k.buffers = {gate, up, input("dout", p.t, p.rows * rs)};
    k.run = [s](Ctx& x) {
      swiglu_forward(x.dev, s, x[0], x[0], x[1]);
      swiglu_backward(x.dev, s, x[0], x[1], x[0], x[1], x[2]);
      return std::vector<double>{};
    };
    out.push_back(k);
  }
}

// ---- tensor ops -------------------------------------------------------------------------------

void add_tensor_ops(std::vector<OpCase>& out) {
  struct RowDot {
    int64_t rows, dim, lda, ldb, out_stride, a_skew, b_skew, out_skew;
  };
  auto row_dot_case = [&](const std::string& origin, DType t, const RowDot& c, int64_t pad) {
    OpCase k;
    k.name = case_name({"row_dot", origin, dt(t), "rows" + n(c.rows), "dim" + n(c.dim), "lda" + n(c.lda),
                        "ldb" + n(c.ldb), "os" + n(c.out_stride), "skew" + n(c.a_skew) + n(c.b_skew) + n(c.out_skew)});
    // fp32 output either way: bf16 products are exact in fp32, only the summation order differs.
    k.buffers = {input("a", t, c.rows * c.lda + pad, c.a_skew), input("b", t, c.rows * c.ldb + pad, c.b_skew),
                 output("out", kF, std::max<int64_t>(1, (c.rows - 1) * c.out_stride + 1), c.out_skew,
                        rows_of(c.rows, 1, c.out_stride), both(close(kF32Tol)))};
    k.run = [c, t](Ctx& x) {
      row_dot(x.dev, c.rows, c.dim, t, x[0], c.lda, x[1], c.ldb, x.as<float>(2), c.out_stride);
      return std::vector<double>{};
    };
    out.push_back(k);
  };
  const RowDot gpu[] = {
      {1000, 128, 128, 136, 1, 0, 0, 0},                                 // 16-byte path
      {333, 75, 77, 80, 3, 0, 0, 0},                                     // one element per step
      {50, 1024, 1024, 1032, 2, 0, 0, 0}, {64, 64, 64, 64, 1, 1, 1, 0},  // unaligned
      {5, 0, 3, 3, 2, 0, 0, 0},                                          // empty rows: 0
      {1, 1, 1, 1, 1, 0, 0, 0},
  };
  for (DType t : {kF, kB})
    for (const RowDot& c : gpu) row_dot_case("gpu", t, c, 1);
  const std::pair<DType, RowDot> emu[] = {
      {kF, {19, 96, 96, 100, 1, 0, 0, 0}},    // vector
      {kB, {17, 136, 144, 136, 3, 0, 0, 0}},  // vector, strides
      {kF, {9, 67, 70, 67, 2, 0, 0, 0}},      // scalar: dim 67
      {kB, {10, 64, 64, 64, 1, 1, 0, 1}},     // scalar: misaligned
  };
  for (const auto& [t, c] : emu) row_dot_case("emu", t, c, 0);

  // add_into and convert: exact; n and skews (0 or 1) as in the two tests.
  // spare: the GPU suite's buffers hold len + 1 elements from their start (skew included).
  auto add_into_case = [&](const std::string& origin, DType acc_t, DType t, int64_t len, int64_t acc_skew,
                           int64_t x_skew, bool spare, double x_range) {
    OpCase k;
    k.name = case_name({"add_into", origin, dt(acc_t), "plus", dt(t), "n" + n(len), "skew" + n(acc_skew) + n(x_skew)});
    k.buffers = {output("acc", acc_t, len + (spare ? 1 - acc_skew : 0), acc_skew, rows_of(1, len, len), both(bits())),
                 input("x", t, len + (spare ? 1 - x_skew : 0), x_skew, -x_range, x_range)};
    k.run = [=](Ctx& x) {
      add_into(x.dev, x[0], acc_t, x[1], t, len);
      return std::vector<double>{};
    };
    k.one_schedule = len > 100000;  // element-wise, no barrier: the emulator's time
    out.push_back(k);
  };
  for (DType acc_t : {kF, kB})
    for (DType t : {kF, kB})
      for (int64_t off_acc : {0, 1})
        for (int64_t off_x : {0, 1}) add_into_case("gpu", acc_t, t, 100'003, off_acc, off_x, true, 3.0);
  const std::tuple<DType, DType, int64_t, int64_t, int64_t> emu_add[] = {
      {kF, kF, 1037, 0, 0},  // vector + tail
      {kF, kB, 1030, 0, 0},  // vector (8-byte bf16 loads) + tail
      {kF, kF, 1029, 1, 0},  // scalar
      {kF, kB, 515, 0, 1},   // scalar
      {kB, kB, 1031, 0, 0},  // bf16 sums rounded: vector + tail
      {kB, kF, 1028, 0, 0},  // vector
      {kB, kB, 517, 1, 0},   // scalar
      {kB, kF, 519, 0, 1},   // scalar
  };
  for (const auto& [acc_t, t, len, sa, sx] : emu_add) add_into_case("emu", acc_t, t, len, sa, sx, false, 1.0);

  // add_bias: exact (one fp32 add and one rounding per element, as add_into); the stride gaps of
  // out come back untouched. bias_grad: the same fp32 adds in the same order on both sides (rows
  // in chunks of kBiasGradRows, then the chunks; no fused multiply-adds), so bit for bit on the
  // emulated GPU (one chunk and three); the GPU suite's tolerance on a GPU. Rows and widths ragged (not multiples of the vector widths), a skew.
  for (DType out_t : {kF, kB})
    for (DType b_t : {kF, kB}) {
      const int64_t rows = 37, cols = 70, ld = 75;
      OpCase k;
      k.name = case_name({"add_bias", dt(out_t), "plus", dt(b_t), "rows" + n(rows), "n" + n(cols)});
      k.buffers = {output("out", out_t, rows * ld, out_t == b_t ? 1 : 0, rows_of(rows, cols, ld), both(bits())),
                   input("bias", b_t, cols, 0, -2.0, 2.0)};
      k.run = [=](Ctx& x) {
        add_bias(x.dev, x[0], out_t, ld, rows, cols, x[1], b_t);
        return std::vector<double>{};
      };
      out.push_back(k);
      for (bool accumulate : {false, true}) {
        const int64_t grows = accumulate ? 301 : 2500;  // one chunk of the GPU's 1024 rows, or three
        OpCase g;
        g.name = case_name({"bias_grad", dt(b_t), "from", dt(out_t), "rows" + n(grows), "n" + n(cols),
                            accumulate ? "accumulate" : "overwrite"});
        g.buffers = {output("db", b_t, cols, 0, rows_of(1, cols, cols), exact_on_emu(b_t)),
                     input("g", out_t, grows * ld, accumulate ? 1 : 0, -1.0, 1.0)};
        g.run = [=](Ctx& x) {
          bias_grad(x.dev, x[0], b_t, x[1], out_t, ld, grows, cols, accumulate);
          return std::vector<double>{};
        };
        out.push_back(g);
      }
    }

  // The mixture of experts' row movements (kernels/moe.h): gather_rows and combine_rows are exact
  // on both sides (a copy; fp32 products and sums in the order j = 0..k-1, no fused multiply-adds,
  // one rounding); combine_rows_backward's dys is exact (one product, one rounding) and its dw a
  // dot product of E terms summed in another order on the device: the fp32 tolerance. 37 tokens, 3
  // experts each, rows of 70 elements; the routes a fixed permutation of the 111 expert rows.
  for (DType t : {kF, kB}) {
    const int64_t nt = 37, k = 3, m = nt * k, dim = 70;
    const MoeRows s{.n = nt, .k = k, .m = m, .dim = dim, .dtype = t};
    auto route_fill = [=](HostBuffer& b, test::Rng&) {  // pos (n, k): a permutation of the m rows
      for (int64_t i = 0; i < m; ++i) b.set(i, static_cast<double>((i * 29 + 5) % m));
    };
    BufferSpec idx = input("idx", DType::kI32, m);
    idx.fill = [=](HostBuffer& b, test::Rng&) {
      for (int64_t i = 0; i < m; ++i) b.set(i, static_cast<double>((i * 7 + 3) % nt));
    };
    BufferSpec pos = input("pos", DType::kI32, m);
    pos.fill = route_fill;
    OpCase gather;
    gather.name = case_name({"gather_rows", dt(t), "m" + n(m), "dim" + n(dim)});
    gather.buffers = {output("dst", t, m * dim, 0, everything(), both(bits())), input("src", t, nt * dim), idx};
    gather.run = [=](Ctx& x) {
      gather_rows(x.dev, s, x[0], x[1], nt, static_cast<const int32_t*>(x[2]));
      return std::vector<double>{};
    };
    out.push_back(gather);
    for (bool weighted : {true, false}) {
      OpCase c;
      c.name = case_name({"combine_rows", dt(t), weighted ? "weighted" : "unweighted", "n" + n(nt), "k" + n(k)});
      c.buffers = {output("out", t, nt * dim, 0, everything(), exact_on_emu(t)), input("ys", t, m * dim), pos,
                   input("w", kF, m, 0, 0.0, 1.0)};
      c.run = [=](Ctx& x) {
        combine_rows(x.dev, s, x[0], x[1], static_cast<const int32_t*>(x[2]),
                     weighted ? static_cast<const float*>(x[3]) : nullptr, /*accumulate=*/weighted);
        return std::vector<double>{};
      };
      out.push_back(c);
    }
    OpCase b;
    b.name = case_name({"combine_rows_backward", dt(t), "n" + n(nt), "k" + n(k)});
    b.buffers = {output("dys", t, m * dim, 0, everything(), both(bits())),
                 output("dw", kF, m, 0, everything(), emu_else(close(emu_tol(kF)), close(gpu_tol(kF)))),
                 input("dy", t, nt * dim), input("ys", t, m * dim), pos, input("w", kF, m, 0, 0.0, 1.0)};
    b.run = [=](Ctx& x) {
      combine_rows_backward(x.dev, s, x[0], static_cast<float*>(x[1]), x[2], x[3], static_cast<const int32_t*>(x[4]),
                            static_cast<const float*>(x[5]));
      return std::vector<double>{};
    };
    out.push_back(b);
  }

  auto convert_case = [&](const std::string& origin, DType dst_t, DType src_t, int64_t len, int64_t dst_skew,
                          int64_t src_skew, int64_t spare, double range, bool specials) {
    OpCase k;
    k.name =
        case_name({"convert", origin, dt(src_t), "to", dt(dst_t), "n" + n(len), "skew" + n(dst_skew) + n(src_skew)});
    BufferSpec src = input("src", src_t, len + spare, src_skew, -range, range);
    if (specials) {
      src.fill = [src_t, range](HostBuffer& b, test::Rng& rng) {
        const std::vector<double> v = test::uniform_values(rng, b.total(), src_t, -range, range);
        for (int64_t i = 0; i < b.total(); ++i) b.set(i - b.skew, v[static_cast<size_t>(i)]);
        if (src_t == kF) {
          const float inf = std::numeric_limits<float>::infinity();
          const float sp[] = {0.0f,
                              -0.0f,
                              inf,
                              -inf,
                              FLT_MAX,            // rounds up to inf in bf16
                              1.0f + 1.0f / 256,  // halfway between two bf16 values: to even (1.0)
                              1.0f + 3.0f / 256,  // halfway: to even (1 + 4/256)
                              1e-40f,
                              -1e-45f,  // subnormals
                              std::numeric_limits<float>::quiet_NaN()};
          std::memcpy(b.data(), sp, sizeof sp);
        } else {
          const uint16_t sp[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x8001, 0x7f7f, 0x7fc0};
          std::memcpy(b.data(), sp, sizeof sp);
        }
      };
    }
    // A NaN stays a NaN; on the device its payload may differ from the CPU's.
    const Compare rule = specials ? both(same_values()) : emu_else(bits(), same_values());
    k.buffers = {output("dst", dst_t, len + spare, dst_skew, rows_of(1, len, len), rule), src};
    k.run = [=](Ctx& x) {
      convert(x.dev, x[0], dst_t, x[1], src_t, len);
      return std::vector<double>{};
    };
    k.one_schedule = len > 100000;  // element-wise, no barrier: the emulator's time
    out.push_back(k);
  };
  for (DType src_t : {kF, kB})
    for (DType dst_t : {kF, kB})
      for (int64_t off : {0, 1}) convert_case("gpu", dst_t, src_t, 100'003, off, off, 1 - off, 100.0, true);
  const std::tuple<DType, DType, int64_t, int64_t, int64_t> emu_conv[] = {
      {kB, kF, 1027, 0, 0},  // vector + tail
      {kF, kB, 1026, 0, 0},  // vector + tail
      {kB, kF, 517, 1, 0},   // scalar
      {kF, kB, 518, 0, 1},   // scalar
      {kB, kB, 101, 1, 0},   // same type: a copy
      {kF, kF, 99, 0, 1},    // same type: a copy
  };
  for (const auto& [dst_t, src_t, len, sd, ss] : emu_conv)
    convert_case("emu", dst_t, src_t, len, sd, ss, 0, 300.0, false);
}

// ---- Device::copy_2d --------------------------------------------------------------------------

void add_copy_2d(std::vector<OpCase>& out) {
  struct C {
    int64_t rows, row_bytes, src_pitch, dst_pitch, src_off, dst_off;
  };
  const C cases[] = {
      {37, 4, 12, 20, 0, 0},                             // a row width of 4 bytes, pitches wider than the rows
      {9, 1000, 1024, 1536, 0, 0}, {5, 4, 4, 4, 0, 0},   // contiguous
      {17, 7, 9, 8, 1, 3},                               // odd widths, pitches and offsets
      {3, 4096, 8192, 4096, 0, 0},                       // gather rows into a contiguous buffer
      {4, 0, 4, 4, 0, 0},                                // nothing to copy
      {0, 16, 16, 16, 0, 0},       {1, 64, 0, 0, 0, 0},  // one row: the pitches are not used
      {6, 16, 0, 24, 0, 0},  // one source row to every destination row (pitch 0 < row_bytes)
  };
  for (const C& c : cases) {
    // Room for every row (a pitch may be shorter than a row), plus one byte that must survive.
    const auto span = [&](int64_t pitch) { return std::max(c.rows * pitch, (c.rows - 1) * pitch + c.row_bytes); };
    OpCase k;
    k.name =
        case_name({"copy_2d", "rows" + n(c.rows), "row_bytes" + n(c.row_bytes),
                   "pitches" + n(c.src_pitch) + "x" + n(c.dst_pitch), "offsets" + n(c.src_off) + "x" + n(c.dst_off)});
    BufferSpec src{.name = "src", .elem = Elem::kU8, .elems = span(c.src_pitch) + 1, .skew = c.src_off};
    src.fill = [](HostBuffer& b, test::Rng&) {
      uint32_t state = 12345;
      for (auto& x : b.bytes) x = static_cast<unsigned char>((state = state * 1664525u + 1013904223u) >> 24);
    };
    BufferSpec dst{.name = "dst",
                   .elem = Elem::kU8,
                   .elems = span(c.dst_pitch) + 1,
                   .skew = c.dst_off,
                   .output = true,
                   .region = rows_of(c.rows, c.row_bytes, c.dst_pitch),
                   .cmp = both(bits())};
    dst.fill = [](HostBuffer& b, test::Rng&) {  // must survive in the gaps
      for (size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<unsigned char>(0xA5 ^ i);
    };
    k.buffers = {src, dst};
    k.run = [c](Ctx& x) {
      x.dev.copy_2d(x[1], c.dst_pitch, x[0], c.src_pitch, c.row_bytes, c.rows);
      return std::vector<double>{};
    };
    out.push_back(k);
  }
}

// ---- argument checks --------------------------------------------------------------------------

// Bad shapes are refused with Error(kInvalidArgument) by the public entry point, before any
// work is issued, on every backend: the buffer handed in comes back unchanged.
void add_bad_arguments(std::vector<OpCase>& out) {
  using Call = std::function<void(Device&, void*, float*)>;
  const std::pair<const char*, Call> calls[] = {
      {"rope_odd_head_dim",
       [](Device& d, void* p, float*) {
         rope_forward(d, RopeShape{.tokens = 4, .heads = 2, .head_dim = 7}, p, nullptr);
       }},
      {"rope_head_dim_4096",
       [](Device& d, void* p, float*) {
         rope_forward(d, RopeShape{.tokens = 4, .heads = 2, .head_dim = 4096}, p, nullptr);
       }},
      {"rope_short_row_stride",
       [](Device& d, void* p, float*) {
         rope_backward(d, RopeShape{.tokens = 4, .heads = 2, .head_dim = 8, .row_stride = 15}, p, nullptr);
       }},
      {"rmsnorm_short_row_stride",
       [](Device& d, void* p, float* f) {
         rmsnorm_forward(d, RmsNormShape{.rows = 4, .dim = 8, .row_stride = 7}, p, f, p, p);
       }},
      {"rmsnorm_f64_weights",
       [](Device& d, void* p, float* f) {
         rmsnorm_backward(d, RmsNormShape{.rows = 4, .dim = 8, .weight_dtype = DType::kF64}, p, f, p, f, p, p);
       }},
      {"swiglu_f64",
       [](Device& d, void* p, float*) {
         swiglu_forward(d, SwigluShape{.rows = 4, .dim = 8, .dtype = DType::kF64}, p, p, p);
       }},
      {"swiglu_short_in_stride",
       [](Device& d, void* p, float*) {
         swiglu_backward(d, SwigluShape{.rows = 4, .dim = 8, .in_row_stride = 4}, p, p, p, p, p);
       }},
      {"row_dot_short_lda", [](Device& d, void* p, float* f) { row_dot(d, 4, 8, DType::kF32, p, 7, p, 8, f, 1); }},
      {"row_dot_out_stride_0", [](Device& d, void* p, float* f) { row_dot(d, 4, 8, DType::kF32, p, 8, p, 8, f, 0); }},
      {"add_into_i32", [](Device& d, void* p, float* f) { add_into(d, f, DType::kF32, p, DType::kI32, 8); }},
      {"add_into_f64_acc", [](Device& d, void* p, float*) { add_into(d, p, DType::kF64, p, DType::kF32, 8); }},
      {"convert_to_f64", [](Device& d, void* p, float*) { convert(d, p, DType::kF64, p, DType::kF32, 8); }},
      {"convert_negative_n", [](Device& d, void* p, float*) { convert(d, p, DType::kF32, p, DType::kF32, -1); }},
  };
  for (const auto& [name, call] : calls) {
    OpCase k;
    k.name = case_name({"refuses", name});
    k.buffers = {input("buffer", kF, 4096)};
    k.run = [call](Ctx& x) {
      call(x.dev, x[0], x.as<float>(0));
      return std::vector<double>{};
    };
    k.refused_on_cpu = k.refused_on_dut = Refusal{.kind = ErrorKind::kInvalidArgument};
    out.push_back(k);
  }
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> out;
  add_rope(out);
  add_rmsnorm(out);
  add_swiglu(out);
  add_tensor_ops(out);
  add_copy_2d(out);
  add_bad_arguments(out);
  return out;
}

}  // namespace untied::ops
