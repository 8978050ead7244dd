// Building blocks shared by the attention strategies: named GEMM shapes over head rows of the
// standard weight layout, RoPE on packed buffers, and the all-to-all exchange.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "untied/attention/attention_block.h"
#include "untied/attention/token_layout.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/rope.h"

namespace untied::attn {

enum class Rope { kForward, kInverse };         // RoPE, or its inverse (the backward of a rotation)
enum class Write { kOverwrite, kAccumulate };   // a weight gradient: = or +=
enum class QkPart { kQ, kK };                   // which of Qwen3's per-head norms
enum class QkGrads { kNone, kAccumulate };      // forward passes need no weight gradients

// A buffer packed by rank for the all-to-all: blocks p < C of (rows, heads, D) elements of
// elem_bytes each (send buffers: block p goes to rank p; receives: block p came from rank p).
// slot(p, j) is head j of block p, its rows ld() elements apart. The one place the layout
// [C][rows][heads][D] is spelled out.
struct PackedHeads {
  void* base = nullptr;
  int64_t rows = 0, heads = 0, d = 0, elem_bytes = 0;
  char* slot(int64_t p, int64_t j) const {
    return static_cast<char*>(base) + (p * rows * heads + j) * d * elem_bytes;
  }
  int64_t ld() const { return heads * d; }
};

// Throws Error(kInvalidArgument) naming the tensor when x (rows, E), the weights or the
// gradient/output tensors do not match the configuration (shapes and dtype).
void check_tensors(const AttentionConfig& cfg, int64_t rows, const Tensor& x, const AttentionWeights& w,
                   const Tensor& y_or_dy);
void check_grads(const AttentionConfig& cfg, int64_t rows, const Tensor& dx, const AttentionGrads& g);
// The weight gradients alone (a call whose dx and dy are both given by tiles).
void check_grad_weights(const AttentionConfig& cfg, const AttentionGrads& g);
// The weights alone (a call whose x and y are both given by tiles).
void check_weights(const AttentionConfig& cfg, const AttentionWeights& w);
// Checks a TiledOutput (tile >= 1, consume set), then makes y whole (Tag::kOther) with
// forward(whole) and hands it out by tiles: for strategies that write y whole.
void hand_out_whole_output(Device& dev, const TiledOutput& y, int64_t rows, int64_t hidden, DType t,
                           const std::function<void(const Tensor& whole)>& forward);

// The projections run one GEMM per block of heads: the heads whose slots lie side by side in a
// send or receive buffer (PackedHeads: block p's slots j = 0..n-1), `heads` holding the model's
// head in each slot. Their weights are w's own rows (or wo's columns) when the heads are
// consecutive, else a copy of them in slot order (HeadWeights).

// The weights of a block of heads as one matrix: the rows of w (n_heads*D, E) for `heads`, in
// order, as (n*D, E) (kRows); or the columns of wo (E, n_heads*D) as (E, n*D) (kCols).
class HeadWeights {
 public:
  enum Side { kRows, kCols };
  HeadWeights(Device& dev, const Tensor& w, const std::vector<int64_t>& heads, int64_t d, Side side);
  const void* data() const { return data_; }
  int64_t ld() const { return ld_; }
  DType dtype() const { return dtype_; }

 private:
  TensorBuffer copy_;  // Tag::kAttnWorkspace, when the heads are not consecutive
  const void* data_ = nullptr;
  int64_t ld_ = 0;
  DType dtype_ = DType::kF32;
};

// out (rows, n*D) at ld_out = x (rows, E) W^T, W = HeadWeights(w, heads, kRows).
void project_heads(Device& dev, void* out, int64_t ld_out, DType out_t, const void* x, DType x_t, int64_t rows,
                   const Tensor& w, const std::vector<int64_t>& heads, int64_t d);

// dst (rows, n*D) at ld_dst = dy (rows, E) W, W = HeadWeights(wo, heads, kCols).
void project_out_grad_heads(Device& dev, void* dst, int64_t ld_dst, DType dst_t, const void* dy, DType dy_t,
                            int64_t rows, const Tensor& wo, const std::vector<int64_t>& heads, int64_t d);

// The projections of every block of a packed buffer at once: rows [r0, r0 + n) of block p of dst
// (its slots, heads[p] holding the model's head in each) = x (n, E) W_p^T (kRows, W_p =
// HeadWeights(w, heads[p])) or dy (n, E) W_p (kCols, w = wo). One GEMM over every block's heads
// (all C blocks' columns side by side, a run of at most kProjectionRows rows (attention_block.h) at a time, into a
// Tag::kAttnWorkspace buffer of that many rows) scattered into the blocks: x is packed once for
// them all, not once per block, and the GEMM is C times wider. Each element is the same sum over
// E as one GEMM per block computes.
void project_blocks(Device& dev, const PackedHeads& dst, int64_t r0, DType out_t, const void* x, DType x_t, int64_t n,
                    const Tensor& w, const std::vector<std::vector<int64_t>>& heads, HeadWeights::Side side);

// Qwen2's q/k/v biases (AttentionConfig::qkv_bias; nothing when `bias` is empty): rows [r0, r0 + n)
// of every block of dst (its slots holding heads[p]) += the bias (model heads * D) of each
// slot's head, one add_bias per run of consecutive heads.
void add_head_biases(Device& dev, const PackedHeads& dst, int64_t r0, int64_t n, DType t, const Tensor& bias,
                     const std::vector<std::vector<int64_t>>& heads);

// The block input as the projections read it: whole (an (L, E) tensor), or a tile of rows at a
// time (TiledInput, attention_block.h), each tile written into a scratch buffer first.
class InputRows {
 public:
  explicit InputRows(const Tensor& whole) : whole_(&whole) {}
  // what: the name of the tile's scratch buffer (Tag::kAttnWorkspace).
  InputRows(Device& dev, const TiledInput& tiled, int64_t rows, int64_t hidden, DType t,
            const char* what = "block input (tile)")
      : dev_(&dev), tiled_(&tiled), rows_(rows), hidden_(hidden), t_(t), what_(what) {}
  bool tiled() const { return tiled_ != nullptr; }
  DType dtype() const { return tiled_ != nullptr ? t_ : whole_->dtype(); }
  // The most rows one call of for_each's fn gets.
  int64_t max_rows() const;
  // fn(r0, n, x) over consecutive runs of rows covering all of them, x pointing at row r0 of the
  // input (n rows, E apart): one call with every row when whole, one per tile otherwise.
  void for_each(const std::function<void(int64_t r0, int64_t n, const void* x)>& fn) const;

 private:
  const Tensor* whole_ = nullptr;
  Device* dev_ = nullptr;
  const TiledInput* tiled_ = nullptr;
  int64_t rows_ = 0, hidden_ = 0;
  DType t_ = DType::kF32;
  const char* what_ = "block input (tile)";
};

// The tiled input made whole (rows, E): for the strategies that do not tile (local).
TensorBuffer whole_input(Device& dev, const TiledInput& x, int64_t rows, int64_t hidden, DType t);

// For the strategies that do not form dx by tiles (local): dx made whole in fp32 (rows, hidden,
// Tag::kOther) by backward(whole), then handed out to dx.consume a tile at a time.
void hand_out_whole(Device& dev, const TiledGrad& dx, int64_t rows, int64_t hidden,
                    const std::function<void(const Tensor& whole)>& backward);

// A block of heads of a gradient (rows, n*D) at g, for head_weight_grads.
struct HeadBlock {
  const void* g;
  std::vector<int64_t> heads;
};
// The backward of project_heads, the weight side: dw_head (D, E) (= or +=, per dw_write) g^T x
// for each head of each block, x read by `x`'s runs of rows, one GEMM per block and run (x
// packed once for the block's heads). The sums run in fp32 and a dw in another dtype is rounded
// once per call: a block whose heads are consecutive is written into dw's rows by its GEMM
// (which rounds once) when x is whole or dw is fp32; otherwise its sums go to an fp32 scratch
// (Tag::kAttnWorkspace: one block's heads when x is whole, every block's when it is tiled, as the
// sums over tiles need) and are written or added into dw per head.
void head_weight_grads(Device& dev, const std::vector<HeadBlock>& blocks, int64_t ld_g, DType g_t, const InputRows& x,
                       int64_t d, const Tensor& dw, Write dw_write);
// The bias side (qkv_bias; nothing when db is empty): db[head] (D) = or += (per db_write) the sum
// over the rows of each head's D columns of g; a head in several blocks (a KV head replicated
// over ranks) adds up.
void head_bias_grads(Device& dev, const std::vector<HeadBlock>& blocks, int64_t ld_g, DType g_t, int64_t rows,
                     int64_t d, const Tensor& db, Write db_write);
// The input side: dx (rows, E) (f32 accumulator) += g (rows, n*D) W, W = HeadWeights(w, heads, kRows).
void heads_input_grad(Device& dev, float* dx, const void* g, int64_t ld_g, DType g_t, int64_t rows, const Tensor& w,
                      const std::vector<int64_t>& heads, int64_t d);

// The RoPE positions of a run of rows: the segments of global positions they hold
// (token_layout.h: one or two runs), or, with packed documents, a device table of one position per
// row (each document restarting at 0, sequence_mask.h).
struct RowPositions {
  const std::vector<TokenSegment>* segments = nullptr;
  const int64_t* table = nullptr;  // when not null, used instead of the segments
};

// RoPE on a packed buffer (blocks, rows, heads, D): every block holds the same `rows` tokens, at
// `pos`; one kernel call per block (and segment).
void rope_blocks(Device& dev, void* buf, DType t, int64_t blocks, int64_t rows, int64_t heads, int64_t d,
                 double theta, const RopeScaling& scaling, const RowPositions& pos, Rope dir);

// What a forward keeps of its mask (attention_block.h, SavedMask): the host copy, and with more
// than one document the starts and the RoPE positions of `rows` (this rank's) and `group` (its
// group sequence's) on the device. Counted, not copied, in rehearsal.
void keep_mask(Device& dev, const SequenceMask& mask, const std::vector<TokenSegment>& rows,
               const std::vector<TokenSegment>& group, SavedMask& out);
// s with the kept mask's documents and window.
AttentionShape masked(AttentionShape s, const SavedMask& m);
// Refuses a mask of another length than the block's sequence.
void check_mask(const AttentionConfig& cfg, const SequenceMask& mask);

// all_to_all of equal blocks; skipped in rehearsal (unbacked buffers).
void exchange(Device& dev, Communicator& comm, const void* send, void* recv, int64_t block_bytes);

// A group of all-to-alls of equal blocks (one stage's q, or its k and v, ...), each holding its
// send buffer until the group is waited for. Overlapped (UPipe's --overlap): start() leaves the
// exchange in flight (Communicator::all_to_all_start) and wait() completes the group in start
// order, then frees the send buffers; the receive buffers are the caller's and hold the data
// once wait() returns. Not overlapped: start() exchanges at once and frees the send buffer, and
// wait() has nothing to do. In rehearsal nothing moves but the buffers are held as in a real
// run, so the allocator counts what overlap costs.
class Exchanges {
 public:
  Exchanges() = default;
  Exchanges(Device& dev, Communicator& comm, bool overlap) : dev_(&dev), comm_(&comm), overlap_(overlap) {}
  Exchanges(Exchanges&&) = default;
  Exchanges& operator=(Exchanges&&) = default;
  ~Exchanges();  // waits for what is still in flight (errors dropped: call wait() to see them)
  // recv (C blocks of block_bytes) = all_to_all(send); `send` belongs to the group from now on.
  void start(TensorBuffer send, void* recv, int64_t block_bytes);
  // The same from a send buffer the caller keeps alive, unchanged, until wait() returns.
  void start(const void* send, void* recv, int64_t block_bytes);
  void wait();
  bool in_flight() const { return !pending_.empty(); }

 private:
  Device* dev_ = nullptr;
  Communicator* comm_ = nullptr;
  bool overlap_ = false;
  std::vector<TensorBuffer> sends_;
  std::vector<std::unique_ptr<PendingExchange>> pending_;  // null entries: rehearsal
};


// Qwen3's per-head RMSNorm of q and k (cfg.qk_norm): forward into a new buffer, backward from
// the saved pre-norm input and rstd, weight gradients accumulated in fp32 over every call of one
// backward pass and stored (=) into the block's gradients at its end.
class QkNorm {
 public:
  // kAccumulate: allocate the fp32 weight-gradient accumulators (backward passes).
  QkNorm(Device& dev, const AttentionConfig& cfg, QkGrads grads);
  bool on() const { return on_; }
  // y = rmsnorm(x) over each D-vector of x (any shape, numel % D == 0); rstd receives one per vector.
  TensorBuffer forward(const Tensor& x, const Tensor& w, TensorBuffer* rstd, const char* what);
  // dx from the saved x and rstd and dy; accumulates the q or k weight gradient.
  TensorBuffer backward(QkPart part, const Tensor& x, const Tensor& rstd, const Tensor& w, const Tensor& dy);
  void store_grads(const AttentionGrads& g);

 private:
  Device& dev_;
  bool on_;
  int64_t d_;
  float eps_;
  DType t_;
  TensorBuffer dq_, dk_;
};

}  // namespace untied::attn
