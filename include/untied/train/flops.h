// The FLOPs of a training step, for the numbers users compare across systems: model TFLOP/s per
// rank (the work the model needs, whatever the schedule) and MFU against the device's peak.
//
// Per token of a causal decoder with L layers, H query heads of dimension D, at sequence length S:
//     model    = 6 * N + 6 * L * (H * D) * S
// where N counts the parameters that multiply (every parameter but the input embedding table; a
// tied LM head counts its V * E once, as the head's matmul). 6N: forward (2N) and backward (4N) of
// the matmuls; 6*L*(H*D)*S: QK^T and PV, forward and backward, halved by the causal mask
// (2 * 2 * S * H*D per token and layer forward, x3 with the backward, / 2). Recompute not
// counted: the usual MFU definition (PaLM, Megatron, the paper's TorchTitan figures).
//     hardware = model + the recomputed forward: full recompute repeats each block's forward
//                (2 * N_blocks + 2 * L * (H * D) * S), selective its non-attention part
//                (2 * N_blocks); N_blocks: the parameters of the L blocks.
// Norms, RoPE, SwiGLU's elementwise product and the softmax are left out (a few percent at most).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "untied/core/dtype.h"
#include "untied/model/decoder_options.h"
#include "untied/model/model_config.h"

namespace untied {

struct TokenFlops {
  double model = 0;     // per token, recompute not counted
  double hardware = 0;  // per token, recompute counted
};

// REQUIRES: recompute is kFull or kSelective (auto resolved).
TokenFlops flops_per_token(const ModelConfig& m, int64_t seq, Recompute recompute);

// The dense peak TFLOP/s of one device for dtype (bf16, or f32 on the tensor cores as TF32), by its name ("NVIDIA H100 80GB HBM3"): H100
// SXM / H200 989 (bf16) and 494 (f32 as TF32), H100 PCIe 756 / 378, A100 312 / 156, B200 2250 /
// 1100. none for other devices (CPUs: give --peak-tflops).
std::optional<double> known_peak_tflops(std::string_view device_name, DType dtype);

}  // namespace untied
