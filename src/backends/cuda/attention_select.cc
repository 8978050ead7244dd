#include "backends/cuda/attention_select.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "untied/core/check.h"

namespace untied::cuda {

StatusOr<AttentionKernel> parse_attention_kernel(const std::string& v) {
  if (v.empty() || v == "auto") return AttentionKernel::kAuto;
  if (v == "cudnn") return AttentionKernel::kCudnn;
  if (v == "mma") return AttentionKernel::kMma;
  if (v == "wgmma") return AttentionKernel::kWgmma;
  return Status::invalid_argument("UNTIED_CUDA_ATTENTION='" + v +
                                  "': use auto (the default), cudnn, mma or wgmma");
}

StatusOr<AttentionKernel> attention_kernel_requested() {
  const char* e = std::getenv("UNTIED_CUDA_ATTENTION");
  return parse_attention_kernel(e == nullptr ? "" : e);
}

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kAuto: return "auto";
    case AttentionKernel::kCudnn: return "cudnn";
    case AttentionKernel::kMma: return "mma";
    case AttentionKernel::kWgmma: return "wgmma";
  }
  return "?";
}

Status cudnn_supports(const AttentionShape& s, bool backward, DeltaSource delta) {
  const auto no = [](const std::string& why) { return Status::unsupported("cuDNN attention: " + why); };
  if (s.dtype != DType::kBF16) return no("f32 storage runs on our kernels (cuDNN's fused attention is bf16/fp16)");
  if (s.head_dim != 64 && s.head_dim != 128)
    return no("head_dim " + std::to_string(s.head_dim) + " (taken: 64 and 128)");
  if (s.heads % s.kv_heads != 0) return no("heads not a multiple of the KV heads");
  if (s.f32_results || s.accumulate_dkv)
    return no("fp32 partial results (ring blocks and UPipe's summed dK/dV) are merged by our kernels");
  if (s.q_offset != s.k_offset || s.seq_q != s.seq_k)
    return no("a block of a longer sequence (offsets " + std::to_string(s.q_offset) + "/" + std::to_string(s.k_offset) +
              ", " + std::to_string(s.seq_q) + " queries and " + std::to_string(s.seq_k) + " keys)");
  if (s.doc_starts != nullptr && s.num_docs > 1) return no("packed documents (" + std::to_string(s.num_docs) + ")");
  if (s.window > 0) return no("the sliding window");
  const int64_t q_rs = s.q_row_stride > 0 ? s.q_row_stride : s.heads * s.head_dim;
  const int64_t kv_rs = s.kv_row_stride > 0 ? s.kv_row_stride : s.kv_heads * s.head_dim;
  if (q_rs % 8 != 0 || kv_rs % 8 != 0) return no("row strides not multiples of 8 elements");
  if (backward && delta == DeltaSource::kGiven) return no("a backward whose D is given (no O to hand cuDNN)");
  return Status::ok_status();
}

AttentionKernel choose_attention_kernel(AttentionKernel requested, const Status& cudnn_ready, const AttentionShape& s,
                                        bool backward, DeltaSource delta, std::string* why) {
  if (why != nullptr) why->clear();
  if (requested == AttentionKernel::kMma || requested == AttentionKernel::kWgmma) {
    if (why != nullptr) *why = std::string("UNTIED_CUDA_ATTENTION=") + attention_kernel_name(requested);
    return requested;
  }
  if (requested == AttentionKernel::kAuto && !kAutoTakesCudnn) {
    if (why != nullptr)
      *why = "auto runs our kernels until a GPU run has checked cuDNN's (UNTIED_CUDA_ATTENTION=cudnn takes them)";
    return AttentionKernel::kMma;
  }
  Status st = cudnn_ready.ok() ? cudnn_supports(s, backward, delta) : cudnn_ready;
  if (st.ok()) return AttentionKernel::kCudnn;
  if (why != nullptr) *why = st.message();
  return AttentionKernel::kMma;
}

std::string CudnnGraphKey::describe() const {
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  return str_cat(backward ? "bwd" : "fwd", " S=", seq_q, "/", seq_k, " H=", heads, " G=", kv_heads, " D=", head_dim,
                 causal ? " causal" : " full", " strides ", q_row_stride, "/", kv_row_stride, " scale ", scale, " gpu ",
                 device);
}

CudnnGraphKey cudnn_graph_key(const AttentionShape& s, bool backward, int device) {
  CudnnGraphKey k;
  k.backward = backward;
  k.seq_q = s.seq_q;
  k.seq_k = s.seq_k;
  k.heads = s.heads;
  k.kv_heads = s.kv_heads;
  k.head_dim = s.head_dim;
  k.q_row_stride = s.q_row_stride > 0 ? s.q_row_stride : s.heads * s.head_dim;
  k.kv_row_stride = s.kv_row_stride > 0 ? s.kv_row_stride : s.kv_heads * s.head_dim;
  k.causal = s.causal;
  const float scale = s.scale > 0 ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  std::memcpy(&k.scale_bits, &scale, 4);
  k.device = device;
  return k;
}

size_t CudnnGraphKeyHash::operator()(const CudnnGraphKey& k) const {
  size_t h = std::hash<int64_t>()(k.seq_q);
  for (const int64_t v : {k.seq_k, k.heads, k.kv_heads, k.head_dim, k.q_row_stride, k.kv_row_stride,
                          static_cast<int64_t>(k.scale_bits), static_cast<int64_t>(k.device),
                          static_cast<int64_t>(k.backward) * 2 + static_cast<int64_t>(k.causal)})
    h = h * 1000003u ^ std::hash<int64_t>()(v);
  return h;
}

}  // namespace untied::cuda
