#include "untied/kernels/adamw.h"

#include <cmath>

#include "kernels/backend.h"
#include "untied/core/check.h"

namespace untied {

void validate(const AdamWParams& a) {
  UNTIED_CHECK(std::isfinite(a.lr) && a.lr >= 0.0f, "adamw: lr must be finite and >= 0, got ", a.lr);
  UNTIED_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "adamw: beta1 must be in [0, 1), got ", a.beta1);
  UNTIED_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "adamw: beta2 must be in [0, 1), got ", a.beta2);
  UNTIED_CHECK(std::isfinite(a.eps) && a.eps > 0.0f, "adamw: eps must be finite and > 0, got ", a.eps);
  UNTIED_CHECK(std::isfinite(a.weight_decay) && a.weight_decay >= 0.0f,
               "adamw: weight_decay must be finite and >= 0, got ", a.weight_decay);
  UNTIED_CHECK(a.step >= 1, "adamw: step must be >= 1 (1-based), got ", a.step);
}

void adamw_step(Device& dev, float* p, float* m, float* v, const float* g, int64_t n,
                const AdamWParams& a) {
  UNTIED_CHECK(n >= 0, "adamw: n must be >= 0, got ", n);
  validate(a);
  run_op(dev, &KernelTable::adamw, "adamw_step", AdamWCall{.p = p, .m = m, .v = v, .g = g, .n = n, .a = a});
}

double grad_sum_squares(Device& dev, const float* g, int64_t n) {
  UNTIED_CHECK(n >= 0, "grad_sum_squares: n must be >= 0, got ", n);
  double sum = 0.0;  // 0 in rehearsal
  run_op(dev, &KernelTable::grad_sum_squares, "grad_sum_squares", SumSquaresCall{.g = g, .n = n, .result = &sum});
  return sum;
}

void scale_in_place(Device& dev, float* x, int64_t n, float scale) {
  UNTIED_CHECK(n >= 0, "scale_in_place: n must be >= 0, got ", n);
  run_op(dev, &KernelTable::scale_in_place, "scale_in_place", ScaleCall{.x = x, .n = n, .scale = scale});
}

}  // namespace untied
