#include "model_kernels/model_reference.h"

#include <cmath>

namespace untied::ref {

// ---- RMSNorm --------------------------------------------------------------------------------

template <typename T>
void rmsnorm_forward(const std::vector<T>& x, const std::vector<T>& w, int64_t rows, int64_t dim,
                     double eps, std::vector<T>& y, std::vector<T>& rstd) {
  y.assign(static_cast<size_t>(rows * dim), T(0));
  rstd.assign(static_cast<size_t>(rows), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    T sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += x[r * dim + i] * x[r * dim + i];
    rstd[r] = T(1) / std::sqrt(sum_sq / static_cast<T>(dim) + static_cast<T>(eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * rstd[r] * w[i];
  }
}

// y_i = x_i r w_i with r = (mean(x^2) + eps)^(-1/2), so dr/dx_k = -r^3 x_k / dim and
//   dx_k = sum_i dy_i dy_i/dx_k = r w_k dy_k - r^3 / dim * x_k * sum_i dy_i w_i x_i,
//   dw_i = sum_rows dy_i x_i r.
template <typename T>
void rmsnorm_backward(const std::vector<T>& x, const std::vector<T>& rstd, const std::vector<T>& w,
                      const std::vector<T>& dy, int64_t rows, int64_t dim, std::vector<T>& dx,
                      std::vector<T>& dw) {
  dx.assign(static_cast<size_t>(rows * dim), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T rr = rstd[r];
    T dot = 0;
    for (int64_t i = 0; i < dim; ++i) dot += dy[r * dim + i] * w[i] * x[r * dim + i];
    for (int64_t k = 0; k < dim; ++k)
      dx[r * dim + k] = rr * w[k] * dy[r * dim + k] - rr * rr * rr / static_cast<T>(dim) * x[r * dim + k] * dot;
    for (int64_t i = 0; i < dim; ++i) dw[i] += dy[r * dim + i] * x[r * dim + i] * rr;
  }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

template <typename T>
T sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

template <typename T>
void swiglu_forward(const std::vector<T>& gate, const std::vector<T>& up, std::vector<T>& out) {
  out.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// d silu(g) / dg = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g).
template <typename T>
void swiglu_backward(const std::vector<T>& gate, const std::vector<T>& up,
                     const std::vector<T>& dout, std::vector<T>& dgate, std::vector<T>& dup) {
  dgate.resize(gate.size());
  dup.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const T g = gate[i], s = sigmoid(g);
    dup[i] = dout[i] * g * s;
    dgate[i] = dout[i] * up[i] * s * (T(1) + g * (T(1) - s));
  }
}

// ---- Embedding ------------------------------------------------------------------------------

template <typename T>
void embedding_forward(const std::vector<int32_t>& ids, const std::vector<T>& table, int64_t dim,
                       std::vector<T>& out) {
  out.assign(ids.size() * static_cast<size_t>(dim), T(0));
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < dim; ++i) out[t * dim + i] = table[ids[t] * dim + i];
}

template <typename T>
void embedding_backward(const std::vector<int32_t>& ids, const std::vector<T>& dout, int64_t dim,
                        std::vector<T>& dtable) {
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < dim; ++i) dtable[ids[t] * dim + i] += dout[t * dim + i];
}

// ---- LM head + cross-entropy ----------------------------------------------------------------

// loss_i = lse_i - logit_i[label_i]; d loss_i / d logit_ij = softmax_ij - [j == label_i];
// logits = h w^T, so dh = G w and dw = G^T h with G = grad_scale * (softmax - onehot).
template <typename T>
void lm_head_loss(const LossProblem& p, const std::vector<T>& h, const std::vector<T>& w,
                  const std::vector<int32_t>& labels, LossResult<T>& r, std::vector<T>& dw) {
  const int64_t n = p.tokens, e = p.dim, v = p.vocab;
  r.loss_sum = 0;
  r.count = 0;
  r.logits.assign(static_cast<size_t>(n * v), T(0));
  r.argmax.assign(static_cast<size_t>(n), 0);
  r.dh.assign(static_cast<size_t>(n * e), T(0));
  std::vector<T> g(static_cast<size_t>(v));
  for (int64_t t = 0; t < n; ++t) {
    T* row = &r.logits[t * v];
    for (int64_t j = 0; j < v; ++j) {
      T dot = 0;
      for (int64_t k = 0; k < e; ++k) dot += h[t * e + k] * w[j * e + k];
      row[j] = dot;
    }
    T mx = row[0];
    for (int64_t j = 1; j < v; ++j)
      if (row[j] > mx) {
        mx = row[j];
        r.argmax[t] = j;
      }
    if (labels[t] == p.ignore_index) continue;
    T sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    const T lse = mx + std::log(sum);
    r.loss_sum += lse - row[labels[t]];
    r.count += 1;
    const T scale = static_cast<T>(p.grad_scale);
    for (int64_t j = 0; j < v; ++j)
      g[j] = scale * (std::exp(row[j] - lse) - (j == labels[t] ? T(1) : T(0)));
    for (int64_t k = 0; k < e; ++k) {
      T acc = 0;
      for (int64_t j = 0; j < v; ++j) acc += g[j] * w[j * e + k];
      r.dh[t * e + k] = acc;
    }
    for (int64_t j = 0; j < v; ++j)
      for (int64_t k = 0; k < e; ++k) dw[j * e + k] += g[j] * h[t * e + k];
  }
}

// ---- AdamW ----------------------------------------------------------------------------------

template <typename T>
void adamw_step(const AdamWHyper& a, std::vector<T>& p, std::vector<T>& m, std::vector<T>& v,
                const std::vector<T>& g) {
  const T lr = static_cast<T>(a.lr), b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
  const T eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay);
  const T bc1 = T(1) - std::pow(b1, static_cast<T>(a.step));
  const T bc2 = T(1) - std::pow(b2, static_cast<T>(a.step));
  for (size_t i = 0; i < p.size(); ++i) {
    if (a.decay) p[i] = p[i] - lr * wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * g[i];
    v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
    const T m_hat = m[i] / bc1, v_hat = v[i] / bc2;
    p[i] = p[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

#define UNTIED_INSTANTIATE(T)                                                                   \
  template void rmsnorm_forward<T>(const std::vector<T>&, const std::vector<T>&, int64_t,        \
                                   int64_t, double, std::vector<T>&, std::vector<T>&);          \
  template void rmsnorm_backward<T>(const std::vector<T>&, const std::vector<T>&,                \
                                    const std::vector<T>&, const std::vector<T>&, int64_t,      \
                                    int64_t, std::vector<T>&, std::vector<T>&);                 \
  template void swiglu_forward<T>(const std::vector<T>&, const std::vector<T>&, std::vector<T>&); \
  template void swiglu_backward<T>(const std::vector<T>&, const std::vector<T>&,                 \
                                   const std::vector<T>&, std::vector<T>&, std::vector<T>&);    \
  template void embedding_forward<T>(const std::vector<int32_t>&, const std::vector<T>&,         \
                                     int64_t, std::vector<T>&);                                 \
  template void embedding_backward<T>(const std::vector<int32_t>&, const std::vector<T>&,        \
                                      int64_t, std::vector<T>&);                                \
  template void lm_head_loss<T>(const LossProblem&, const std::vector<T>&, const std::vector<T>&, \
                                const std::vector<int32_t>&, LossResult<T>&, std::vector<T>&);  \
  template void adamw_step<T>(const AdamWHyper&, std::vector<T>&, std::vector<T>&,               \
                              std::vector<T>&, const std::vector<T>&);

UNTIED_INSTANTIATE(double)
UNTIED_INSTANTIATE(float)
#undef UNTIED_INSTANTIATE

}  // namespace untied::ref
