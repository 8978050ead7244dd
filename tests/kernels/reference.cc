#include "kernels/reference.h"

#include <cmath>
#include <limits>

namespace untied::ref {

bool attn_visible(const AttnDims& d, int64_t i, int64_t j) {
  if (!d.causal) return true;
  const int64_t p = d.q_offset + i, k = d.k_offset + j;
  if (k > p) return false;
  for (const int64_t s : d.doc_starts)
    if (k < s && s <= p) return false;  // a document starts between the key and the query
  return d.window == 0 || p - k < d.window;
}

namespace {

// Index helpers for the dense layouts.
struct AttnIndex {
  const AttnDims& d;
  int64_t q(int64_t i, int64_t h, int64_t e) const { return (i * d.heads + h) * d.head_dim + e; }
  int64_t kv(int64_t j, int64_t g, int64_t e) const {
    return (j * d.kv_heads + g) * d.head_dim + e;
  }
  int64_t kv_head(int64_t h) const { return h / (d.heads / d.kv_heads); }  // standard GQA
};

template <typename T>
T softmax_scale(const AttnDims& d) {
  return d.scale != 0 ? static_cast<T>(d.scale) : T(1) / std::sqrt(static_cast<T>(d.head_dim));
}

// The full probability matrix P (seq_q, seq_k) of head h: P = softmax(scale * q k^T) over the
// visible keys of each row, 0 elsewhere; also each row's log-sum-exp (-inf with no visible key).
template <typename T>
void probabilities(const AttnDims& d, int64_t h, const std::vector<T>& q, const std::vector<T>& k,
                   std::vector<T>& p, std::vector<T>& row_lse) {
  const AttnIndex ix{d};
  const T scale = softmax_scale<T>(d);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const int64_t g = ix.kv_head(h);
  p.assign(static_cast<size_t>(d.seq_q * d.seq_k), T(0));
  row_lse.assign(static_cast<size_t>(d.seq_q), neg_inf);
  for (int64_t i = 0; i < d.seq_q; ++i) {
    T* s = &p[i * d.seq_k];  // scores first, probabilities after
    T row_max = neg_inf;
    for (int64_t j = 0; j < d.seq_k; ++j) {
      if (!attn_visible(d, i, j)) { s[j] = neg_inf; continue; }
      T dot = 0;
      for (int64_t e = 0; e < d.head_dim; ++e) dot += q[ix.q(i, h, e)] * k[ix.kv(j, g, e)];
      s[j] = scale * dot;
      if (s[j] > row_max) row_max = s[j];
    }
    if (row_max == neg_inf) {  // no visible key: P row stays 0, lse -inf
      for (int64_t j = 0; j < d.seq_k; ++j) s[j] = 0;
      continue;
    }
    T sum = 0;
    for (int64_t j = 0; j < d.seq_k; ++j) {
      s[j] = s[j] == neg_inf ? T(0) : std::exp(s[j] - row_max);
      sum += s[j];
    }
    for (int64_t j = 0; j < d.seq_k; ++j) s[j] /= sum;
    row_lse[i] = row_max + std::log(sum);
  }
}

}  // namespace

template <typename T>
void attention_forward(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                       const std::vector<T>& v, std::vector<T>& out, std::vector<T>& lse) {
  const AttnIndex ix{d};
  out.assign(static_cast<size_t>(d.seq_q * d.heads * d.head_dim), T(0));
  lse.assign(static_cast<size_t>(d.heads * d.seq_q), T(0));
  std::vector<T> p, row_lse;
  for (int64_t h = 0; h < d.heads; ++h) {
    probabilities(d, h, q, k, p, row_lse);
    const int64_t g = ix.kv_head(h);
    for (int64_t i = 0; i < d.seq_q; ++i) {
      lse[h * d.seq_q + i] = row_lse[i];
      for (int64_t e = 0; e < d.head_dim; ++e) {
        T acc = 0;
        for (int64_t j = 0; j < d.seq_k; ++j) acc += p[i * d.seq_k + j] * v[ix.kv(j, g, e)];
        out[ix.q(i, h, e)] = acc;
      }
    }
  }
}

// With S = scale * q k^T, P = softmax(S), out = P v and L = sum(dout * out):
//   dv = P^T dout                      dP = dout v^T
//   dS = P * (dP - rowsum(P * dP))     (softmax backward, row by row)
//   dq = scale * dS k                  dk = scale * dS^T q
// and the heads of a GQA group add their dk, dv into the shared KV head.
template <typename T>
void attention_backward(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                        const std::vector<T>& v, const std::vector<T>& dout, std::vector<T>& dq,
                        std::vector<T>& dk, std::vector<T>& dv) {
  const AttnIndex ix{d};
  const T scale = softmax_scale<T>(d);
  dq.assign(static_cast<size_t>(d.seq_q * d.heads * d.head_dim), T(0));
  dk.assign(static_cast<size_t>(d.seq_k * d.kv_heads * d.head_dim), T(0));
  dv.assign(dk.size(), T(0));
  std::vector<T> p, row_lse, dp(static_cast<size_t>(d.seq_q * d.seq_k)), ds(dp.size());
  for (int64_t h = 0; h < d.heads; ++h) {
    probabilities(d, h, q, k, p, row_lse);
    const int64_t g = ix.kv_head(h);
    for (int64_t i = 0; i < d.seq_q; ++i)
      for (int64_t j = 0; j < d.seq_k; ++j) {
        T acc = 0;
        for (int64_t e = 0; e < d.head_dim; ++e) acc += dout[ix.q(i, h, e)] * v[ix.kv(j, g, e)];
        dp[i * d.seq_k + j] = acc;
      }
    for (int64_t i = 0; i < d.seq_q; ++i) {
      T row_dot = 0;
      for (int64_t j = 0; j < d.seq_k; ++j) row_dot += p[i * d.seq_k + j] * dp[i * d.seq_k + j];
      for (int64_t j = 0; j < d.seq_k; ++j)
        ds[i * d.seq_k + j] = p[i * d.seq_k + j] * (dp[i * d.seq_k + j] - row_dot);
    }
    for (int64_t j = 0; j < d.seq_k; ++j)
      for (int64_t e = 0; e < d.head_dim; ++e) {
        T acc_v = 0, acc_k = 0;
        for (int64_t i = 0; i < d.seq_q; ++i) {
          acc_v += p[i * d.seq_k + j] * dout[ix.q(i, h, e)];
          acc_k += ds[i * d.seq_k + j] * q[ix.q(i, h, e)];
        }
        dv[ix.kv(j, g, e)] += acc_v;
        dk[ix.kv(j, g, e)] += scale * acc_k;
      }
    for (int64_t i = 0; i < d.seq_q; ++i)
      for (int64_t e = 0; e < d.head_dim; ++e) {
        T acc = 0;
        for (int64_t j = 0; j < d.seq_k; ++j) acc += ds[i * d.seq_k + j] * k[ix.kv(j, g, e)];
        dq[ix.q(i, h, e)] = scale * acc;
      }
  }
}

template <typename T>
void attention_backward_saved(const AttnDims& d, const std::vector<T>& q, const std::vector<T>& k,
                              const std::vector<T>& v, const std::vector<T>& out,
                              const std::vector<T>& lse, const std::vector<T>& dout,
                              std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv) {
  const AttnIndex ix{d};
  const T scale = softmax_scale<T>(d);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  dq.assign(static_cast<size_t>(d.seq_q * d.heads * d.head_dim), T(0));
  dk.assign(static_cast<size_t>(d.seq_k * d.kv_heads * d.head_dim), T(0));
  dv.assign(dk.size(), T(0));
  std::vector<T> p(static_cast<size_t>(d.seq_k)), ds(p.size());
  for (int64_t h = 0; h < d.heads; ++h) {
    const int64_t g = ix.kv_head(h);
    for (int64_t i = 0; i < d.seq_q; ++i) {
      const T row_lse = lse[h * d.seq_q + i];
      T row_d = 0;  // D_i = rowsum(dout * out)
      for (int64_t e = 0; e < d.head_dim; ++e) row_d += dout[ix.q(i, h, e)] * out[ix.q(i, h, e)];
      for (int64_t j = 0; j < d.seq_k; ++j) {
        p[j] = 0;
        ds[j] = 0;
        if (!attn_visible(d, i, j) || row_lse == neg_inf) continue;
        T s = 0, dp = 0;
        for (int64_t e = 0; e < d.head_dim; ++e) {
          s += q[ix.q(i, h, e)] * k[ix.kv(j, g, e)];
          dp += dout[ix.q(i, h, e)] * v[ix.kv(j, g, e)];
        }
        p[j] = std::exp(scale * s - row_lse);
        ds[j] = p[j] * (dp - row_d);
      }
      for (int64_t j = 0; j < d.seq_k; ++j)
        for (int64_t e = 0; e < d.head_dim; ++e) {
          dv[ix.kv(j, g, e)] += p[j] * dout[ix.q(i, h, e)];
          dk[ix.kv(j, g, e)] += scale * ds[j] * q[ix.q(i, h, e)];
          dq[ix.q(i, h, e)] += scale * ds[j] * k[ix.kv(j, g, e)];
        }
    }
  }
}

void attention_backward_magnitudes(const AttnDims& d, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& dout, std::vector<double>& dq_mag,
                                   std::vector<double>& dk_mag, std::vector<double>& dv_mag) {
  auto abs_of = [](const std::vector<double>& x) {
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = std::fabs(x[i]);
    return y;
  };
  const std::vector<double> aq = abs_of(q), ak = abs_of(k), av = abs_of(v), ado = abs_of(dout);
  const AttnIndex ix{d};
  const double scale = softmax_scale<double>(d);
  dq_mag.assign(static_cast<size_t>(d.seq_q * d.heads * d.head_dim), 0.0);
  dk_mag.assign(static_cast<size_t>(d.seq_k * d.kv_heads * d.head_dim), 0.0);
  dv_mag.assign(dk_mag.size(), 0.0);
  std::vector<double> p, row_lse, ds(static_cast<size_t>(d.seq_q * d.seq_k));
  for (int64_t h = 0; h < d.heads; ++h) {
    probabilities(d, h, q, k, p, row_lse);  // the true P: its terms are >= 0 already
    const int64_t g = ix.kv_head(h);
    for (int64_t i = 0; i < d.seq_q; ++i) {
      std::vector<double> dp(static_cast<size_t>(d.seq_k), 0.0);
      double row_dot = 0;
      for (int64_t j = 0; j < d.seq_k; ++j) {
        for (int64_t e = 0; e < d.head_dim; ++e) dp[j] += ado[ix.q(i, h, e)] * av[ix.kv(j, g, e)];
        row_dot += p[i * d.seq_k + j] * dp[j];
      }
      for (int64_t j = 0; j < d.seq_k; ++j)
        ds[i * d.seq_k + j] = p[i * d.seq_k + j] * (dp[j] + row_dot);
    }
    for (int64_t i = 0; i < d.seq_q; ++i)
      for (int64_t j = 0; j < d.seq_k; ++j)
        for (int64_t e = 0; e < d.head_dim; ++e) {
          dv_mag[ix.kv(j, g, e)] += p[i * d.seq_k + j] * ado[ix.q(i, h, e)];
          dk_mag[ix.kv(j, g, e)] += scale * ds[i * d.seq_k + j] * aq[ix.q(i, h, e)];
          dq_mag[ix.q(i, h, e)] += scale * ds[i * d.seq_k + j] * ak[ix.kv(j, g, e)];
        }
  }
}

namespace {
// Rotates each head vector's pairs (i, i + D/2) by +angle (forward) or -angle (backward).
template <typename T>
void rope_rotate(std::vector<T>& x, int64_t tokens, int64_t heads, int64_t head_dim,
                 const std::vector<int64_t>& positions, double theta, double sign,
                 const std::vector<double>& inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double f = inv_freq.empty() ? std::pow(theta, -2.0 * static_cast<double>(i) / head_dim) : inv_freq[i];
      const double angle = static_cast<double>(positions[t]) * f;
      const T c = static_cast<T>(std::cos(angle));
      const T s = static_cast<T>(sign * std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        T* row = &x[(t * heads + h) * head_dim];
        const T lo = row[i], hi = row[i + half];
        row[i] = lo * c - hi * s;
        row[i + half] = hi * c + lo * s;
      }
    }
}
}  // namespace

template <typename T>
void rope_forward(std::vector<T>& x, int64_t tokens, int64_t heads, int64_t head_dim,
                  const std::vector<int64_t>& positions, double theta, const std::vector<double>& inv_freq) {
  rope_rotate(x, tokens, heads, head_dim, positions, theta, +1.0, inv_freq);
}

template <typename T>
void rope_backward(std::vector<T>& dx, int64_t tokens, int64_t heads, int64_t head_dim,
                   const std::vector<int64_t>& positions, double theta, const std::vector<double>& inv_freq) {
  rope_rotate(dx, tokens, heads, head_dim, positions, theta, -1.0, inv_freq);  // R(a)^T = R(-a)
}

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha,
          const std::vector<T>& a, int64_t lda, const std::vector<T>& b, int64_t ldb, T beta,
          std::vector<T>& c, int64_t ldc) {
  auto op_a = [&](int64_t i, int64_t p) { return trans_a ? a[p * lda + i] : a[i * lda + p]; };
  auto op_b = [&](int64_t p, int64_t j) { return trans_b ? b[j * ldb + p] : b[p * ldb + j]; };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p) acc += op_a(i, p) * op_b(p, j);
      T& cij = c[i * ldc + j];
      cij = beta == T(0) ? alpha * acc : alpha * acc + beta * cij;
    }
}

#define UNTIED_REF_INSTANTIATE(T)                                                                \
  template void attention_forward<T>(const AttnDims&, const std::vector<T>&,                     \
                                     const std::vector<T>&, const std::vector<T>&,               \
                                     std::vector<T>&, std::vector<T>&);                          \
  template void attention_backward<T>(const AttnDims&, const std::vector<T>&,                    \
                                      const std::vector<T>&, const std::vector<T>&,              \
                                      const std::vector<T>&, std::vector<T>&, std::vector<T>&,   \
                                      std::vector<T>&);                                          \
  template void attention_backward_saved<T>(                                                     \
      const AttnDims&, const std::vector<T>&, const std::vector<T>&, const std::vector<T>&,     \
      const std::vector<T>&, const std::vector<T>&, const std::vector<T>&, std::vector<T>&,     \
      std::vector<T>&, std::vector<T>&);                                                        \
  template void rope_forward<T>(std::vector<T>&, int64_t, int64_t, int64_t,                      \
                                const std::vector<int64_t>&, double, const std::vector<double>&);                            \
  template void rope_backward<T>(std::vector<T>&, int64_t, int64_t, int64_t,                     \
                                 const std::vector<int64_t>&, double, const std::vector<double>&);                           \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const std::vector<T>&,         \
                        int64_t, const std::vector<T>&, int64_t, T, std::vector<T>&, int64_t);

UNTIED_REF_INSTANTIATE(double)
UNTIED_REF_INSTANTIATE(float)

}  // namespace untied::ref
