// Naive references for the kernel tests, written for clarity, not speed.
//
// Every function is a template over the arithmetic type T: T = double is THE reference the
// kernels are judged against; T = float is the same formula, same loop order, in fp32, and is
// used only to measure what a straightforward fp32 computation costs in accuracy (the baseline
// of the tolerances, STYLE.md habit 8). Tensors are dense, row-major, and use the layouts of
// the kernels' headers without strides:
//   q, out, dout, dq  (seq_q, H, D)      k, v, dk, dv  (seq_k, G, D)      lse  (H, seq_q)
//   x (tokens, heads, D) for RoPE;   A, B, C with explicit leading dimensions for GEMM.
#pragma once

#include <cstdint>
#include <vector>

namespace untied::ref {

// The attention problem in the glossary's letters (mirrors AttentionShape minus storage).
struct AttnDims {
  int64_t seq_q = 0, seq_k = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // H, G, D
  int64_t q_offset = 0, k_offset = 0;             // global positions of row 0
  bool causal = true;
  double scale = 0;  // 0 = 1/sqrt(D)
  // Packed documents (global start positions, the first 0; empty = one document) and a sliding
  // window of `window` keys (0 = none), both with causal only.
  std::vector<int64_t> doc_starts = {};
  int64_t window = 0;
};

// Query row i (position p = q_offset + i) sees key j (position k = k_offset + j) iff !causal, or
// k <= p, k is in p's document (no document start s with k < s <= p) and p - k < window (when
// window > 0).
bool attn_visible(const AttnDims& d, int64_t i, int64_t j);

// out (seq_q, H, D) =, lse (H, seq_q) =. A row that sees no key: out = 0, lse = -inf.
template <typename T>
void attention_forward(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                       const std::vector<T>& v, std::vector<T>& out, std::vector<T>& lse);

// dq (seq_q, H, D) =, dk, dv (seq_k, G, D) = : the gradient of sum(dout * out) with respect to
// q, k, v. Recomputes the probabilities itself (it does not take out or lse).
template <typename T>
void attention_backward(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                        const std::vector<T>& v, const std::vector<T>& dout, std::vector<T>& dq,
                        std::vector<T>& dk, std::vector<T>& dv);

// The same gradient computed from what the forward saved, as the kernel's API defines it:
//   P = exp(scale q k^T - lse) (0 where masked or lse = -inf),   D_i = rowsum(dout_i * out_i),
// then dS = P * (dP - D) and the products above. Equal to attention_backward in exact
// arithmetic. Its fp32 instantiation, fed the fp32 lse and the stored out that the kernel gets,
// is the honest fp32 baseline for the kernel's backward: exp(s - lse) has an absolute error of
// ~eps |lse| in its argument (lse is stored in fp32), which the recomputing form, exp(s - max),
// does not pay.
template <typename T>
void attention_backward_saved(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                              const std::vector<T>& v, const std::vector<T>& out,
                              const std::vector<T>& lse, const std::vector<T>& dout,
                              std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv);

// The sums behind each gradient element with every term replaced by its absolute value (fp64):
//   dv_mag = P^T |dout|,   dP_mag = |dout| |v|^T,   dS_mag = P * (dP_mag + rowsum(P * dP_mag)),
//   dq_mag = scale dS_mag |k|,   dk_mag = scale dS_mag^T |q|.
// Any summation order's rounding error is bounded in units of eps times these, so they size the
// absolute floor of a tolerance where the gradient itself cancels to ~0 (a row with one visible
// key has dq = 0 exactly, yet its terms dP_ij and rowsum(dout * out) are O(1)).
void attention_backward_magnitudes(const AttnDims& d, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& dout, std::vector<double>& dq_mag,
                                   std::vector<double>& dk_mag, std::vector<double>& dv_mag);

// RoPE, rotate_half convention (rope.h). Angles in double in both instantiations (the contract
// of the kernel); T is the arithmetic of the rotation itself. x (tokens, heads, D) in place.
// inv_freq (D/2 values) replaces theta^(-2i/D) when given (scaled frequencies).
template <typename T>
void rope_forward(std::vector<T>& x, int64_t tokens, int64_t heads, int64_t head_dim,
                  const std::vector<int64_t>& positions, double theta, const std::vector<double>& inv_freq = {});
template <typename T>
void rope_backward(std::vector<T>& dx, int64_t tokens, int64_t heads, int64_t head_dim,
                   const std::vector<int64_t>& positions, double theta, const std::vector<double>& inv_freq = {});

// C (m, n, row stride ldc) = alpha * op(A) * op(B) + beta * C, row-major; A is stored (m, k)
// or, when trans_a, (k, m), with row stride lda; likewise B. beta == 0 ignores C's old
// contents (NaN included).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
          const std::vector<T>& a, int64_t lda, const std::vector<T>& b, int64_t ldb, T beta,
          std::vector<T>& c, int64_t ldc);

}  // namespace untied::ref
