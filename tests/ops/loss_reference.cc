// The LM head loss problems, their fp64 reference and checks (loss_reference.h).
//
// The GPU suite's bounds: the device's error against the unfused fp64 reference (softmax and
// products) must be at most 2 x the CPU's own error plus a floor. Both compute the same fp32
// operations in another order (fp32 exponentials summed in fp64, the gradient products as fp32
// GEMMs of the same operands), so their errors are of one size. The floor: for the loss
// 8 x 2^-24 per labelled row (the exponentials' error); for dh and dw a few fp32 roundings of the
// magnitude (the sum of |terms| behind an element) plus the high-probability bound
// 4 sqrt(K) 2^-24 of a K-term fp32 sum (dh: K = V; dw: K = tokens), and for a bf16 dh one bf16
// rounding (2^-8 of the magnitude).
#include "ops/loss_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/compare.h"

namespace untied::ops {

enum LossBufIndex { kH, kW, kLabels, kArgmax, kSums, kDh, kDw };

std::vector<LossCase> loss_cases() {
  const DType kB = DType::kBF16;
  return {
      {.name = "f32_default_chunk", .tokens = 37, .dim = 48, .vocab = 100},
      {.name = "f32_chunk1", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 1},
      {.name = "f32_chunk5_ragged_last", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 5},
      {.name = "f32_chunk_over_tokens", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 64},
      {.name = "f32_vocab257_scalar_rows", .tokens = 20, .dim = 33, .vocab = 257, .chunk = 6, .ignored = 0.0},
      {.name = "f32_all_ignored", .tokens = 20, .dim = 32, .vocab = 52, .chunk = 6, .ignored = 1.0},
      {.name = "f32_wide_rows", .tokens = 9, .dim = 24, .vocab = 5000, .chunk = 4},
      {.name = "bf16_h_f32_w", .tokens = 30, .dim = 64, .vocab = 120, .chunk = 7, .dtype = kB},
      {.name = "bf16_h_bf16_w", .tokens = 30, .dim = 40, .vocab = 90, .chunk = 10, .dtype = kB, .weight_dtype = kB},
      {.name = "bf16_bf16_vector_rows",
       .tokens = 33,
       .dim = 64,
       .vocab = 1024,
       .chunk = 8,
       .dtype = kB,
       .weight_dtype = kB},
      // V * E * 4 > 16 MiB: a bf16 w is widened in two vocab blocks.
      {.name = "f32_h_bf16_w_two_blocks", .tokens = 6, .dim = 64, .vocab = 70000, .chunk = 4, .weight_dtype = kB},
      {.name = "bf16_bf16_two_blocks",
       .tokens = 5,
       .dim = 64,
       .vocab = 70000,
       .chunk = 2,
       .dtype = kB,
       .weight_dtype = kB},
  };
}

std::vector<int32_t> loss_labels(const LossCase& c) {
  test::Rng rng(101);
  std::uniform_int_distribution<int32_t> cls(0, static_cast<int32_t>(c.vocab - 1));
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> labels(static_cast<size_t>(c.tokens));
  for (int64_t t = 0; t < c.tokens; ++t) {
    const bool ignore = u(rng) < c.ignored || (t >= 10 && t < 15);  // rows 10..14 ignored
    labels[static_cast<size_t>(t)] = ignore ? kIgnoreIndex : cls(rng);
  }
  for (const auto& [at, label] : c.bad_labels) labels[static_cast<size_t>(at)] = label;
  return labels;
}

LmHeadLossShape loss_shape(const LossCase& c) {
  int64_t labelled = 0;
  for (int32_t l : loss_labels(c)) labelled += l != kIgnoreIndex;
  return LmHeadLossShape{
      .tokens = c.tokens,
      .dim = c.dim,
      .vocab = c.vocab,
      .chunk_tokens = c.chunk,
      .ignore_index = kIgnoreIndex,
      .grad_scale = labelled > 0 ? static_cast<float>(1.0 / (2.0 * static_cast<double>(labelled))) : 1.0f,
      .dtype = c.dtype,
      .weight_dtype = c.weight_dtype};
}

std::function<void(HostBuffer&, test::Rng&)> fill_loss_h(const LossCase& c) {
  return [c](HostBuffer& b, test::Rng& rng) {
    const std::vector<double> v = test::quantized(rng, b.elems, 16, 1.0 / 16);
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, v[static_cast<size_t>(i)]);
    if (c.inf_rows_10_to_14)
      for (int64_t i = 10 * c.dim; i < 15 * c.dim; ++i) b.set(i, std::numeric_limits<double>::infinity());
  };
}

std::function<void(HostBuffer&, test::Rng&)> fill_loss_w(const LossCase& c) {
  UNTIED_CHECK(c.dim <= 64, "loss case ", c.name, ": larger E would let the logits round");
  const int levels = static_cast<int>(std::lround(9.0 * 64.0 / std::sqrt(static_cast<double>(c.dim))));
  return [levels](HostBuffer& b, test::Rng& rng) {
    const std::vector<double> v = test::quantized(rng, b.elems, std::min(levels, 256), 1.0 / 64);
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, v[static_cast<size_t>(i)]);
  };
}

std::function<void(HostBuffer&, test::Rng&)> fill_loss_labels(const LossCase& c) {
  const std::vector<int32_t> labels = loss_labels(c);
  return [labels](HostBuffer& b, test::Rng&) {
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, labels[static_cast<size_t>(i)]);
  };
}

namespace {

std::vector<double> values(const HostBuffer& b) {
  std::vector<double> v(static_cast<size_t>(b.elems));
  for (int64_t i = 0; i < b.elems; ++i) v[static_cast<size_t>(i)] = b.get(i);
  return v;
}

LossSums sums_of(const RunResult& r) {
  LossSums s;
  std::memcpy(&s, r.buffers[kSums].data(), sizeof s);
  return s;
}

// The unfused fp64 reference and the magnitudes of the budgets.
struct LossReference {
  std::vector<double> logits;  // (tokens, V), exact (see loss_reference.h)
  double loss_sum = 0;
  int64_t count = 0;
  std::vector<double> dh, dw;
  double dh_mag = 0, dw_mag = 0;  // the largest sum of |terms| behind an element
};

LossReference reference(const LmHeadLossShape& s, const std::vector<double>& h, const std::vector<double>& w,
                        const std::vector<double>& labels, const std::vector<double>& dw0) {
  const int64_t T = s.tokens, E = s.dim, V = s.vocab;
  const double gs = s.grad_scale;
  LossReference R;
  R.logits.assign(static_cast<size_t>(T * V), 0.0);
  R.dh.assign(static_cast<size_t>(T * E), 0.0);
  R.dw = dw0;
  std::vector<double> dw_abs(R.dw.size());
  for (size_t i = 0; i < dw_abs.size(); ++i) dw_abs[i] = std::fabs(R.dw[i]);
  std::vector<double> g(static_cast<size_t>(V)), dh_abs(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    double* z = &R.logits[static_cast<size_t>(t * V)];
    for (int64_t j = 0; j < V; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < E; ++k) acc += h[t * E + k] * w[j * E + k];
      z[j] = acc;
    }
    const int32_t label = static_cast<int32_t>(labels[static_cast<size_t>(t)]);
    if (label == s.ignore_index) continue;  // G = 0: dh row 0, dw unchanged
    double mx = z[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, z[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    const double lse = mx + std::log(sum);
    R.loss_sum += lse - z[label];
    R.count += 1;
    for (int64_t j = 0; j < V; ++j) g[j] = gs * (std::exp(z[j] - lse) - (j == label ? 1.0 : 0.0));
    std::fill(dh_abs.begin(), dh_abs.end(), 0.0);
    for (int64_t j = 0; j < V; ++j)
      for (int64_t k = 0; k < E; ++k) {
        const double wj = w[j * E + k], hk = h[t * E + k];
        R.dh[t * E + k] += g[j] * wj;
        dh_abs[k] += std::fabs(g[j] * wj);
        R.dw[j * E + k] += g[j] * hk;
        dw_abs[j * E + k] += std::fabs(g[j] * hk);
      }
    R.dh_mag = std::max(R.dh_mag, test::max_abs(dh_abs));
  }
  R.dw_mag = test::max_abs(dw_abs);
  return R;
}

// The rounding error of a K-term fp32 sum of terms of total magnitude `mag` that holds with high
// probability (Higham and Mary's lambda sqrt(K) u, lambda = 4), plus a few roundings of the
// terms themselves (expf, the softmax scale, G).
double sum_floor(int64_t k, double mag) {
  return (8.0 + 4.0 * std::sqrt(static_cast<double>(k))) * std::ldexp(1.0, -24) * mag;
}

// err(device) <= 2 err(CPU) + floor, both against the fp64 reference.
void expect_within(const char* what, double err_dut, double err_cpu, double floor) {
  EXPECT_LE(err_dut, 2 * err_cpu + floor)
      << what << ": device error " << err_dut << ", CPU error " << err_cpu << ", floor " << floor;
}

}  // namespace

void check_loss_against_reference(const LossCase& c, const RunResult& init, const RunResult& cpu, const RunResult& dut,
                                  bool backward, bool with_argmax) {
  const LmHeadLossShape s = loss_shape(c);
  const LossReference R =
      reference(s, values(init.buffers[kH]), values(init.buffers[kW]), values(init.buffers[kLabels]),
                backward ? values(init.buffers[kDw]) : std::vector<double>(static_cast<size_t>(s.vocab * s.dim)));
  const LossSums gs = sums_of(dut), cs = sums_of(cpu);
  EXPECT_EQ(gs.count, R.count);
  EXPECT_EQ(cs.count, R.count);
  // Per labelled row, loss = max + log(sum of fp32 exponentials) - logit[label], all exact but
  // the exponentials (within 2 ulps = 4 x 2^-24 relative each on the GPU), so the row's loss is
  // within ~4 x 2^-24 (the fp64 sum and log add nothing visible): 8 x 2^-24 per row.
  expect_within("loss_sum", std::fabs(gs.loss_sum - R.loss_sum), std::fabs(cs.loss_sum - R.loss_sum),
                8 * std::ldexp(1.0, -24) * static_cast<double>(R.count));

  // argmax: the logits are exact, so both backends pick the first index of the exact maximum.
  int64_t bad = 0;
  const HostBuffer& ga = dut.buffers[kArgmax];
  const HostBuffer& ca = cpu.buffers[kArgmax];
  for (int64_t t = 0; t < (with_argmax ? s.tokens : 0); ++t) {
    const double* z = &R.logits[static_cast<size_t>(t * s.vocab)];
    int32_t first = 0;
    for (int64_t j = 1; j < s.vocab; ++j)
      if (z[j] > z[first]) first = static_cast<int32_t>(j);
    if ((ga.get(t) != first || ca.get(t) != first) && bad++ < 5)
      ADD_FAILURE() << "argmax[" << t << "]: device " << ga.get(t) << ", CPU " << ca.get(t) << ", reference " << first;
  }
  EXPECT_EQ(bad, 0) << "rows whose argmax is not the first maximum";
  if (!backward) return;

  // dh: a V-term sum per element (then one bf16 rounding, <= 2^-8 relative, when dh is bf16);
  // dw: dw0 plus a tokens-term sum.
  const std::vector<double> gdh = values(dut.buffers[kDh]), cdh = values(cpu.buffers[kDh]);
  const std::vector<double> gdw = values(dut.buffers[kDw]), cdw = values(cpu.buffers[kDw]);
  const double dh_round = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) * R.dh_mag : 0.0;
  expect_within("dh", test::max_abs_error(gdh, R.dh), test::max_abs_error(cdh, R.dh),
                dh_round + sum_floor(s.vocab, R.dh_mag));
  expect_within("dw", test::max_abs_error(gdw, R.dw), test::max_abs_error(cdw, R.dw),
                sum_floor(s.tokens + 1, R.dw_mag));
  // Ignored rows: G = 0, so dh is exactly 0 there.
  expect_ignored_rows_zero(init, cpu, dut, s.dim);
}

std::vector<int32_t> emu_loss_labels(int64_t tokens, int64_t vocab, int64_t chunk, bool ignore_chunk) {
  test::Rng rng(static_cast<uint64_t>(tokens * 1000003 + vocab * 31 + chunk));
  std::vector<int32_t> v = test::uniform_ints(rng, tokens, 0, static_cast<int32_t>(vocab - 1));
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t t = 0; t < tokens; ++t)
    if (u(rng) < 0.2) v[static_cast<size_t>(t)] = kIgnoreIndex;  // ~20% ignored
  if (tokens > 3) {                                              // the vocabulary's edges as labels
    v[1] = 0;
    v[2] = static_cast<int32_t>(vocab - 1);
  }
  const int64_t c = chunk > 0 ? chunk : tokens;
  if (ignore_chunk)
    for (int64_t t = c; t < std::min(2 * c, tokens); ++t) v[static_cast<size_t>(t)] = kIgnoreIndex;
  return v;
}

void expect_ignored_rows_zero(const RunResult& init, const RunResult& cpu, const RunResult& dut, int64_t dim) {
  const HostBuffer& labels = init.buffers[kLabels];
  int64_t nonzero_dut = 0, nonzero_cpu = 0;
  for (int64_t t = 0; t < labels.elems; ++t)
    if (labels.get(t) == kIgnoreIndex)
      for (int64_t k = 0; k < dim; ++k) {
        nonzero_dut += dut.buffers[kDh].get(t * dim + k) != 0.0;
        nonzero_cpu += cpu.buffers[kDh].get(t * dim + k) != 0.0;
      }
  EXPECT_EQ(nonzero_dut, 0) << "dh elements of ignored rows that are not 0 (device)";
  EXPECT_EQ(nonzero_cpu, 0) << "dh elements of ignored rows that are not 0 (CPU)";
}

}  // namespace untied::ops
