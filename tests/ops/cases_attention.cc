// Flash attention in the cross-backend op test (op_case.h): forward (out, lse), backward with D
// computed from out (attention_backward) and with D given (attention_backward_with_delta), f32
// and bf16 storage, both GPU paths (tensor cores: bf16 with D in {64, 128}, row strides multiples
// of 8, aligned tensors, compute capability >= 8; portable SIMT: everything else, and a device of
// compute capability 7.x), causal and not, seq_q != seq_k with offsets (rows that see no key and
// keys no row sees), GQA and MHA, ragged lengths, padded and odd row strides, a given scale.
// Ported from the GPU suite (tests/cuda/cuda_attention_test.cc: "gpu" cases, against the CPU
// kernel) and the older emulator test (tests/cuda_emu/attention_emu_test.cc: "emu" cases, against
// a naive fp64 reference; here against the CPU kernel too).
//
// Every case runs: forward; backward from the CPU forward's out and lse (the same inputs as the
// CPU backward); backward with delta = rowsum(dout * out) computed in fp32 from the CPU's out.
// On the emulated GPU each step must take the case's kernel path (mma instructions executed or
// not), so that a change in the path choice cannot quietly move a case's coverage elsewhere.
//
// Tolerances against the CPU (relative to the largest |CPU value| of the tensor; lse absolute):
//   * f32 storage, 1e-4. Both sides compute in fp32 from the same fp32 inputs with the same
//     algorithm; they differ in summation order (tiles, warp reductions, the atomic order of dQ)
//     and in exp2 (a degree-7 polynomial on the CPU, the hardware ex2 on the GPU, each within a
//     few ulp). tests/kernels/attention_test.cc bounds the CPU kernel within ~4x the error of a
//     naive fp32 loop, ~1e-6 relative at these sizes; 1e-4 is that with 100x headroom.
//   * bf16 storage, 2e-2. Both sides round each output once to bf16 (2^-9 of the element), so
//     they may differ by 2^-8 ~ 4e-3 of max |ref|. The tensor-core path also rounds P and dS to
//     bf16 as matrix-product operands (as FlashAttention does): each term of a key sum carries
//     an independent relative error <= 2^-9, which over n terms adds ~2^-9 / sqrt(n) of the
//     sum's scale, below the output rounding. 2e-2 is 5x 2^-8; a wrong mask, head mapping or
//     tile edge errs by O(1).
//   * One key per row (seq_k = 1): P = 1, so dS = dP - delta is 0 in exact arithmetic and dq, dk
//     are the rounding of that cancellation on each side (~1e-8 here, of either sign). Their
//     scale is then at least the size of one term, softmax scale x |dP| x |K| with |dP| ~
//     sqrt(D)/3 for inputs uniform in [-1, 1] (Rule::min_scale), not max |want|, which is itself
//     rounding (a GPU's mma sums dP in another order than the CPU and than a given delta).
//   * lse is fp32 for both dtypes and computed from the same stored values: 1e-4 absolute
//     (f32), 1e-3 (bf16: the tensor cores sum bf16 x bf16 products in fp32 in another order).
// Against the fp64 reference (the emulator test's cases), relative to the largest reference
// element: f32 1e-4 (every operand exact in fp32 and fp32 accumulation over at most a few hundred
// terms of size <= 1: a few hundred fp32 ulps at most, while any masking or indexing error, an
// O(1) change, fails it); bf16 2e-2 (the outputs rounded to bf16, 2^-9 relative, and on the
// tensor-core path P and dS rounded before their products: with random signs over the keys a few
// 2^-8). lse 1e-4 absolute: fp32 on both paths from the exact stored inputs, |lse| < 10 here
// where an fp32 ulp is < 1e-6: about a hundred ulps (on a GPU, bf16: the 1e-3 above).
// Rows that see no key must give out = 0, lse = -inf and dq = 0 exactly, and keys no row sees
// dk = dv = 0 exactly (no NaN, no +inf); elements between H*D and a padded row stride are never
// written (the driver's untouched bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/compare.h"
#include "ops/op_case.h"
#include "untied/kernels/attention.h"

namespace untied::ops {
namespace {

constexpr DType kF = DType::kF32, kB = DType::kBF16;

struct AttnCase {
  std::string name;
  DType dtype;
  int64_t seq_q, seq_k, heads, kv_heads, head_dim;
  bool causal = true;
  int64_t q_offset = 0, k_offset = 0;
  int64_t q_pad = 0, kv_pad = 0;  // row stride = H*D + q_pad, G*D + kv_pad
  float scale = 0.0f;             // 0: 1/sqrt(D)
  int cc_major = 0;               // the emulated device's compute capability (0: its own, 9)
  std::vector<int64_t> doc_starts = {};  // packed documents, global positions (empty: one)
  int64_t window = 0;                    // sliding window (0: none)
};

AttentionShape shape_of(const AttnCase& c) {
  return AttentionShape{.seq_q = c.seq_q,
                        .seq_k = c.seq_k,
                        .heads = c.heads,
                        .kv_heads = c.kv_heads,
                        .head_dim = c.head_dim,
                        .q_offset = c.q_offset,
                        .k_offset = c.k_offset,
                        .causal = c.causal,
                        .scale = c.scale,
                        .q_row_stride = c.heads * c.head_dim + c.q_pad,
                        .kv_row_stride = c.kv_heads * c.head_dim + c.kv_pad,
                        .dtype = c.dtype};
}

// The shape with the documents (their starts in a device buffer) and the window.
AttentionShape with_docs(AttentionShape s, const AttnCase& c, const int64_t* starts) {
  s.window = c.window;
  if (!c.doc_starts.empty()) {
    s.doc_starts = starts;
    s.num_docs = static_cast<int64_t>(c.doc_starts.size());
  }
  return s;
}

// The path attention_tiles.cuh chooses (every tensor of these cases is 16-byte aligned); kAny
// where no row sees a key, since then neither path runs an instruction the emulator counts.
Path path_of(const AttnCase& c) {
  if (c.causal && c.q_offset + c.seq_q - 1 < c.k_offset) return Path::kAny;
  const AttentionShape s = shape_of(c);
  const bool tc = c.dtype == kB && (c.head_dim == 64 || c.head_dim == 128) && s.q_row_stride % 8 == 0 &&
                  s.kv_row_stride % 8 == 0 && (c.cc_major == 0 || c.cc_major >= 8);
  return tc ? Path::kTensorCores : Path::kPortable;
}

enum AttnBuf { kQ, kK, kV, kDout, kOutSaved, kLseSaved, kDelta, kOut, kLse, kDq, kDk, kDv, kDq2, kDk2, kDv2, kDocs };

// ---- the fp64 reference ------------------------------------------------------------------------

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // out/dq (sq, H, D), lse (H, sq), dk/dv (sk, G, D): dense
};

// Naive fp64 attention and its gradient, written for clarity.
Reference reference(const AttnCase& c, const std::vector<HostBuffer>& b) {
  const int64_t H = c.heads, G = c.kv_heads, D = c.head_dim, sq = c.seq_q, sk = c.seq_k, group = H / G;
  const int64_t q_rs = H * D + c.q_pad, kv_rs = G * D + c.kv_pad;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<float>(D));
  Reference r;
  r.out.assign(sq * H * D, 0.0);
  r.lse.assign(H * sq, -INFINITY);
  r.dq.assign(sq * H * D, 0.0);
  r.dk.assign(sk * G * D, 0.0);
  r.dv.assign(sk * G * D, 0.0);
  auto Q = [&](int64_t i, int64_t h, int64_t d) { return b[kQ].get(i * q_rs + h * D + d); };
  auto K = [&](int64_t j, int64_t g, int64_t d) { return b[kK].get(j * kv_rs + g * D + d); };
  auto V = [&](int64_t j, int64_t g, int64_t d) { return b[kV].get(j * kv_rs + g * D + d); };
  auto dO = [&](int64_t i, int64_t h, int64_t d) { return b[kDout].get(i * q_rs + h * D + d); };
  std::vector<double> s(sk), p(sk);
  std::vector<bool> visible(sk);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < sq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < sk; ++j) {
        const int64_t qp = c.q_offset + i, kp = c.k_offset + j;
        visible[j] = !c.causal || kp <= qp;
        for (const int64_t st : c.doc_starts) visible[j] = visible[j] && !(kp < st && st <= qp);  // same document
        if (c.window > 0) visible[j] = visible[j] && qp - kp < c.window;
        if (!visible[j]) continue;
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += Q(i, h, d) * K(j, g, d);
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;  // sees no key: out 0, lse -inf, no gradient
      double sum = 0;
      for (int64_t j = 0; j < sk; ++j) sum += visible[j] ? std::exp(s[j] - mx) : 0.0;
      const double lse = mx + std::log(sum);
      r.lse[h * sq + i] = lse;
      for (int64_t j = 0; j < sk; ++j) p[j] = visible[j] ? std::exp(s[j] - lse) : 0.0;
      double* o = &r.out[(i * H + h) * D];
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < sk; ++j) o[d] += p[j] * V(j, g, d);
      double delta = 0;  // rowsum(dout * out)
      for (int64_t d = 0; d < D; ++d) delta += o[d] * dO(i, h, d);
      for (int64_t j = 0; j < sk; ++j) {
        if (!visible[j]) continue;
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += dO(i, h, d) * V(j, g, d);
        const double ds = p[j] * (dp - delta);
        for (int64_t d = 0; d < D; ++d) {
          r.dq[(i * H + h) * D + d] += scale * ds * K(j, g, d);
          r.dk[(j * G + g) * D + d] += scale * ds * Q(i, h, d);
          r.dv[(j * G + g) * D + d] += p[j] * dO(i, h, d);
        }
      }
    }
  }
  return r;
}

// The (rows, cols) block of a buffer with row stride rs, dense.
std::vector<double> dense(const HostBuffer& b, int64_t rows, int64_t cols, int64_t rs) {
  std::vector<double> v(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(i * cols + c)] = b.get(i * rs + c);
  return v;
}

std::vector<double> all(const HostBuffer& b) { return dense(b, 1, b.elems, b.elems); }

void check_against_reference(const AttnCase& c, const RunResult& init, const RunResult& dut, bool emulated) {
  const Reference ref = reference(c, init.buffers);
  const int64_t q_rs = c.heads * c.head_dim + c.q_pad, kv_rs = c.kv_heads * c.head_dim + c.kv_pad;
  const int64_t qc = c.heads * c.head_dim, kc = c.kv_heads * c.head_dim;
  const double tol = c.dtype == kF ? 1e-4 : 2e-2;
  auto expect_rel = [&](const char* what, int buf, const std::vector<double>& want, int64_t rows, int64_t cols,
                        int64_t rs) {
    const double err = test::rel_error(dense(dut.buffers[buf], rows, cols, rs), want, want);  // NaN: infinite
    EXPECT_LE(err, tol) << what << " against the fp64 reference: max error / max |reference|";
  };
  expect_rel("out", kOut, ref.out, c.seq_q, qc, q_rs);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "backward, delta from out" : "backward, delta given");
    expect_rel("dq", pass == 0 ? kDq : kDq2, ref.dq, c.seq_q, qc, q_rs);
    expect_rel("dk", pass == 0 ? kDk : kDk2, ref.dk, c.seq_k, kc, kv_rs);
    expect_rel("dv", pass == 0 ? kDv : kDv2, ref.dv, c.seq_k, kc, kv_rs);
  }
  const double lse_tol = emulated || c.dtype == kF ? 1e-4 : 1e-3;
  EXPECT_TRUE(test::expect_close("lse against the fp64 reference", all(dut.buffers[kLse]), ref.lse, lse_tol,
                                 test::CheckOptions{.print = false}));
}

// Rows that see no key: out = 0 and dq = 0 exactly; keys seen by no row: dk = dv = 0 exactly;
// lse finite or -inf (-inf exactly where the CPU's is: the driver's rule), never NaN or +inf.
void check_exact_zeros(const AttnCase& c, const RunResult& dut) {
  const HostBuffer& lse = dut.buffers[kLse];
  int64_t bad_lse = 0;
  for (int64_t x = 0; x < lse.elems; ++x) bad_lse += !(std::isfinite(lse.get(x)) || lse.get(x) == -INFINITY);
  EXPECT_EQ(bad_lse, 0) << "lse elements that are neither finite nor -inf";
  if (!c.causal) return;
  const int64_t q_rs = c.heads * c.head_dim + c.q_pad, kv_rs = c.kv_heads * c.head_dim + c.kv_pad;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < c.seq_q; ++i) {
    if (c.q_offset + i - c.k_offset >= 0) continue;  // row i sees key 0
    for (int64_t col = 0; col < c.heads * c.head_dim; ++col)
      for (int buf : {kOut, kDq, kDq2}) nonzero += dut.buffers[buf].get(i * q_rs + col) != 0.0;
  }
  for (int64_t j = 0; j < c.seq_k; ++j) {
    if (c.k_offset + j <= c.q_offset + c.seq_q - 1) continue;  // the last row sees key j
    for (int64_t col = 0; col < c.kv_heads * c.head_dim; ++col)
      for (int buf : {kDk, kDv, kDk2, kDv2}) nonzero += dut.buffers[buf].get(j * kv_rs + col) != 0.0;
  }
  EXPECT_EQ(nonzero, 0) << "rows without keys / keys without rows must give exact zeros";
}

// ---- the cases ---------------------------------------------------------------------------------

enum class Origin { kGpu, kEmu };

OpCase attention_case(const AttnCase& c, Origin origin) {
  const AttentionShape s = shape_of(c);
  const DType t = c.dtype;
  const int64_t q_rs = s.q_row_stride, kv_rs = s.kv_row_stride, qn = c.seq_q * q_rs, kn = c.seq_k * kv_rs;
  const int64_t hq = c.heads * c.seq_q;
  const Compare rule = both(close(t == kF ? 1e-4 : 2e-2));
  Rule one_key = close(t == kF ? 1e-4 : 2e-2);  // dq, dk with one key: a cancellation (above)
  one_key.min_scale = (c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim))) *
                      std::sqrt(static_cast<double>(c.head_dim)) / 3.0;
  const Compare dqk_rule = c.seq_k == 1 ? both(one_key) : rule;
  const Compare lse_rule = both(close_abs(t == kF ? 1e-4 : 1e-3));
  // The outputs start as a sentinel, kept in the stride gaps: 7.0 (exact in bf16) in the GPU
  // suite, 0xAB bytes in the emulator test.
  const auto sentinel = origin == Origin::kGpu ? fill_value(7.0) : fill_byte(0xAB);
  auto out_buf = [&](const char* name, int64_t elems, Region r, Compare cmp) {
    BufferSpec b = output(name, t, elems, 0, r, cmp);
    b.fill = sentinel;
    return b;
  };
  const Region qr = rows_of(c.seq_q, c.heads * c.head_dim, q_rs), kr = rows_of(c.seq_k, c.kv_heads * c.head_dim, kv_rs);
  OpCase k;
  k.name = case_name({"attention", origin == Origin::kGpu ? "gpu" : "emu", c.name});
  k.buffers = {input("q", t, qn),
               input("k", t, kn),
               input("v", t, kn),
               input("dout", t, qn),
               input("out_saved", t, qn),
               input("lse_saved", kF, hq),
               input("delta", kF, hq),
               out_buf("out", qn, qr, rule),
               output("lse", kF, hq, 0, everything(), lse_rule),
               out_buf("dq", qn, qr, dqk_rule),
               out_buf("dk", kn, kr, dqk_rule),
               out_buf("dv", kn, kr, rule),
               out_buf("dq_delta_given", qn, qr, dqk_rule),
               out_buf("dk_delta_given", kn, kr, dqk_rule),
               out_buf("dv_delta_given", kn, kr, rule)};
  // The document starts (one unused element without documents).
  BufferSpec docs = input("doc_starts", DType::kI64, std::max<int64_t>(1, static_cast<int64_t>(c.doc_starts.size())));
  docs.fill = [c](HostBuffer& b, test::Rng&) {
    for (size_t d = 0; d < c.doc_starts.size(); ++d) b.as<int64_t>()[d] = c.doc_starts[d];
    if (c.doc_starts.empty()) b.as<int64_t>()[0] = 0;
  };
  k.buffers.push_back(docs);
  k.prepare = [s0 = s, c](Device& cpu, std::vector<HostBuffer>& b) {
    const AttentionShape s = with_docs(s0, c, b[kDocs].as<int64_t>());
    attention_forward(cpu, s,
                      {.out = b[kOutSaved].data(), .lse = b[kLseSaved].as<float>(), .q = b[kQ].data(),
                       .k = b[kK].data(), .v = b[kV].data()});
    // delta = rowsum(dout * out) in fp32 from the CPU's out, as a context-parallel caller has it.
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        float acc = 0.0f;
        for (int64_t e = 0; e < c.head_dim; ++e) {
          const int64_t at = i * s.q_row_stride + h * c.head_dim + e;
          acc += static_cast<float>(b[kOutSaved].get(at)) * static_cast<float>(b[kDout].get(at));
        }
        b[kDelta].as<float>()[h * c.seq_q + i] = acc;
      }
  };
  k.run = [s0 = s, c](Ctx& x) {
    const AttentionShape s = with_docs(s0, c, x.as<const int64_t>(kDocs));
    attention_forward(x.dev, s, {.out = x[kOut], .lse = x.as<float>(kLse), .q = x[kQ], .k = x[kK], .v = x[kV]});
    x.step("forward");
    attention_backward(x.dev, s,
                       {.dq = x[kDq], .dk = x[kDk], .dv = x[kDv], .q = x[kQ], .k = x[kK], .v = x[kV],
                        .out = x[kOutSaved], .lse = x.as<const float>(kLseSaved), .dout = x[kDout]});
    x.step("backward (delta from out)");
    attention_backward_with_delta(x.dev, s,
                                  {.dq = x[kDq2], .dk = x[kDk2], .dv = x[kDv2], .q = x[kQ], .k = x[kK], .v = x[kV],
                                   .delta = x.as<const float>(kDelta), .lse = x.as<const float>(kLseSaved),
                                   .dout = x[kDout]});
    x.step("backward (delta given)");
    return std::vector<double>{};
  };
  k.cc_major = c.cc_major;
  k.path = path_of(c);
  k.check = [c, origin](const RunResult& init, const RunResult&, const RunResult& dut, bool emulated) {
    check_exact_zeros(c, dut);
    if (origin == Origin::kEmu) check_against_reference(c, init, dut, emulated);
  };
  // The GPU suite's sizes run under one schedule on the emulated GPU (as it ran them there), and
  // only with -DUNTIED_EMU_SLOW_TESTS=ON where they take more than a few seconds there: on the
  // tensor-core path beyond ~1.5e5 (query, key, head) triples (bf16 D=128 at 1000 x 1000 x 8:
  // about a minute; S = 4096: far longer), on the portable one beyond 3e6 (f32 D=64 at 1000 x
  // 1000 x 8: 7 s).
  if (origin == Origin::kGpu) {
    const int64_t triples = c.seq_q * c.seq_k * c.heads;
    k.one_schedule = true;
    k.slow_on_emu = path_of(c) == Path::kTensorCores ? triples > 150'000 : triples > 3'000'000;
  }
  return k;
}

std::vector<AttnCase> gpu_cases() {
  const DType F = kF, B = kB;
  return {
      {"f32_d64_causal_gqa", F, 1000, 1000, 8, 2, 64},
      {"bf16_d128_causal_gqa", B, 1000, 1000, 8, 2, 128},
      {"bf16_d64_mha_noncausal_ragged", B, 77, 1000, 4, 4, 64, false},
      {"bf16_d128_query_tail", B, 300, 1000, 8, 2, 128, true, 700, 0},
      // Rows 0..59 see no key; keys 140..149 are seen by no row.
      {"bf16_d128_rows_without_keys", B, 200, 150, 4, 2, 128, true, 0, 60},
      {"bf16_d64_rows_without_keys", B, 130, 200, 2, 1, 64, true, 0, 30},
      {"f32_d96_portable", F, 77, 77, 8, 2, 96},
      {"bf16_d40_portable_more_queries", B, 1000, 77, 4, 1, 40},
      {"bf16_d128_padded_strides", B, 500, 600, 8, 2, 128, true, 100, 0, 24, 8},
      // Odd strides: the tensor-core path needs 16-byte rows, so bf16 D=64 goes portable.
      {"bf16_d64_odd_strides_portable", B, 300, 300, 4, 2, 64, true, 0, 0, 3, 1},
      {"f32_d128_strided_offsets", F, 200, 333, 4, 2, 128, true, 133, 0, 5, 3},
      {"f32_d256", F, 100, 100, 2, 1, 256},
      {"bf16_d200_portable_noncausal", B, 64, 90, 2, 2, 200, false},
      {"f32_no_row_sees_a_key", F, 50, 50, 2, 1, 64, true, 0, 100},
      // Many blocks of the tensor-core kernels (32 query tiles x 8 heads forward, 32 key tiles x
      // 2 KV heads backward, each looping over 4 heads): seq 4096, H 8, G 2, D 128, bf16, causal.
      {"large_seq4096_bf16_d128", B, 4096, 4096, 8, 2, 128},
  };
}

// Ragged sizes throughout (none a multiple of the 64/128-row tiles).
std::vector<AttnCase> emu_cases() {
  return {
      {.name = "mma_d64_gqa", .dtype = kB, .seq_q = 130, .seq_k = 130, .heads = 2, .kv_heads = 1, .head_dim = 64},
      {.name = "mma_d128_gqa_q_offset_strides",
       .dtype = kB,
       .seq_q = 100,
       .seq_k = 170,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 128,
       .q_offset = 40,
       .q_pad = 8,
       .kv_pad = 16},
      {.name = "mma_d128_rows_0_to_29_see_no_key",
       .dtype = kB,
       .seq_q = 70,
       .seq_k = 200,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 128,
       .k_offset = 30,
       .kv_pad = 8},
      {.name = "mma_d128_long_key_prefix",
       .dtype = kB,
       .seq_q = 90,
       .seq_k = 300,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 128,
       .q_offset = 250},
      {.name = "mma_d64_h3_g1_offsets_scale",
       .dtype = kB,
       .seq_q = 129,
       .seq_k = 257,
       .heads = 3,
       .kv_heads = 1,
       .head_dim = 64,
       .q_offset = 1000,
       .k_offset = 1100,
       .scale = 0.3f},
      {.name = "mma_d64_non_causal",
       .dtype = kB,
       .seq_q = 90,
       .seq_k = 75,
       .heads = 2,
       .kv_heads = 2,
       .head_dim = 64,
       .causal = false},
      {.name = "simt_f32_d40_gqa_q_offset_strides",
       .dtype = kF,
       .seq_q = 50,
       .seq_k = 90,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 40,
       .q_offset = 30,
       .q_pad = 3,
       .kv_pad = 5},
      {.name = "simt_bf16_d96_k_offset_odd_stride",
       .dtype = kB,
       .seq_q = 60,
       .seq_k = 45,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 96,
       .k_offset = 20,
       .q_pad = 1},
      {.name = "simt_f32_d200_non_causal",
       .dtype = kF,
       .seq_q = 33,
       .seq_k = 40,
       .heads = 2,
       .kv_heads = 2,
       .head_dim = 200,
       .causal = false},
      {.name = "simt_f32_d17_no_row_sees_a_key",
       .dtype = kF,
       .seq_q = 20,
       .seq_k = 30,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 17,
       .k_offset = 50},
      {.name = "simt_bf16_d64_stride_not_a_multiple_of_8",
       .dtype = kB,
       .seq_q = 70,
       .seq_k = 70,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .q_pad = 2,
       .kv_pad = 2},
      // Packed documents and windows (tiles skipped, rows and keys cut at document starts): both
      // paths, forward and backward; a one-token document, a ring-style block with offsets.
      {.name = "mma_d64_docs",
       .dtype = kB,
       .seq_q = 300,
       .seq_k = 300,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .doc_starts = {0, 37, 38, 150, 290}},
      {.name = "mma_d128_docs_window_offsets",
       .dtype = kB,
       .seq_q = 130,
       .seq_k = 200,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 128,
       .q_offset = 120,
       .k_offset = 50,
       .doc_starts = {0, 100, 180, 181},
       .window = 60},
      {.name = "simt_f32_d64_docs_window",
       .dtype = kF,
       .seq_q = 150,
       .seq_k = 150,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .doc_starts = {0, 1, 20, 90},
       .window = 25},
      {.name = "simt_f32_d40_tiny_docs",
       .dtype = kF,
       .seq_q = 70,
       .seq_k = 70,
       .heads = 2,
       .kv_heads = 2,
       .head_dim = 40,
       .doc_starts = {0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45, 48, 51, 54, 57, 60, 63, 66, 69}},
      {.name = "simt_bf16_d64_on_sm_70",
       .dtype = kB,
       .seq_q = 40,
       .seq_k = 50,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .cc_major = 7},
  };
}

// The emulator test's exhaustive sweep (UNTIED_EMU_SWEEP=1): larger sizes, more offsets.
std::vector<AttnCase> sweep_cases() {
  return {
      {.name = "sweep_mma_d64_causal",
       .dtype = kB,
       .seq_q = 77,
       .seq_k = 77,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64},
      {.name = "sweep_mma_d64_no_row_sees_a_key",
       .dtype = kB,
       .seq_q = 64,
       .seq_k = 128,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .k_offset = 500},
      {.name = "sweep_mma_d128_one_token",
       .dtype = kB,
       .seq_q = 1,
       .seq_k = 1,
       .heads = 1,
       .kv_heads = 1,
       .head_dim = 128},
      {.name = "sweep_mma_d128_large",
       .dtype = kB,
       .seq_q = 1000,
       .seq_k = 1000,
       .heads = 4,
       .kv_heads = 2,
       .head_dim = 128},
      {.name = "sweep_mma_d64_large_q_offset",
       .dtype = kB,
       .seq_q = 600,
       .seq_k = 1000,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64,
       .q_offset = 400,
       .q_pad = 8},
      {.name = "sweep_simt_f32_d64_causal",
       .dtype = kF,
       .seq_q = 77,
       .seq_k = 77,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 64},
      {.name = "sweep_simt_f32_d128_non_causal",
       .dtype = kF,
       .seq_q = 40,
       .seq_k = 70,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 128,
       .causal = false},
      {.name = "sweep_simt_f32_d200_q_offset",
       .dtype = kF,
       .seq_q = 33,
       .seq_k = 40,
       .heads = 2,
       .kv_heads = 2,
       .head_dim = 200,
       .q_offset = 5},
      {.name = "sweep_simt_bf16_d128_on_sm_70",
       .dtype = kB,
       .seq_q = 70,
       .seq_k = 60,
       .heads = 2,
       .kv_heads = 1,
       .head_dim = 128,
       .cc_major = 7},
  };
}

// f32_results (ring attention's partial results): out, dq, dk, dv in fp32 whatever the storage of
// q, k, v, dout. With bf16 storage the backward takes D from the caller, so both backward slots
// of the buffer layout run attention_backward_with_delta. Compared with the CPU at the f32 rule
// (both compute in fp32 and now round nothing to bf16; the inputs are the same bf16 values) and,
// like the emulator's cases, against the fp64 reference.
OpCase f32_results_case(const AttnCase& c) {
  AttentionShape s = shape_of(c);
  s.f32_results = true;
  const DType t = c.dtype;
  const int64_t q_rs = s.q_row_stride, kv_rs = s.kv_row_stride, qn = c.seq_q * q_rs, kn = c.seq_k * kv_rs;
  const int64_t hq = c.heads * c.seq_q;
  // The rule of the storage-dtype cases: f32 1e-4; bf16 2e-2, as the tensor-core path rounds P and
  // dS to bf16 for its mma (measured here: 1.2e-3 of max |dv| on the emulated GPU), which fp32
  // results do not undo.
  const Compare rule = both(close(t == kF ? 1e-4 : 2e-2));
  const Region qr = rows_of(c.seq_q, c.heads * c.head_dim, q_rs), kr = rows_of(c.seq_k, c.kv_heads * c.head_dim, kv_rs);
  OpCase k;
  k.name = case_name({"attention", "f32_results", c.name});
  k.buffers = {input("q", t, qn),
               input("k", t, kn),
               input("v", t, kn),
               input("dout", t, qn),
               input("out_saved", t, qn),
               input("lse_saved", kF, hq),
               input("delta", kF, hq),
               output("out", kF, qn, 0, qr, rule),
               output("lse", kF, hq, 0, everything(), both(close_abs(t == kF ? 1e-4 : 1e-3))),
               output("dq", kF, qn, 0, qr, rule),
               output("dk", kF, kn, 0, kr, rule),
               output("dv", kF, kn, 0, kr, rule),
               output("dq_delta_given", kF, qn, 0, qr, rule),
               output("dk_delta_given", kF, kn, 0, kr, rule),
               output("dv_delta_given", kF, kn, 0, kr, rule)};
  const AttentionShape storage = shape_of(c);  // the saved out in the storage dtype, as the caller has it
  k.prepare = [storage, c](Device& cpu, std::vector<HostBuffer>& b) {
    attention_forward(cpu, storage,
                      {.out = b[kOutSaved].data(), .lse = b[kLseSaved].as<float>(), .q = b[kQ].data(),
                       .k = b[kK].data(), .v = b[kV].data()});
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        float acc = 0.0f;
        for (int64_t e = 0; e < c.head_dim; ++e) {
          const int64_t at = i * storage.q_row_stride + h * c.head_dim + e;
          acc += static_cast<float>(b[kOutSaved].get(at)) * static_cast<float>(b[kDout].get(at));
        }
        b[kDelta].as<float>()[h * c.seq_q + i] = acc;
      }
  };
  k.run = [s](Ctx& x) {
    attention_forward(x.dev, s, {.out = x[kOut], .lse = x.as<float>(kLse), .q = x[kQ], .k = x[kK], .v = x[kV]});
    x.step("forward");
    for (int slot : {kDq, kDq2}) {
      attention_backward_with_delta(x.dev, s,
                                    {.dq = x[slot], .dk = x[slot + 1], .dv = x[slot + 2], .q = x[kQ], .k = x[kK],
                                     .v = x[kV], .delta = x.as<const float>(kDelta),
                                     .lse = x.as<const float>(kLseSaved), .dout = x[kDout]});
      x.step("backward (delta given)");
    }
    return std::vector<double>{};
  };
  k.cc_major = c.cc_major;
  k.path = path_of(c);
  k.check = [c](const RunResult& init, const RunResult&, const RunResult& dut, bool emulated) {
    check_exact_zeros(c, dut);
    check_against_reference(c, init, dut, emulated);
  };
  return k;
}

// accumulate_dkv (UPipe's stages adding dk, dv into the round's fp32 sums): the delta-given slot
// is run first as above, then once more with accumulate_dkv and a zero dO and D, whose dk and dv
// are exactly zero: added to the first results they must leave them as they are (written over,
// they would be zeros). Its dq goes to the other slot, which the plain call then writes.
OpCase accumulate_dkv_case(const AttnCase& c) {
  OpCase k = f32_results_case(c);
  k.name = case_name({"attention", "accumulate_dkv", c.name});
  const int64_t qn = c.seq_q * shape_of(c).q_row_stride, hq = c.heads * c.seq_q;
  constexpr int kDoutZero = kDv2 + 1, kDeltaZero = kDv2 + 2;
  BufferSpec dout_zero = input("dout_zero", c.dtype, qn), delta_zero = input("delta_zero", kF, hq);
  for (BufferSpec* z : {&dout_zero, &delta_zero})
    z->fill = [](HostBuffer& b, test::Rng&) {
      for (int64_t i = 0; i < b.elems; ++i) b.set(i, 0.0);
    };
  k.buffers.push_back(dout_zero);
  k.buffers.push_back(delta_zero);
  AttentionShape s = shape_of(c);
  s.f32_results = true;
  k.run = [s](Ctx& x) {
    attention_forward(x.dev, s, {.out = x[kOut], .lse = x.as<float>(kLse), .q = x[kQ], .k = x[kK], .v = x[kV]});
    x.step("forward");
    attention_backward_with_delta(x.dev, s,
                                  {.dq = x[kDq2], .dk = x[kDk2], .dv = x[kDv2], .q = x[kQ], .k = x[kK], .v = x[kV],
                                   .delta = x.as<const float>(kDelta), .lse = x.as<const float>(kLseSaved),
                                   .dout = x[kDout]});
    AttentionShape acc = s;
    acc.accumulate_dkv = true;
    attention_backward_with_delta(x.dev, acc,
                                  {.dq = x[kDq], .dk = x[kDk2], .dv = x[kDv2], .q = x[kQ], .k = x[kK], .v = x[kV],
                                   .delta = x.as<const float>(kDeltaZero), .lse = x.as<const float>(kLseSaved),
                                   .dout = x[kDoutZero]});
    x.step("backward (dk, dv added to)");
    attention_backward_with_delta(x.dev, s,
                                  {.dq = x[kDq], .dk = x[kDk], .dv = x[kDv], .q = x[kQ], .k = x[kK], .v = x[kV],
                                   .delta = x.as<const float>(kDelta), .lse = x.as<const float>(kLseSaved),
                                   .dout = x[kDout]});
    x.step("backward (delta given)");
    return std::vector<double>{};
  };
  return k;
}

// attention_merge: the log-sum-exp rule of ring attention. Padded rows and head strides, a ragged
// size, and LSEs of -inf on either side (a part that saw no key; an accumulator that has none yet).
// Both sides take the weights in double and combine in fp32, but the CPU build may fuse the
// multiply-add (g++ contracts by default) while the kernel rounds each product (__fmul_rn): one
// fp32 rounding apart, so 1e-6 of the largest value (8 ulps), on the emulated GPU and on a GPU.
OpCase merge_case(int64_t rows, int64_t heads, int64_t d, int64_t pad) {
  const AttentionMergeShape s{.rows = rows, .heads = heads, .head_dim = d, .acc_row_stride = heads * d + pad,
                              .part_row_stride = heads * d, .lse_acc_stride = rows + pad, .lse_part_stride = rows};
  const int64_t acc_n = rows * s.acc_row_stride, part_n = rows * heads * d;
  // Every 7th LSE of the accumulator and every 5th of the part is -inf; the rest O(10).
  auto lse_fill = [](int every) {
    return [every](HostBuffer& b, test::Rng& rng) {
      for (int64_t i = 0; i < b.elems; ++i) b.set(i, i % every == 3 ? -INFINITY : std::uniform_real_distribution<double>(-10.0, 10.0)(rng));
    };
  };
  BufferSpec lse_acc = output("lse_acc", kF, heads * s.lse_acc_stride, 0,
                              rows_of(heads, rows, s.lse_acc_stride), both(close(1e-6)));
  lse_acc.fill = lse_fill(7);
  BufferSpec lse_part = input("lse_part", kF, heads * rows);
  lse_part.fill = lse_fill(5);
  OpCase k;
  k.name = case_name({"attention_merge", std::to_string(rows), std::to_string(heads), std::to_string(d),
                      "pad" + std::to_string(pad)});
  k.buffers = {output("acc", kF, acc_n, 0, rows_of(rows, heads * d, s.acc_row_stride), both(close(1e-6))),
               lse_acc, input("part", kF, part_n), lse_part};
  k.run = [s](Ctx& x) {
    attention_merge(x.dev, s,
                    {.acc = x.as<float>(0), .lse_acc = x.as<float>(1), .part = x.as<const float>(2),
                     .lse_part = x.as<const float>(3)});
    return std::vector<double>{};
  };
  // Against the rule itself, in fp64, on the initial contents.
  k.check = [s](const RunResult& init, const RunResult&, const RunResult& dut, bool) {
    int64_t bad = 0;
    for (int64_t i = 0; i < s.rows; ++i)
      for (int64_t h = 0; h < s.heads; ++h) {
        const double la = init.buffers[1].get(h * s.lse_acc_stride + i), lb = init.buffers[3].get(h * s.lse_part_stride + i);
        const double lse = la == -INFINITY && lb == -INFINITY ? -INFINITY
                           : la == -INFINITY                  ? lb
                           : lb == -INFINITY                  ? la
                                                              : std::max(la, lb) + std::log1p(std::exp(-std::fabs(la - lb)));
        const double got_lse = dut.buffers[1].get(h * s.lse_acc_stride + i);
        bad += !(got_lse == lse || std::fabs(got_lse - lse) <= 1e-6 * std::max(1.0, std::fabs(lse)));
        for (int64_t e = 0; e < s.head_dim; ++e) {
          const double a = init.buffers[0].get(i * s.acc_row_stride + h * s.head_dim + e);
          const double b = init.buffers[2].get(i * s.part_row_stride + h * s.head_dim + e);
          const double want = lse == -INFINITY ? a
                              : (la == -INFINITY ? 0.0 : a * std::exp(la - lse)) + (lb == -INFINITY ? 0.0 : b * std::exp(lb - lse));
          bad += std::fabs(dut.buffers[0].get(i * s.acc_row_stride + h * s.head_dim + e) - want) > 1e-6;
        }
      }
    EXPECT_EQ(bad, 0) << "attention_merge against the log-sum-exp rule in fp64";
  };
  return k;
}

// A refused attention call on a small (seq 8 or 16) problem: every buffer must come back as it was.
OpCase attention_refusal(const std::string& name, const AttentionShape& s, DType t, bool backward, bool on_cpu,
                         Refusal r) {
  const int64_t q_rs = s.heads * s.head_dim, n = s.seq_q * q_rs;
  OpCase k;
  k.name = name;
  BufferSpec out = output("out", t, n, 0, everything(), both(bits()));
  out.fill = fill_value(7.0);
  k.buffers = {input("q", t, n), out, output("lse", kF, s.heads * s.seq_q, 0, everything(), both(bits()))};
  k.run = [s, backward](Ctx& x) {
    if (backward)
      attention_backward(x.dev, s,
                         {.dq = x[1], .dk = x[1], .dv = x[1], .q = x[0], .k = x[0], .v = x[0], .out = x[0],
                          .lse = x.as<const float>(2), .dout = x[0]});
    else
      attention_forward(x.dev, s, {.out = x[1], .lse = x.as<float>(2), .q = x[0], .k = x[0], .v = x[0]});
    return std::vector<double>{};
  };
  k.refused_on_dut = r;
  if (on_cpu) {
    k.refused_on_cpu = r;
  } else {
    k.dut_only = true;  // the CPU goes to D = 1024: nothing to refuse there
  }
  return k;
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> out;
  for (const AttnCase& c : gpu_cases()) out.push_back(attention_case(c, Origin::kGpu));
  for (const AttnCase& c : emu_cases()) out.push_back(attention_case(c, Origin::kEmu));
  for (const AttnCase& c : sweep_cases()) {
    OpCase k = attention_case(c, Origin::kEmu);
    k.sweep_only = true;
    out.push_back(k);
  }
  // dk, dv (and the forward) are computed in a fixed order (no atomics): bitwise equal run to
  // run. dq is summed with fp32 atomics, so only equal to rounding (relative to its largest
  // element: 1e-5 f32, 1e-2 bf16).
  for (const AttnCase& c :
       {AttnCase{"tc_twice", kB, 700, 700, 8, 2, 128}, AttnCase{"portable_twice", kF, 300, 300, 4, 2, 96}}) {
    OpCase k = attention_case(c, Origin::kGpu);
    k.repeat = true;
    const Rule dq = close(c.dtype == kF ? 1e-5 : 1e-2);
    k.buffers[kDq].repeat = dq;
    k.buffers[kDq2].repeat = dq;
    out.push_back(k);
  }
  // Ring attention's fp32 partial results, on both kernel paths, with offsets (a ring step's block).
  for (const AttnCase& c : {AttnCase{"tc_bf16_d128_offsets", kB, 96, 96, 4, 2, 128, true, 96, 0},
                            AttnCase{"tc_bf16_d64_diagonal", kB, 130, 130, 2, 1, 64},
                            AttnCase{"portable_f32_d64_offsets", kF, 70, 70, 4, 2, 64, true, 70, 0},
                            AttnCase{"portable_bf16_d40", kB, 50, 50, 2, 1, 40}}) {
    out.push_back(f32_results_case(c));
    out.push_back(accumulate_dkv_case(c));
  }
  out.push_back(merge_case(37, 3, 16, 5));
  out.push_back(merge_case(128, 4, 128, 0));
  // The CUDA kernels stop at D = 256 (the CPU goes to 1024): a clear kUnsupported, nothing written.
  const AttentionShape d300{.seq_q = 8, .seq_k = 8, .heads = 1, .kv_heads = 1, .head_dim = 300};
  const Refusal unsupported{.kind = ErrorKind::kUnsupported, .message = "head_dim"};
  out.push_back(
      attention_refusal("attention_forward_head_dim_above_256_is_refused", d300, kF, false, false, unsupported));
  out.push_back(
      attention_refusal("attention_backward_head_dim_above_256_is_refused", d300, kF, true, false, unsupported));
  // The public entry validates the shape before dispatching: bad shapes throw kInvalidArgument
  // on every backend and nothing is written.
  AttentionShape bad_group{.seq_q = 16, .seq_k = 16, .heads = 4, .kv_heads = 2, .head_dim = 64, .dtype = kB};
  AttentionShape bad_stride = bad_group;
  bad_group.kv_heads = 3;         // 4 % 3 != 0
  bad_stride.q_row_stride = 100;  // < H*D
  const Refusal invalid{.kind = ErrorKind::kInvalidArgument};
  out.push_back(
      attention_refusal("attention_refuses_heads_not_a_multiple_of_kv_heads", bad_group, kB, false, true, invalid));
  out.push_back(attention_refusal("attention_refuses_a_short_row_stride", bad_stride, kB, false, true, invalid));
  return out;
}

}  // namespace untied::ops
