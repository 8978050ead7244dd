// A build without the CUDA backend: no CUDA Device can be made (make_cuda_device says so), so
// these are never reached; they exist so the dispatch in src/kernels/*.cc links.
#include "kernels/cuda/cuda_kernels.h"

namespace untied::cuda {

namespace {
[[noreturn]] void none(Device& dev, const char* op) { unsupported(dev, op); }
}  // namespace

void gemm(Device& dev, const GemmParams&) { none(dev, "gemm (this build has no CUDA backend)"); }
void attention_forward(Device& dev, const AttentionShape&, void*, float*, const void*, const void*, const void*) {
  none(dev, "attention_forward (this build has no CUDA backend)");
}
void attention_backward(Device& dev, const AttentionShape&, void*, void*, void*, const void*, const void*, const void*,
                        const void*, const float*, const float*, const void*) {
  none(dev, "attention_backward (this build has no CUDA backend)");
}
void rope_apply(Device& dev, const RopeShape&, void*, const int64_t*, bool) { none(dev, "rope (no CUDA backend)"); }
void rmsnorm_forward(Device& dev, const RmsNormShape&, void*, float*, const void*, const void*) {
  none(dev, "rmsnorm_forward (no CUDA backend)");
}
void rmsnorm_backward(Device& dev, const RmsNormShape&, void*, float*, const void*, const float*, const void*,
                      const void*) {
  none(dev, "rmsnorm_backward (no CUDA backend)");
}
void swiglu_forward(Device& dev, const SwigluShape&, void*, const void*, const void*) {
  none(dev, "swiglu_forward (no CUDA backend)");
}
void swiglu_backward(Device& dev, const SwigluShape&, void*, void*, const void*, const void*, const void*) {
  none(dev, "swiglu_backward (no CUDA backend)");
}
void embedding_forward(Device& dev, const EmbeddingShape&, void*, const int32_t*, const void*) {
  none(dev, "embedding_forward (no CUDA backend)");
}
void embedding_backward(Device& dev, const EmbeddingShape&, float*, const int32_t*, const void*) {
  none(dev, "embedding_backward (no CUDA backend)");
}
void lm_head_loss(Device& dev, const LmHeadLossShape&, bool, LossSums*, int32_t*, void*, float*, const void*,
                  const int32_t*, const void*) {
  none(dev, "lm_head_loss (no CUDA backend)");
}
void adamw_step(Device& dev, float*, float*, float*, const float*, int64_t, const AdamWParams&) {
  none(dev, "adamw_step (no CUDA backend)");
}
double grad_sum_squares(Device& dev, const float*, int64_t) { none(dev, "grad_sum_squares (no CUDA backend)"); }
void scale_in_place(Device& dev, float*, int64_t, float) { none(dev, "scale_in_place (no CUDA backend)"); }
void row_dot(Device& dev, int64_t, int64_t, DType, const void*, int64_t, const void*, int64_t, float*, int64_t) {
  none(dev, "row_dot (no CUDA backend)");
}
void add_into(Device& dev, void*, DType, const void*, DType, int64_t) { none(dev, "add_into (no CUDA backend)"); }
void convert(Device& dev, void*, DType, const void*, DType, int64_t) { none(dev, "convert (no CUDA backend)"); }

}  // namespace untied::cuda
