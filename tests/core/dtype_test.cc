// DTypes and bf16 conversion. The reference rounds in double arithmetic: it decodes bit patterns
// with ldexp (no bit tricks shared with the code under test) and picks the nearest of the
// neighbouring bf16 values, ties to the even bit pattern.
#include "untied/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/expect_error.h"

namespace untied {
namespace {

using testing::quoted;
using testing::throws_error;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool f32_is_nan(uint32_t u) { return ((u >> 23) & 0xffu) == 0xffu && (u & 0x7fffffu) != 0; }
bool f32_is_inf(uint32_t u) { return ((u >> 23) & 0xffu) == 0xffu && (u & 0x7fffffu) == 0; }

// The value of a finite f32 bit pattern, in double (exact).
double f32_value(uint32_t u) {
  const int sign = static_cast<int>(u >> 31);
  const int e = static_cast<int>((u >> 23) & 0xffu);
  const int64_t m = u & 0x7fffffu;
  double v = e == 0 ? std::ldexp(static_cast<double>(m), -126 - 23)
                    : std::ldexp(static_cast<double>(m + (int64_t{1} << 23)), e - 127 - 23);
  return sign ? -v : v;
}

// The value of a non-negative bf16 magnitude pattern (sign bit clear), in double. 0x7f80, the
// pattern above the largest finite bf16, counts as 2^128: rounding as if the exponent range were
// unbounded and then overflowing is IEEE round-to-nearest-even.
double bf16_magnitude_value(uint32_t mag) {
  const int e = static_cast<int>((mag >> 7) & 0xffu);
  const int64_t m = mag & 0x7fu;
  if (e == 0xff) return std::ldexp(1.0, 128);
  if (e == 0) return std::ldexp(static_cast<double>(m), -126 - 7);
  return std::ldexp(static_cast<double>(m + 128), e - 127 - 7);
}

// The nearest bf16 to a finite or infinite (not NaN) f32 pattern.
uint16_t reference_bf16(uint32_t u) {
  const uint32_t sign = u & 0x80000000u;
  if (f32_is_inf(u)) return static_cast<uint16_t>((sign >> 16) | 0x7f80u);
  const double x = std::fabs(f32_value(u));
  // Neighbours of the truncated magnitude; the nearest of them is the nearest bf16 overall.
  const uint32_t t = (u & 0x7fffffffu) >> 16;
  uint32_t best = t;
  double best_err = std::fabs(x - bf16_magnitude_value(t));
  for (uint32_t c : {t == 0 ? 0u : t - 1, t + 1, t + 2}) {
    if (c > 0x7f80u) continue;
    const double err = std::fabs(x - bf16_magnitude_value(c));
    if (err < best_err || (err == best_err && (c & 1u) == 0 && (best & 1u) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint16_t>((sign >> 16) | best);
}

// Checks float_to_bf16 on one f32 pattern; returns true when it matches the reference.
bool matches_reference(uint32_t u, uint16_t* got, uint16_t* want) {
  *got = float_to_bf16(float_of(u)).bits;
  if (f32_is_nan(u)) {
    *want = 0x7fc0;
    return std::isnan(bf16_to_float(bf16{*got}));
  }
  *want = reference_bf16(u);
  return *got == *want;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_size(DType::kF64), 8);
  EXPECT_EQ(dtype_size(DType::kI32), 4);
  EXPECT_EQ(dtype_size(DType::kI64), 8);
  EXPECT_EQ(dtype_name(DType::kF32), "f32");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_name(DType::kF64), "f64");
  EXPECT_EQ(dtype_name(DType::kI32), "i32");
  EXPECT_EQ(dtype_name(DType::kI64), "i64");
}

TEST(DType, Parse) {
  for (const char* s : {"f32", "fp32", "float32"}) {
    StatusOr<DType> r = parse_dtype(s);
    ASSERT_TRUE(r.ok()) << s;
    EXPECT_EQ(r.value(), DType::kF32) << s;
  }
  for (const char* s : {"bf16", "bfloat16"}) {
    StatusOr<DType> r = parse_dtype(s);
    ASSERT_TRUE(r.ok()) << s;
    EXPECT_EQ(r.value(), DType::kBF16) << s;
  }
  for (const char* s : {"", "f16", "F32", "int8", "bf16 "}) {
    StatusOr<DType> r = parse_dtype(s);
    ASSERT_FALSE(r.ok()) << "'" << s << "' accepted";
    EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(quoted(s)), std::string::npos);
    EXPECT_NE(r.status().message().find("use f32 or bf16"), std::string::npos);
  }
}

TEST(BF16, ReferenceSelfCheck) {
  // The reference itself, on values whose answer is obvious.
  EXPECT_EQ(f32_value(bits_of(1.0f)), 1.0);
  EXPECT_EQ(f32_value(bits_of(-0.375f)), -0.375);
  EXPECT_EQ(f32_value(0x00000001u), std::ldexp(1.0, -149));
  EXPECT_EQ(bf16_magnitude_value(0x3f80u), 1.0);
  EXPECT_EQ(bf16_magnitude_value(0x3f81u), 1.0 + 1.0 / 128);
  EXPECT_EQ(reference_bf16(bits_of(1.0f)), 0x3f80);
  EXPECT_EQ(reference_bf16(0x3f808000u), 0x3f80);
  EXPECT_EQ(reference_bf16(0x3f818000u), 0x3f82);
}

TEST(BF16, RoundToNearestEvenHandBuilt) {
  struct Case {
    uint32_t f32;
    uint16_t bf16;
    const char* why;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1.0 is exact"},
      {0x3f808000u, 0x3f80, "tie, lower neighbour even: stays"},
      {0x3f818000u, 0x3f82, "tie, lower neighbour odd: rounds up"},
      {0x3f807fffu, 0x3f80, "just below the tie: down"},
      {0x3f808001u, 0x3f81, "just above the tie: up"},
      {0x3f817fffu, 0x3f81, "odd, just below the tie: down"},
      {0xbf808000u, 0xbf80, "negative tie to even (magnitude stays)"},
      {0xbf818000u, 0xbf82, "negative tie to even (magnitude grows)"},
      {0xbf808001u, 0xbf81, "negative, just above the tie"},
      {0x3fff8000u, 0x4000, "tie carries into the exponent: 1.99.. -> 2.0"},
      {0x3fffffffu, 0x4000, "carry into the exponent"},
      {0x7f7f7fffu, 0x7f7f, "below the tie at the largest finite bf16"},
      {0x7f7f8000u, 0x7f80, "tie at the top, odd: overflows to inf"},
      {0x7f7fffffu, 0x7f80, "FLT_MAX rounds to inf"},
      {0xff7fffffu, 0xff80, "-FLT_MAX rounds to -inf"},
      {0x00008000u, 0x0000, "subnormal tie to zero (even)"},
      {0x00018000u, 0x0002, "subnormal tie, odd: up"},
      {0x0000ffffu, 0x0001, "tiny subnormal rounds up to the smallest bf16 subnormal"},
      {0x007fffffu, 0x0080, "largest f32 subnormal rounds to the smallest normal"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0 keeps its sign"},
      {0x80008000u, 0x8000, "negative subnormal tie to -0"},
      {0x7f800000u, 0x7f80, "+inf stays inf"},
      {0xff800000u, 0xff80, "-inf stays -inf"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(float_to_bf16(float_of(c.f32)).bits, c.bf16)
        << std::hex << "f32 0x" << c.f32 << ": " << c.why;
    EXPECT_EQ(reference_bf16(c.f32), c.bf16) << std::hex << "reference, f32 0x" << c.f32;
  }
}

TEST(BF16, NaNStaysNaN) {
  // Quiet and signalling NaNs of both signs, including payloads only in the low 16 bits, which
  // truncation alone would turn into infinity.
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu,
                     0x7fffffffu, 0xffffffffu, 0x7fbfffffu, 0x7f810000u}) {
    bf16 h = float_to_bf16(float_of(u));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << "0x" << u << " -> 0x" << h.bits;
    EXPECT_TRUE(std::isnan(round_to_bf16(float_of(u)))) << std::hex << "0x" << u;
  }
  EXPECT_TRUE(std::isnan(round_to_bf16(std::nanf(""))));
  EXPECT_EQ(round_to_bf16(INFINITY), INFINITY);
  EXPECT_EQ(round_to_bf16(-INFINITY), -INFINITY);
}

TEST(BF16, EveryBF16ValueIsExact) {
  int64_t wrong = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint32_t u = b << 16;
    if (f32_is_nan(u)) continue;
    const float f = bf16_to_float(bf16{static_cast<uint16_t>(b)});
    bool ok = bits_of(f) == u && float_to_bf16(f).bits == b && bits_of(round_to_bf16(f)) == u;
    if (!f32_is_inf(u)) {
      const double mag = bf16_magnitude_value(b & 0x7fffu);
      ok = ok && static_cast<double>(f) == ((b & 0x8000u) ? -mag : mag);
    }
    if (!ok && ++wrong <= 5) std::printf("  bf16 0x%04x does not round-trip\n", b);
  }
  EXPECT_EQ(wrong, 0) << "bf16 values that are not exact";
}

TEST(BF16, MatchesReferenceOnSweep) {
  // Every upper half with low halves at and around the tie, plus pseudo-random patterns.
  std::vector<uint32_t> inputs;
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x3fffu, 0x7ffeu, 0x7fffu, 0x8000u,
                           0x8001u, 0xbfffu, 0xfffeu, 0xffffu};
  for (uint32_t hi = 0; hi <= 0xffffu; ++hi)
    for (uint32_t lo : lows) inputs.push_back((hi << 16) | lo);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1 << 21; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    inputs.push_back(static_cast<uint32_t>(state >> 32));
  }
  int64_t wrong = 0;
  for (uint32_t u : inputs) {
    uint16_t got, want;
    if (!matches_reference(u, &got, &want) && ++wrong <= 5)
      std::printf("  f32 0x%08x -> bf16 0x%04x, reference 0x%04x\n", u, got, want);
  }
  EXPECT_EQ(wrong, 0) << "of " << inputs.size() << " patterns differ from the reference";
}

TEST(BF16, LoadStoreRoundTrip) {
  std::vector<float> src = {0.0f, -0.0f, 1.0f, -2.5f, 3.14159265f, 1e-40f, -1e-45f,
                            65504.0f, 3.0e38f, -3.4e38f, INFINITY, -INFINITY, 1.0f / 3.0f};
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x00018000u}) src.push_back(float_of(u));
  const int64_t n = static_cast<int64_t>(src.size());

  // f32 storage is a bit-exact copy, NaN payloads included.
  std::vector<float> with_nan = src;
  with_nan.push_back(float_of(0x7fc01234u));
  std::vector<float> stored(with_nan.size()), loaded(with_nan.size());
  store_f32(stored.data(), DType::kF32, with_nan.data(), static_cast<int64_t>(with_nan.size()));
  load_f32(loaded.data(), stored.data(), DType::kF32, static_cast<int64_t>(with_nan.size()));
  EXPECT_EQ(std::memcmp(loaded.data(), with_nan.data(), with_nan.size() * sizeof(float)), 0);

  // bf16 storage holds the nearest bf16; loading gives back exactly its value.
  std::vector<bf16> half(src.size());
  std::vector<float> back(src.size());
  store_f32(half.data(), DType::kBF16, src.data(), n);
  load_f32(back.data(), half.data(), DType::kBF16, n);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = bits_of(src[i]);
    const uint16_t want = reference_bf16(u);
    const bool ok = half[i].bits == want && bits_of(back[i]) == (static_cast<uint32_t>(want) << 16);
    if (!ok && ++wrong <= 5)
      std::printf("  element %lld: f32 0x%08x stored 0x%04x loaded 0x%08x, want 0x%04x\n",
                  static_cast<long long>(i), u, half[i].bits, bits_of(back[i]), want);
  }
  EXPECT_EQ(wrong, 0);

  // A second store of values already in bf16 changes nothing.
  std::vector<bf16> again(src.size());
  store_f32(again.data(), DType::kBF16, back.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(again[i].bits, half[i].bits) << i;

  // NaN survives a bf16 store and load.
  float nan_in = float_of(0x7f800001u), nan_out = 0;
  bf16 nan_half{};
  store_f32(&nan_half, DType::kBF16, &nan_in, 1);
  load_f32(&nan_out, &nan_half, DType::kBF16, 1);
  EXPECT_TRUE(std::isnan(nan_out));
}

TEST(BF16, LoadStoreRejectOtherTypes) {
  float f[2] = {1, 2};
  double d[2] = {};
  EXPECT_TRUE(throws_error([&] { store_f32(d, DType::kF64, f, 2); }, ErrorKind::kInvalidArgument,
                           {"store_f32", "f64"}));
  EXPECT_TRUE(throws_error([&] { load_f32(f, d, DType::kI32, 2); }, ErrorKind::kInvalidArgument,
                           {"load_f32", "i32"}));
}

}  // namespace
}  // namespace untied
