// The CUDA embedding, AdamW (with the clipping helpers) and fused LM head loss against the CPU
// kernels on the same inputs: f32 and bf16 storage, ragged sizes (E and V not multiples of the
// vector width, a last loss chunk shorter than the others), pointers off the 16-byte alignment
// (the scalar paths), ignored labels, repeated ids, and the data checks (a bad id or label
// throws Error(kInvalidArgument) naming it, and nothing is written).
//
// Tolerances:
//   embedding forward and backward: exact. The forward is a copy or one rounding to bf16 (round
//     to nearest even on both); the backward adds the same fp32 values in the same token order
//     (embedding.cu), so every bit agrees.
//   adamw_step: <= 1e-6 of the largest |value|. Each element is at most 8 fp32 operations on
//     both; the CPU compiler may fuse a multiply-add (one rounding fewer), so the two can differ
//     by a few ulps of the operands: 8 x 2^-24 ~ 5e-7.
//   grad_sum_squares: <= 2e-11 relative. Both sum squares exactly formed in fp64 (a float
//     squared is exact in a double) over the same fixed blocks of 65536, in different orders
//     inside a block; the terms are positive, so each result is within 65536 x 2^-53 ~ 7.3e-12
//     of the exact sum, relative (worst case; ~3e-14 typically).
//   scale_in_place: exact (one fp32 multiply).
//   lm_head_loss: h and w are small multiples of 2^-4 and 2^-6 (make_loss_problem), so the
//     logits are exact on both backends and the argmax must be the reference's first maximum.
//     The rest is checked against an fp64 reference (the unfused softmax and products): the
//     GPU's error must be at most 2 x the CPU's own error plus a floor. Both compute the same
//     fp32 operations in another order (fp32 exponentials summed in fp64, the gradient products
//     as fp32 GEMMs of the same operands), so their errors are of one size. The floor: for the
//     loss 8 x 2^-24 per labelled row (the exponentials' error; see check_against_reference);
//     for dh and dw a few fp32 roundings of the magnitude (the sum of |terms| behind an element)
//     plus the high-probability bound 4 sqrt(K) 2^-24 of a K-term fp32 sum (dh: K = V; dw:
//     K = tokens), and for a bf16 dh one bf16 rounding (2^-8 of the magnitude).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "untied/core/check.h"
#include "untied/kernels/adamw.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/lm_head_loss.h"

namespace untied {
namespace {

using gputest::gpu_device;

// ---- helpers -------------------------------------------------------------------------------

// Host values in [-scale, scale), rounded to what storage `t` holds.
std::vector<float> random_values(uint64_t seed, int64_t n, DType t, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = scale * hash_uniform(seed, 7, static_cast<uint64_t>(i));
    v[static_cast<size_t>(i)] = t == DType::kBF16 ? round_to_bf16(x) : x;
  }
  return v;
}

// The bytes of `x` stored as `t`.
std::vector<char> pack(const std::vector<float>& x, DType t) {
  std::vector<char> out(x.size() * static_cast<size_t>(dtype_size(t)));
  store_f32(out.data(), t, x.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<float> unpack(const std::vector<char>& raw, DType t) {
  std::vector<float> out(raw.size() / static_cast<size_t>(dtype_size(t)));
  load_f32(out.data(), raw.data(), t, static_cast<int64_t>(out.size()));
  return out;
}

// A GPU buffer holding `bytes` of host data starting `offset` bytes into it (an offset that is
// not a multiple of 16 sends the kernels down their scalar paths).
struct GpuCopy {
  Buffer buf;
  int64_t offset = 0;
  void* data() const { return static_cast<char*>(buf.data()) + offset; }
};

GpuCopy upload(Device& gpu, const void* host, int64_t bytes, int64_t offset = 0) {
  GpuCopy c{gpu.allocator().allocate(bytes + offset, Tag::kOther, "test input"), offset};
  gpu.copy(c.data(), host, bytes);
  return c;
}

template <typename T>
GpuCopy upload(Device& gpu, const std::vector<T>& host, int64_t offset = 0) {
  return upload(gpu, host.data(), static_cast<int64_t>(host.size() * sizeof(T)), offset);
}

// `bytes` of GPU memory back on the host (after the device's work).
std::vector<char> download(Device& gpu, const void* src, int64_t bytes) {
  gpu.synchronize();
  std::vector<char> out(static_cast<size_t>(bytes));
  gpu.copy(out.data(), src, bytes);
  return out;
}

template <typename T>
std::vector<T> download_as(Device& gpu, const void* src, int64_t n) {
  const std::vector<char> raw = download(gpu, src, n * static_cast<int64_t>(sizeof(T)));
  std::vector<T> out(static_cast<size_t>(n));
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

// Runs `f`, which must throw Error(kInvalidArgument) whose message contains `what`.
template <typename F>
void expect_invalid(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Max |a - b| over a[i], b[i] as doubles; NaN if any difference is NaN (an element left
// unwritten in a buffer filled with NaN, a NaN result), so that every `<=` check on it fails.
template <typename A, typename B>
double max_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

template <typename T>
double max_abs(const std::vector<T>& a) {
  double m = 0;
  for (const T& x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// ---- embedding -----------------------------------------------------------------------------

struct EmbCase {
  int64_t tokens, vocab, dim;
  int64_t offset_elems = 0;   // table / dout start this many elements into their GPU buffers
  int32_t only_id = -1;       // >= 0: every token has this id (one run over all tokens)
};

std::vector<EmbCase> emb_cases() {
  return {
      {.tokens = 37, .vocab = 50, .dim = 48},                       // vector path
      {.tokens = 37, .vocab = 50, .dim = 13},                       // E % 4 != 0: scalar path
      {.tokens = 37, .vocab = 50, .dim = 1000},                     // two column blocks
      {.tokens = 37, .vocab = 50, .dim = 1029},                     // nine column blocks, scalar
      {.tokens = 37, .vocab = 50, .dim = 48, .offset_elems = 1},    // misaligned: scalar path
      {.tokens = 300, .vocab = 7, .dim = 20},                       // runs of ~40 repeated ids
      {.tokens = 1000, .vocab = 5, .dim = 12, .only_id = 3},        // one run of 1000
      {.tokens = 70000, .vocab = 3, .dim = 8},                      // more tokens than blocks
  };
}

std::vector<int32_t> make_ids(const EmbCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(c.tokens));
  for (auto& x : ids) x = c.only_id >= 0 ? c.only_id : id(rng);
  return ids;
}

TEST(CudaEmbedding, ForwardMatchesTheCpuExactly) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  for (const EmbCase& c : emb_cases())
    for (DType table_t : {DType::kF32, DType::kBF16})
      for (DType out_t : {DType::kF32, DType::kBF16}) {
        const EmbeddingShape s{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = out_t,
                               .table_dtype = table_t};
        const std::vector<int32_t> ids = make_ids(c, 11);
        const std::vector<char> table = pack(random_values(3, c.vocab * c.dim, table_t), table_t);
        std::vector<char> out_cpu(static_cast<size_t>(c.tokens * c.dim * dtype_size(out_t)));
        embedding_forward(*cpu, s, out_cpu.data(), ids.data(), table.data());

        const GpuCopy d_ids = upload(*gpu, ids);
        const GpuCopy d_table = upload(*gpu, table, c.offset_elems * dtype_size(table_t));
        const std::vector<char> nan(out_cpu.size(), static_cast<char>(0xff));
        const GpuCopy d_out = upload(*gpu, nan, c.offset_elems * dtype_size(out_t));
        embedding_forward(*gpu, s, d_out.data(), static_cast<const int32_t*>(d_ids.data()), d_table.data());
        const std::vector<char> out_gpu = download(*gpu, d_out.data(), static_cast<int64_t>(out_cpu.size()));
        EXPECT_TRUE(out_gpu == out_cpu) << "tokens " << c.tokens << " E " << c.dim << " offset " << c.offset_elems
                                        << " table " << dtype_name(table_t) << " out " << dtype_name(out_t)
                                        << ": max diff " << max_diff(unpack(out_gpu, out_t), unpack(out_cpu, out_t));
      }
}

TEST(CudaEmbedding, BackwardMatchesTheCpuBitForBit) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  for (const EmbCase& c : emb_cases())
    for (DType t : {DType::kF32, DType::kBF16}) {
      const EmbeddingShape s{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = t, .table_dtype = t};
      const std::vector<int32_t> ids = make_ids(c, 12);
      const std::vector<char> dout = pack(random_values(4, c.tokens * c.dim, t), t);
      const std::vector<float> dtable0 = random_values(5, c.vocab * c.dim, DType::kF32, 0.1f);  // += onto this
      std::vector<float> dtable_cpu = dtable0;
      embedding_backward(*cpu, s, dtable_cpu.data(), ids.data(), dout.data());

      const GpuCopy d_ids = upload(*gpu, ids);
      const GpuCopy d_dout = upload(*gpu, dout, c.offset_elems * dtype_size(t));
      const GpuCopy d_dtable = upload(*gpu, dtable0, c.offset_elems * 4);
      embedding_backward(*gpu, s, static_cast<float*>(d_dtable.data()), static_cast<const int32_t*>(d_ids.data()),
                         d_dout.data());
      const std::vector<float> dtable_gpu = download_as<float>(*gpu, d_dtable.data(), c.vocab * c.dim);
      EXPECT_EQ(std::memcmp(dtable_gpu.data(), dtable_cpu.data(), dtable_cpu.size() * 4), 0)
          << "tokens " << c.tokens << " V " << c.vocab << " E " << c.dim << " offset " << c.offset_elems << " "
          << dtype_name(t) << ": max diff " << max_diff(dtable_gpu, dtable_cpu);
    }
}

TEST(CudaEmbedding, BadIdsThrowBeforeAnythingIsWritten) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  const EmbeddingShape s{.tokens = 64, .vocab = 32000, .dim = 8};
  std::vector<int32_t> ids(64);
  for (int i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i * 100;
  ids[17] = 50000;  // the first bad one
  ids[40] = -3;
  const GpuCopy d_ids = upload(*gpu, ids);
  const std::vector<float> table = random_values(6, s.vocab * s.dim, DType::kF32);
  const GpuCopy d_table = upload(*gpu, table);
  const std::vector<char> nan(static_cast<size_t>(s.tokens * s.dim * 4), static_cast<char>(0xff));
  const GpuCopy d_out = upload(*gpu, nan);
  expect_invalid([&] { embedding_forward(*gpu, s, d_out.data(), static_cast<const int32_t*>(d_ids.data()),
                                         d_table.data()); },
                 "ids[17] = 50000 is outside [0, vocab = 32000)");
  EXPECT_TRUE(download(*gpu, d_out.data(), static_cast<int64_t>(nan.size())) == nan) << "forward wrote its output";

  const std::vector<float> dtable0 = random_values(7, s.vocab * s.dim, DType::kF32);
  const GpuCopy d_dtable = upload(*gpu, dtable0);
  const GpuCopy d_dout = upload(*gpu, random_values(8, s.tokens * s.dim, DType::kF32));
  expect_invalid([&] { embedding_backward(*gpu, s, static_cast<float*>(d_dtable.data()),
                                          static_cast<const int32_t*>(d_ids.data()), d_dout.data()); },
                 "ids[17] = 50000 is outside [0, vocab = 32000)");
  EXPECT_TRUE(download_as<float>(*gpu, d_dtable.data(), s.vocab * s.dim) == dtable0) << "backward wrote dtable";

  // Only a negative id: named too.
  ids[17] = 1;
  const GpuCopy d_ids2 = upload(*gpu, ids);
  expect_invalid([&] { embedding_forward(*gpu, s, d_out.data(), static_cast<const int32_t*>(d_ids2.data()),
                                         d_table.data()); },
                 "ids[40] = -3 is outside [0, vocab = 32000)");
}

// ---- AdamW ---------------------------------------------------------------------------------

TEST(CudaAdamW, StepMatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  const int64_t n = 1000003;  // not a multiple of 4 or of the 65536-element blocks
  for (int64_t offset : {0, 1})  // 1: every pointer off 16 bytes, the scalar path
    for (bool decay : {true, false})
      for (int64_t step : {1, 10}) {
        const AdamWParams a{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .step = step, .decay = decay};
        std::vector<float> p = random_values(20, n, DType::kF32), m = random_values(21, n, DType::kF32, 0.1f);
        std::vector<float> v = random_values(22, n, DType::kF32, 0.01f), g = random_values(23, n, DType::kF32);
        for (float& x : v) x = std::fabs(x);
        v[5] = 0.0f;  // a zero second moment: the update is m / eps-limited
        const GpuCopy dp = upload(*gpu, p, offset * 4), dm = upload(*gpu, m, offset * 4);
        const GpuCopy dv = upload(*gpu, v, offset * 4), dg = upload(*gpu, g, offset * 4);
        adamw_step(*cpu, p.data(), m.data(), v.data(), g.data(), n, a);
        adamw_step(*gpu, static_cast<float*>(dp.data()), static_cast<float*>(dm.data()), static_cast<float*>(dv.data()),
                   static_cast<const float*>(dg.data()), n, a);
        const auto p2 = download_as<float>(*gpu, dp.data(), n), m2 = download_as<float>(*gpu, dm.data(), n);
        const auto v2 = download_as<float>(*gpu, dv.data(), n);
        const std::string where = "offset " + std::to_string(offset) + " decay " + std::to_string(decay) +
                                  " step " + std::to_string(step);
        EXPECT_LE(max_diff(p2, p), 1e-6 * max_abs(p)) << where;
        EXPECT_LE(max_diff(m2, m), 1e-6 * max_abs(m)) << where;
        EXPECT_LE(max_diff(v2, v), 1e-6 * max_abs(v)) << where;
      }
}

TEST(CudaAdamW, SumOfSquaresMatchesTheCpuAndIsDeterministic) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{65536}, 3 * int64_t{65536} + 123})
    for (int64_t offset : {0, 1}) {
      const std::vector<float> g = random_values(30, n, DType::kF32, 3.0f);
      const GpuCopy dg = upload(*gpu, g, offset * 4);
      const double want = grad_sum_squares(*cpu, g.data(), n);
      const double got = grad_sum_squares(*gpu, static_cast<const float*>(dg.data()), n);
      const double again = grad_sum_squares(*gpu, static_cast<const float*>(dg.data()), n);
      EXPECT_LE(std::fabs(got - want), 2e-11 * std::fabs(want)) << "n " << n << " offset " << offset;
      EXPECT_EQ(got, again) << "n " << n << " offset " << offset << ": two calls differ";
      if (n == 0) {
        EXPECT_EQ(got, 0.0);
      }
    }
}

TEST(CudaAdamW, ScaleInPlaceMatchesTheCpuExactly) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  auto cpu = make_cpu_device({.threads = 1});
  const int64_t n = 100003;
  for (int64_t offset : {0, 1}) {
    std::vector<float> x = random_values(40, n, DType::kF32);
    const GpuCopy dx = upload(*gpu, x, offset * 4);
    scale_in_place(*cpu, x.data(), n, 0.37f);
    scale_in_place(*gpu, static_cast<float*>(dx.data()), n, 0.37f);
    EXPECT_TRUE(download_as<float>(*gpu, dx.data(), n) == x) << "offset " << offset;
  }
}

// ---- LM head loss --------------------------------------------------------------------------

constexpr int32_t kIgnore = -100;

struct LossCase {
  std::string name;
  int64_t tokens, dim, vocab;
  int64_t chunk = 0;      // chunk_tokens (0 = default)
  double ignored = 0.25;  // fraction of labels that are ignore_index (besides rows 10..14)
  DType dtype = DType::kF32, weight_dtype = DType::kF32;
};

std::ostream& operator<<(std::ostream& os, const LossCase& c) { return os << c.name; }

std::vector<LossCase> loss_cases() {
  return {
      {.name = "f32_default_chunk", .tokens = 37, .dim = 48, .vocab = 100},
      {.name = "f32_chunk1", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 1},
      {.name = "f32_chunk5_ragged_last", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 5},
      {.name = "f32_chunk_over_tokens", .tokens = 37, .dim = 48, .vocab = 100, .chunk = 64},
      {.name = "f32_vocab257_scalar_rows", .tokens = 20, .dim = 33, .vocab = 257, .chunk = 6, .ignored = 0.0},
      {.name = "f32_all_ignored", .tokens = 20, .dim = 32, .vocab = 52, .chunk = 6, .ignored = 1.0},
      {.name = "f32_wide_rows", .tokens = 9, .dim = 24, .vocab = 5000, .chunk = 4},
      {.name = "bf16_h_f32_w", .tokens = 30, .dim = 64, .vocab = 120, .chunk = 7, .dtype = DType::kBF16},
      {.name = "bf16_h_bf16_w", .tokens = 30, .dim = 40, .vocab = 90, .chunk = 10, .dtype = DType::kBF16,
       .weight_dtype = DType::kBF16},
      {.name = "bf16_bf16_vector_rows", .tokens = 33, .dim = 64, .vocab = 1024, .chunk = 8, .dtype = DType::kBF16,
       .weight_dtype = DType::kBF16},
      // V * E * 4 > 16 MiB: a bf16 w is widened in two vocab blocks.
      {.name = "f32_h_bf16_w_two_blocks", .tokens = 6, .dim = 64, .vocab = 70000, .chunk = 4,
       .weight_dtype = DType::kBF16},
      {.name = "bf16_bf16_two_blocks", .tokens = 5, .dim = 64, .vocab = 70000, .chunk = 2, .dtype = DType::kBF16,
       .weight_dtype = DType::kBF16},
  };
}

// unit * round(levels * uniform[-1, 1)): integers in [-levels, levels] times unit.
std::vector<float> quantized(uint64_t seed, int64_t n, int levels, float unit) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float x = static_cast<float>(levels) * hash_uniform(seed, 9, static_cast<uint64_t>(i));
    v[static_cast<size_t>(i)] = unit * std::round(x);
  }
  return v;
}

struct LossProblem {
  LmHeadLossShape shape;
  std::vector<float> h, w, dw0;  // values as stored (bf16-representable where stored as bf16)
  std::vector<int32_t> labels;
};

LossProblem make_loss_problem(const LossCase& c, uint64_t seed) {
  LossProblem p;
  p.shape = LmHeadLossShape{.tokens = c.tokens, .dim = c.dim, .vocab = c.vocab, .chunk_tokens = c.chunk,
                            .ignore_index = kIgnore, .dtype = c.dtype, .weight_dtype = c.weight_dtype};
  // h = k / 16 (|k| <= 16) and w = m / 64 (|m| <= M <= 256): exact in bf16, and every product is
  // an integer multiple of 2^-10 whose partial sums stay below 2^24 of those units (E <= 64), so
  // the logits are exact in fp32 in any summation order, on tensor cores too. M = 9 x 64 /
  // sqrt(E) gives logits of spread ~3: a softmax neither flat nor one-hot.
  EXPECT_LE(c.dim, 64) << "larger E would let the logits round";
  const int levels = static_cast<int>(std::lround(9.0 * 64.0 / std::sqrt(static_cast<double>(c.dim))));
  p.h = quantized(seed, c.tokens * c.dim, 16, 1.0f / 16);
  p.w = quantized(seed + 1, c.vocab * c.dim, std::min(levels, 256), 1.0f / 64);
  p.dw0 = random_values(seed + 2, c.vocab * c.dim, DType::kF32, 0.01f);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> cls(0, static_cast<int32_t>(c.vocab - 1));
  std::uniform_real_distribution<double> u(0, 1);
  p.labels.resize(static_cast<size_t>(c.tokens));
  int64_t labelled = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    const bool ignore = u(rng) < c.ignored || (t >= 10 && t < 15);  // rows 10..14 ignored
    p.labels[static_cast<size_t>(t)] = ignore ? kIgnore : cls(rng);
    labelled += !ignore;
  }
  p.shape.grad_scale = labelled > 0 ? static_cast<float>(1.0 / (2.0 * static_cast<double>(labelled))) : 1.0f;
  return p;
}

struct LossResult {
  LossSums sums;
  std::vector<int32_t> argmax;
  std::vector<float> dh, dw;
};

// with_argmax = false passes a null argmax (the result's argmax stays -1).
LossResult run_cpu(const LossProblem& p, bool backward, bool with_argmax = true) {
  auto cpu = make_cpu_device({.threads = 1});
  const LmHeadLossShape& s = p.shape;
  const std::vector<char> h = pack(p.h, s.dtype), w = pack(p.w, s.weight_dtype);
  std::vector<char> dh(h.size());
  LossResult r;
  r.argmax.assign(static_cast<size_t>(s.tokens), -1);
  r.dw = p.dw0;
  int32_t* am = with_argmax ? r.argmax.data() : nullptr;
  if (backward)
    lm_head_loss_forward_backward(*cpu, s, &r.sums, am, dh.data(), r.dw.data(), h.data(), p.labels.data(), w.data());
  else
    lm_head_loss_forward(*cpu, s, &r.sums, am, h.data(), p.labels.data(), w.data());
  r.dh = unpack(dh, s.dtype);
  return r;
}

// On the GPU; also checks that the workspace the call allocates is lm_head_loss_workspace_bytes.
LossResult run_gpu(Device& gpu, const LossProblem& p, bool backward, bool with_argmax = true) {
  const LmHeadLossShape& s = p.shape;
  const std::vector<char> h = pack(p.h, s.dtype), w = pack(p.w, s.weight_dtype);
  const GpuCopy d_h = upload(gpu, h), d_w = upload(gpu, w), d_labels = upload(gpu, p.labels);
  const GpuCopy d_dw = upload(gpu, p.dw0);
  const std::vector<char> nan(h.size(), static_cast<char>(0xff));  // `=`: every element must be written
  const GpuCopy d_dh = upload(gpu, nan);
  const GpuCopy d_argmax = upload(gpu, std::vector<int32_t>(static_cast<size_t>(s.tokens), -1));

  Allocator& alloc = gpu.allocator();
  const int other = static_cast<int>(Tag::kOther);
  const int64_t live_before = alloc.stats().live[other];
  alloc.reset_peaks();
  LossResult r;
  auto* am = with_argmax ? static_cast<int32_t*>(d_argmax.data()) : nullptr;
  const auto* lab = static_cast<const int32_t*>(d_labels.data());
  if (backward)
    lm_head_loss_forward_backward(gpu, s, &r.sums, am, d_dh.data(), static_cast<float*>(d_dw.data()), d_h.data(), lab,
                                  d_w.data());
  else
    lm_head_loss_forward(gpu, s, &r.sums, am, d_h.data(), lab, d_w.data());
  EXPECT_EQ(alloc.stats().peak[other] - live_before, lm_head_loss_workspace_bytes(s, backward))
      << "the workspace differs from lm_head_loss_workspace_bytes";
  r.argmax = download_as<int32_t>(gpu, d_argmax.data(), s.tokens);
  r.dh = unpack(download(gpu, d_dh.data(), static_cast<int64_t>(h.size())), s.dtype);
  r.dw = download_as<float>(gpu, d_dw.data(), s.vocab * s.dim);
  return r;
}

// The unfused fp64 reference and the magnitudes of the budgets.
struct LossReference {
  std::vector<double> logits;  // (tokens, V), exact (see make_loss_problem)
  double loss_sum = 0;
  int64_t count = 0;
  std::vector<double> dh, dw;
  double dh_mag = 0, dw_mag = 0;  // the largest sum of |terms| behind an element
};

LossReference reference(const LossProblem& p) {
  const LmHeadLossShape& s = p.shape;
  const int64_t T = s.tokens, E = s.dim, V = s.vocab;
  const double gs = s.grad_scale;
  LossReference R;
  R.logits.assign(static_cast<size_t>(T * V), 0.0);
  R.dh.assign(static_cast<size_t>(T * E), 0.0);
  R.dw.assign(p.dw0.begin(), p.dw0.end());
  std::vector<double> dw_abs(R.dw.size());
  for (size_t i = 0; i < dw_abs.size(); ++i) dw_abs[i] = std::fabs(R.dw[i]);
  std::vector<double> g(static_cast<size_t>(V)), dh_abs(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    double* z = &R.logits[static_cast<size_t>(t * V)];
    for (int64_t j = 0; j < V; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < E; ++k) acc += static_cast<double>(p.h[t * E + k]) * p.w[j * E + k];
      z[j] = acc;
    }
    const int32_t label = p.labels[static_cast<size_t>(t)];
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
        const double wj = p.w[j * E + k], hk = p.h[t * E + k];
        R.dh[t * E + k] += g[j] * wj;
        dh_abs[k] += std::fabs(g[j] * wj);
        R.dw[j * E + k] += g[j] * hk;
        dw_abs[j * E + k] += std::fabs(g[j] * hk);
      }
    R.dh_mag = std::max(R.dh_mag, max_abs(dh_abs));
  }
  R.dw_mag = max_abs(dw_abs);
  return R;
}

// The rounding error of a K-term fp32 sum of terms of total magnitude `mag` that holds with high
// probability (Higham and Mary's lambda sqrt(K) u, lambda = 4), plus a few roundings of the
// terms themselves (expf, the softmax scale, G).
double sum_floor(int64_t k, double mag) {
  return (8.0 + 4.0 * std::sqrt(static_cast<double>(k))) * std::ldexp(1.0, -24) * mag;
}

// err(GPU) <= 2 err(CPU) + floor, both against the fp64 reference (see the top of the file).
void expect_within(const char* what, double err_gpu, double err_cpu, double floor) {
  EXPECT_LE(err_gpu, 2 * err_cpu + floor) << what << ": GPU error " << err_gpu << ", CPU error " << err_cpu
                                          << ", floor " << floor;
}

void check_against_reference(const LossProblem& p, const LossReference& R, const LossResult& cpu,
                             const LossResult& gpu, bool backward, bool with_argmax = true) {
  const LmHeadLossShape& s = p.shape;
  EXPECT_EQ(gpu.sums.count, R.count);
  EXPECT_EQ(cpu.sums.count, R.count);
  // Per labelled row, loss = max + log(sum of fp32 exponentials) - logit[label], all exact but
  // the exponentials (within 2 ulps = 4 x 2^-24 relative each on the GPU), so the row's loss is
  // within ~4 x 2^-24 (the fp64 sum and log add nothing visible): 8 x 2^-24 per row.
  expect_within("loss_sum", std::fabs(gpu.sums.loss_sum - R.loss_sum), std::fabs(cpu.sums.loss_sum - R.loss_sum),
                8 * std::ldexp(1.0, -24) * static_cast<double>(R.count));

  // argmax: the logits are exact, so both backends pick the first index of the exact maximum.
  int64_t bad = 0;
  for (int64_t t = 0; t < (with_argmax ? s.tokens : 0); ++t) {
    const double* z = &R.logits[static_cast<size_t>(t * s.vocab)];
    int32_t first = 0;
    for (int64_t j = 1; j < s.vocab; ++j)
      if (z[j] > z[first]) first = static_cast<int32_t>(j);
    const int32_t a = gpu.argmax[static_cast<size_t>(t)];
    if ((a != first || cpu.argmax[static_cast<size_t>(t)] != first) && bad++ < 5)
      ADD_FAILURE() << "argmax[" << t << "]: GPU " << a << ", CPU " << cpu.argmax[t] << ", reference " << first;
  }
  EXPECT_EQ(bad, 0) << "rows whose argmax is not the first maximum";
  if (!backward) return;

  // dh: a V-term sum per element (then one bf16 rounding, <= 2^-8 relative, when dh is bf16);
  // dw: dw0 plus a tokens-term sum.
  const double dh_round = s.dtype == DType::kBF16 ? std::ldexp(1.0, -8) * R.dh_mag : 0.0;
  expect_within("dh", max_diff(gpu.dh, R.dh), max_diff(cpu.dh, R.dh), dh_round + sum_floor(s.vocab, R.dh_mag));
  expect_within("dw", max_diff(gpu.dw, R.dw), max_diff(cpu.dw, R.dw), sum_floor(s.tokens + 1, R.dw_mag));
  // Ignored rows: G = 0, so dh is exactly 0 there.
  int64_t nonzero = 0;
  for (int64_t t = 0; t < s.tokens; ++t)
    if (p.labels[static_cast<size_t>(t)] == s.ignore_index)
      for (int64_t k = 0; k < s.dim; ++k) nonzero += gpu.dh[static_cast<size_t>(t * s.dim + k)] != 0.0f;
  EXPECT_EQ(nonzero, 0) << "dh elements of ignored rows that are not 0";
}

class CudaLmHeadLoss : public ::testing::TestWithParam<LossCase> {};

TEST_P(CudaLmHeadLoss, ForwardBackwardMatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  const LossProblem p = make_loss_problem(GetParam(), 101);
  const LossReference R = reference(p);
  const LossResult cpu = run_cpu(p, /*backward=*/true);
  const LossResult got = run_gpu(*gpu, p, /*backward=*/true);
  check_against_reference(p, R, cpu, got, /*backward=*/true);
}

TEST_P(CudaLmHeadLoss, ForwardOnlyMatchesTheCpu) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  const LossProblem p = make_loss_problem(GetParam(), 202);
  const LossReference R = reference(p);
  const LossResult cpu = run_cpu(p, /*backward=*/false);
  const LossResult got = run_gpu(*gpu, p, /*backward=*/false);
  check_against_reference(p, R, cpu, got, /*backward=*/false);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLmHeadLoss, ::testing::ValuesIn(loss_cases()),
                         [](const ::testing::TestParamInfo<LossCase>& i) { return i.param.name; });

// Without argmax, a chunk whose rows are all ignored skips its GEMMs and zeroes its dh rows (the
// CPU's contract): non-finite h rows there must reach neither dh nor dw.
TEST(CudaLmHeadLossSkip, ChunksWithoutLabelsAreSkippedAsOnTheCpu) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  LossProblem p = make_loss_problem(loss_cases()[2], 505);  // chunks of 5 rows; rows 10..14 ignored
  const int64_t E = p.shape.dim;
  for (int64_t i = 10 * E; i < 15 * E; ++i) p.h[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();
  const LossReference R = reference(p);
  const LossResult cpu = run_cpu(p, /*backward=*/true, /*with_argmax=*/false);
  const LossResult got = run_gpu(*gpu, p, /*backward=*/true, /*with_argmax=*/false);
  check_against_reference(p, R, cpu, got, /*backward=*/true, /*with_argmax=*/false);
  EXPECT_TRUE(got.argmax == std::vector<int32_t>(static_cast<size_t>(p.shape.tokens), -1)) << "argmax written";
}

// Same inputs, same bits: the loss, dh and dw of two calls agree exactly.
TEST(CudaLmHeadLossDeterminism, RepeatedCallsAreBitIdentical) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  for (const LossCase& c : {loss_cases()[2], loss_cases()[9]}) {
    const LossProblem p = make_loss_problem(c, 303);
    const LossResult a = run_gpu(*gpu, p, true), b = run_gpu(*gpu, p, true);
    EXPECT_EQ(a.sums.loss_sum, b.sums.loss_sum) << c.name;
    EXPECT_EQ(a.sums.count, b.sums.count) << c.name;
    EXPECT_TRUE(a.argmax == b.argmax) << c.name;
    EXPECT_EQ(std::memcmp(a.dh.data(), b.dh.data(), a.dh.size() * 4), 0) << c.name;
    EXPECT_EQ(std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4), 0) << c.name;
  }
}

TEST(CudaLmHeadLossLabels, BadLabelsThrowBeforeAnythingIsWritten) {
  REQUIRE_GPU();
  auto gpu = gpu_device();
  LossProblem p = make_loss_problem(loss_cases()[2], 404);  // 37 tokens, V = 100, chunks of 5
  p.labels[17] = 100;                                       // the first bad one (== V)
  p.labels[30] = -5;
  const LmHeadLossShape& s = p.shape;
  const std::vector<char> h = pack(p.h, s.dtype), w = pack(p.w, s.weight_dtype);
  const GpuCopy d_h = upload(*gpu, h), d_w = upload(*gpu, w), d_dw = upload(*gpu, p.dw0);
  const std::vector<char> nan(h.size(), static_cast<char>(0xff));
  const GpuCopy d_dh = upload(*gpu, nan);
  const std::vector<int32_t> minus1(static_cast<size_t>(s.tokens), -1);
  const GpuCopy d_argmax = upload(*gpu, minus1);
  auto* am = static_cast<int32_t*>(d_argmax.data());
  auto check_nothing_written = [&](const LossSums& sums) {
    EXPECT_EQ(sums.loss_sum, 0.0);
    EXPECT_EQ(sums.count, 0);
    EXPECT_TRUE(download(*gpu, d_dh.data(), static_cast<int64_t>(nan.size())) == nan) << "dh written";
    EXPECT_TRUE(download_as<float>(*gpu, d_dw.data(), s.vocab * s.dim) == p.dw0) << "dw written";
    EXPECT_TRUE(download_as<int32_t>(*gpu, am, s.tokens) == minus1) << "argmax written";
  };

  GpuCopy d_labels = upload(*gpu, p.labels);
  const std::string msg = "labels[17] = 100 is neither ignore_index (-100) nor in [0, vocab = 100)";
  LossSums sums;
  expect_invalid([&] { lm_head_loss_forward_backward(*gpu, s, &sums, am, d_dh.data(), static_cast<float*>(d_dw.data()),
                                                     d_h.data(), static_cast<const int32_t*>(d_labels.data()),
                                                     d_w.data()); },
                 msg);
  check_nothing_written(sums);
  expect_invalid([&] { lm_head_loss_forward(*gpu, s, &sums, am, d_h.data(),
                                            static_cast<const int32_t*>(d_labels.data()), d_w.data()); },
                 msg);
  check_nothing_written(sums);

  p.labels[17] = 3;  // now only the negative one
  d_labels = upload(*gpu, p.labels);
  expect_invalid([&] { lm_head_loss_forward(*gpu, s, &sums, am, d_h.data(),
                                            static_cast<const int32_t*>(d_labels.data()), d_w.data()); },
                 "labels[30] = -5 is neither ignore_index (-100) nor in [0, vocab = 100)");
  check_nothing_written(sums);
}

}  // namespace
}  // namespace untied
