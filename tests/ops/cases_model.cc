// The model ops of the cross-backend op test (op_case.h): the token embedding, AdamW with the
// clipping helpers, and the fused LM head loss (its fp64 reference: loss_reference.cc). Ported
// from the GPU suite (tests/cuda/cuda_model_ops_test.cc: "gpu" cases) and the older emulator
// test (tests/cuda_emu/model_ops_emu_test.cc: "emu" cases): f32 and bf16 storage, ragged sizes
// (E and V not multiples of the vector width, a last loss chunk shorter than the others),
// pointers off the 16-byte alignment (the scalar paths), ignored labels, repeated ids (runs
// longer than the backward's 8-row unroll, one id only), 1-, 2- and 3-digit-pass sort bit ranges,
// a chunk without labels, a bf16 LM head in two widened blocks, and the data checks (a bad id or
// label throws Error(kInvalidArgument) naming it, with the CPU's message, and nothing is written).
//
// Rules:
//   embedding forward and backward: exact on both. The forward is a copy or one rounding to
//     bf16 (round to nearest even on both); the backward adds the same fp32 values in the same
//     token order (embedding.cu), so every bit agrees.
//   adamw_step: exact on the emulated GPU (the same fp32 operations, one rounding each, the CPU
//     kernel compiled without fused multiply-adds there: cases_elementwise.cc); on a GPU <= 1e-6
//     of the largest |value|: each element is at most 8 fp32 operations on both; the CPU compiler
//     may fuse a multiply-add (one rounding fewer), so the two can differ by a few ulps of the
//     operands: 8 x 2^-24 ~ 5e-7.
//   grad_sum_squares: <= 2e-11 relative (the emulator test's cases: 1e-12). Both sum squares
//     exactly formed in fp64 (a float squared is exact in a double) over the same fixed blocks of
//     65536, in different orders inside a block; the terms are positive, so each result is within
//     65536 x 2^-53 ~ 7.3e-12 of the exact sum, relative (worst case; ~3e-14 typically, ~1e-16
//     for the emulator test's sizes). Two calls: the same bits.
//   scale_in_place: exact (one fp32 multiply).
//   lm_head_loss, GPU suite: h and w are small multiples of 2^-4 and 2^-6, so the logits are
//     exact on both backends and the argmax must be the reference's first maximum. The rest is
//     checked against an fp64 reference (loss_reference.cc says how): the device's error must be
//     at most 2 x the CPU's own error plus a floor.
//   lm_head_loss, emulator test (random inputs): count exact; argmax exact (the same logits up to
//     the GEMM's summation order; random inputs have no near ties); loss_sum to 1e-6 relative and
//     dh (f32) / dw increments to 1e-5 of their largest magnitude (the row sums are fp64 in
//     another order, so G may differ from the CPU's in the last fp32 bit; the GEMMs on the two
//     sides may sum in different orders); a bf16 dh element additionally one bf16 rounding (2^-8
//     relative), a dw element 2^-22 of its prior contents; ignored rows' dh exactly 0.
#include <cmath>
#include <cstring>

#include "ops/loss_reference.h"
#include "ops/op_case.h"
#include "untied/kernels/adamw.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/lm_head_loss.h"

namespace untied::ops {
namespace {

constexpr DType kF = DType::kF32, kB = DType::kBF16;
std::string n(int64_t v) { return std::to_string(v); }
const std::vector<double> kNone;

std::function<void(HostBuffer&, test::Rng&)> fill_ints(std::vector<int32_t> v) {
  return [v](HostBuffer& b, test::Rng&) {
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, v[static_cast<size_t>(i)]);
  };
}

// ---- embedding --------------------------------------------------------------------------------

struct EmbCase {
  int64_t tokens, vocab, dim;
  int64_t offset_elems = 0;  // table / out / dout / dtable start this many elements into their buffers
  int32_t only_id = -1;      // >= 0: every token has this id (one run over all tokens)
};

// Random ids in [0, V), or only `only_id`; `edges`: the first and last ids of the vocabulary appear.
std::function<void(HostBuffer&, test::Rng&)> fill_ids(int64_t vocab, int32_t only_id, bool edges) {
  return [=](HostBuffer& b, test::Rng& rng) {
    const std::vector<int32_t> v = test::uniform_ints(rng, b.elems, 0, static_cast<int32_t>(vocab - 1));
    for (int64_t i = 0; i < b.elems; ++i) b.set(i, only_id >= 0 ? only_id : v[static_cast<size_t>(i)]);
    if (edges && b.elems > 2) {
      b.set(0, 0);
      b.set(b.elems - 1, static_cast<double>(vocab - 1));
    }
  };
}

OpCase embedding_forward_case(const std::string& origin, const EmbCase& c, DType out_t, DType table_t) {
  const EmbeddingShape s{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = out_t, .table_dtype = table_t};
  OpCase k;
  k.name = case_name({"embedding_forward", origin, "out" + dt(out_t), "table" + dt(table_t), "t" + n(c.tokens),
                      "v" + n(c.vocab), "e" + n(c.dim), "skew" + n(c.offset_elems), c.only_id >= 0 ? "one_id" : ""});
  BufferSpec ids{.name = "ids", .elem = Elem::kI32, .elems = c.tokens, .fill = fill_ids(c.vocab, c.only_id, false)};
  BufferSpec out = output("out", out_t, c.tokens * c.dim, c.offset_elems, everything(), both(bits()));
  out.fill = fill_byte(0xff);  // a NaN pattern: every element must be written
  k.buffers = {ids, input("table", table_t, c.vocab * c.dim, c.offset_elems), out};
  k.run = [s](Ctx& x) {
    embedding_forward(x.dev, s, x[2], x.as<const int32_t>(0), x[1]);
    return std::vector<double>{};
  };
  k.one_schedule = c.tokens * c.dim > 100000;  // no barrier in the kernels: the emulator's time
  return k;
}

OpCase embedding_backward_case(const std::string& origin, const EmbCase& c, DType t) {
  const EmbeddingShape s{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = t, .table_dtype = t};
  OpCase k;
  k.name = case_name({"embedding_backward", origin, dt(t), "t" + n(c.tokens), "v" + n(c.vocab), "e" + n(c.dim),
                      "skew" + n(c.offset_elems), c.only_id >= 0 ? "one_id" : ""});
  BufferSpec ids{.name = "ids", .elem = Elem::kI32, .elems = c.tokens, .fill = fill_ids(c.vocab, c.only_id, false)};
  BufferSpec dtable = output("dtable", kF, c.vocab * c.dim, c.offset_elems, everything(), both(bits()));
  dtable.lo = -0.1, dtable.hi = 0.1;  // += onto this
  k.buffers = {ids, input("dout", t, c.tokens * c.dim, c.offset_elems), dtable};
  k.run = [s](Ctx& x) {
    embedding_backward(x.dev, s, x.as<float>(2), x.as<const int32_t>(0), x[1]);
    return std::vector<double>{};
  };
  k.one_schedule = c.tokens * c.dim > 100000;
  return k;
}

// The emulator test: forward and backward on one set of ids (the vocabulary's edges among them).
OpCase embedding_both_case(const EmbCase& c, DType out_t, DType table_t) {
  const EmbeddingShape s{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = out_t, .table_dtype = table_t};
  OpCase k;
  k.name = case_name({"embedding", "emu", "out" + dt(out_t), "table" + dt(table_t), "t" + n(c.tokens), "v" + n(c.vocab),
                      "e" + n(c.dim), "skew" + n(c.offset_elems)});
  const int64_t sk = c.offset_elems;
  BufferSpec ids{.name = "ids", .elem = Elem::kI32, .elems = c.tokens, .fill = fill_ids(c.vocab, -1, true)};
  k.buffers = {ids, input("table", table_t, c.vocab * c.dim, sk),
               output("out", out_t, c.tokens * c.dim, sk, everything(), both(bits())),
               output("dtable", kF, c.vocab * c.dim, sk, everything(), both(bits())),
               input("dout", out_t, c.tokens * c.dim, sk)};
  k.run = [s](Ctx& x) {
    embedding_forward(x.dev, s, x[2], x.as<const int32_t>(0), x[1]);
    embedding_backward(x.dev, s, x.as<float>(3), x.as<const int32_t>(0), x[4]);
    return std::vector<double>{};
  };
  k.one_schedule = c.vocab * c.dim > 100000;
  return k;
}

// A call with bad ids: refused on both devices with the same message, nothing written.
OpCase embedding_bad_ids_case(const std::string& name, const EmbeddingShape& s, std::vector<int32_t> ids, bool backward,
                              const std::string& message) {
  OpCase k;
  k.name = name;
  BufferSpec id{.name = "ids", .elem = Elem::kI32, .elems = s.tokens, .fill = fill_ints(std::move(ids))};
  BufferSpec out = output("out", s.dtype, s.tokens * s.dim, 0, everything(), both(bits()));
  out.fill = fill_byte(0xff);
  k.buffers = {id, input("table", s.table_dtype, s.vocab * s.dim), out,
               output("dtable", kF, s.vocab * s.dim, 0, everything(), both(bits())),
               input("dout", s.dtype, s.tokens * s.dim)};
  k.run = [s, backward](Ctx& x) {
    if (backward)
      embedding_backward(x.dev, s, x.as<float>(3), x.as<const int32_t>(0), x[4]);
    else
      embedding_forward(x.dev, s, x[2], x.as<const int32_t>(0), x[1]);
    return std::vector<double>{};
  };
  k.refused_on_cpu = k.refused_on_dut = Refusal{.kind = ErrorKind::kInvalidArgument, .message = message};
  return k;
}

void add_embedding(std::vector<OpCase>& out) {
  const EmbCase gpu[] = {
      {.tokens = 37, .vocab = 50, .dim = 48},                     // vector path
      {.tokens = 37, .vocab = 50, .dim = 13},                     // E % 4 != 0: scalar path
      {.tokens = 37, .vocab = 50, .dim = 1000},                   // two column blocks
      {.tokens = 37, .vocab = 50, .dim = 1029},                   // nine column blocks, scalar
      {.tokens = 37, .vocab = 50, .dim = 48, .offset_elems = 1},  // misaligned: scalar path
      {.tokens = 300, .vocab = 7, .dim = 20},                     // runs of ~40 repeated ids
      {.tokens = 1000, .vocab = 5, .dim = 12, .only_id = 3},      // one run of 1000
      {.tokens = 70000, .vocab = 3, .dim = 8},                    // more tokens than blocks
  };
  for (const EmbCase& c : gpu) {
    for (DType table_t : {kF, kB})
      for (DType out_t : {kF, kB}) out.push_back(embedding_forward_case("gpu", c, out_t, table_t));
    for (DType t : {kF, kB}) out.push_back(embedding_backward_case("gpu", c, t));
  }
  // GPU suite: the first bad id is named (and only a negative one, once the first is fixed).
  {
    const EmbeddingShape s{.tokens = 64, .vocab = 32000, .dim = 8};
    std::vector<int32_t> ids(64);
    for (int i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i * 100;
    ids[17] = 50000;  // the first bad one
    ids[40] = -3;
    const std::string msg = "ids[17] = 50000 is outside [0, vocab = 32000)";
    out.push_back(embedding_bad_ids_case("embedding_forward_gpu_refuses_bad_ids", s, ids, false, msg));
    out.push_back(embedding_bad_ids_case("embedding_backward_gpu_refuses_bad_ids", s, ids, true, msg));
    ids[17] = 1;
    out.push_back(embedding_bad_ids_case("embedding_forward_gpu_refuses_a_negative_id", s, ids, false,
                                         "ids[40] = -3 is outside [0, vocab = 32000)"));
  }
  // Emulator test: every storage combination; bad ids at `first` (the one named) and `second` (-7).
  auto bad_ids = [&](DType d, DType t, int32_t bad, int64_t tokens, int64_t first, int64_t second) {
    const EmbeddingShape s{.tokens = tokens, .vocab = 9, .dim = 12, .dtype = d, .table_dtype = t};
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 5 + 2) % 9);
    ids[static_cast<size_t>(first)] = bad;
    ids[static_cast<size_t>(second)] = -7;
    const std::string msg = "ids[" + n(first) + "] = " + n(bad) + " is outside [0, vocab = 9)";
    for (bool backward : {false, true})
      out.push_back(embedding_bad_ids_case(
          case_name({backward ? "embedding_backward" : "embedding_forward", "emu", "out" + dt(d), "table" + dt(t),
                     "refuses_id", bad < 0 ? "minus" + n(-bad) : n(bad), "at" + n(first), "of" + n(tokens)}),
          s, ids, backward, msg));
  };
  const DType combos[4][2] = {{kF, kF}, {kB, kB}, {kB, kF}, {kF, kB}};  // (out, table)
  for (const auto& d : combos) {
    out.push_back(
        embedding_both_case({37, 11, 20, 0}, d[0], d[1]));  // vector path (E % 4 == 0), repeated ids, 1 sort pass
    out.push_back(embedding_both_case({29, 300, 13, 0}, d[0], d[1]));  // scalar path (E odd), 2 sort passes
    out.push_back(embedding_both_case({23, 7, 24, 1}, d[0], d[1]));    // scalar path (pointers one element off)
    bad_ids(d[0], d[1], d[0] == kF ? 9 : -1, 40, 13, 29);
  }
  out.push_back(embedding_both_case({45, 5, 516, 0}, kF, kB));      // two column blocks (512 columns per vector block)
  out.push_back(embedding_both_case({31, 70000, 130, 0}, kB, kF));  // two column blocks, scalar path, 3 sort passes
  out.push_back(embedding_both_case({300, 2, 8, 0}, kF, kF));       // runs of ~150 tokens: gallop, unrolled rows, tail
  out.push_back(embedding_both_case({19, 1, 5, 0}, kB, kB));        // one id (a 1-bit sort), every token in one run
  bad_ids(kF, kF, 12, 700, 333, 610);                               // bad ids in the 2nd and 3rd blocks of the check
}

// ---- AdamW and the clipping helpers ------------------------------------------------------------

void add_adamw(std::vector<OpCase>& out) {
  // p, m, v, g; v >= 0 with v[5] = 0 (a zero second moment: the update is m / eps-limited).
  auto adamw_case = [&](const std::string& origin, int64_t len, int64_t skew, bool decay, int64_t step, float lr,
                        int steps, int64_t v_skew) {
    const AdamWParams a{
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = step, .decay = decay};
    const Compare rule = emu_else(bits(), close(1e-6));
    OpCase k;
    k.name = case_name({"adamw", origin, "n" + n(len), "skew" + n(skew), decay ? "decay" : "no_decay", "step" + n(step),
                        steps > 1 ? "twice" : ""});
    BufferSpec m = output("m", kF, len, skew, everything(), rule);
    m.lo = -0.1, m.hi = 0.1;
    BufferSpec v = output("v", kF, len, v_skew, everything(), rule);
    v.fill = [origin](HostBuffer& b, test::Rng& rng) {
      const std::vector<double> x = test::uniform_values(rng, b.total(), kF, origin == "gpu" ? -0.01 : 0.0, 0.01);
      for (int64_t i = 0; i < b.total(); ++i) b.set(i - b.skew, std::fabs(x[static_cast<size_t>(i)]));
      if (origin == "gpu") b.set(5, 0.0);
    };
    k.buffers = {output("p", kF, len, skew, everything(), rule), m, v, input("g", kF, len, skew)};
    k.run = [=](Ctx& x) {
      for (int i = 0; i < steps; ++i)  // twice: the second step reads the first's m and v
        adamw_step(x.dev, x.as<float>(0), x.as<float>(1), x.as<float>(2), x.as<const float>(3), len, a);
      return std::vector<double>{};
    };
    k.one_schedule = len > 100000;  // element-wise, no barrier: the emulator's time
    out.push_back(k);
  };
  for (int64_t offset : {0, 1})  // 1: every pointer off 16 bytes, the scalar path
    for (bool decay : {true, false})
      for (int64_t step : {1, 10}) adamw_case("gpu", 1000003, offset, decay, step, 1e-3f, 1, offset);
  adamw_case("emu", 1031, 0, true, 7, 3e-3f, 2, 0);   // vector + tail
  adamw_case("emu", 1030, 1, false, 7, 3e-3f, 2, 0);  // scalar

  auto sum_squares_case = [&](const std::string& origin, int64_t len, int64_t skew, double range, Compare rule) {
    OpCase k;
    k.name = case_name({"grad_sum_squares", origin, "n" + n(len), "skew" + n(skew)});
    k.buffers = {input("g", kF, len, skew, -range, range)};
    k.run = [len](Ctx& x) { return std::vector<double>{grad_sum_squares(x.dev, x.as<const float>(0), len)}; };
    k.scalars = {{"sum", rule}};  // n = 0: exactly 0 (the CPU's), as tol = rel x |0|
    k.repeat = true;              // two calls: the same bits
    out.push_back(k);
  };
  for (int64_t len : {int64_t{0}, int64_t{5}, int64_t{65536}, 3 * int64_t{65536} + 123})
    for (int64_t offset : {0, 1}) sum_squares_case("gpu", len, offset, 3.0, both(close(2e-11)));
  const Compare emu_sum = emu_else(close(1e-12), close(2e-11));
  sum_squares_case("emu", 2 * 65536 + 1001, 0, 1.0, emu_sum);  // three blocks of 65536, vector
  sum_squares_case("emu", 65536 + 3, 1, 1.0, emu_sum);         // scalar
  sum_squares_case("emu", 5, 0, 1.0, emu_sum);

  auto scale_case = [&](const std::string& origin, int64_t len, int64_t skew) {
    OpCase k;
    k.name = case_name({"scale_in_place", origin, "n" + n(len), "skew" + n(skew)});
    k.buffers = {output("x", kF, len, skew, everything(), both(bits()))};
    k.run = [len](Ctx& x) {
      scale_in_place(x.dev, x.as<float>(0), len, 0.37f);
      return std::vector<double>{};
    };
    out.push_back(k);
  };
  for (int64_t offset : {0, 1}) scale_case("gpu", 100003, offset);
  scale_case("emu", 1031, 0);  // vector + tail
  scale_case("emu", 1029, 1);  // scalar
}

// ---- LM head loss -----------------------------------------------------------------------------

// Buffers of a loss case, in this order: h, w, labels, argmax, sums (host), then dh, dw when backward.
enum LossBuf { kH, kW, kLabels, kArgmax, kSums, kDh, kDw };

OpCase loss_case(const std::string& name, const LmHeadLossShape& s, bool backward, bool with_argmax,
                 std::vector<BufferSpec> inputs, double sums_loss, int64_t sums_count, Compare argmax_rule,
                 Compare dh_rule, Compare dw_rule, double dw_lo, double dw_hi, unsigned char argmax_byte) {
  OpCase k;
  k.name = name;
  BufferSpec am{.name = "argmax", .elem = Elem::kI32, .elems = s.tokens};
  am.fill = fill_byte(argmax_byte);                                                   // 0xff: -1 everywhere
  if (with_argmax) am.output = true, am.region = everything(), am.cmp = argmax_rule;  // else it must stay untouched
  BufferSpec sums{.name = "sums",
                  .elem = Elem::kU8,
                  .elems = static_cast<int64_t>(sizeof(LossSums)),
                  .host = true,
                  .output = true,
                  .region = everything(),
                  .cmp = both(custom())};
  sums.fill = [sums_loss, sums_count](HostBuffer& b, test::Rng&) {
    const LossSums v{sums_loss, sums_count};
    std::memcpy(b.data(), &v, sizeof v);
  };
  k.buffers = std::move(inputs);
  k.buffers.push_back(am);
  k.buffers.push_back(sums);
  if (backward) {
    BufferSpec dh = output("dh", s.dtype, s.tokens * s.dim, 0, everything(), dh_rule);
    dh.fill = fill_byte(0xff);  // `=`: every element must be written
    BufferSpec dw = output("dw", kF, s.vocab * s.dim, 0, everything(), dw_rule);
    dw.lo = dw_lo, dw.hi = dw_hi;
    k.buffers.push_back(dh);
    k.buffers.push_back(dw);
  }
  k.run = [s, backward, with_argmax](Ctx& x) {
    auto* sums = x.as<LossSums>(kSums);
    int32_t* am = with_argmax ? x.as<int32_t>(kArgmax) : nullptr;
    if (backward)
      lm_head_loss_forward_backward(x.dev, s, sums, am, x[kDh], x.as<float>(kDw), x[kH], x.as<const int32_t>(kLabels),
                                    x[kW]);
    else
      lm_head_loss_forward(x.dev, s, sums, am, x[kH], x.as<const int32_t>(kLabels), x[kW]);
    return std::vector<double>{sums->loss_sum, static_cast<double>(sums->count)};
  };
  k.dut_scratch_bytes = lm_head_loss_workspace_bytes(s, backward);
  return k;
}

// GPU suite: quantized inputs (exact logits) against the fp64 reference.
OpCase gpu_loss_case(const LossCase& c, bool backward, bool with_argmax, const std::string& what) {
  const LmHeadLossShape s = loss_shape(c);
  BufferSpec h{.name = "h", .elem = elem_of(c.dtype), .elems = c.tokens * c.dim, .fill = fill_loss_h(c)};
  BufferSpec w{.name = "w", .elem = elem_of(c.weight_dtype), .elems = c.vocab * c.dim, .fill = fill_loss_w(c)};
  BufferSpec labels{.name = "labels", .elem = Elem::kI32, .elems = c.tokens, .fill = fill_loss_labels(c)};
  OpCase k = loss_case(case_name({"lm_head_loss", "gpu", c.name, what}), s, backward, with_argmax, {h, w, labels}, 0.0,
                       0, both(custom()), both(custom()), both(custom()), -0.01, 0.01, 0xff);
  k.scalars = {{"loss_sum", both(custom())}, {"count", both(custom())}};
  k.one_schedule = c.vocab * c.dim > 1'000'000;  // the widened two-block LM heads: the emulator's time
  k.check = [c, backward, with_argmax](const RunResult& init, const RunResult& cpu, const RunResult& dut, bool) {
    check_loss_against_reference(c, init, cpu, dut, backward, with_argmax);
  };
  return k;
}

// The emulator test: random inputs against the CPU.
struct EmuLossCase {
  int64_t tokens, dim, vocab, chunk;
  bool backward, with_argmax;
  bool ignore_chunk;  // every label of the second chunk is ignore_index
};

OpCase emu_loss_case(const EmuLossCase& c, DType dt_h, DType wt) {
  const std::vector<int32_t> labels = emu_loss_labels(c.tokens, c.vocab, c.chunk, c.ignore_chunk);
  int64_t labelled = 0;
  for (int32_t l : labels) labelled += l != kIgnoreIndex;
  const LmHeadLossShape s{.tokens = c.tokens,
                          .dim = c.dim,
                          .vocab = c.vocab,
                          .chunk_tokens = c.chunk,
                          .ignore_index = kIgnoreIndex,
                          .grad_scale = 1.0f / static_cast<float>(std::max<int64_t>(labelled, 1)),
                          .dtype = dt_h,
                          .weight_dtype = wt};
  BufferSpec l{.name = "labels", .elem = Elem::kI32, .elems = c.tokens, .fill = fill_ints(labels)};
  // bf16 dh: the two sides' fp32 values, summed in another order, may round to neighbouring bf16
  // values: one ulp, up to 2^-7 of the element (seen on an H200: 2 of 20480 elements at e 4096).
  const Rule dh = Rule{.kind = Rule::Kind::kClose, .rel = 1e-5, .per_elem_rel = dt_h == kB ? std::ldexp(1.0, -7) : 0.0};
  const Rule dw = Rule{.kind = Rule::Kind::kClose, .rel = 1e-5, .init_rel = std::ldexp(1.0, -22), .increment = true};
  OpCase k =
      loss_case(case_name({"lm_head_loss", "emu", "h" + dt(dt_h), "w" + dt(wt), "t" + n(c.tokens), "e" + n(c.dim),
                           "v" + n(c.vocab), "chunk" + n(c.chunk), c.backward ? "forward_backward" : "forward",
                           c.with_argmax ? "argmax" : "", c.ignore_chunk ? "a_chunk_without_labels" : ""}),
                s, c.backward, c.with_argmax, {input("h", dt_h, c.tokens * c.dim), input("w", wt, c.vocab * c.dim), l},
                0.25, 3, both(bits()), both(dh), both(dw), -1.0, 1.0, 0xff);
  k.scalars = {{"loss_sum", both(close(1e-6))}, {"count", both(bits())}};
  if (c.backward)
    k.check = [c](const RunResult& init, const RunResult& cpu, const RunResult& dut, bool) {
      expect_ignored_rows_zero(init, cpu, dut, c.dim);
    };
  k.one_schedule = c.dim * c.vocab > 1'000'000;  // the emulator's time
  return k;
}

OpCase loss_refusal(OpCase k, const std::string& message) {
  k.refused_on_cpu = k.refused_on_dut = Refusal{.kind = ErrorKind::kInvalidArgument, .message = message};
  k.check = nullptr;
  k.scalars.clear();
  return k;
}

void add_loss(std::vector<OpCase>& out) {
  for (const LossCase& c : loss_cases()) {
    out.push_back(gpu_loss_case(c, true, true, "forward_backward"));
    out.push_back(gpu_loss_case(c, false, true, "forward"));
  }
  // Without argmax, a chunk whose rows are all ignored skips its GEMMs and zeroes its dh rows (the
  // CPU's contract): non-finite h rows there must reach neither dh nor dw, and argmax stays -1.
  {
    LossCase c = loss_cases()[2];  // chunks of 5 rows; rows 10..14 ignored
    c.inf_rows_10_to_14 = true;
    OpCase k = gpu_loss_case(c, true, false, "chunks_without_labels_are_skipped");
    out.push_back(k);
  }
  // Same inputs, same bits: the loss, dh and dw of two calls agree exactly.
  for (const LossCase& c : {loss_cases()[2], loss_cases()[9]}) {
    OpCase k = gpu_loss_case(c, true, true, "twice_bit_identical");
    k.repeat = true;
    out.push_back(k);
  }
  // Bad labels: refused before anything is written (sums, dh, dw, argmax), naming the first.
  {
    LossCase c = loss_cases()[2];          // 37 tokens, V = 100, chunks of 5
    c.bad_labels = {{17, 100}, {30, -5}};  // the first bad one (== V), then a negative one
    const std::string msg = "labels[17] = 100 is neither ignore_index (-100) nor in [0, vocab = 100)";
    out.push_back(loss_refusal(gpu_loss_case(c, true, true, "forward_backward_refuses_bad_labels"), msg));
    out.push_back(loss_refusal(gpu_loss_case(c, false, true, "forward_refuses_bad_labels"), msg));
    c.bad_labels = {{17, 3}, {30, -5}};  // now only the negative one
    out.push_back(loss_refusal(gpu_loss_case(c, false, true, "forward_refuses_a_negative_label"),
                               "labels[30] = -5 is neither ignore_index (-100) nor in [0, vocab = 100)"));
  }
  // Emulator test.
  const DType combos[4][2] = {{kF, kF}, {kB, kB}, {kB, kF}, {kF, kB}};  // (h, w)
  for (const auto& d : combos) {
    // V % 4 == 0 (vector row kernel); ragged chunks 7, 7, 7, 2; the second chunk without labels.
    out.push_back(emu_loss_case({23, 24, 100, 7, true, true, true}, d[0], d[1]));
    // The same chunk skipped (no label, no argmax): its dh rows zeroed, no GEMM.
    out.push_back(emu_loss_case({23, 24, 100, 7, true, false, true}, d[0], d[1]));
    // Scalar row kernel (V odd), chunks 5, 5, 5, 2; forward only.
    out.push_back(emu_loss_case({17, 13, 37, 5, false, true, false}, d[0], d[1]));
    // A bad label in the second chunk: nothing of the first may be written either.
    const int32_t bad = d[0] == kF ? -1 : 1000;
    std::vector<int32_t> v = emu_loss_labels(21, 50, 6, false);
    v[11] = bad;
    v[17] = 50;
    const LmHeadLossShape s{.tokens = 21,
                            .dim = 8,
                            .vocab = 50,
                            .chunk_tokens = 6,
                            .ignore_index = kIgnoreIndex,
                            .dtype = d[0],
                            .weight_dtype = d[1]};
    for (bool backward : {false, true}) {
      BufferSpec l{.name = "labels", .elem = Elem::kI32, .elems = 21, .fill = fill_ints(v)};
      OpCase k = loss_case(
          case_name({"lm_head_loss", "emu", "h" + dt(d[0]), "w" + dt(d[1]), backward ? "forward_backward" : "forward",
                     "refuses_label", bad < 0 ? "minus1" : n(bad)}),
          s, backward, true, {input("h", d[0], 21 * 8), input("w", d[1], 50 * 8), l}, 0.5, 2, both(bits()),
          both(bits()), both(bits()), -1.0, 1.0, 0xff);
      out.push_back(
          loss_refusal(k, "labels[11] = " + n(bad) + " is neither ignore_index (-100) nor in [0, vocab = 50)"));
    }
  }
  // Rows longer than one pass of the block: vector (V / 4 = 513 groups) and scalar (V = 1031).
  out.push_back(emu_loss_case({6, 8, 2052, 4, true, true, false}, kF, kF));
  out.push_back(emu_loss_case({5, 9, 1031, 0, true, true, false}, kB, kB));
  // A bf16 w of 1030 * 4096 elements: two widened blocks (1024 + 6 vocab rows) per GEMM.
  out.push_back(emu_loss_case({5, 4096, 1030, 3, true, true, false}, kF, kB));
  out.push_back(emu_loss_case({5, 4096, 1030, 3, true, false, false}, kB, kB));
}

}  // namespace

std::vector<OpCase> model_cases() {
  std::vector<OpCase> out;
  add_embedding(out);
  add_adamw(out);
  add_loss(out);
  return out;
}

}  // namespace untied::ops
