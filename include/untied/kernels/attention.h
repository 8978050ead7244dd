// Flash attention, forward and backward (the FlashAttention-2 algorithm): softmax(scale*QK^T)V
// computed block by block with an online softmax, never holding a (seq_q, seq_k) matrix.
//
// Layouts (token-major, heads interleaved; row strides are elements between tokens):
//   q, out, dout, dq   (seq_q, H, D)   row stride q_row_stride  (default H*D)
//   k, v, dk, dv       (seq_k, G, D)   row stride kv_row_stride (default G*D)
//   lse                (H, seq_q) fp32, contiguous: log-sum-exp of the scaled scores per row
// Storage is f32 or bf16 (`dtype`, the same for all tensors, but see f32_results); compute is
// fp32.
//
// GQA with the standard mapping: query head h reads KV head h / (H / G).
// Causal: query row i (global position q_offset + i) sees key j (global position
// k_offset + j) iff k_offset + j <= q_offset + i. Offsets let ring attention call the kernel
// on blocks of a longer sequence. A query row that sees no key gets out = 0, lse = -inf.
//
// Workspace: from the device allocator, tag kAttnWorkspace. Forward: per-thread tiles only
// (independent of seq). Backward, with T = dev.threads(): D_i = rowsum(dO * O) (H, seq_q) fp32
// unless the caller passes it, and fp32 dQ accumulators (seq_q, H, D): T - 1 of them when dq is
// f32 (thread 0 accumulates into dq itself), T when dq is bf16. One accumulator per thread keeps
// the result deterministic for a given T (no atomics; a fixed summation order). All are
// linear in seq.
// CUDA: a tensor-core path (bf16, D = 64 or 128, sm_80+, row strides multiples of 8, 16-byte
// aligned tensors; on Hopper also the wgmma kernels, chosen with UNTIED_CUDA_ATTENTION=wgmma) and a
// portable fp32 path for everything else (all f32 storage); D <= 256
// (larger D is Error(kUnsupported) there); block_q/block_k are ignored. Workspace: delta
// (H, seq_q) fp32 when not given, and for bf16 dq an fp32 (seq_q, H, D) accumulator; the
// forward none. out, lse, dk and dv are run-to-run deterministic; dq is accumulated with fp32
// atomics (equal to rounding, not bitwise, between runs).
// REQUIRES: H % G == 0; seq_q, seq_k, H, G >= 1; 1 <= D <= 1024; q/k/v/out/dout non-overlapping with the
// outputs written.
#pragma once

#include <cstdint>

#include "untied/core/dtype.h"
#include "untied/device/device.h"

namespace untied {

struct AttentionShape {
  int64_t seq_q = 0;
  int64_t seq_k = 0;
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // G
  int64_t head_dim = 0;  // D
  int64_t q_offset = 0;  // global position of query row 0
  int64_t k_offset = 0;  // global position of key row 0
  bool causal = true;
  const int64_t* doc_starts = nullptr;  // num_docs entries, device memory; null = one document
  int64_t num_docs = 0;
  int64_t window = 0;                   // keys a query sees at most (itself included); 0 = all
  float scale = 0.0f;          // 0 = 1/sqrt(D)
  int64_t q_row_stride = 0;    // 0 = H*D
  int64_t kv_row_stride = 0;   // 0 = G*D
  DType dtype = DType::kF32;   // storage of q, k, v, out, dout, dq, dk, dv
  // out (forward) and dq, dk, dv (backward) in fp32 whatever `dtype`: partial results that ring
  // attention merges and sums in fp32. The backward then takes D from the caller
  // (attention_backward_with_delta).
  bool f32_results = false;
  // With f32_results, backward adds dk and dv into the caller's fp32 buffers (+=) instead of
  // writing them (=): a sum over several calls (UPipe's stages of a KV round) with no buffer of
  // its own per call.
  bool accumulate_dkv = false;
  int64_t block_q = 0;         // tile sizes; 0 = the backend's default
  int64_t block_k = 0;
};

// Throws Error(kInvalidArgument) naming the bad field when the shape cannot work.
void validate(const AttentionShape& s);

// The tensors of one call, in device memory, laid out as above and stored as `dtype` unless said
// otherwise. A field marked = is overwritten, one marked += added to; the others are read.
// Forward:
struct AttentionForwardTensors {
  void* out = nullptr;      // (seq_q, H, D) =, fp32 with f32_results
  float* lse = nullptr;     // (H, seq_q) fp32 =
  const void* q = nullptr;  // (seq_q, H, D)
  const void* k = nullptr;  // (seq_k, G, D)
  const void* v = nullptr;  // (seq_k, G, D)
};

// out =, lse = from q, k, v.
void attention_forward(Device& dev, const AttentionShape& s, const AttentionForwardTensors& t);

// Backward: the gradients it writes, then what the forward saved (by the forward's names) and
// dout. D = rowsum(dout * out) comes from exactly one of out and delta, chosen by the function
// called (not by the pointers, which are null in rehearsal); the other must be null.
struct AttentionBackwardTensors {
  void* dq = nullptr;            // (seq_q, H, D) =, fp32 with f32_results
  void* dk = nullptr;            // (seq_k, G, D) =, or += with accumulate_dkv; fp32 with f32_results
  void* dv = nullptr;            // (seq_k, G, D) =, or += with accumulate_dkv; fp32 with f32_results
  const void* q = nullptr;       // (seq_q, H, D)
  const void* k = nullptr;       // (seq_k, G, D)
  const void* v = nullptr;       // (seq_k, G, D)
  const void* out = nullptr;     // (seq_q, H, D): attention_backward computes D from it
  const float* delta = nullptr;  // (H, seq_q) fp32, D itself: attention_backward_with_delta
  const float* lse = nullptr;    // (H, seq_q) fp32
  const void* dout = nullptr;    // (seq_q, H, D)
};

// dq =, dk, dv = (or with accumulate_dkv +=), with D computed from out.
// REQUIRES: delta null; with f32_results, f32 storage (else use attention_backward_with_delta).
void attention_backward(Device& dev, const AttentionShape& s, const AttentionBackwardTensors& t);

// The same with D given by the caller in delta instead of out (context-parallel callers compute
// it before the exchange, where out is local).
// REQUIRES: out null.
void attention_backward_with_delta(Device& dev, const AttentionShape& s, const AttentionBackwardTensors& t);

// Two attention results over disjoint key sets of the same queries, merged into the first (ring
// attention's log-sum-exp rule, all fp32), per query row i and head h:
//   lse' = log(exp(lse_acc) + exp(lse_part))
//   acc  = acc * exp(lse_acc - lse') + part * exp(lse_part - lse')     (acc =, lse_acc =)
// A side with lse = -inf (no key seen) contributes nothing; both -inf leaves acc and lse as they
// are. acc, part (rows, H, D) with row strides acc_row_stride, part_row_stride (0 = H*D); lse_acc,
// lse_part (H, ...) with lse_acc_stride, lse_part_stride elements between heads (0 = rows).
struct AttentionMergeShape {
  int64_t rows = 0, heads = 0, head_dim = 0;
  int64_t acc_row_stride = 0, part_row_stride = 0;
  int64_t lse_acc_stride = 0, lse_part_stride = 0;
};
struct AttentionMergeTensors {
  float* acc = nullptr;             // (rows, H, D) fp32 =, row stride acc_row_stride
  float* lse_acc = nullptr;         // (H, rows) fp32 =, head stride lse_acc_stride
  const float* part = nullptr;      // (rows, H, D) fp32, row stride part_row_stride
  const float* lse_part = nullptr;  // (H, rows) fp32, head stride lse_part_stride
};
void attention_merge(Device& dev, const AttentionMergeShape& s, const AttentionMergeTensors& t);

// FLOPs used in benchmarks: forward 4*Sq*Sk*D*H (halved when causal with Sq == Sk),
// backward 2.5x forward.
// The CPU backend's attention scratch for a call of shape s with `threads` threads, in bytes (all
// Tag::kAttnWorkspace): for plans made without a device (memory_plan.h). Pointers are not read.
int64_t cpu_attention_forward_scratch_bytes(const AttentionShape& s, int threads);
struct CpuAttentionBackwardScratch {
  int64_t delta = 0;            // D = rowsum(dO * O), when the kernel computes it from out
  int64_t dq_accumulators = 0;  // fp32 dQ accumulators beyond dq itself
  int64_t tiles = 0;            // every thread's tiles
};
CpuAttentionBackwardScratch cpu_attention_backward_scratch_bytes(const AttentionShape& s, bool delta_from_out,
                                                                 int threads);

double attention_forward_flops(const AttentionShape& s);
double attention_backward_flops(const AttentionShape& s);

}  // namespace untied
