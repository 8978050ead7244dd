#include "untied/kernels/moe.h"

#include "kernels/backend.h"

namespace untied {

namespace {
void check_rows(const MoeRows& s, const char* op) {
  UNTIED_CHECK(s.n >= 0 && s.k >= 1 && s.m >= 0 && s.dim >= 0, op, ": need n, m, dim >= 0 and k >= 1, got n=", s.n,
               " k=", s.k, " m=", s.m, " dim=", s.dim);
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16, op, ": rows must be f32 or bf16, got ",
               dtype_name(s.dtype));
  // (int32 row indices; one GPU block per row)
  UNTIED_CHECK(s.m < INT32_MAX && s.n * s.k < INT32_MAX, op, ": at most 2^31-1 rows, got n=", s.n, " k=", s.k,
               " m=", s.m);
}
}  // namespace

void gather_rows(Device& dev, const MoeRows& s, void* dst, const void* src, int64_t src_rows, const int32_t* idx) {
  check_rows(s, "gather_rows");
  UNTIED_CHECK(src_rows >= 0, "gather_rows: src_rows must be >= 0");
  if (s.m == 0 || s.dim == 0) return;
  run_op(dev, &KernelTable::gather_rows, "gather_rows",
         GatherRowsCall{.s = s, .dst = dst, .src = src, .src_rows = src_rows, .idx = idx});
}

void combine_rows(Device& dev, const MoeRows& s, void* out, const void* ys, const int32_t* pos, const float* w,
                  bool accumulate) {
  check_rows(s, "combine_rows");
  if (s.n == 0 || s.dim == 0) return;
  run_op(dev, &KernelTable::combine_rows, "combine_rows",
         CombineRowsCall{.s = s, .out = out, .ys = ys, .pos = pos, .w = w, .accumulate = accumulate});
}

void combine_rows_backward(Device& dev, const MoeRows& s, void* dys, float* dw, const void* dy, const void* ys,
                           const int32_t* pos, const float* w) {
  check_rows(s, "combine_rows_backward");
  UNTIED_CHECK(w != nullptr || !dev.backed(), "combine_rows_backward: the weights are required");
  if (s.n == 0) return;
  run_op(dev, &KernelTable::combine_rows_backward, "combine_rows_backward",
         CombineRowsBackwardCall{.s = s, .dys = dys, .dw = dw, .dy = dy, .ys = ys, .pos = pos, .w = w});
}

}  // namespace untied
