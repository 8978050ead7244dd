// Which kernel runs a CUDA attention call: UNTIED_CUDA_ATTENTION's choice, what cuDNN's fused
// attention (cudnn_attention.h) can take, and the key of a cuDNN graph. Host code only, no GPU
// needed: the rules are unit-tested on the CPU (tests/cuda_emu/attention_select_test.cc).
//
// UNTIED_CUDA_ATTENTION:
//   auto (also unset or empty)  cuDNN where it takes the case and can run here, else ours (mma;
//                               the Hopper wgmma kernels only when asked for) -- once a GPU run has
//                               checked the cuDNN path (kAutoTakesCudnn); until then ours. A
//                               measured choice per case replaces this rule once GPU timings exist
//                               (docs/gpu.md).
//   cudnn                       cuDNN where it takes the case; a case it cannot take runs ours
//                               and cudnn_supports() says why (as auto does).
//   mma | wgmma                 our kernels (wgmma: the Hopper ones where they can run).
// Any other value is refused, naming these, before any compute (make_cuda_device).
//
// What cuDNN is given (cudnn_supports): bf16 storage (f32 stays on our kernels), head dims 64
// and 128, full or causal attention of one sequence (q_offset == k_offset, seq_q == seq_k), GQA
// (H % G == 0, K and V not expanded), row strides multiples of 8. Not yet: ring blocks (offsets,
// f32 partial results and their merge), packed documents, the sliding window, and a backward
// whose D comes from the caller (no O): those run ours, with the reason.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "untied/core/status.h"

namespace untied::cuda {

enum class AttentionKernel { kAuto, kCudnn, kMma, kWgmma };

// Whether `auto` takes cuDNN: false until scripts/gpu-check has run the cuDNN path against the CPU
// on a GPU (it has not yet: docs/gpu.md); `cudnn` takes it regardless.
inline constexpr bool kAutoTakesCudnn = false;

// UNTIED_CUDA_ATTENTION parsed: invalid_argument naming the choices for any other value.
StatusOr<AttentionKernel> attention_kernel_requested();
StatusOr<AttentionKernel> parse_attention_kernel(const std::string& value);
const char* attention_kernel_name(AttentionKernel k);

// ok when cuDNN's fused attention takes this call's case (forward, or backward with its delta
// source); else unsupported, saying which property keeps it on our kernels.
Status cudnn_supports(const AttentionShape& s, bool backward, DeltaSource delta = DeltaSource::kFromOut);

// The kernel that runs a call: cuDNN when requested is cudnn (or auto, with kAutoTakesCudnn), `cudnn_ready` (the library
// opened, the build has the frontend) is ok and cudnn_supports(...) is ok; else kMma or kWgmma
// (as requested; auto and cudnn fall back to kMma). *why (when not null) says why cuDNN was not
// taken, or "" when it was.
AttentionKernel choose_attention_kernel(AttentionKernel requested, const Status& cudnn_ready, const AttentionShape& s,
                                        bool backward, DeltaSource delta, std::string* why = nullptr);

// The key of a cuDNN graph: everything the graph is built from (not the pointers). Graphs are
// built once per key and cached (cudnn_attention.cc).
struct CudnnGraphKey {
  bool backward = false;
  int64_t seq_q = 0, seq_k = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t q_row_stride = 0, kv_row_stride = 0;
  bool causal = false;
  uint32_t scale_bits = 0;  // the softmax scale's float bits
  int device = 0;           // the GPU the graph is built for
  bool operator==(const CudnnGraphKey&) const = default;
  std::string describe() const;  // "fwd S=8192/8192 H=32 G=8 D=128 causal strides 4096/1024 scale 0.0884 gpu 0"
};
CudnnGraphKey cudnn_graph_key(const AttentionShape& s, bool backward, int device);
struct CudnnGraphKeyHash {
  size_t operator()(const CudnnGraphKey& k) const;
};

}  // namespace untied::cuda
