// The CUDA element-wise and row ops against the CPU backend on the same inputs: RoPE, RMSNorm
// (forward, backward with accumulated dw), SwiGLU (including the in-place forms the header
// allows), row_dot, add_into, convert, and Device::copy_2d. Every case runs f32 and bf16 storage
// (where the op has a storage type), ragged sizes that are not multiples of the vector widths
// (so both the 16-byte and the one-element paths run), row strides with padding between rows
// (compared too: the padding must come back untouched), and pointers offset by one element.
//
// Tolerances, relative to the largest |CPU value| of the tensor (compare() below):
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
//   add_into, convert, copy_2d: exact (one IEEE operation or a copy per element).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "untied/core/check.h"
#include "untied/core/random.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/rope.h"
#include "untied/kernels/swiglu.h"
#include "untied/kernels/tensor_ops.h"

namespace untied {
namespace {

using gputest::gpu_device;
using gputest::host_f32;
using gputest::random_host;
using gputest::to_gpu;
using gputest::to_host_f32;

constexpr double kF32Tol = 1e-5;               // see the top of the file
constexpr double kBf16Tol = 1.0 / 128 + 1e-5;  // one bf16 ulp plus the fp32 tolerance

double tol_for(DType t) { return t == DType::kBF16 ? kBf16Tol : kF32Tol; }

// max |cpu - gpu| <= tol * max|cpu| (or tol where cpu is all zeros); on failure prints the
// error, the tolerance, how many elements exceed it and the first few of them.
::testing::AssertionResult compare(const std::string& what, const std::vector<float>& cpu,
                                   const std::vector<float>& gpu, double tol) {
  if (cpu.size() != gpu.size())
    return ::testing::AssertionFailure() << what << ": " << cpu.size() << " CPU values vs " << gpu.size() << " GPU";
  double mx = 0;
  for (float v : cpu) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  const double limit = tol * (mx > 0 ? mx : 1.0);
  double err = 0;
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::fabs(static_cast<double>(cpu[i]) - static_cast<double>(gpu[i]));
    if (!(e <= limit)) {  // NaN counts as a mismatch
      if (bad < 5) first << "\n  [" << i << "] cpu " << cpu[i] << " gpu " << gpu[i];
      ++bad;
    }
    if (e > err || std::isnan(e)) err = e;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max |cpu - gpu| " << err << " > " << limit << " (" << tol
                                       << " x max|cpu| " << mx << "); " << bad << " of " << cpu.size()
                                       << " elements, first:" << first.str();
}

// Element-wise identity: the same bits, or NaN on both sides.
::testing::AssertionResult same_values(const std::string& what, const std::vector<float>& cpu,
                                       const std::vector<float>& gpu) {
  if (cpu.size() != gpu.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const bool same = (std::isnan(cpu[i]) && std::isnan(gpu[i])) || std::memcmp(&cpu[i], &gpu[i], sizeof(float)) == 0;
    if (!same) {
      if (bad < 5) first << "\n  [" << i << "] cpu " << cpu[i] << " gpu " << gpu[i];
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << cpu.size() << " elements differ, first:"
                                       << first.str();
}

struct Devices {
  std::unique_ptr<Device> cpu = make_cpu_device({.threads = 1});
  std::unique_ptr<Device> gpu = gpu_device();
};

// `elems` elements of storage t into a buffer (pointer arithmetic on void*).
void* at(void* p, int64_t elems, DType t) { return static_cast<char*>(p) + elems * dtype_size(t); }

std::string dt(DType t) { return std::string(dtype_name(t)); }

// ---- RoPE ----------------------------------------------------------------------------------

struct RopeCase {
  int64_t tokens, heads, head_dim;
  int64_t pad;              // row stride = heads * D + pad (0: the default stride)
  bool explicit_positions;  // else first_position + t
  int64_t first_position;
  double theta;
};

TEST(CudaOps, RopeMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  const RopeCase cases[] = {
      {37, 3, 128, 0, false, 1'000'003, 10000.0},     // 16-byte path, a rank's slice far into the sequence
      {29, 5, 6, 3, true, 0, 10000.0},                 // one pair per thread, odd stride
      {19, 2, 64, 16, true, 0, 1e6},                   // 16-byte path with padding between tokens
      {5, 1, 2048, 0, true, 0, 500000.0},              // the largest head dim: 1024 pairs
      {3, 4, 72, 0, false, 4'000'000, 10000.0},        // D/2 = 36: f32 vectors, bf16 one pair at a time
      {0, 4, 64, 0, false, 0, 10000.0},                // nothing to do
      {(int64_t{1} << 20) + 5, 1, 2, 0, false, 0, 10000.0},  // more tokens than blocks: grid-stride
  };
  for (DType t : {DType::kF32, DType::kBF16})
    for (const RopeCase& c : cases)
      for (bool inverse : {false, true}) {
        if (c.tokens > (1 << 20) && t == DType::kBF16) continue;  // the f32 run covers the grid-stride loop
        const int64_t rs = c.heads * c.head_dim + c.pad;
        const RopeShape s{.tokens = c.tokens, .heads = c.heads, .head_dim = c.head_dim,
                          .row_stride = c.pad ? rs : 0, .theta = c.theta, .dtype = t,
                          .first_position = c.first_position};
        const std::string what = "rope " + dt(t) + " tokens " + std::to_string(c.tokens) + " D " +
                                 std::to_string(c.head_dim) + (inverse ? " backward" : " forward");
        TensorBuffer hx = random_host(*d.cpu, t, {std::max<int64_t>(1, c.tokens * rs)}, 11);
        TensorBuffer gx = to_gpu(*d.gpu, hx);
        // Positions of a large sequence, out of order (a zig-zag shard), up to ~5e6.
        std::vector<int64_t> pos(static_cast<size_t>(c.tokens));
        for (int64_t i = 0; i < c.tokens; ++i) pos[i] = 1'000'000 + (i * 2'654'435'761LL) % 4'000'000;
        Buffer gpos = d.gpu->allocator().allocate(c.tokens * 8, Tag::kOther, "positions");
        if (c.tokens > 0) d.gpu->copy(gpos.data(), pos.data(), c.tokens * 8);
        const int64_t* hp = c.explicit_positions ? pos.data() : nullptr;
        const int64_t* gp = c.explicit_positions ? gpos.as<int64_t>() : nullptr;
        if (inverse) {
          rope_backward(*d.cpu, s, hx.data(), hp);
          rope_backward(*d.gpu, s, gx.data(), gp);
        } else {
          rope_forward(*d.cpu, s, hx.data(), hp);
          rope_forward(*d.gpu, s, gx.data(), gp);
        }
        EXPECT_TRUE(compare(what, host_f32(hx), to_host_f32(*d.gpu, gx), tol_for(t)));
      }
}

TEST(CudaOps, RopeAllocatesNothingOnTheGpu) {
  REQUIRE_GPU();
  Devices d;
  const RopeShape s{.tokens = 64, .heads = 4, .head_dim = 128};
  TensorBuffer gx = to_gpu(*d.gpu, random_host(*d.cpu, DType::kF32, {64 * 4 * 128}, 3));
  const int64_t before = d.gpu->allocator().stats().num_allocations;
  rope_forward(*d.gpu, s, gx.data(), nullptr);
  d.gpu->synchronize();
  EXPECT_EQ(d.gpu->allocator().stats().num_allocations, before);
}

// ---- RMSNorm -------------------------------------------------------------------------------

struct NormCase {
  int64_t rows, dim;
  int64_t pad;     // row stride = dim + pad (0: the default stride)
  int64_t offset;  // elements before row 0 in x, y, dy, dx (1: unaligned, one element per step)
};

// One warp per row (dim <= 1024), 256 threads per row (<= 4096), 512 (larger); vectors where
// dim, stride and offset allow; several 2048-row blocks of dw with a ragged last one.
const NormCase kNormCases[] = {
    {37, 64, 0, 0},     {13, 1001, 2, 0},  {7, 3000, 24, 0}, {5, 16384, 0, 0}, {3, 5003, 0, 0},
    {9, 128, 0, 1},     {11, 2048, 8, 0},  {4100, 64, 0, 0}, {2049, 1001, 2, 0}, {2050, 256, 0, 1},
    {0, 64, 0, 0},
};

RmsNormShape norm_shape(const NormCase& c, DType t, DType wt) {
  return RmsNormShape{.rows = c.rows, .dim = c.dim, .eps = 1e-6f, .row_stride = c.pad ? c.dim + c.pad : 0,
                      .dtype = t, .weight_dtype = wt};
}

int64_t norm_elems(const NormCase& c) { return std::max<int64_t>(1, c.offset + c.rows * (c.dim + c.pad)); }

TEST(CudaOps, RmsNormForwardMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  for (DType t : {DType::kF32, DType::kBF16})
    for (DType wt : {DType::kF32, DType::kBF16})
      for (const NormCase& c : kNormCases) {
        if (c.rows > 2048) continue;  // the long cases are for dw
        const RmsNormShape s = norm_shape(c, t, wt);
        const std::string what = "rmsnorm forward x " + dt(t) + " w " + dt(wt) + " rows " + std::to_string(c.rows) +
                                 " dim " + std::to_string(c.dim) + " offset " + std::to_string(c.offset);
        const int64_t n = norm_elems(c);
        TensorBuffer hx = random_host(*d.cpu, t, {n}, 21, 2.0f);
        TensorBuffer hy = random_host(*d.cpu, t, {n}, 22);  // prior contents: padding must survive
        TensorBuffer hw = random_host(*d.cpu, wt, {c.dim}, 23);
        TensorBuffer hr = random_host(*d.cpu, DType::kF32, {std::max<int64_t>(1, c.rows)}, 24);
        TensorBuffer gx = to_gpu(*d.gpu, hx), gy = to_gpu(*d.gpu, hy), gw = to_gpu(*d.gpu, hw), gr = to_gpu(*d.gpu, hr);
        rmsnorm_forward(*d.cpu, s, at(hy.data(), c.offset, t), hr.as<float>(), at(hx.data(), c.offset, t), hw.data());
        rmsnorm_forward(*d.gpu, s, at(gy.data(), c.offset, t), gr.as<float>(), at(gx.data(), c.offset, t), gw.data());
        EXPECT_TRUE(compare(what + ": y", host_f32(hy), to_host_f32(*d.gpu, gy), tol_for(t)));
        EXPECT_TRUE(compare(what + ": rstd", host_f32(hr), to_host_f32(*d.gpu, gr), kF32Tol));
      }
}

TEST(CudaOps, RmsNormBackwardMatchesTheCpuAndIsDeterministic) {
  REQUIRE_GPU();
  Devices d;
  for (DType t : {DType::kF32, DType::kBF16})
    for (DType wt : {DType::kF32, DType::kBF16})
      for (const NormCase& c : kNormCases) {
        const RmsNormShape s = norm_shape(c, t, wt);
        const std::string what = "rmsnorm backward x " + dt(t) + " w " + dt(wt) + " rows " + std::to_string(c.rows) +
                                 " dim " + std::to_string(c.dim) + " offset " + std::to_string(c.offset);
        const int64_t n = norm_elems(c), rows1 = std::max<int64_t>(1, c.rows);
        TensorBuffer hx = random_host(*d.cpu, t, {n}, 31, 2.0f);
        TensorBuffer hdy = random_host(*d.cpu, t, {n}, 32);
        TensorBuffer hw = random_host(*d.cpu, wt, {c.dim}, 33);
        TensorBuffer hdx = random_host(*d.cpu, t, {n}, 34);                // prior contents: padding must survive
        TensorBuffer hdw = random_host(*d.cpu, DType::kF32, {c.dim}, 35);  // dw accumulates onto this
        // The saved rstd of the forward, the same on both sides.
        TensorBuffer hy = random_host(*d.cpu, t, {n}, 36);
        TensorBuffer hr = random_host(*d.cpu, DType::kF32, {rows1}, 37);
        rmsnorm_forward(*d.cpu, s, at(hy.data(), c.offset, t), hr.as<float>(), at(hx.data(), c.offset, t), hw.data());
        TensorBuffer gx = to_gpu(*d.gpu, hx), gdy = to_gpu(*d.gpu, hdy), gw = to_gpu(*d.gpu, hw);
        TensorBuffer gr = to_gpu(*d.gpu, hr);
        TensorBuffer gdx = to_gpu(*d.gpu, hdx), gdw = to_gpu(*d.gpu, hdw);
        TensorBuffer gdx2 = to_gpu(*d.gpu, hdx), gdw2 = to_gpu(*d.gpu, hdw);

        rmsnorm_backward(*d.cpu, s, at(hdx.data(), c.offset, t), hdw.as<float>(), at(hx.data(), c.offset, t),
                         hr.as<float>(), hw.data(), at(hdy.data(), c.offset, t));
        Allocator& ga = d.gpu->allocator();
        ga.reset_peaks();
        const int64_t live = ga.stats().live[static_cast<int>(Tag::kOther)];
        rmsnorm_backward(*d.gpu, s, at(gdx.data(), c.offset, t), gdw.as<float>(), at(gx.data(), c.offset, t),
                         gr.as<float>(), gw.data(), at(gdy.data(), c.offset, t));
        // The scratch the header names: ceil(rows / 2048) * dim fp64 block sums, kOther, freed.
        const MemoryStats ms = ga.stats();
        EXPECT_EQ(ms.peak[static_cast<int>(Tag::kOther)] - live, (c.rows + 2047) / 2048 * c.dim * 8) << what;
        EXPECT_EQ(ms.live[static_cast<int>(Tag::kOther)], live) << what;

        EXPECT_TRUE(compare(what + ": dx", host_f32(hdx), to_host_f32(*d.gpu, gdx), tol_for(t)));
        EXPECT_TRUE(compare(what + ": dw", host_f32(hdw), to_host_f32(*d.gpu, gdw), kF32Tol));

        // Run to run: the same bits again.
        rmsnorm_backward(*d.gpu, s, at(gdx2.data(), c.offset, t), gdw2.as<float>(), at(gx.data(), c.offset, t),
                         gr.as<float>(), gw.data(), at(gdy.data(), c.offset, t));
        EXPECT_TRUE(same_values(what + ": dw twice", to_host_f32(*d.gpu, gdw), to_host_f32(*d.gpu, gdw2)));
        EXPECT_TRUE(same_values(what + ": dx twice", to_host_f32(*d.gpu, gdx), to_host_f32(*d.gpu, gdx2)));
      }
}

// ---- SwiGLU --------------------------------------------------------------------------------

struct SwigluCase {
  int64_t rows, dim;
  int64_t in_pad, out_pad;  // strides = dim + pad (0: the default stride)
  int64_t offset;           // elements before row 0 of every tensor
};

TEST(CudaOps, SwigluMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  const SwigluCase cases[] = {
      {37, 1000, 0, 0, 0},  // 16-byte path
      {11, 37, 4, 2, 0},    // one element per step, padded strides
      {9, 256, 8, 16, 0},   // 16-byte path, padded strides
      {7, 64, 0, 0, 1},     // unaligned pointers: one element per step
      {3, 3000, 0, 0, 0},   // several blocks across a row
      {0, 64, 0, 0, 0},     // nothing to do
  };
  for (DType t : {DType::kF32, DType::kBF16})
    for (const SwigluCase& c : cases) {
      const SwigluShape s{.rows = c.rows, .dim = c.dim, .in_row_stride = c.in_pad ? c.dim + c.in_pad : 0,
                          .out_row_stride = c.out_pad ? c.dim + c.out_pad : 0, .dtype = t};
      const std::string what = "swiglu " + dt(t) + " rows " + std::to_string(c.rows) + " F " + std::to_string(c.dim) +
                               " offset " + std::to_string(c.offset);
      const int64_t n_in = std::max<int64_t>(1, c.offset + c.rows * (c.dim + c.in_pad));
      const int64_t n_out = std::max<int64_t>(1, c.offset + c.rows * (c.dim + c.out_pad));
      TensorBuffer hg = random_host(*d.cpu, t, {n_in}, 41, 6.0f);  // gate over the sigmoid's range
      TensorBuffer hu = random_host(*d.cpu, t, {n_in}, 42);
      TensorBuffer hout = random_host(*d.cpu, t, {n_out}, 43);  // prior contents: padding must survive
      TensorBuffer hdout = random_host(*d.cpu, t, {n_out}, 44);
      TensorBuffer hdg = random_host(*d.cpu, t, {n_in}, 45), hdu = random_host(*d.cpu, t, {n_in}, 46);
      TensorBuffer gg = to_gpu(*d.gpu, hg), gu = to_gpu(*d.gpu, hu), gout = to_gpu(*d.gpu, hout);
      TensorBuffer gdout = to_gpu(*d.gpu, hdout), gdg = to_gpu(*d.gpu, hdg), gdu = to_gpu(*d.gpu, hdu);
      const int64_t o = c.offset;

      swiglu_forward(*d.cpu, s, at(hout.data(), o, t), at(hg.data(), o, t), at(hu.data(), o, t));
      swiglu_forward(*d.gpu, s, at(gout.data(), o, t), at(gg.data(), o, t), at(gu.data(), o, t));
      EXPECT_TRUE(compare(what + ": out", host_f32(hout), to_host_f32(*d.gpu, gout), tol_for(t)));

      swiglu_backward(*d.cpu, s, at(hdg.data(), o, t), at(hdu.data(), o, t), at(hg.data(), o, t), at(hu.data(), o, t),
                      at(hdout.data(), o, t));
      swiglu_backward(*d.gpu, s, at(gdg.data(), o, t), at(gdu.data(), o, t), at(gg.data(), o, t), at(gu.data(), o, t),
                      at(gdout.data(), o, t));
      EXPECT_TRUE(compare(what + ": dgate", host_f32(hdg), to_host_f32(*d.gpu, gdg), tol_for(t)));
      EXPECT_TRUE(compare(what + ": dup", host_f32(hdu), to_host_f32(*d.gpu, gdu), tol_for(t)));
    }
}

// The fused gate_up buffer (rows, 2F): gate = buf, up = buf + F, in stride 2F. Forward writes
// out over gate (out stride 2F); backward writes dgate over gate and dup over up.
TEST(CudaOps, SwigluInPlaceOnTheFusedBufferMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  for (DType t : {DType::kF32, DType::kBF16})
    for (int64_t f : {512, 37}) {
      const int64_t rows = 13;
      const std::string what = "swiglu in place " + dt(t) + " F " + std::to_string(f);
      TensorBuffer hbuf = random_host(*d.cpu, t, {rows * 2 * f}, 51, 6.0f);
      TensorBuffer gbuf = to_gpu(*d.gpu, hbuf);
      const SwigluShape fwd{.rows = rows, .dim = f, .in_row_stride = 2 * f, .out_row_stride = 2 * f, .dtype = t};
      swiglu_forward(*d.cpu, fwd, hbuf.data(), hbuf.data(), at(hbuf.data(), f, t));
      swiglu_forward(*d.gpu, fwd, gbuf.data(), gbuf.data(), at(gbuf.data(), f, t));
      EXPECT_TRUE(compare(what + " forward", host_f32(hbuf), to_host_f32(*d.gpu, gbuf), tol_for(t)));

      TensorBuffer hb2 = random_host(*d.cpu, t, {rows * 2 * f}, 52, 6.0f);
      TensorBuffer gb2 = to_gpu(*d.gpu, hb2);
      TensorBuffer hdout = random_host(*d.cpu, t, {rows * f}, 53);
      TensorBuffer gdout = to_gpu(*d.gpu, hdout);
      const SwigluShape bwd{.rows = rows, .dim = f, .in_row_stride = 2 * f, .out_row_stride = 0, .dtype = t};
      swiglu_backward(*d.cpu, bwd, hb2.data(), at(hb2.data(), f, t), hb2.data(), at(hb2.data(), f, t), hdout.data());
      swiglu_backward(*d.gpu, bwd, gb2.data(), at(gb2.data(), f, t), gb2.data(), at(gb2.data(), f, t), gdout.data());
      EXPECT_TRUE(compare(what + " backward", host_f32(hb2), to_host_f32(*d.gpu, gb2), tol_for(t)));
    }
}

TEST(CudaOps, SwigluWithMoreRowsThanTheGridCovers) {
  REQUIRE_GPU();
  Devices d;
  // F = 1: 8 rows per block, 65535 blocks in y cover 524280 rows; the rest by the grid-stride loop.
  const int64_t rows = 600'000;
  const SwigluShape s{.rows = rows, .dim = 1};
  TensorBuffer hg = random_host(*d.cpu, DType::kF32, {rows}, 61, 6.0f);
  TensorBuffer hu = random_host(*d.cpu, DType::kF32, {rows}, 62);
  TensorBuffer hout = random_host(*d.cpu, DType::kF32, {rows}, 63);
  TensorBuffer gg = to_gpu(*d.gpu, hg), gu = to_gpu(*d.gpu, hu), gout = to_gpu(*d.gpu, hout);
  swiglu_forward(*d.cpu, s, hout.data(), hg.data(), hu.data());
  swiglu_forward(*d.gpu, s, gout.data(), gg.data(), gu.data());
  EXPECT_TRUE(compare("swiglu 600000 rows", host_f32(hout), to_host_f32(*d.gpu, gout), kF32Tol));
}

// ---- tensor ops ----------------------------------------------------------------------------

TEST(CudaOps, RowDotMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  struct Case {
    int64_t rows, dim, lda, ldb, out_stride, offset;
  };
  const Case cases[] = {
      {1000, 128, 128, 136, 1, 0},  // 16-byte path
      {333, 75, 77, 80, 3, 0},      // one element per step
      {50, 1024, 1024, 1032, 2, 0},
      {64, 64, 64, 64, 1, 1},       // unaligned
      {5, 0, 3, 3, 2, 0},           // empty rows: 0
      {1, 1, 1, 1, 1, 0},
  };
  for (DType t : {DType::kF32, DType::kBF16})
    for (const Case& c : cases) {
      const std::string what = "row_dot " + dt(t) + " rows " + std::to_string(c.rows) + " dim " +
                               std::to_string(c.dim) + " offset " + std::to_string(c.offset);
      TensorBuffer ha = random_host(*d.cpu, t, {c.offset + c.rows * c.lda + 1}, 71);
      TensorBuffer hb = random_host(*d.cpu, t, {c.offset + c.rows * c.ldb + 1}, 72);
      TensorBuffer hout = random_host(*d.cpu, DType::kF32, {(c.rows - 1) * c.out_stride + 1}, 73);
      TensorBuffer ga = to_gpu(*d.gpu, ha), gb = to_gpu(*d.gpu, hb), gout = to_gpu(*d.gpu, hout);
      row_dot(*d.cpu, c.rows, c.dim, t, at(ha.data(), c.offset, t), c.lda, at(hb.data(), c.offset, t), c.ldb,
              hout.as<float>(), c.out_stride);
      row_dot(*d.gpu, c.rows, c.dim, t, at(ga.data(), c.offset, t), c.lda, at(gb.data(), c.offset, t), c.ldb,
              gout.as<float>(), c.out_stride);
      // fp32 output either way: bf16 products are exact in fp32, only the summation order differs.
      EXPECT_TRUE(compare(what, host_f32(hout), to_host_f32(*d.gpu, gout), kF32Tol));
    }
}

TEST(CudaOps, AddIntoMatchesTheCpuExactly) {
  REQUIRE_GPU();
  Devices d;
  const int64_t n = 100'003;
  for (DType acc_t : {DType::kF32, DType::kBF16})
  for (DType t : {DType::kF32, DType::kBF16})
    for (int64_t off_acc : {0, 1})
      for (int64_t off_x : {0, 1}) {
        const std::string what = "add_into " + dt(acc_t) + " += " + dt(t) + " offsets " + std::to_string(off_acc) +
                                 "," + std::to_string(off_x);
        TensorBuffer hacc = random_host(*d.cpu, acc_t, {n + 1}, 81);
        TensorBuffer hx = random_host(*d.cpu, t, {n + 1}, 82, 3.0f);
        TensorBuffer gacc = to_gpu(*d.gpu, hacc), gx = to_gpu(*d.gpu, hx);
        add_into(*d.cpu, at(hacc.data(), off_acc, acc_t), acc_t, at(hx.data(), off_x, t), t, n);
        add_into(*d.gpu, at(gacc.data(), off_acc, acc_t), acc_t, at(gx.data(), off_x, t), t, n);
        EXPECT_TRUE(same_values(what, host_f32(hacc), to_host_f32(*d.gpu, gacc)));
      }
}

TEST(CudaOps, ConvertMatchesTheCpuExactly) {
  REQUIRE_GPU();
  Devices d;
  const int64_t n = 100'003;
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf,
                            FLT_MAX,  // rounds up to inf in bf16
                            1.0f + 1.0f / 256,  // halfway between two bf16 values: to even (1.0)
                            1.0f + 3.0f / 256,  // halfway: to even (1 + 4/256)
                            1e-40f, -1e-45f,    // subnormals
                            std::numeric_limits<float>::quiet_NaN()};
  for (DType src_t : {DType::kF32, DType::kBF16})
    for (DType dst_t : {DType::kF32, DType::kBF16})
      for (int64_t off : {0, 1}) {
        const std::string what = "convert " + dt(src_t) + " -> " + dt(dst_t) + " offset " + std::to_string(off);
        TensorBuffer hsrc = random_host(*d.cpu, src_t, {n + 1}, 91, 100.0f);
        if (src_t == DType::kF32) {
          std::memcpy(hsrc.as<float>() + off, specials, sizeof specials);
        } else {
          const uint16_t bits[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x8001, 0x7f7f, 0x7fc0};
          std::memcpy(hsrc.as<uint16_t>() + off, bits, sizeof bits);
        }
        TensorBuffer hdst = random_host(*d.cpu, dst_t, {n + 1}, 92);
        TensorBuffer gsrc = to_gpu(*d.gpu, hsrc), gdst = to_gpu(*d.gpu, hdst);
        convert(*d.cpu, at(hdst.data(), off, dst_t), dst_t, at(hsrc.data(), off, src_t), src_t, n);
        convert(*d.gpu, at(gdst.data(), off, dst_t), dst_t, at(gsrc.data(), off, src_t), src_t, n);
        EXPECT_TRUE(same_values(what, host_f32(hdst), to_host_f32(*d.gpu, gdst)));
      }
}

// ---- Device::copy_2d -----------------------------------------------------------------------

TEST(CudaOps, Copy2dMatchesTheCpu) {
  REQUIRE_GPU();
  Devices d;
  struct Case {
    int64_t rows, row_bytes, src_pitch, dst_pitch, src_off, dst_off;
  };
  const Case cases[] = {
      {37, 4, 12, 20, 0, 0},          // a row width of 4 bytes, pitches wider than the rows
      {9, 1000, 1024, 1536, 0, 0},
      {5, 4, 4, 4, 0, 0},             // contiguous
      {17, 7, 9, 8, 1, 3},            // odd widths, pitches and offsets
      {3, 4096, 8192, 4096, 0, 0},    // gather rows into a contiguous buffer
      {4, 0, 4, 4, 0, 0},             // nothing to copy
      {0, 16, 16, 16, 0, 0},
      {1, 64, 0, 0, 0, 0},            // one row: the pitches are not used
      {6, 16, 0, 24, 0, 0},           // one source row to every destination row (pitch 0 < row_bytes)
  };
  for (const Case& c : cases) {
    const std::string what = "copy_2d rows " + std::to_string(c.rows) + " row_bytes " + std::to_string(c.row_bytes) +
                             " pitches " + std::to_string(c.src_pitch) + "/" + std::to_string(c.dst_pitch);
    // Room for every row (a pitch may be shorter than a row), plus one byte that must survive.
    const auto span = [&](int64_t pitch) { return std::max(c.rows * pitch, (c.rows - 1) * pitch + c.row_bytes); };
    const int64_t src_bytes = c.src_off + span(c.src_pitch) + 1, dst_bytes = c.dst_off + span(c.dst_pitch) + 1;
    std::vector<unsigned char> src(static_cast<size_t>(src_bytes)), dst(static_cast<size_t>(dst_bytes));
    uint32_t state = 12345;
    for (auto& b : src) b = static_cast<unsigned char>((state = state * 1664525u + 1013904223u) >> 24);
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<unsigned char>(0xA5 ^ i);  // must survive in the gaps
    Buffer gsrc = d.gpu->allocator().allocate(src_bytes, Tag::kOther, "src");
    Buffer gdst = d.gpu->allocator().allocate(dst_bytes, Tag::kOther, "dst");
    d.gpu->copy(gsrc.data(), src.data(), src_bytes);
    d.gpu->copy(gdst.data(), dst.data(), dst_bytes);
    d.cpu->copy_2d(dst.data() + c.dst_off, c.dst_pitch, src.data() + c.src_off, c.src_pitch, c.row_bytes, c.rows);
    d.gpu->copy_2d(gdst.as<char>() + c.dst_off, c.dst_pitch, gsrc.as<char>() + c.src_off, c.src_pitch, c.row_bytes,
                   c.rows);
    d.gpu->synchronize();
    std::vector<unsigned char> back(static_cast<size_t>(dst_bytes));
    d.gpu->copy(back.data(), gdst.data(), dst_bytes);
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < back.size(); ++i)
      if (back[i] != dst[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " bytes differ, first at " << first;
  }
}

// ---- argument checks -----------------------------------------------------------------------

// Bad shapes are refused with untied::Error before any work is issued: the buffer handed in
// comes back unchanged.
TEST(CudaOps, BadArgumentsThrowAndWriteNothing) {
  REQUIRE_GPU();
  Devices d;
  TensorBuffer hbuf = random_host(*d.cpu, DType::kF32, {4096}, 101);
  TensorBuffer gbuf = to_gpu(*d.gpu, hbuf);
  void* p = gbuf.data();
  float* f = gbuf.as<float>();
  EXPECT_THROW(rope_forward(*d.gpu, RopeShape{.tokens = 4, .heads = 2, .head_dim = 7}, p, nullptr), Error);
  EXPECT_THROW(rope_forward(*d.gpu, RopeShape{.tokens = 4, .heads = 2, .head_dim = 4096}, p, nullptr), Error);
  EXPECT_THROW(rope_backward(*d.gpu, RopeShape{.tokens = 4, .heads = 2, .head_dim = 8, .row_stride = 15}, p, nullptr),
               Error);
  EXPECT_THROW(rmsnorm_forward(*d.gpu, RmsNormShape{.rows = 4, .dim = 8, .row_stride = 7}, p, f, p, p), Error);
  EXPECT_THROW(
      rmsnorm_backward(*d.gpu, RmsNormShape{.rows = 4, .dim = 8, .weight_dtype = DType::kF64}, p, f, p, f, p, p),
      Error);
  EXPECT_THROW(swiglu_forward(*d.gpu, SwigluShape{.rows = 4, .dim = 8, .dtype = DType::kF64}, p, p, p), Error);
  EXPECT_THROW(swiglu_backward(*d.gpu, SwigluShape{.rows = 4, .dim = 8, .in_row_stride = 4}, p, p, p, p, p), Error);
  EXPECT_THROW(row_dot(*d.gpu, 4, 8, DType::kF32, p, 7, p, 8, f, 1), Error);
  EXPECT_THROW(row_dot(*d.gpu, 4, 8, DType::kF32, p, 8, p, 8, f, 0), Error);
  EXPECT_THROW(add_into(*d.gpu, f, DType::kF32, p, DType::kI32, 8), Error);
  EXPECT_THROW(add_into(*d.gpu, p, DType::kF64, p, DType::kF32, 8), Error);
  EXPECT_THROW(convert(*d.gpu, p, DType::kF64, p, DType::kF32, 8), Error);
  EXPECT_THROW(convert(*d.gpu, p, DType::kF32, p, DType::kF32, -1), Error);
  EXPECT_TRUE(same_values("buffer after refused calls", host_f32(hbuf), to_host_f32(*d.gpu, gbuf)));
}

}  // namespace
}  // namespace untied
