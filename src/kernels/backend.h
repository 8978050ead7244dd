// The interface between the backend-neutral kernel entry points (the public headers in
// include/untied/kernels/, implemented in src/kernels/<op>.cc) and a backend (cpu/, cuda/).
//
// Each backend fills one KernelTable, in one file (cpu/cpu_backend.cc, cuda/cuda_backend.cc).
// Per op the table holds an OpEntry: the function that runs the op and, where the backend needs
// them, the scratch it asks for and the calls it refuses. Every entry point does, in order:
//   1. the shape checks of the public header (the same for every backend);
//   2. the backend's own refusal, if any (supports): Error(kUnsupported)
//      "<device> does not support <op>: <what to change>";
//   3. the call's scratch, allocated from the device's allocator as the backend asks
//      (scratch: a pure function of the call and the device's thread count);
//   4. on a backed device only, the backend's run function.
// So a rehearsal (an unbacked, counting device) allocates every byte a real run would, and
// never reaches a backend's kernel. A backend without an op leaves its run null: the entry
// point then fails with "<device> does not support <op>".
//
// Each op's arguments travel in one call struct: the public header's shape struct and the
// op's pointers, by the header's names; where the header has a struct of them (gemm's
// GemmParams, attention's tensors), that struct itself.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

#include "untied/core/allocator.h"
#include "untied/core/check.h"
#include "untied/core/status.h"
#include "untied/kernels/adamw.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/embedding.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/lm_head_loss.h"
#include "untied/kernels/moe.h"
#include "untied/kernels/rmsnorm.h"
#include "untied/kernels/rope.h"
#include "untied/kernels/swiglu.h"

namespace untied {

// ---- scratch ----

inline constexpr int kMaxScratch = 6;

// The scratch buffers one call asks for, by slot (each kernel names its slots with an enum).
// Slots that are set are allocated in slot order, before the call, and freed after it.
struct ScratchRequest {
  struct Item {
    bool set = false;
    int64_t bytes = 0;
    Tag tag = Tag::kOther;
    const char* what = "";
  };
  std::array<Item, kMaxScratch> items{};
  void set(int slot, int64_t bytes, Tag tag, const char* what) { items.at(slot) = Item{true, bytes, tag, what}; }
};

// The allocated scratch of one call; slots that were not asked for are empty (null).
struct Scratch {
  std::array<Buffer, kMaxScratch> buffers;
  template <typename T>
  T* as(int slot) const {
    return buffers.at(slot).as<T>();
  }
  void* data(int slot) const { return buffers.at(slot).data(); }
};

// ---- one call struct per op ----

enum class Direction { kForward, kInverse };     // rope: the rotation or its inverse (its backward)
enum class LossPass { kForward, kForwardBackward };

struct AttentionForwardCall { AttentionShape s; AttentionForwardTensors t; };
// Where the backward's D = rowsum(dO * O) comes from: t.out or t.delta. Not inferred from the
// pointers, which are null in rehearsal.
enum class DeltaSource { kFromOut, kGiven };
struct AttentionBackwardCall { AttentionShape s; AttentionBackwardTensors t; DeltaSource delta_source; };
struct AttentionMergeCall { AttentionMergeShape s; AttentionMergeTensors t; };
struct RopeCall { RopeShape s; void* x; const int64_t* positions; Direction dir; };
struct RmsNormForwardCall { RmsNormShape s; void* y; float* rstd; const void *x, *w; };
struct RmsNormBackwardCall {
  RmsNormShape s;
  void* dx;
  float* dw;
  const void* x;
  const float* rstd;
  const void *w, *dy;
};
struct SwigluForwardCall { SwigluShape s; void* out; const void *gate, *up; };
struct SwigluBackwardCall { SwigluShape s; void *dgate, *dup; const void *gate, *up, *dout; };
struct EmbeddingForwardCall { EmbeddingShape s; void* out; const int32_t* ids; const void* table; };
struct EmbeddingBackwardCall { EmbeddingShape s; float* dtable; const int32_t* ids; const void* dout; };
struct LmHeadLossCall {
  LmHeadLossShape s;
  LossPass pass;
  LossSums* sums;   // host memory
  int32_t* argmax;  // nullable
  void* dh;         // kForwardBackward only
  float* dw;        // kForwardBackward only
  const void* h;
  const int32_t* labels;
  const void* w;
  double* row_losses = nullptr;  // host memory, nullable: (tokens) per-row losses (0 unlabelled)
};
struct AdamWCall { float *p, *m, *v; const float* g; int64_t n; AdamWParams a; };
struct SumSquaresCall {
  const float* g;
  int64_t n;
  double* result;  // host memory: the sum (left untouched in rehearsal)
};
struct ScaleCall { float* x; int64_t n; float scale; };
struct RowDotCall {
  int64_t rows, dim;
  DType dtype;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  float* out;
  int64_t out_stride;
};
struct AddIntoCall { void* acc; DType acc_dtype; const void* x; DType x_dtype; int64_t n; };
struct ConvertCall { void* dst; DType dst_dtype; const void* src; DType src_dtype; int64_t n; };
struct GemmGroupedCall {
  const GemmParams* groups;  // each with m, n > 0, one dtype of A, of B and of C for all
  int64_t count;
};
struct GatherRowsCall {
  MoeRows s;
  void* dst;
  const void* src;
  int64_t src_rows;
  const int32_t* idx;
};
struct CombineRowsCall {
  MoeRows s;
  void* out;
  const void* ys;
  const int32_t* pos;
  const float* w;
  bool accumulate;
};
struct CombineRowsBackwardCall {
  MoeRows s;
  void* dys;
  float* dw;
  const void* dy;
  const void* ys;
  const int32_t* pos;
  const float* w;
};
struct AddBiasCall { void* out; DType out_dtype; int64_t ld, rows, n; const void* bias; DType bias_dtype; };
struct BiasGradCall {
  void* db;
  DType db_dtype;
  const void* g;
  DType g_dtype;
  int64_t ld, rows, n;
  bool accumulate;
};

// ---- the table ----

template <typename Call>
struct OpEntry {
  void (*run)(Device& dev, const Call& call, const Scratch& scratch) = nullptr;  // null: not supported
  ScratchRequest (*scratch)(const Device& dev, const Call& call) = nullptr;      // null: no scratch
  Status (*supports)(const Call& call) = nullptr;                                // null: every valid call
};

struct KernelTable {
  const char* name = "";
  OpEntry<GemmParams> gemm;
  OpEntry<GemmGroupedCall> gemm_grouped;  // null: gemm_grouped runs the groups one by one
  OpEntry<AttentionForwardCall> attention_forward;
  OpEntry<AttentionBackwardCall> attention_backward;
  OpEntry<AttentionMergeCall> attention_merge;
  OpEntry<RopeCall> rope;
  OpEntry<RmsNormForwardCall> rmsnorm_forward;
  OpEntry<RmsNormBackwardCall> rmsnorm_backward;
  OpEntry<SwigluForwardCall> swiglu_forward;
  OpEntry<SwigluBackwardCall> swiglu_backward;
  OpEntry<EmbeddingForwardCall> embedding_forward;
  OpEntry<EmbeddingBackwardCall> embedding_backward;
  OpEntry<LmHeadLossCall> lm_head_loss;
  OpEntry<AdamWCall> adamw;
  OpEntry<SumSquaresCall> grad_sum_squares;
  OpEntry<ScaleCall> scale_in_place;
  OpEntry<RowDotCall> row_dot;
  OpEntry<AddIntoCall> add_into;
  OpEntry<ConvertCall> convert;
  OpEntry<AddBiasCall> add_bias;
  OpEntry<BiasGradCall> bias_grad;
  OpEntry<GatherRowsCall> gather_rows;
  OpEntry<CombineRowsCall> combine_rows;
  OpEntry<CombineRowsBackwardCall> combine_rows_backward;
};

// The tables (cpu/cpu_backend.cc; cuda/cuda_backend.cc in builds with the CUDA backend, handed
// out by the CUDA device: Device::kernels()).
namespace cpu {
const KernelTable& kernel_table();
}
namespace cuda {
const KernelTable& kernel_table();
}

// The table of dev's backend: dev.kernels(), or the CPU's.
const KernelTable& kernel_table(const Device& dev);

Scratch allocate_scratch(Device& dev, const ScratchRequest& request);
// Steps 2-4 above, for the op `entry` of dev's table (`op` names it in messages).
template <typename Call>
void run_op(Device& dev, OpEntry<Call> KernelTable::*entry, const char* op, const Call& call) {
  const OpEntry<Call>& e = kernel_table(dev).*entry;
  if (e.run == nullptr) unsupported(dev, op);
  if (e.supports != nullptr) {
    const Status st = e.supports(call);
    if (!st.ok()) fail(ErrorKind::kUnsupported, str_cat(dev.name(), " does not support ", op, ": ", st.message()));
  }
  Scratch scratch;
  if (e.scratch != nullptr) scratch = allocate_scratch(dev, e.scratch(dev, call));
  if (!dev.backed()) return;
  OpTimes* const times = dev.kind() == DeviceKind::kCpu ? dev.op_times : nullptr;
  if (times == nullptr) {
    e.run(dev, call, scratch);
    return;
  }
  // The op's own time: its callees' (ops it runs itself) are taken off it and counted as theirs.
  times->nested.push_back(0.0);
  const auto t0 = std::chrono::steady_clock::now();
  e.run(dev, call, scratch);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  times->seconds[op] += total - times->nested.back();
  times->nested.pop_back();
  if (!times->nested.empty()) times->nested.back() += total;
}

// ---- scratch layouts that every backend shares ----

// rmsnorm backward: the fp64 block sums of dw, ceil(rows / 2048) x dim (rmsnorm.h).
inline constexpr int64_t kRmsNormRowBlock = 2048;
enum RmsNormScratch { kRmsNormBlockSums };
ScratchRequest rmsnorm_backward_scratch(const Device& dev, const RmsNormBackwardCall& c);

// The loss's workspace as lm_head_loss.h lays it out; h32/dh32/w32 only when h / h in backward
// / w are bf16. Vocab rows per widened block of a bf16 w: lm_head_loss_weight_block.
enum LmHeadLossScratch { kLossLogits, kLossRowLosses, kLossH32, kLossDh32, kLossW32 };
ScratchRequest lm_head_loss_scratch(const Device& dev, const LmHeadLossCall& c);
int64_t lm_head_loss_weight_block(const LmHeadLossShape& s);

}  // namespace untied
