// Flash attention (CPU) against the naive fp64 reference (reference.h).
//
// How the tolerances are derived (STYLE.md habit 8; the constants are in test_util.h):
//   * fp32 storage. The same naive formula run in fp32 tells how much error an honest fp32
//     computation of this very problem makes; call it the baseline. Forward:
//     ref::attention_forward<float>. Backward: ref::attention_backward_saved<float>, which,
//     like the kernel, starts from the saved fp32 lse and the stored out, so it pays what any
//     backward given those pays: exp(s - lse) with an fp32 lse carries an argument error of
//     ~eps |lse| (the recomputing form exp(s - max) does not; measured, it made the kernel
//     look up to 10x worse than the naive loop at scale 0.3). The kernel computes in fp32 too,
//     but blocked: tiled dot products, an online softmax that rescales its running sum once per
//     key tile, exp via exp2 of a pre-scaled score. Each costs about one extra fp32 rounding
//     per element, not a different error growth, so err(kernel) <= 4 x baseline + floor
//     (measured over 16 seeds: <= 2.3 x baseline). The floor, 2 FLT_EPSILON x the largest sum
//     of |terms| behind an element (out: P|v|; gradients: ref::attention_backward_magnitudes;
//     lse: |lse|), matters only where the baseline is ~0 by luck: with one visible key the
//     naive loop gets out = v and dq = 0 exactly, while the kernel's dP - rowsum(dO * O)
//     cancels two O(1) numbers summed in different orders.
//   * bf16 storage. Inputs are bf16 values and the reference runs in fp64 on exactly those
//     values. No kernel can beat rounding the exact result to bf16 once, so the baseline is the
//     larger of that rounding error and the naive fp32 error (the latter governs lse, which is
//     fp32 whatever the dtype, and dq/dk, whose rowsum(dO * O) reads the bf16-rounded out).
//     Same factor 4. On top, each bf16 output element must be within half a bf16 ulp plus the
//     fp32 budget of its exact value (expect_rounded_once): computed in fp32, rounded once.
//     Where the tile products run on bf16 kernels (AMX, or the AVX512-BF16 dot-product kernel),
//     P and dS are rounded to bf16 before their products
//     (as FlashAttention and the GPU kernels do): each element may then be off by 2^-8 (bf16's
//     unit roundoff) of the sum of |terms| behind it more (expect_rounded_once_after_bf16_operands), the most that
//     rounding one factor of every term to nearest can change a sum.
// A wrong formula (a missed GQA head, a mask off by one, a tile edge read twice) errs by
// O(magnitude), which is 10^4..10^6 times these tolerances.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/bf16_gemm.h"
#include "kernels/reference.h"
#include "kernels/test_util.h"
#include "untied/core/allocator.h"
#include "untied/core/check.h"
#include "untied/device/device.h"
#include "untied/kernels/attention.h"

namespace untied {
namespace {

using test::ErrorBudget;
using test::expect_close;
using test::make_budget;
using test::Stored;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct AttnCase {
  std::string name;
  int64_t seq_q, seq_k, heads, kv_heads, head_dim;
  bool causal = true;
  int64_t q_offset = 0, k_offset = 0;
  DType dtype = DType::kF32;
  int64_t block_q = 0, block_k = 0;  // 0 = kernel default
  int64_t q_pad = 0, kv_pad = 0;     // row stride = H*D + q_pad, G*D + kv_pad
  float scale = 0;                   // 0 = 1/sqrt(D)
  std::vector<int64_t> doc_starts = {};  // global positions; empty = one document
  int64_t window = 0;
};

std::ostream& operator<<(std::ostream& os, const AttnCase& c) { return os << c.name; }

// One attention problem: the kernel's shape, the reference's dims and storage-exact inputs.
struct Problem {
  AttentionShape shape;
  std::vector<int64_t> doc_starts;  // what shape.doc_starts points to
  ref::AttnDims dims;
  std::vector<double> q, k, v, dout;  // dense, each value exact in shape.dtype
  int64_t q_cols() const { return shape.heads * shape.head_dim; }
  int64_t kv_cols() const { return shape.kv_heads * shape.head_dim; }
  int64_t q_stride() const { return shape.q_row_stride ? shape.q_row_stride : q_cols(); }
  int64_t kv_stride() const { return shape.kv_row_stride ? shape.kv_row_stride : kv_cols(); }
  std::vector<int64_t> q_dims() const { return {shape.seq_q, shape.heads, shape.head_dim}; }
  std::vector<int64_t> kv_dims() const { return {shape.seq_k, shape.kv_heads, shape.head_dim}; }
  std::vector<int64_t> lse_dims() const { return {shape.heads, shape.seq_q}; }
};

Problem make_problem(const AttnCase& c, uint64_t seed) {
  Problem p;
  p.shape = AttentionShape{.seq_q = c.seq_q, .seq_k = c.seq_k, .heads = c.heads,
                           .kv_heads = c.kv_heads, .head_dim = c.head_dim,
                           .q_offset = c.q_offset, .k_offset = c.k_offset, .causal = c.causal,
                           .scale = c.scale,
                           .q_row_stride = c.q_pad ? c.heads * c.head_dim + c.q_pad : 0,
                           .kv_row_stride = c.kv_pad ? c.kv_heads * c.head_dim + c.kv_pad : 0,
                           .dtype = c.dtype, .block_q = c.block_q, .block_k = c.block_k};
  p.dims = ref::AttnDims{.seq_q = c.seq_q, .seq_k = c.seq_k, .heads = c.heads,
                         .kv_heads = c.kv_heads, .head_dim = c.head_dim,
                         .q_offset = c.q_offset, .k_offset = c.k_offset, .causal = c.causal,
                         .scale = static_cast<double>(c.scale),  // the fp32 scale, exactly
                         .doc_starts = c.doc_starts, .window = c.window};
  p.doc_starts = c.doc_starts;
  p.shape.window = c.window;
  if (!p.doc_starts.empty()) {
    p.shape.doc_starts = p.doc_starts.data();
    p.shape.num_docs = static_cast<int64_t>(p.doc_starts.size());
  }
  test::Rng rng(seed);
  p.q = test::random_values(rng, c.seq_q * c.heads * c.head_dim, c.dtype);
  p.k = test::random_values(rng, c.seq_k * c.kv_heads * c.head_dim, c.dtype);
  p.v = test::random_values(rng, c.seq_k * c.kv_heads * c.head_dim, c.dtype);
  p.dout = test::random_values(rng, c.seq_q * c.heads * c.head_dim, c.dtype);
  return p;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }
std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Whether query row i sees at least one key, and whether key j is seen by some row.
bool row_sees_any(const ref::AttnDims& d, int64_t i) {
  for (int64_t j = 0; j < d.seq_k; ++j)
    if (ref::attn_visible(d, i, j)) return true;
  return false;
}
bool key_seen_by_any(const ref::AttnDims& d, int64_t j) {
  for (int64_t i = 0; i < d.seq_q; ++i)
    if (ref::attn_visible(d, i, j)) return true;
  return false;
}

// Stored copies of the inputs in the kernel's layout (padding = NaN: never to be read).
struct Inputs {
  Stored q, k, v, dout;
  explicit Inputs(const Problem& p)
      : q(p.shape.dtype, p.shape.seq_q, p.q_cols(), p.q_stride(), Stored::Pad::kNaN),
        k(p.shape.dtype, p.shape.seq_k, p.kv_cols(), p.kv_stride(), Stored::Pad::kNaN),
        v(p.shape.dtype, p.shape.seq_k, p.kv_cols(), p.kv_stride(), Stored::Pad::kNaN),
        dout(p.shape.dtype, p.shape.seq_q, p.q_cols(), p.q_stride(), Stored::Pad::kNaN) {
    q.set(p.q);
    k.set(p.k);
    v.set(p.v);
    dout.set(p.dout);
  }
};

struct ForwardResult {
  std::vector<double> out, lse;
  int64_t out_padding_changed = 0;
};

ForwardResult run_forward(Device& dev, const Problem& p, const Inputs& in) {
  Stored out(p.shape.dtype, p.shape.seq_q, p.q_cols(), p.q_stride(), Stored::Pad::kSentinel);
  out.fill_view_nan();  // `=`: every element must be written
  std::vector<float> lse(static_cast<size_t>(p.shape.heads * p.shape.seq_q), kNaN);
  attention_forward(dev, p.shape,
                    {.out = out.data(), .lse = lse.data(), .q = in.q.data(), .k = in.k.data(), .v = in.v.data()});
  return {out.get(), to_double(lse), out.padding_changed()};
}

struct BackwardResult {
  std::vector<double> dq, dk, dv;
  int64_t padding_changed = 0;
};

BackwardResult run_backward(Device& dev, const Problem& p, const Inputs& in,
                            const std::vector<double>& out, const std::vector<double>& lse) {
  const DType t = p.shape.dtype;
  Stored out_s(t, p.shape.seq_q, p.q_cols(), p.q_stride(), Stored::Pad::kNaN);
  out_s.set(out);
  std::vector<float> lse_f = to_float(lse);
  Stored dq(t, p.shape.seq_q, p.q_cols(), p.q_stride(), Stored::Pad::kSentinel);
  Stored dk(t, p.shape.seq_k, p.kv_cols(), p.kv_stride(), Stored::Pad::kSentinel);
  Stored dv(t, p.shape.seq_k, p.kv_cols(), p.kv_stride(), Stored::Pad::kSentinel);
  dq.fill_view_nan();  // `=` (overwritten, not accumulated): NaN must not survive
  dk.fill_view_nan();
  dv.fill_view_nan();
  attention_backward(dev, p.shape,
                     {.dq = dq.data(), .dk = dk.data(), .dv = dv.data(), .q = in.q.data(), .k = in.k.data(),
                      .v = in.v.data(), .out = out_s.data(), .lse = lse_f.data(), .dout = in.dout.data()});
  return {dq.get(), dk.get(), dv.get(),
          dq.padding_changed() + dk.padding_changed() + dv.padding_changed()};
}

std::unique_ptr<Device> cpu() { return make_cpu_device(CpuDeviceOptions{.threads = 2}); }

// Whether the kernel rounds P and dS to bf16 for their products on bf16 storage (on AMX, and on
// the dot-product kernel where its packs fit the tiles; where they do not, the fp32 products
// meet the stricter bound too).
bool p_rounded_to_bf16() { return cpu::bf16_tile_products_on_amx() || cpu::bf16_tile_products_available(); }

// The fp64 reference gradients and the error budget of each (see the top of the file), for a
// backward call that is given `out` and `lse` (the values exactly as the kernel receives them).
struct GradReference {
  std::vector<double> dq, dk, dv;
  std::vector<double> dq_mag, dk_mag, dv_mag;  // sums of |terms| (ref::attention_backward_magnitudes)
  ErrorBudget dq_budget, dk_budget, dv_budget;  // for the storage type
  ErrorBudget dq_f32, dk_f32, dv_f32;           // of the fp32 computation alone
};

GradReference grad_reference(const Problem& p, const std::vector<double>& out,
                             const std::vector<double>& lse) {
  GradReference r;
  ref::attention_backward<double>(p.dims, p.q, p.k, p.v, p.dout, r.dq, r.dk, r.dv);
  // fp32 baseline: the naive backward from the same saved state the kernel consumes.
  std::vector<float> dq32, dk32, dv32;
  ref::attention_backward_saved<float>(p.dims, to_float(p.q), to_float(p.k), to_float(p.v),
                                       to_float(out), to_float(lse), to_float(p.dout), dq32,
                                       dk32, dv32);
  std::vector<double>&dq_mag = r.dq_mag, &dk_mag = r.dk_mag, &dv_mag = r.dv_mag;
  ref::attention_backward_magnitudes(p.dims, p.q, p.k, p.v, p.dout, dq_mag, dk_mag, dv_mag);
  const DType t = p.shape.dtype;
  r.dq_budget = make_budget(r.dq, to_double(dq32), t, test::max_abs(dq_mag));
  r.dk_budget = make_budget(r.dk, to_double(dk32), t, test::max_abs(dk_mag));
  r.dv_budget = make_budget(r.dv, to_double(dv32), t, test::max_abs(dv_mag));
  r.dq_f32 = make_budget(r.dq, to_double(dq32), DType::kF32, test::max_abs(dq_mag));
  r.dk_f32 = make_budget(r.dk, to_double(dk32), DType::kF32, test::max_abs(dk_mag));
  r.dv_f32 = make_budget(r.dv, to_double(dv32), DType::kF32, test::max_abs(dv_mag));
  return r;
}

// ---- the cases ----------------------------------------------------------------------------

std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cs;
  // GQA ratio g = H/G in {1, 2, 4, 8} x D in {64, 128} x causal/non-causal; S = 100 is not a
  // multiple of any block; D = 64 forces small tiles (many partial ones), D = 128 the default.
  for (int64_t g : {1, 2, 4, 8})
    for (int64_t d : {64, 128})
      for (bool causal : {true, false}) {
        AttnCase c{.name = "g" + std::to_string(g) + "_d" + std::to_string(d) +
                           (causal ? "_causal" : "_full"),
                   .seq_q = 100, .seq_k = 100, .heads = 8, .kv_heads = 8 / g, .head_dim = d,
                   .causal = causal};
        if (d == 64) { c.block_q = 32; c.block_k = 16; }
        cs.push_back(c);
      }
  // Sequence lengths that are not multiples of the block size, default and tiny blocks.
  for (int64_t s : {1, 7, 100, 129, 300})
    for (bool causal : {true, false})
      for (bool small_blocks : {false, true}) {
        if (s == 1 && small_blocks) continue;
        AttnCase c{.name = "s" + std::to_string(s) + (causal ? "_causal" : "_full") +
                           (small_blocks ? "_b16x32" : ""),
                   .seq_q = s, .seq_k = s, .heads = 4, .kv_heads = 2, .head_dim = 64,
                   .causal = causal};
        if (small_blocks) { c.block_q = 16; c.block_k = 32; }
        cs.push_back(c);
      }
  // Ring-attention style blocks: seq_q != seq_k with global offsets.
  //   queries at 100..149, keys at 120..183: rows 0..19 see no key (out 0, lse -inf, dq 0),
  //   keys 30..63 are seen by no query (dk = dv = 0).
  cs.push_back({.name = "ring_partial_empty", .seq_q = 50, .seq_k = 64, .heads = 4,
                .kv_heads = 1, .head_dim = 64, .causal = true, .q_offset = 100,
                .k_offset = 120, .block_q = 16, .block_k = 32});
  cs.push_back({.name = "ring_partial_empty_default_blocks", .seq_q = 150, .seq_k = 140,
                .heads = 2, .kv_heads = 2, .head_dim = 128, .causal = true, .q_offset = 1000,
                .k_offset = 1060});
  //   a query block after its key block: every key visible.
  cs.push_back({.name = "ring_q_after_k", .seq_q = 70, .seq_k = 45, .heads = 4, .kv_heads = 2,
                .head_dim = 128, .causal = true, .q_offset = 300, .k_offset = 100,
                .block_q = 16, .block_k = 16});
  //   the diagonal block of a longer sequence.
  cs.push_back({.name = "ring_diagonal", .seq_q = 90, .seq_k = 90, .heads = 4, .kv_heads = 2,
                .head_dim = 64, .causal = true, .q_offset = 500, .k_offset = 500,
                .block_q = 32, .block_k = 16});
  //   a query block before its key block: no row sees any key.
  cs.push_back({.name = "ring_all_empty", .seq_q = 20, .seq_k = 30, .heads = 4, .kv_heads = 2,
                .head_dim = 64, .causal = true, .q_offset = 0, .k_offset = 40});
  //   the last queries of a sequence against all of its keys (bottom-right aligned).
  cs.push_back({.name = "tail_queries", .seq_q = 37, .seq_k = 200, .heads = 4, .kv_heads = 1,
                .head_dim = 64, .causal = true, .q_offset = 163, .k_offset = 0,
                .block_q = 16, .block_k = 32});
  cs.push_back({.name = "rect_full", .seq_q = 33, .seq_k = 150, .heads = 4, .kv_heads = 2,
                .head_dim = 64, .causal = false, .q_offset = 7, .k_offset = 900});
  // Row strides wider than the rows: views into a wider (e.g. fused QKV) buffer; odd padding
  // so that no alignment is implied.
  cs.push_back({.name = "strided", .seq_q = 100, .seq_k = 100, .heads = 4, .kv_heads = 2,
                .head_dim = 64, .causal = true, .block_q = 16, .block_k = 32, .q_pad = 37,
                .kv_pad = 5});
  cs.push_back({.name = "strided_fused_qkv", .seq_q = 129, .seq_k = 129, .heads = 4,
                .kv_heads = 1, .head_dim = 128, .causal = false, .q_pad = 2 * 128,
                .kv_pad = 4 * 128 + 128});
  cs.push_back({.name = "explicit_scale", .seq_q = 60, .seq_k = 80, .heads = 2, .kv_heads = 1,
                .head_dim = 64, .causal = true, .q_offset = 20, .k_offset = 0, .scale = 0.3f});
  // bf16 storage.
  cs.push_back({.name = "bf16_g4_d128", .seq_q = 129, .seq_k = 129, .heads = 8, .kv_heads = 2,
                .head_dim = 128, .causal = true, .dtype = DType::kBF16, .block_q = 16,
                .block_k = 32});
  cs.push_back({.name = "bf16_g1_d64_full", .seq_q = 100, .seq_k = 100, .heads = 4,
                .kv_heads = 4, .head_dim = 64, .causal = false, .dtype = DType::kBF16});
  cs.push_back({.name = "bf16_g8_s300", .seq_q = 300, .seq_k = 300, .heads = 8, .kv_heads = 1,
                .head_dim = 64, .causal = true, .dtype = DType::kBF16});
  //   long enough for the 256 x 256 default tiles of the AMX path, and not a multiple of them
  cs.push_back({.name = "bf16_s2100", .seq_q = 2100, .seq_k = 2100, .heads = 2, .kv_heads = 1,
                .head_dim = 128, .causal = true, .dtype = DType::kBF16});
  cs.push_back({.name = "bf16_ring_partial_empty", .seq_q = 50, .seq_k = 64, .heads = 4,
                .kv_heads = 2, .head_dim = 64, .causal = true, .q_offset = 100,
                .k_offset = 120, .dtype = DType::kBF16, .block_q = 16, .block_k = 32});
  cs.push_back({.name = "bf16_strided", .seq_q = 77, .seq_k = 77, .heads = 8, .kv_heads = 1,
                .head_dim = 64, .causal = true, .dtype = DType::kBF16, .block_q = 16,
                .block_k = 16, .q_pad = 3, .kv_pad = 67});
  // Packed documents and sliding windows (global positions; tiles the mask removes are skipped).
  //   boundaries inside and at tile edges, a one-token document (37), default blocks and small ones.
  for (bool small_blocks : {false, true}) {
    AttnCase c{.name = std::string("docs_mixed") + (small_blocks ? "_b16x32" : ""), .seq_q = 300, .seq_k = 300,
               .heads = 4, .kv_heads = 2, .head_dim = 64, .causal = true,
               .doc_starts = {0, 32, 37, 38, 150, 256, 299}};
    if (small_blocks) { c.block_q = 16; c.block_k = 32; }
    cs.push_back(c);
  }
  //   many tiny documents (every 3 tokens), G = 1.
  {
    AttnCase c{.name = "docs_tiny", .seq_q = 130, .seq_k = 130, .heads = 8, .kv_heads = 1, .head_dim = 64,
               .causal = true, .block_q = 16, .block_k = 16};
    for (int64_t s = 0; s < 130; s += 3) c.doc_starts.push_back(s);
    cs.push_back(c);
  }
  //   a window alone, and with documents (bf16 too).
  cs.push_back({.name = "window17", .seq_q = 200, .seq_k = 200, .heads = 4, .kv_heads = 2, .head_dim = 64,
                .causal = true, .block_q = 16, .block_k = 32, .window = 17});
  cs.push_back({.name = "window1", .seq_q = 40, .seq_k = 40, .heads = 2, .kv_heads = 1, .head_dim = 64,
                .causal = true, .window = 1});
  cs.push_back({.name = "docs_window_bf16", .seq_q = 257, .seq_k = 257, .heads = 8, .kv_heads = 2,
                .head_dim = 128, .causal = true, .dtype = DType::kBF16, .doc_starts = {0, 100, 101, 200},
                .window = 40});
  //   ring blocks: queries 128..191 against keys 0..63 and 100..163 of documents starting at 50
  //   and 150 (rows that see nothing in the block; keys seen by nobody).
  cs.push_back({.name = "docs_ring_block", .seq_q = 64, .seq_k = 64, .heads = 4, .kv_heads = 2, .head_dim = 64,
                .causal = true, .q_offset = 128, .k_offset = 100, .block_q = 16, .block_k = 16,
                .doc_starts = {0, 50, 150}});
  cs.push_back({.name = "docs_ring_block_unseen", .seq_q = 64, .seq_k = 64, .heads = 4, .kv_heads = 2,
                .head_dim = 64, .causal = true, .q_offset = 128, .k_offset = 0, .block_q = 16, .block_k = 16,
                .doc_starts = {0, 50, 150}, .window = 100});
  return cs;
}

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, ForwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 1234);
  const Inputs in(p);
  auto dev = cpu();
  const ForwardResult got = run_forward(*dev, p, in);

  std::vector<double> out64, lse64;
  ref::attention_forward<double>(p.dims, p.q, p.k, p.v, out64, lse64);
  std::vector<float> out32, lse32;
  ref::attention_forward<float>(p.dims, to_float(p.q), to_float(p.k), to_float(p.v), out32, lse32);
  std::vector<double> abs_v = p.v, out_mag, unused;
  for (double& x : abs_v) x = std::fabs(x);
  ref::attention_forward<double>(p.dims, p.q, p.k, abs_v, out_mag, unused);  // sum_j P_ij |v_j|

  EXPECT_TRUE(expect_close("out", got.out, out64,
                           make_budget(out64, to_double(out32), p.shape.dtype,
                                       test::max_abs(out_mag)),
                           p.q_dims()));
  if (p.shape.dtype == DType::kBF16) {
    const ErrorBudget f32 = make_budget(out64, to_double(out32), DType::kF32, test::max_abs(out_mag));
    if (p_rounded_to_bf16())
      EXPECT_TRUE(test::expect_rounded_once_after_bf16_operands("out", got.out, out64, f32, out_mag, p.q_dims()));
    else
      EXPECT_TRUE(test::expect_rounded_once("out", got.out, out64, f32, p.q_dims()));
  }
  EXPECT_TRUE(expect_close("lse", got.lse, lse64,
                           make_budget(lse64, to_double(lse32), DType::kF32), p.lse_dims()));
  EXPECT_EQ(got.out_padding_changed, 0) << "forward wrote into the padding of out's rows";

  // A row that sees no key: out exactly 0, lse exactly -inf (the contract, not a tolerance).
  const int64_t hd = p.q_cols();
  int64_t empty_rows = 0, violations = 0;
  for (int64_t i = 0; i < p.shape.seq_q; ++i) {
    if (row_sees_any(p.dims, i)) continue;
    ++empty_rows;
    for (int64_t e = 0; e < hd; ++e) violations += got.out[i * hd + e] != 0.0;
    for (int64_t h = 0; h < p.shape.heads; ++h) {
      const double l = got.lse[h * p.shape.seq_q + i];
      violations += !(std::isinf(l) && l < 0);
    }
  }
  EXPECT_EQ(violations, 0) << "of " << empty_rows << " rows with no visible key";
}

TEST_P(AttentionTest, BackwardMatchesReference) {
  const Problem p = make_problem(GetParam(), 5678);
  const Inputs in(p);
  auto dev = cpu();

  // Saved forward state from the reference (so backward is tested on its own): out rounded to
  // the storage type as the forward would store it, lse rounded to fp32.
  std::vector<double> out64, lse64;
  ref::attention_forward<double>(p.dims, p.q, p.k, p.v, out64, lse64);
  const std::vector<double> out_saved = test::stored_as(out64, p.shape.dtype);
  const std::vector<double> lse_saved = test::stored_as(lse64, DType::kF32);
  const BackwardResult got = run_backward(*dev, p, in, out_saved, lse_saved);

  const GradReference r = grad_reference(p, out_saved, lse_saved);
  EXPECT_TRUE(expect_close("dq", got.dq, r.dq, r.dq_budget, p.q_dims()));
  EXPECT_TRUE(expect_close("dk", got.dk, r.dk, r.dk_budget, p.kv_dims()));
  EXPECT_TRUE(expect_close("dv", got.dv, r.dv, r.dv_budget, p.kv_dims()));
  if (p.shape.dtype == DType::kBF16 && p_rounded_to_bf16()) {
    EXPECT_TRUE(test::expect_rounded_once_after_bf16_operands("dq", got.dq, r.dq, r.dq_f32, r.dq_mag, p.q_dims()));
    EXPECT_TRUE(test::expect_rounded_once_after_bf16_operands("dk", got.dk, r.dk, r.dk_f32, r.dk_mag, p.kv_dims()));
    EXPECT_TRUE(test::expect_rounded_once_after_bf16_operands("dv", got.dv, r.dv, r.dv_f32, r.dv_mag, p.kv_dims()));
  } else if (p.shape.dtype == DType::kBF16) {
    EXPECT_TRUE(test::expect_rounded_once("dq", got.dq, r.dq, r.dq_f32, p.q_dims()));
    EXPECT_TRUE(test::expect_rounded_once("dk", got.dk, r.dk, r.dk_f32, p.kv_dims()));
    EXPECT_TRUE(test::expect_rounded_once("dv", got.dv, r.dv, r.dv_f32, p.kv_dims()));
  }
  EXPECT_EQ(got.padding_changed, 0) << "backward wrote into the padding of dq/dk/dv rows";

  // Rows that see no key have dq exactly 0; keys seen by no row have dk = dv = 0 exactly.
  int64_t violations = 0;
  for (int64_t i = 0; i < p.shape.seq_q; ++i)
    if (!row_sees_any(p.dims, i))
      for (int64_t e = 0; e < p.q_cols(); ++e) violations += got.dq[i * p.q_cols() + e] != 0.0;
  for (int64_t j = 0; j < p.shape.seq_k; ++j)
    if (!key_seen_by_any(p.dims, j))
      for (int64_t e = 0; e < p.kv_cols(); ++e)
        violations += got.dk[j * p.kv_cols() + e] != 0.0 || got.dv[j * p.kv_cols() + e] != 0.0;
  EXPECT_EQ(violations, 0) << "nonzero gradients for rows/keys outside every causal pair";
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionTest, ::testing::ValuesIn(attention_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- the reference backward, validated on its own --------------------------------------------

// L(q, k, v) = sum(dout * out(q, k, v)) with the fp64 reference forward.
double ref_loss(const ref::AttnDims& d, const std::vector<double>& q, const std::vector<double>& k,
                const std::vector<double>& v, const std::vector<double>& dout) {
  std::vector<double> out, lse;
  ref::attention_forward<double>(d, q, k, v, out, lse);
  double l = 0;
  for (size_t i = 0; i < out.size(); ++i) l += dout[i] * out[i];
  return l;
}

// Central differences of the fp64 reference forward, element by element, against the fp64
// reference backward, on problems small enough to visit every element.
// Tolerance: with h = 1e-5 the truncation error is h^2/6 |d3L| ~ 2e-11 |d3L| (third
// derivatives are O(1..10) for O(1) inputs); the rounding error is ~DBL_EPSILON * sum|terms of L|
// / (2h) ~ 2e-16 * 200 / 2e-5 ~ 2e-9. 1e-7 x max(1, max|grad|) is 50x above both, while a wrong
// gradient formula is off by O(0.1..1).
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  const std::vector<AttnCase> tiny = {
      // row 0 (position 0) sees no key; keys at positions 5, 6 are seen by no row; GQA g = 2.
      {.name = "causal_offsets", .seq_q = 5, .seq_k = 6, .heads = 4, .kv_heads = 2,
       .head_dim = 8, .causal = true, .q_offset = 0, .k_offset = 1},
      {.name = "full_rect_scale", .seq_q = 3, .seq_k = 7, .heads = 2, .kv_heads = 1,
       .head_dim = 6, .causal = false, .scale = 0.7f},
  };
  for (const AttnCase& c : tiny) {
    SCOPED_TRACE(c.name);
    Problem p = make_problem(c, 42);
    std::vector<double> dq, dk, dv;
    ref::attention_backward<double>(p.dims, p.q, p.k, p.v, p.dout, dq, dk, dv);
    const double h = 1e-5;
    auto fd = [&](std::vector<double>& x, size_t i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = ref_loss(p.dims, p.q, p.k, p.v, p.dout);
      x[i] = x0 - h;
      const double lm = ref_loss(p.dims, p.q, p.k, p.v, p.dout);
      x[i] = x0;
      return (lp - lm) / (2 * h);
    };
    auto check = [&](const char* name, std::vector<double>& x, const std::vector<double>& g,
                     const std::vector<int64_t>& dims) {
      std::vector<double> num(x.size());
      for (size_t i = 0; i < x.size(); ++i) num[i] = fd(x, i);
      ErrorBudget b{.baseline = 0, .floor = 1e-7 * std::max(1.0, test::max_abs(g))};
      EXPECT_TRUE(expect_close(std::string("ref ") + name + " vs finite diff", g, num, b, dims));
    };
    check("dq", p.q, dq, p.q_dims());
    check("dk", p.k, dk, p.kv_dims());
    check("dv", p.v, dv, p.kv_dims());

    // The from-saved-state form (the fp32 baseline's formula) is the same function: in fp64 it
    // agrees with the recomputing form to rounding (1e-12 x max(1, max|grad|): both are
    // O(100)-term double sums of O(1) values, ~1e-14 apart).
    std::vector<double> out, lse, dq_s, dk_s, dv_s;
    ref::attention_forward<double>(p.dims, p.q, p.k, p.v, out, lse);
    ref::attention_backward_saved<double>(p.dims, p.q, p.k, p.v, out, lse, p.dout, dq_s, dk_s,
                                          dv_s);
    auto same = [](const std::vector<double>& g) {
      return ErrorBudget{.baseline = 0, .floor = 1e-12 * std::max(1.0, test::max_abs(g))};
    };
    EXPECT_TRUE(expect_close("ref saved dq vs recompute", dq_s, dq, same(dq), p.q_dims()));
    EXPECT_TRUE(expect_close("ref saved dk vs recompute", dk_s, dk, same(dk), p.kv_dims()));
    EXPECT_TRUE(expect_close("ref saved dv vs recompute", dv_s, dv, same(dv), p.kv_dims()));
  }
}

// ---- the kernel's gradients against the forward, through a directional derivative ---------

// The kernel's forward then backward (as training uses them) give g = (dq, dk, dv). For a random
// direction t, <g, t> must equal the directional derivative of L = sum(dout * out) computed by
// central differences of the fp64 reference FORWARD, so this check does not depend on the
// reference backward at all.
// Tolerance, each term derived:
//   * truncation of the central difference at step h is c h^2; fd(2h) - fd(h) = 3 c h^2, so
//     |fd(2h) - fd(h)| bounds it with a 3x margin;
//   * rounding in L: 64 DBL_EPSILON sum|dout * out| / h (64: generous for the sums involved);
//   * the kernel's own gradient error e = g - g_exact: each element is within its tolerance
//     tol_T from the elementwise test (same budgets, measured here). t is drawn independently
//     of those rounding errors, so <e, t> is a sum of independent zero-mean terms with standard
//     deviation ||e||_2 <= sqrt(sum_T n_T tol_T^2); allow 6 standard deviations (a fixed seed,
//     so no flakiness either way). A wrong gradient block of n elements of size ~1 shifts
//     <g, t> by ~sqrt(n), orders above this.
TEST(AttentionKernel, GradientsMatchDirectionalDerivative) {
  const std::vector<AttnCase> cases = {
      {.name = "f32_ring_gqa", .seq_q = 40, .seq_k = 48, .heads = 4, .kv_heads = 2,
       .head_dim = 64, .causal = true, .q_offset = 20, .k_offset = 25, .block_q = 16,
       .block_k = 16},
      {.name = "f32_full_g4", .seq_q = 33, .seq_k = 50, .heads = 4, .kv_heads = 1,
       .head_dim = 128, .causal = false},
      {.name = "bf16_causal_g2", .seq_q = 45, .seq_k = 45, .heads = 4, .kv_heads = 2,
       .head_dim = 64, .causal = true, .dtype = DType::kBF16, .block_q = 16, .block_k = 32},
  };
  auto dev = cpu();
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Problem p = make_problem(c, 99);
    const Inputs in(p);
    const ForwardResult fwd = run_forward(*dev, p, in);
    const BackwardResult g = run_backward(*dev, p, in, fwd.out, fwd.lse);

    // Element budgets, as in BackwardMatchesReference (only the budgets are used here).
    const GradReference r = grad_reference(p, fwd.out, fwd.lse);
    const double tol_q = r.dq_budget.tol(), tol_k = r.dk_budget.tol(), tol_v = r.dv_budget.tol();

    test::Rng rng(7);
    std::normal_distribution<double> nd;
    auto direction = [&](size_t n) {
      std::vector<double> x(n);
      for (auto& e : x) e = nd(rng);
      return x;
    };
    const std::vector<double> tq = direction(p.q.size()), tk = direction(p.k.size()),
                              tv = direction(p.v.size());
    auto loss_at = [&](double eps) {
      auto shift = [eps](const std::vector<double>& x, const std::vector<double>& dir) {
        std::vector<double> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] + eps * dir[i];
        return y;
      };
      return ref_loss(p.dims, shift(p.q, tq), shift(p.k, tk), shift(p.v, tv), p.dout);
    };
    const double h = 1e-3;
    const double fd_h = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double fd_2h = (loss_at(2 * h) - loss_at(-2 * h)) / (4 * h);

    auto dot = [](const std::vector<double>& a, const std::vector<double>& b) {
      double s = 0;
      for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
      return s;
    };
    std::vector<double> out64, lse64;
    ref::attention_forward<double>(p.dims, p.q, p.k, p.v, out64, lse64);
    double loss_terms = 0;
    for (size_t i = 0; i < out64.size(); ++i) loss_terms += std::fabs(p.dout[i] * out64[i]);

    const double analytic = dot(g.dq, tq) + dot(g.dk, tk) + dot(g.dv, tv);
    const double kernel_sigma = std::sqrt(tq.size() * tol_q * tol_q +
                                          tk.size() * tol_k * tol_k + tv.size() * tol_v * tol_v);
    const double allowed =
        std::fabs(fd_2h - fd_h) + 64 * DBL_EPSILON * loss_terms / h + 6 * kernel_sigma;
    std::printf("[   err    ] directional %-16s |<g,t> - fd| %.3e  allowed %.3e  (fd %.6e)\n",
                c.name.c_str(), std::fabs(analytic - fd_h), allowed, fd_h);
    EXPECT_LE(std::fabs(analytic - fd_h), allowed)
        << "<g,t> = " << analytic << ", central difference = " << fd_h << " (2h: " << fd_2h << ")";
  }
}

// ---- workspace ----------------------------------------------------------------------------

struct WorkspacePeaks {
  int64_t forward = 0, backward = 0;
};

// Forward then backward at sequence length s (causal, H = 2, G = 1, D = 64; values all zero:
// the workspace does not depend on them). Returns the kAttnWorkspace peak of each call,
// measured from reset_peaks() just before it.
WorkspacePeaks measure_workspace(Device& dev, int64_t s, DType dtype) {
  const AttentionShape shape{.seq_q = s, .seq_k = s, .heads = 2, .kv_heads = 1, .head_dim = 64,
                             .causal = true, .dtype = dtype};
  const Stored::Pad pad = Stored::Pad::kSentinel;
  Stored q(dtype, s, 2 * 64, 2 * 64, pad), out(dtype, s, 2 * 64, 2 * 64, pad),
      dout(dtype, s, 2 * 64, 2 * 64, pad), dq(dtype, s, 2 * 64, 2 * 64, pad);
  Stored k(dtype, s, 64, 64, pad), v(dtype, s, 64, 64, pad), dk(dtype, s, 64, 64, pad),
      dv(dtype, s, 64, 64, pad);
  std::vector<float> lse(static_cast<size_t>(2 * s));
  const int tag = static_cast<int>(Tag::kAttnWorkspace);
  WorkspacePeaks w;
  dev.allocator().reset_peaks();
  attention_forward(dev, shape, {.out = out.data(), .lse = lse.data(), .q = q.data(), .k = k.data(), .v = v.data()});
  w.forward = dev.allocator().stats().peak[tag];
  dev.allocator().reset_peaks();
  attention_backward(dev, shape,
                     {.dq = dq.data(), .dk = dk.data(), .dv = dv.data(), .q = q.data(), .k = k.data(), .v = v.data(),
                      .out = out.data(), .lse = lse.data(), .dout = dout.data()});
  w.backward = dev.allocator().stats().peak[tag];
  EXPECT_EQ(dev.allocator().stats().live[tag], 0) << "workspace still live after backward";
  return w;
}

std::unique_ptr<Device> rehearsal() {
  return make_cpu_device(CpuDeviceOptions{.threads = 2, .rehearsal = true});
}

// A rehearsal (counting) device sees exactly the allocations of a real run: the kernels
// allocate their whole workspace up front and only then skip compute. This is what lets the
// scaling tests below run at S = 16384 in no time, and what the memory planner relies on.
TEST(AttentionWorkspace, RehearsalCountsWhatARealRunAllocates) {
  for (DType t : {DType::kF32, DType::kBF16})
    for (int64_t s : {1000, 2048}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " S " + std::to_string(s));
      auto real = cpu();
      auto counted = rehearsal();
      const WorkspacePeaks a = measure_workspace(*real, s, t);
      const WorkspacePeaks b = measure_workspace(*counted, s, t);
      EXPECT_GT(a.backward, 0) << "backward allocated no workspace through the allocator";
      EXPECT_EQ(a.forward, b.forward);
      EXPECT_EQ(a.backward, b.backward);
    }
}

// Backward's workspace is linear in S (dQ accumulator and D_i), never quadratic: doubling S
// must less than double the peak (the constant per-thread tiles make it strictly less).
// Forward's workspace is per-thread tiles only: doubling S may not grow it beyond a small slack
// (64 KiB; any (H, S) fp32 buffer at S = 16384 is already 128 KiB).
TEST(AttentionWorkspace, BackwardLinearForwardConstantInS) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto dev = rehearsal();
    const WorkspacePeaks a = measure_workspace(*dev, 8192, t);
    const WorkspacePeaks b = measure_workspace(*dev, 16384, t);
    std::printf("[  bytes   ] %s attn workspace peak, S 8192 -> 16384: forward %lld -> %lld, "
                "backward %lld -> %lld\n",
                std::string(dtype_name(t)).c_str(), static_cast<long long>(a.forward),
                static_cast<long long>(b.forward), static_cast<long long>(a.backward),
                static_cast<long long>(b.backward));
    EXPECT_LT(b.backward, 2 * a.backward)
        << "backward workspace: S=8192 " << a.backward << " B, S=16384 " << b.backward << " B";
    EXPECT_LE(b.forward, a.forward + (64 << 10))
        << "forward workspace: S=8192 " << a.forward << " B, S=16384 " << b.forward << " B";
  }
}

// attention.h documents the S-dependent part of backward's workspace: D_i (H, S) fp32, plus one
// fp32 dQ accumulator (S, H, D) when dq is bf16. Doubling S from S0 may therefore add at most
// 4 * S0 * H * (1 + (bf16 ? D : 0)) bytes (+ 64 KiB slack for rounding). A planner sizing
// memory from the header depends on this; more (e.g. one accumulator per thread) must be
// documented there, with its thread count, or removed.
TEST(AttentionWorkspace, BackwardGrowthMatchesTheHeader) {
  const int64_t s0 = 8192, h = 2, d = 64;
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto dev = rehearsal();
    const WorkspacePeaks a = measure_workspace(*dev, s0, t);
    const WorkspacePeaks b = measure_workspace(*dev, 2 * s0, t);
    // D_i (H, S) plus the fp32 dQ accumulators: T - 1 for f32 dq, T for bf16 (attention.h).
    const int64_t accs = dev->threads() - 1 + (t == DType::kBF16 ? 1 : 0);
    const int64_t documented = 4 * s0 * h * (1 + accs * d);
    EXPECT_LE(b.backward - a.backward, documented + (64 << 10))
        << "backward workspace grew by " << (b.backward - a.backward) << " B from S=" << s0
        << " to S=" << 2 * s0 << " (" << dev->threads() << " threads); attention.h documents "
        << documented << " B (D_i + " << accs << " fp32 dQ accumulators)";
  }
}

// ---- bad input ----------------------------------------------------------------------------

AttentionShape good_shape() {
  return AttentionShape{.seq_q = 8, .seq_k = 8, .heads = 4, .kv_heads = 2, .head_dim = 64};
}

// Expects validate(s) to throw Error(kInvalidArgument) whose message names `field`.
void expect_invalid(const AttentionShape& s, const std::string& field) {
  SCOPED_TRACE("field " + field);
  try {
    validate(s);
    ADD_FAILURE() << "validate accepted a shape with a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message does not name `" << field << "`: " << e.what();
  }
}

TEST(AttentionValidate, AcceptsAGoodShape) { EXPECT_NO_THROW(validate(good_shape())); }

TEST(AttentionValidate, RejectsBadShapesNamingTheField) {
  auto with = [](auto edit) {
    AttentionShape s = good_shape();
    edit(s);
    return s;
  };
  expect_invalid(with([](AttentionShape& s) { s.heads = 6; s.kv_heads = 4; }), "heads");
  expect_invalid(with([](AttentionShape& s) { s.seq_q = 0; }), "seq_q");
  expect_invalid(with([](AttentionShape& s) { s.seq_q = -3; }), "seq_q");
  expect_invalid(with([](AttentionShape& s) { s.seq_k = 0; }), "seq_k");
  expect_invalid(with([](AttentionShape& s) { s.seq_k = -1; }), "seq_k");
  expect_invalid(with([](AttentionShape& s) { s.heads = 0; }), "heads");
  expect_invalid(with([](AttentionShape& s) { s.heads = -4; }), "heads");
  expect_invalid(with([](AttentionShape& s) { s.kv_heads = 0; }), "kv_heads");
  expect_invalid(with([](AttentionShape& s) { s.kv_heads = -2; }), "kv_heads");
  expect_invalid(with([](AttentionShape& s) { s.head_dim = 0; }), "head_dim");
  expect_invalid(with([](AttentionShape& s) { s.head_dim = -64; }), "head_dim");
  // Shapes that cannot work for other reasons the header implies.
  expect_invalid(with([](AttentionShape& s) { s.q_row_stride = 4 * 64 - 1; }), "q_row_stride");
  expect_invalid(with([](AttentionShape& s) { s.kv_row_stride = 2 * 64 - 1; }), "kv_row_stride");
  expect_invalid(with([](AttentionShape& s) { s.block_q = -16; }), "block");
  expect_invalid(with([](AttentionShape& s) { s.block_k = -1; }), "block");
  expect_invalid(with([](AttentionShape& s) { s.scale = -0.125f; }), "scale");
  // A bad storage type: kind only (the message names the type, not the field).
  expect_invalid(with([](AttentionShape& s) { s.dtype = DType::kI32; }), "");
}

TEST(AttentionValidate, KernelsValidateAtTheBoundary) {
  AttentionShape s = good_shape();
  s.heads = 6;
  s.kv_heads = 4;
  auto dev = cpu();
  std::vector<float> buf(1 << 12), lse(64);
  EXPECT_THROW(attention_forward(*dev, s,
                                 {.out = buf.data(), .lse = lse.data(), .q = buf.data(), .k = buf.data(),
                                  .v = buf.data()}),
               Error);
  EXPECT_THROW(attention_backward(*dev, s,
                                  {.dq = buf.data(), .dk = buf.data(), .dv = buf.data(), .q = buf.data(),
                                   .k = buf.data(), .v = buf.data(), .out = buf.data(), .lse = lse.data(),
                                   .dout = buf.data()}),
               Error);
}

// D comes from exactly one of out and delta, as the function called says: the one it does not
// read must be null, so that a D the caller set is never silently left unread.
TEST(AttentionValidate, BackwardTakesDFromOneSource) {
  const AttentionShape s = good_shape();
  auto dev = cpu();
  std::vector<float> buf(1 << 12), lse(64);
  const AttentionBackwardTensors both{.dq = buf.data(), .dk = buf.data(), .dv = buf.data(), .q = buf.data(),
                                      .k = buf.data(), .v = buf.data(), .out = buf.data(), .delta = lse.data(),
                                      .lse = lse.data(), .dout = buf.data()};
  auto expect_invalid_call = [](auto call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "accepted tensors it must refuse (" << what << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_invalid_call([&] { attention_backward(*dev, s, both); }, "delta must be null");
  expect_invalid_call([&] { attention_backward_with_delta(*dev, s, both); }, "out must be null");
}

}  // namespace
}  // namespace untied

namespace untied {
namespace {

// A NaN in the input gives NaN where it reaches, never a finite output: the row maximum skips
// NaN scores, which must then not read as a row that sees no key.
TEST(AttentionKernel, NanInputGivesNanOutput) {
  auto dev = make_cpu_device({.threads = 2});
  const int64_t S = 40, H = 2, G = 1, D = 16;
  std::vector<float> q(S * H * D, 0.1f), k(S * G * D, 0.2f), v(S * G * D, 0.3f), out(S * H * D), lse(H * S);
  for (int64_t i = 0; i < S; ++i) q[(i * H + 0) * D] = std::numeric_limits<float>::quiet_NaN();  // head 0 only
  const AttentionShape s{.seq_q = S, .seq_k = S, .heads = H, .kv_heads = G, .head_dim = D};
  attention_forward(*dev, s, {.out = out.data(), .lse = lse.data(), .q = q.data(), .k = k.data(), .v = v.data()});
  for (int64_t i = 0; i < S; ++i) {
    EXPECT_TRUE(std::isnan(out[(i * H + 0) * D])) << "row " << i << " of the NaN head";
    EXPECT_TRUE(std::isnan(lse[0 * S + i])) << "lse of row " << i;
    EXPECT_NEAR(out[(i * H + 1) * D], 0.3f, 1e-6) << "row " << i << " of the clean head";
  }
}

}  // namespace
}  // namespace untied
