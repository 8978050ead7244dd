// The row movements of a mixture-of-experts MLP (model/moe.h): the tokens' rows gathered into
// expert order, and the experts' outputs combined back per token.
//
//   gather_rows:  dst[i, :] = src[idx[i], :]                      (i < m; dim elements a row)
//   combine_rows: out[r, :] = (accumulate ? out[r, :] : 0) + sum_j w[r, j] * ys[pos[r, j], :]
//                 (r < n, j < k; w null: every weight 1), summed in fp32 in the order j = 0..k-1
//                 and rounded once to out's dtype
//   combine_rows_backward: for r < n, j < k, p = pos[r, j]:
//                 dys[p, :] = w[r, j] * dy[r, :]   (rounded to dys's dtype)
//                 dw[r, j]  = sum_d dy[r, d] * ys[p, d]   (fp32)
//
// Rows are contiguous (dim elements apart). src, dst, out, ys, dy and dys share one dtype (f32 or
// bf16); idx and pos int32, each pos[r, :] distinct (a token meets an expert at most once) and
// every pos[r, j] < m; w and dw fp32. All pointers are this device's memory. In rehearsal
// (!dev.backed()) nothing is read or written. Workspace: none. Results do not depend on the
// thread count.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct MoeRows {
  int64_t n = 0;    // tokens
  int64_t k = 0;    // experts per token
  int64_t m = 0;    // rows in expert order (n * k)
  int64_t dim = 0;  // elements a row
  DType dtype = DType::kF32;
};

void gather_rows(Device& dev, const MoeRows& s, void* dst, const void* src, int64_t src_rows, const int32_t* idx);

void combine_rows(Device& dev, const MoeRows& s, void* out, const void* ys, const int32_t* pos, const float* w,
                  bool accumulate);

void combine_rows_backward(Device& dev, const MoeRows& s, void* dys, float* dw, const void* dy, const void* ys,
                           const int32_t* pos, const float* w);

}  // namespace untied
