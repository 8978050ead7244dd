// Naive references for the model kernels (rmsnorm, swiglu, embedding, lm head loss, adamw),
// written for clarity, not speed.
//
// Every function is a template over the arithmetic type T: T = double is THE reference the
// kernels are judged against; T = float is the same formula, same loop order, in fp32, used only
// to measure what a straightforward fp32 computation costs in accuracy (the baseline of the
// tolerances, STYLE.md habit 8). Tensors are dense and row-major, in the layouts of the kernels'
// headers without strides. Outputs marked += accumulate into what the caller passes, like the
// kernels they mirror.
#pragma once

#include <cstdint>
#include <vector>

namespace untied::ref {

// ---- RMSNorm: x, y, dy, dx (rows, dim); w, dw (dim); rstd (rows) ----
// y =, rstd = 1 / sqrt(mean(x^2) + eps) =.
template <typename T>
void rmsnorm_forward(const std::vector<T>& x, const std::vector<T>& w, int64_t rows, int64_t dim,
                     double eps, std::vector<T>& y, std::vector<T>& rstd);
// dx =, dw +=, from the saved rstd (as the kernel's API defines it).
template <typename T>
void rmsnorm_backward(const std::vector<T>& x, const std::vector<T>& rstd, const std::vector<T>& w,
                      const std::vector<T>& dy, int64_t rows, int64_t dim, std::vector<T>& dx,
                      std::vector<T>& dw);

// ---- SwiGLU: gate, up, out, dout, dgate, dup (n elements; element-wise) ----
template <typename T>
void swiglu_forward(const std::vector<T>& gate, const std::vector<T>& up, std::vector<T>& out);
template <typename T>
void swiglu_backward(const std::vector<T>& gate, const std::vector<T>& up,
                     const std::vector<T>& dout, std::vector<T>& dgate, std::vector<T>& dup);

// ---- Embedding: table, dtable (V, E); out, dout (tokens, E); ids (tokens) ----
template <typename T>
void embedding_forward(const std::vector<int32_t>& ids, const std::vector<T>& table, int64_t dim,
                       std::vector<T>& out);
// dtable += scatter of dout by ids, tokens in order.
template <typename T>
void embedding_backward(const std::vector<int32_t>& ids, const std::vector<T>& dout, int64_t dim,
                        std::vector<T>& dtable);

// ---- LM head + cross-entropy, unfused: the full (tokens, V) logits and log-softmax ----
// h, dh (tokens, E); w, dw (V, E); labels (tokens), ignore_index = no label.
struct LossProblem {
  int64_t tokens = 0, dim = 0, vocab = 0;
  int32_t ignore_index = -100;
  double grad_scale = 1.0;
};
template <typename T>
struct LossResult {
  T loss_sum = 0;                   // sum over labelled rows of -log_softmax(logits)[label]
  int64_t count = 0;                // labelled rows
  std::vector<T> logits;            // (tokens, V)
  std::vector<int64_t> argmax;      // (tokens): first index of the row's max logit
  std::vector<T> dh;                // (tokens, E) = grad_scale * (softmax - onehot) w
};
// Fills r; dw += grad_scale * (softmax - onehot)^T h (rows without a label contribute nothing).
template <typename T>
void lm_head_loss(const LossProblem& p, const std::vector<T>& h, const std::vector<T>& w,
                  const std::vector<int32_t>& labels, LossResult<T>& r, std::vector<T>& dw);

// ---- AdamW (PyTorch's formula; see adamw.h), in place on p, m, v ----
struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;
  bool decay = true;
};
template <typename T>
void adamw_step(const AdamWHyper& a, std::vector<T>& p, std::vector<T>& m, std::vector<T>& v,
                const std::vector<T>& g);

}  // namespace untied::ref
