// sin and cos in double for RoPE's tables, written so that g++ vectorizes a loop of them (plain
// double arithmetic, fma and bit moves: no library calls, no branches). glibc's sincos is a
// scalar call, and RoPE's table of tokens x D/2 angles per call took 2-3% of an 8-rank UPipe
// block, whose stages each rotate their own heads.
//
// Range reduction: k = round(x * 2/pi) by the 1.5*2^52 trick (adding it leaves k in the low
// mantissa bits, whose last two are the quadrant), r = x - k pi/2 with pi/2 in three doubles:
// the first fma is exact (x and k*C1 agree to within pi/4, and C1's last bit is 2^-52), the
// second and third are rounded once each. Then sin r and cos r by their Taylor series to degree
// 17 and 16 on |r| <= pi/4 (truncation under 7e-17), swapped and negated by quadrant.
// Accuracy: within 3e-16 of the true values for |x| < 2^40 (test: FastSincos), against glibc's
// below 1 ulp; both round to the same float but for arguments within about 2^-51 of a float
// rounding boundary. Domain: |x| < 2^50 (RoPE's angles are positions times frequencies <= 1).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace untied::cpu {

// Taylor coefficients as polynomials in r^2, highest degree first: sin r = r + r^3 P(r^2) with
// P's 1/17!, -1/15!, ..., -1/3!; cos r = 1 + r^2 Q(r^2) with Q's 1/16!, -1/14!, ..., -1/2!.
inline constexpr double kSinTaylor[] = {2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10,
                                        -2.505210838544172e-08, 2.7557319223985893e-06, -1.984126984126984e-04,
                                        8.333333333333333e-03,  -1.6666666666666666e-01};
inline constexpr double kCosTaylor[] = {4.779477332387385e-14, -1.1470745597729725e-11, 2.08767569878681e-09,
                                        -2.755731922398589e-07, 2.48015873015873e-05,  -1.3888888888888889e-03,
                                        4.1666666666666664e-02, -0.5};

// c[0] x^(N-1) + ... + c[N-1], by Horner's rule.
template <int N>
inline double horner(double x, const double (&c)[N]) {
  double p = c[0];
#pragma GCC unroll 16
  for (int i = 1; i < N; ++i) p = p * x + c[i];
  return p;
}

inline void fast_sincos(double x, double* sin_out, double* cos_out) {
  constexpr double kTwoOverPi = 0.6366197723675814;
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  constexpr double kC1 = 1.5707963267948966, kC2 = 6.123233995736766e-17, kC3 = -1.4973849048591698e-33;
  const double t = x * kTwoOverPi + kMagic;
  const double k = t - kMagic;
  const int64_t q = std::bit_cast<int64_t>(t) & 3;
  double r = std::fma(-k, kC1, x);
  r = std::fma(-k, kC2, r);
  r = std::fma(-k, kC3, r);
  const double r2 = r * r;
  // sin r = r + r^3 (-1/3! + r^2 (1/5! - ...)), to r^17; cos r = 1 + r^2 (-1/2! + ...), to r^16.
  const double sp = std::fma(r * r2, horner(r2, kSinTaylor), r);
  const double cp = std::fma(r2, horner(r2, kCosTaylor), 1.0);
  // Quadrant q: (sin, cos) = (sp, cp), (cp, -sp), (-sp, -cp), (-cp, sp).
  const bool swap = (q & 1) != 0;
  const double s0 = swap ? cp : sp, c0 = swap ? sp : cp;
  *sin_out = (q & 2) != 0 ? -s0 : s0;
  *cos_out = ((q + 1) & 2) != 0 ? -c0 : c0;
}

}  // namespace untied::cpu
