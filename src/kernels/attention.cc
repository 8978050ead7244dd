#include "untied/kernels/attention.h"

#include "kernels/backend.h"

namespace untied {

void validate(const AttentionShape& s) {
  UNTIED_CHECK(s.seq_q >= 1 && s.seq_k >= 1, "attention: seq_q and seq_k must be >= 1, got ", s.seq_q,
               " and ", s.seq_k);
  UNTIED_CHECK(s.heads >= 1 && s.kv_heads >= 1, "attention: heads (", s.heads, ") and kv_heads (",
               s.kv_heads, ") must be >= 1");
  UNTIED_CHECK(s.heads % s.kv_heads == 0, "attention: heads (", s.heads,
               ") must be a multiple of kv_heads (", s.kv_heads, ")");
  UNTIED_CHECK(s.head_dim >= 1 && s.head_dim <= 1024, "attention: head_dim must be in [1, 1024], got ",
               s.head_dim);
  UNTIED_CHECK(s.q_row_stride == 0 || s.q_row_stride >= s.heads * s.head_dim,
               "attention: q_row_stride (", s.q_row_stride, ") is shorter than heads*head_dim (",
               s.heads * s.head_dim, ")");
  UNTIED_CHECK(s.kv_row_stride == 0 || s.kv_row_stride >= s.kv_heads * s.head_dim,
               "attention: kv_row_stride (", s.kv_row_stride, ") is shorter than kv_heads*head_dim (",
               s.kv_heads * s.head_dim, ")");
  UNTIED_CHECK(s.block_q >= 0 && s.block_k >= 0, "attention: block sizes must be >= 0 (0 = default)");
  UNTIED_CHECK(s.scale >= 0.0f, "attention: scale must be >= 0 (0 = 1/sqrt(head_dim)), got ", s.scale);
  UNTIED_CHECK(s.window >= 0, "attention: window must be >= 0 (0 = none), got ", s.window);
  UNTIED_CHECK(!s.accumulate_dkv || s.f32_results, "attention: accumulate_dkv adds into fp32 dk, dv: it needs f32_results");
  UNTIED_CHECK((s.doc_starts == nullptr) == (s.num_docs == 0), "attention: doc_starts and num_docs (", s.num_docs,
               ") must be given together");
  UNTIED_CHECK(s.causal || (s.num_docs == 0 && s.window == 0),
               "attention: documents and windows need the causal mask");
  UNTIED_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16,
               "attention: storage must be f32 or bf16, got ", dtype_name(s.dtype));
}

void attention_forward(Device& dev, const AttentionShape& s, const AttentionForwardTensors& t) {
  validate(s);
  run_op(dev, &KernelTable::attention_forward, "attention_forward", AttentionForwardCall{.s = s, .t = t});
}

void attention_backward(Device& dev, const AttentionShape& s, const AttentionBackwardTensors& t) {
  validate(s);
  UNTIED_CHECK(!s.f32_results || s.dtype == DType::kF32,
               "attention_backward: f32_results with bf16 storage takes D from the caller: use "
               "attention_backward_with_delta");
  UNTIED_CHECK(t.delta == nullptr,
               "attention_backward: computes D from out, so delta must be null: use attention_backward_with_delta");
  run_op(dev, &KernelTable::attention_backward, "attention_backward",
         AttentionBackwardCall{.s = s, .t = t, .delta_source = DeltaSource::kFromOut});
}

void attention_backward_with_delta(Device& dev, const AttentionShape& s, const AttentionBackwardTensors& t) {
  validate(s);
  UNTIED_CHECK(t.out == nullptr,
               "attention_backward_with_delta: reads D from delta, so out must be null: use attention_backward");
  run_op(dev, &KernelTable::attention_backward, "attention_backward",
         AttentionBackwardCall{.s = s, .t = t, .delta_source = DeltaSource::kGiven});
}

void attention_merge(Device& dev, const AttentionMergeShape& s, const AttentionMergeTensors& t) {
  UNTIED_CHECK(s.rows >= 0 && s.heads >= 1 && s.head_dim >= 1, "attention_merge: rows (", s.rows, "), heads (",
               s.heads, ") and head_dim (", s.head_dim, ") must be >= 0, >= 1, >= 1");
  const int64_t hd = s.heads * s.head_dim;
  UNTIED_CHECK((s.acc_row_stride == 0 || s.acc_row_stride >= hd) && (s.part_row_stride == 0 || s.part_row_stride >= hd),
               "attention_merge: row strides (", s.acc_row_stride, ", ", s.part_row_stride,
               ") are shorter than heads*head_dim (", hd, ")");
  UNTIED_CHECK((s.lse_acc_stride == 0 || s.lse_acc_stride >= s.rows) &&
                   (s.lse_part_stride == 0 || s.lse_part_stride >= s.rows),
               "attention_merge: lse strides (", s.lse_acc_stride, ", ", s.lse_part_stride, ") are shorter than rows (",
               s.rows, ")");
  if (s.rows == 0) return;
  AttentionMergeShape f = s;  // defaults filled in: the backends see explicit strides
  if (f.acc_row_stride == 0) f.acc_row_stride = hd;
  if (f.part_row_stride == 0) f.part_row_stride = hd;
  if (f.lse_acc_stride == 0) f.lse_acc_stride = s.rows;
  if (f.lse_part_stride == 0) f.lse_part_stride = s.rows;
  run_op(dev, &KernelTable::attention_merge, "attention_merge",
         AttentionMergeCall{.s = f, .t = t});
}

double attention_forward_flops(const AttentionShape& s) {
  double f = 4.0 * static_cast<double>(s.seq_q) * static_cast<double>(s.seq_k) *
             static_cast<double>(s.head_dim) * static_cast<double>(s.heads);
  return s.causal && s.seq_q == s.seq_k ? f / 2 : f;
}

double attention_backward_flops(const AttentionShape& s) { return 2.5 * attention_forward_flops(s); }

}  // namespace untied
