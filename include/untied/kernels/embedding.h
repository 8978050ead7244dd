// Token embedding, forward and backward: out[t] = table[ids[t]].
//
// Layouts: ids (tokens) int32; table (V, E) in `table_dtype` (f32 or bf16), rows E apart;
// out, dout (tokens, E) in `dtype` (f32 or bf16), rows E apart; dtable (V, E) fp32.
// A bf16 out from an f32 table is the table row rounded once to bf16.
//
// Accumulation: dtable is ACCUMULATED (+=): dtable[ids[t]] += dout[t] for every t, so repeated
// ids add up and the caller zeroes dtable once per step. The backward splits E across threads
// and walks the tokens in order for every column, so the sum over repeated ids is done in token
// order whatever the thread count: the result is deterministic and thread-count independent.
//
// Ids: every id must lie in [0, V). The kernels check all ids before writing anything and throw
// Error(kInvalidArgument) naming the first bad id and its position ("ids[17] = 50000 is outside
// [0, vocab = 32000)"). In rehearsal (!dev.backed()) there is no data and nothing is checked.
//
// Workspace: none on the CPU. On CUDA (dev.allocator(), Tag::kOther, live during the call): 8
// bytes for the id check; the backward also 16 * tokens bytes for its sort plus CUB's temporary
// storage (src/backends/cuda/embedding.cu).
// REQUIRES: tokens >= 0, vocab >= 1, dim >= 1; outputs do not overlap inputs.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct EmbeddingShape {
  int64_t tokens = 0;
  int64_t vocab = 0;                 // V
  int64_t dim = 0;                   // E
  DType dtype = DType::kF32;         // storage of out, dout
  DType table_dtype = DType::kF32;   // storage of table
};

// Throws Error(kInvalidArgument) naming the bad field.
void validate(const EmbeddingShape& s);

// out (tokens, E) = table[ids].
void embedding_forward(Device& dev, const EmbeddingShape& s, void* out, const int32_t* ids,
                       const void* table);

// dtable (V, E) fp32 += scatter of dout (tokens, E) by ids.
void embedding_backward(Device& dev, const EmbeddingShape& s, float* dtable, const int32_t* ids,
                        const void* dout);

}  // namespace untied
