// RMSNorm, forward and backward: y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) per row.
//
// Used for the block norms (rows = L tokens, dim = E) and for Qwen3's per-head q/k norm
// (rows = L*H, dim = D over a contiguous (L, H, D) tensor; or, over a fused QKV buffer, one call
// per head with rows = L, row_stride = the fused row length and x offset by h*D).
//
// Storage: x, y, dy, dx are f32 or bf16 (`dtype`); w is f32 or bf16 (`weight_dtype`); rstd and
// dw are fp32. Compute is fp32 (row sums in fp32 lanes combined in fp64); a bf16 output is
// computed in fp32 and rounded once.
// Rows are `row_stride` elements apart in x, y, dy and dx alike (0 = dim); the elements between
// rows are neither read nor written.
//
// Accumulation: dw is ACCUMULATED (+=), so that the row tiles of one norm, or one weight shared
// by several calls (per-head q/k norm over a fused buffer, a tiled backward), add into one
// gradient; the caller zeroes dw once per step. dx is overwritten (=). dw's sum over rows is
// done in fp64: per fixed block of 2048 rows (rows in order), then over the blocks in order, and
// added to dw once per call; the result does not depend on the thread count.
//
// Workspace: forward none; backward ceil(rows / 2048) * dim * 8 bytes (the fp64 block sums of
// dw, Tag::kOther), live during the call only.
// Thread safety: calls on one Device from one thread (device.h).
// REQUIRES: rows >= 0, dim >= 1, eps >= 0 (eps > 0 unless no row is all zeros);
//           outputs do not overlap inputs.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct RmsNormShape {
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
  int64_t row_stride = 0;             // elements between rows of x, y, dy, dx; 0 = dim
  DType dtype = DType::kF32;          // storage of x, y, dy, dx
  DType weight_dtype = DType::kF32;   // storage of w
};

// Throws Error(kInvalidArgument) naming the bad field.
void validate(const RmsNormShape& s);

// y (rows, dim) =, rstd (rows) fp32 =.
void rmsnorm_forward(Device& dev, const RmsNormShape& s, void* y, float* rstd, const void* x,
                     const void* w);

// dx (rows, dim) =, dw (dim) fp32 += (accumulated), from what forward saved (x, rstd), the
// weight w and dy:
//   dx = rstd * (w * dy) - rstd^3 / dim * x * sum_j(w_j dy_j x_j),   dw += sum_rows dy * x * rstd.
void rmsnorm_backward(Device& dev, const RmsNormShape& s, void* dx, float* dw, const void* x,
                      const float* rstd, const void* w, const void* dy);

}  // namespace untied
