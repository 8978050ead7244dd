#include "untied/kernels/embedding.h"

#include "kernels/backend.h"
#include "untied/core/check.h"

namespace untied {

void validate(const EmbeddingShape& s) {
  UNTIED_CHECK(s.tokens >= 0, "embedding: tokens must be >= 0, got ", s.tokens);
  UNTIED_CHECK(s.vocab >= 1, "embedding: vocab must be >= 1, got ", s.vocab);
  UNTIED_CHECK(s.vocab <= (int64_t{1} << 31), "embedding: vocab (", s.vocab,
               ") must fit int32 ids (<= 2^31)");
  UNTIED_CHECK(s.dim >= 1, "embedding: dim (E) must be >= 1, got ", s.dim);
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16,
               "embedding: dtype (storage of out, dout) must be f32 or bf16, got ", dtype_name(s.dtype));
  UNTIED_CHECK(s.table_dtype == DType::kF32 || s.table_dtype == DType::kBF16,
               "embedding: table_dtype must be f32 or bf16, got ", dtype_name(s.table_dtype));
}

void embedding_forward(Device& dev, const EmbeddingShape& s, void* out, const int32_t* ids,
                       const void* table) {
  validate(s);
  run_op(dev, &KernelTable::embedding_forward, "embedding_forward",
         EmbeddingForwardCall{.s = s, .out = out, .ids = ids, .table = table});
}

void embedding_backward(Device& dev, const EmbeddingShape& s, float* dtable, const int32_t* ids,
                        const void* dout) {
  validate(s);
  run_op(dev, &KernelTable::embedding_backward, "embedding_backward",
         EmbeddingBackwardCall{.s = s, .dtable = dtable, .ids = ids, .dout = dout});
}

}  // namespace untied
