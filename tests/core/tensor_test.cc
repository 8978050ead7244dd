// Shape, Tensor views and TensorBuffer: strides, slicing, reshape, shape checks, and that a
// TensorBuffer's bytes come from the allocator under its tag.
#include "untied/core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "core/expect_error.h"

namespace untied {
namespace {

using testing::throws_error;

TEST(Shape, Basics) {
  Shape s{4096, 32, 128};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s[0], 4096);
  EXPECT_EQ(s[2], 128);
  EXPECT_EQ(s.numel(), int64_t{4096} * 32 * 128);
  EXPECT_EQ(s.to_string(), "(4096, 32, 128)");
  EXPECT_EQ(Shape{}.ndim(), 0);
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_EQ(Shape{}.to_string(), "()");
  EXPECT_EQ(Shape({7}).to_string(), "(7)");
  EXPECT_EQ((Shape{3, 0, 5}).numel(), 0);
  // Large dims do not overflow 32 bits.
  EXPECT_EQ((Shape{1 << 20, 1 << 20, 4}).numel(), int64_t{1} << 42);
}

TEST(Shape, Equality) {
  EXPECT_TRUE((Shape{2, 3}) == (Shape{2, 3}));
  EXPECT_FALSE((Shape{2, 3}) == (Shape{3, 2}));
  EXPECT_FALSE((Shape{2, 3}) == (Shape{2, 3, 1}));
  EXPECT_FALSE((Shape{6}) == (Shape{2, 3}));
  EXPECT_TRUE(Shape{} == Shape{});
}

TEST(Shape, AtMostFourDims) {
  Shape four{1, 2, 3, 4};
  EXPECT_EQ(four.ndim(), kMaxDims);
  EXPECT_TRUE(throws_error([] { Shape five{1, 2, 3, 4, 5}; }, ErrorKind::kInvalidArgument,
                           {"at most 4 dims", "got 5"}));
}

TEST(Tensor, ContiguousStrides) {
  float buf[120];
  Tensor t(buf, DType::kF32, {2, 3, 4, 5});
  EXPECT_EQ(t.strides(), (Shape{60, 20, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.bytes(), 480);
  EXPECT_EQ(t.ndim(), 4);
  EXPECT_EQ(t.dim(3), 5);
  EXPECT_EQ(t.data(), buf);
  EXPECT_EQ(t.as<float>(), buf);
  EXPECT_EQ(t.dtype(), DType::kF32);

  Tensor v(buf, DType::kBF16, {7});
  EXPECT_EQ(v.strides(), (Shape{1}));
  EXPECT_EQ(v.bytes(), 14);

  Tensor z(buf, DType::kF64, {3, 0, 2});
  EXPECT_EQ(z.strides(), (Shape{0, 2, 1}));
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.bytes(), 0);
  EXPECT_TRUE(z.is_contiguous());
}

TEST(Tensor, StridedViewIsNotContiguous) {
  float buf[24];
  Tensor t(buf, DType::kF32, {4, 3}, {6, 1});  // every other 3-element half-row
  EXPECT_FALSE(t.is_contiguous());
  Tensor tr(buf, DType::kF32, {3, 4}, {1, 3});  // a transpose
  EXPECT_FALSE(tr.is_contiguous());
  Tensor c(buf, DType::kF32, {3, 4}, {4, 1});
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(throws_error([&] { Tensor bad(buf, DType::kF32, {3, 4}, {4}); },
                           ErrorKind::kInvalidArgument, {"(3, 4)", "(4)", "differ in rank"}));
}

TEST(Tensor, NegativeDimsRejected) {
  float buf[4];
  EXPECT_TRUE(throws_error([&] { Tensor t(buf, DType::kF32, {2, -1}); },
                           ErrorKind::kInvalidArgument, {"negative dimension", "(2, -1)"}));
  EXPECT_TRUE(throws_error([&] { Tensor t(buf, DType::kF32, {-3}, {1}); },
                           ErrorKind::kInvalidArgument, {"negative dimension", "(-3)"}));
}

TEST(Tensor, Slice0) {
  std::vector<float> buf(24);
  std::iota(buf.begin(), buf.end(), 0.0f);
  Tensor t(buf.data(), DType::kF32, {4, 6});
  Tensor s = t.slice0(1, 3);
  EXPECT_EQ(s.data(), buf.data() + 6);
  EXPECT_EQ(static_cast<char*>(s.data()) - static_cast<char*>(t.data()), 24);
  EXPECT_EQ(s.shape(), (Shape{2, 6}));
  EXPECT_EQ(s.strides(), (Shape{6, 1}));
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.as<float>()[0], 6.0f);
  EXPECT_EQ(s.as<float>()[11], 17.0f);

  Tensor whole = t.slice0(0, 4);
  EXPECT_EQ(whole.data(), t.data());
  EXPECT_EQ(whole.shape(), t.shape());
  Tensor empty = t.slice0(4, 4);
  EXPECT_EQ(empty.shape(), (Shape{0, 6}));
  EXPECT_EQ(empty.data(), buf.data() + 24);

  // bf16: the offset is in elements of the dtype, so 2 bytes each.
  uint16_t hbuf[2 * 3 * 4];
  Tensor h(hbuf, DType::kBF16, {2, 3, 4});
  Tensor hs = h.slice0(1, 2);
  EXPECT_EQ(static_cast<char*>(hs.data()) - static_cast<char*>(h.data()), 12 * 2);
  EXPECT_EQ(hs.shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(hs.dtype(), DType::kBF16);

  // A strided view keeps its strides and offsets by stride(0).
  Tensor st(buf.data(), DType::kF32, {3, 2}, {8, 1});
  Tensor sts = st.slice0(1, 3);
  EXPECT_EQ(sts.data(), buf.data() + 8);
  EXPECT_EQ(sts.strides(), (Shape{8, 1}));
  EXPECT_EQ(sts.shape(), (Shape{2, 2}));
  EXPECT_FALSE(sts.is_contiguous());

  // Rehearsal views have no data and slicing keeps it that way.
  Tensor r(nullptr, DType::kF32, {8, 8});
  EXPECT_EQ(r.slice0(2, 5).data(), nullptr);
  EXPECT_EQ(r.slice0(2, 5).shape(), (Shape{3, 8}));
}

TEST(Tensor, Slice0OutOfRange) {
  float buf[24];
  Tensor t(buf, DType::kF32, {4, 6});
  const int64_t ranges[][2] = {{2, 1}, {0, 5}, {-1, 2}, {5, 5}};
  for (const auto& r : ranges) {
    EXPECT_TRUE(throws_error([&] { t.slice0(r[0], r[1]); }, ErrorKind::kInvalidArgument,
                             {"out of range", "(4, 6)"}))
        << "[" << r[0] << ", " << r[1] << ")";
  }
  Tensor scalar(buf, DType::kF32, Shape{});
  EXPECT_TRUE(throws_error([&] { scalar.slice0(0, 0); }, ErrorKind::kInvalidArgument, {"()"}));
}

TEST(Tensor, Reshape) {
  float buf[24];
  Tensor t(buf, DType::kF32, {4, 6});
  Tensor r = t.reshape({2, 3, 4});
  EXPECT_EQ(r.data(), buf);
  EXPECT_EQ(r.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(r.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(r.dtype(), DType::kF32);

  EXPECT_TRUE(throws_error([&] { t.reshape({5, 5}); }, ErrorKind::kInvalidArgument,
                           {"(4, 6)", "(5, 5)", "element count"}));
  EXPECT_TRUE(throws_error([&] { t.reshape({2, 3, 3}); }, ErrorKind::kInvalidArgument,
                           {"element count"}));

  Tensor tr(buf, DType::kF32, {6, 4}, {1, 6});  // transposed view: same count, wrong layout
  EXPECT_TRUE(throws_error([&] { tr.reshape({24}); }, ErrorKind::kInvalidArgument,
                           {"non-contiguous", "(6, 4)"}));
  Tensor rows(buf, DType::kF32, {2, 6}, {12, 1});  // every other row
  EXPECT_TRUE(throws_error([&] { rows.reshape({12}); }, ErrorKind::kInvalidArgument,
                           {"non-contiguous"}));
}

TEST(Tensor, CheckShape) {
  float buf[6];
  Tensor t(buf, DType::kF32, {2, 3});
  check_shape(t, {2, 3}, "q");  // matches: no throw
  EXPECT_TRUE(throws_error([&] { check_shape(t, {3, 2}, "q"); }, ErrorKind::kInvalidArgument,
                           {"q has shape (2, 3), expected (3, 2)"}));
  EXPECT_TRUE(throws_error([&] { check_shape(t, {2, 3, 1}, "kv"); }, ErrorKind::kInvalidArgument,
                           {"kv has shape (2, 3), expected (2, 3, 1)"}));
}

TEST(TensorBuffer, AllocatesThroughTheAllocatorWithItsTag) {
  Allocator a;
  const int act = static_cast<int>(Tag::kActivations);
  {
    TensorBuffer tb(a, DType::kBF16, {2, 3, 4}, Tag::kActivations, "block input");
    MemoryStats s = a.stats();
    EXPECT_EQ(s.live[act], 2 * 3 * 4 * 2);
    EXPECT_EQ(s.live_total, 48);
    EXPECT_EQ(s.num_allocations, 1);
    ASSERT_NE(tb.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tb.data()) % 64, 0u);
    const Tensor& v = tb;  // usable as its view
    EXPECT_EQ(v.data(), tb.data());
    EXPECT_EQ(tb.as<uint16_t>(), tb.data());
    EXPECT_EQ(v.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(v.dtype(), DType::kBF16);
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_EQ(tb.view().bytes(), 48);

    TensorBuffer g(a, DType::kF32, {10}, Tag::kGradients, "grad");
    EXPECT_EQ(a.stats().live[static_cast<int>(Tag::kGradients)], 40);
    g.reset();
    EXPECT_EQ(a.stats().live[static_cast<int>(Tag::kGradients)], 0);
    EXPECT_EQ(g.data(), nullptr);
    EXPECT_EQ(g.view().ndim(), 0);
  }
  EXPECT_EQ(a.stats().live_total, 0);  // destruction frees
  EXPECT_EQ(a.stats().peak[act], 48);
}

TEST(TensorBuffer, NegativeDimsRejectedBeforeAllocating) {
  Allocator a;
  EXPECT_TRUE(throws_error([&] { TensorBuffer tb(a, DType::kF32, {4, -2}, Tag::kOther, "bad"); },
                           ErrorKind::kInvalidArgument, {"negative dimension", "(4, -2)", "'bad'"}));
  EXPECT_EQ(a.stats().num_allocations, 0);
  EXPECT_EQ(a.stats().live_total, 0);
}

TEST(TensorBuffer, OverBudgetThrowsOutOfBudget) {
  Allocator a(make_counting_memory(), Allocator::Options{.budget_bytes = 1000, .name = "small"});
  TensorBuffer ok(a, DType::kF32, {250}, Tag::kParameters, "fits exactly");
  EXPECT_EQ(ok.data(), nullptr);  // counting memory
  EXPECT_EQ(ok.view().shape(), (Shape{250}));
  EXPECT_TRUE(throws_error([&] { TensorBuffer tb(a, DType::kBF16, {1}, Tag::kActivations, "x"); },
                           ErrorKind::kOutOfBudget, {"'x'", "parameters 1000 B"}));
  EXPECT_EQ(a.stats().live_total, 1000);
}

}  // namespace
}  // namespace untied
