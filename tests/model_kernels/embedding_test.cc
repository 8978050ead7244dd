// Token embedding (CPU) against the naive fp64 reference (model_reference.h).
//
// Forward is a copy: exact for equal storage types, the table value rounded once to bf16
// otherwise; checked bit for bit against the reference's value stored in the output type.
// Backward accumulates rows of dout into dtable (fp32), repeated ids in token order. The
// baseline is the same scatter-add in fp32 (sequential, token order) against fp64; the kernel
// does the very same additions in the same order, so 4 x baseline + 2 FLT_EPSILON x magnitude
// (test_util.h; magnitude = the largest sum of |terms| of an element, initial value included)
// is generous, and determinism across thread counts is checked bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "model_kernels/model_reference.h"
#include "model_kernels/model_test_util.h"
#include "untied/kernels/embedding.h"

namespace untied {
namespace {

using test::expect_close;
using test::make_budget;
using test::Stored;
using test::to_double;
using test::to_float;

struct EmbCase {
  std::string name;
  int64_t tokens, vocab, dim;
  DType dtype = DType::kF32, table_dtype = DType::kF32;
};

std::ostream& operator<<(std::ostream& os, const EmbCase& c) { return os << c.name; }

std::vector<EmbCase> emb_cases() {
  return {
      {.name = "f32", .tokens = 50, .vocab = 97, .dim = 64},
      {.name = "f32_repeats_dim600", .tokens = 300, .vocab = 7, .dim = 600},  // 3 column chunks
      {.name = "bf16_out_f32_table", .tokens = 40, .vocab = 30, .dim = 130, .dtype = DType::kBF16},
      {.name = "bf16_out_bf16_table", .tokens = 40, .vocab = 30, .dim = 48, .dtype = DType::kBF16,
       .table_dtype = DType::kBF16},
      {.name = "f32_out_bf16_table", .tokens = 20, .vocab = 11, .dim = 32,
       .table_dtype = DType::kBF16},
  };
}

struct Problem {
  EmbeddingShape shape;
  std::vector<int32_t> ids;
  std::vector<double> table, dout, dtable0;
};

Problem make_problem(const EmbCase& c, uint64_t seed) {
  Problem p;
  p.shape = EmbeddingShape{.tokens = c.tokens, .vocab = c.vocab, .dim = c.dim, .dtype = c.dtype,
                           .table_dtype = c.table_dtype};
  test::Rng rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(c.vocab - 1));
  p.ids.resize(static_cast<size_t>(c.tokens));
  for (auto& i : p.ids) i = id(rng);
  p.ids[0] = 0;  // both ends of the vocabulary
  if (c.tokens > 1) p.ids[1] = static_cast<int32_t>(c.vocab - 1);
  p.table = test::random_values(rng, c.vocab * c.dim, c.table_dtype);
  p.dout = test::random_values(rng, c.tokens * c.dim, c.dtype);
  p.dtable0 = test::random_values(rng, c.vocab * c.dim, DType::kF32);
  return p;
}

class EmbeddingTest : public ::testing::TestWithParam<EmbCase> {};

TEST_P(EmbeddingTest, ForwardIsTheTableRowRoundedOnce) {
  const Problem p = make_problem(GetParam(), 41);
  const EmbeddingShape& s = p.shape;
  auto dev = test::cpu();
  Stored table(s.table_dtype, s.vocab, s.dim, s.dim, Stored::Pad::kNaN);
  table.set(p.table);
  Stored out(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kSentinel);
  out.fill_view_nan();
  embedding_forward(*dev, s, out.data(), p.ids.data(), table.data());
  std::vector<double> want;
  ref::embedding_forward<double>(p.ids, p.table, s.dim, want);
  EXPECT_EQ(out.get(), test::stored_as(want, s.dtype));
}

std::vector<double> run_backward(Device& dev, const Problem& p) {
  const EmbeddingShape& s = p.shape;
  Stored dout(s.dtype, s.tokens, s.dim, s.dim, Stored::Pad::kNaN);
  dout.set(p.dout);
  std::vector<float> dtable = to_float(p.dtable0);
  embedding_backward(dev, s, dtable.data(), p.ids.data(), dout.data());
  return to_double(dtable);
}

TEST_P(EmbeddingTest, BackwardAccumulatesRepeatedIds) {
  const Problem p = make_problem(GetParam(), 42);
  const EmbeddingShape& s = p.shape;
  auto dev = test::cpu();
  const std::vector<double> got = run_backward(*dev, p);

  std::vector<double> want = p.dtable0;
  ref::embedding_backward<double>(p.ids, p.dout, s.dim, want);
  std::vector<float> naive = to_float(p.dtable0);
  ref::embedding_backward<float>(p.ids, to_float(p.dout), s.dim, naive);
  std::vector<double> mag(p.dtable0.size());
  for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(p.dtable0[i]);
  ref::embedding_backward<double>(p.ids, [&] {
    std::vector<double> a = p.dout;
    for (auto& v : a) v = std::fabs(v);
    return a;
  }(), s.dim, mag);
  EXPECT_TRUE(expect_close("embedding dtable (+=)", got, want,
                           make_budget(want, to_double(naive), DType::kF32, test::max_abs(mag)),
                           {s.vocab, s.dim}));
}

INSTANTIATE_TEST_SUITE_P(Cases, EmbeddingTest, ::testing::ValuesIn(emb_cases()),
                         [](const auto& info) { return info.param.name; });

// Repeated ids are summed in token order whatever the thread count: same bits with 1 and 2.
TEST(Embedding, BackwardIsDeterministicAcrossThreadCounts) {
  const Problem p = make_problem({.name = "det", .tokens = 500, .vocab = 5, .dim = 700}, 43);
  auto dev1 = test::cpu(1);
  auto dev2 = test::cpu(2);
  EXPECT_EQ(run_backward(*dev1, p), run_backward(*dev2, p));
}

// An id outside [0, V) is an error naming the id and its position, raised before any write.
TEST(Embedding, BadIdIsRejectedBeforeAnyWrite) {
  const EmbeddingShape s{.tokens = 6, .vocab = 10, .dim = 4};
  auto dev = test::cpu();
  std::vector<float> table(40, 1.0f), dout(24, 1.0f);
  for (int32_t bad : {10, -1, -100}) {
    SCOPED_TRACE(bad);
    std::vector<int32_t> ids = {0, 1, 2, bad, 4, 5};
    std::vector<float> out(24, -7.0f), dtable(40, -7.0f);
    test::expect_invalid([&] { embedding_forward(*dev, s, out.data(), ids.data(), table.data()); },
                         "ids[3] = " + std::to_string(bad));
    test::expect_invalid([&] { embedding_backward(*dev, s, dtable.data(), ids.data(), dout.data()); },
                         "ids[3] = " + std::to_string(bad));
    for (float v : out) EXPECT_EQ(v, -7.0f) << "out written before the id check";
    for (float v : dtable) EXPECT_EQ(v, -7.0f) << "dtable written before the id check";
  }
}

TEST(EmbeddingValidate, RejectsBadShapesNamingTheField) {
  const EmbeddingShape good{.tokens = 4, .vocab = 8, .dim = 8};
  EXPECT_NO_THROW(validate(good));
  auto with = [&](auto edit) {
    EmbeddingShape s = good;
    edit(s);
    return [s] { validate(s); };
  };
  test::expect_invalid(with([](EmbeddingShape& s) { s.tokens = -1; }), "tokens");
  test::expect_invalid(with([](EmbeddingShape& s) { s.vocab = 0; }), "vocab");
  test::expect_invalid(with([](EmbeddingShape& s) { s.vocab = int64_t{1} << 32; }), "vocab");
  test::expect_invalid(with([](EmbeddingShape& s) { s.dim = 0; }), "dim");
  test::expect_invalid(with([](EmbeddingShape& s) { s.dtype = DType::kI32; }), "dtype");
  test::expect_invalid(with([](EmbeddingShape& s) { s.table_dtype = DType::kF64; }), "table_dtype");
  // Zero tokens: nothing read or written.
  auto dev = test::cpu();
  EXPECT_NO_THROW(embedding_forward(*dev, {.tokens = 0, .vocab = 3, .dim = 2}, nullptr, nullptr, nullptr));
}

}  // namespace
}  // namespace untied
