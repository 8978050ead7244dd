// cuDNN's fused attention (SDPA, through its C++ graph frontend) as a path of the CUDA backend's
// attention: forward with its softmax statistics (our LSE) and backward from O, dO and the LSE,
// bf16, causal or full, GQA without expanding K and V. Which calls it takes: attention_select.h.
//
// Loading: libcudnn.so.9 is opened at the first call of cudnn_attention_ready() (dlopen, as
// cuBLAS is: a CPU run of a CUDA build maps no cuDNN), the frontend resolving every cuDNN
// function from it (its dynamic-loading mode). A build without the frontend headers, or a
// machine without libcudnn 9, is not an error: ready() says why and our kernels run.
// Graphs: built once per CudnnGraphKey (shape, strides, causal, scale, GPU) and cached for the
// process; one cuDNN handle per stream. Workspace: from the device allocator, tag kAttnWorkspace,
// for the call (so the run's peaks count it).
// Layout: ours (attention.h) seen as cuDNN's (b = 1, h, s, d) with strides (-, D, row stride, 1);
// the LSE (H, seq_q) fp32 as cuDNN's Stats (1, H, seq_q, 1).
#pragma once

#include "kernels/backend.h"
#include "untied/core/status.h"

namespace untied::cuda {

// ok when cuDNN's fused attention can run in this process; else why not (once, then cached).
Status cudnn_attention_ready();

// REQUIRES: cudnn_attention_ready().ok() and cudnn_supports(c.s, ...) ok. Throws Error naming the
// graph key when cuDNN refuses or fails a graph it claimed to support.
void cudnn_attention_forward(Device& dev, const AttentionForwardCall& c);
void cudnn_attention_backward(Device& dev, const AttentionBackwardCall& c);

}  // namespace untied::cuda
