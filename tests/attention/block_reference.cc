// The naive attention block (block_reference.h): plain loops, one formula per line.
#include "attention/block_reference.h"

#include <cmath>
#include <limits>

namespace untied::blockref {
namespace {

// out (rows, n) = a (rows, k) b(n, k)^T: a projection x w^T.
template <typename T>
std::vector<T> matmul_bt(const std::vector<T>& a, const std::vector<T>& b, int64_t rows, int64_t n,
                         int64_t k) {
  std::vector<T> out(static_cast<size_t>(rows * n));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T s = 0;
      for (int64_t c = 0; c < k; ++c) s += a[i * k + c] * b[j * k + c];
      out[i * n + j] = s;
    }
  return out;
}

// out (rows, n) += a (rows, k) b (k, n).
template <typename T>
void matmul_acc(std::vector<T>& out, const std::vector<T>& a, const std::vector<T>& b, int64_t rows,
                int64_t n, int64_t k) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T s = 0;
      for (int64_t c = 0; c < k; ++c) s += a[i * k + c] * b[c * n + j];
      out[i * n + j] += s;
    }
}

// out (m, n) = a (rows, m)^T b (rows, n): a weight gradient d^T x.
template <typename T>
std::vector<T> matmul_at(const std::vector<T>& a, const std::vector<T>& b, int64_t rows, int64_t m,
                         int64_t n) {
  std::vector<T> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T s = 0;
      for (int64_t r = 0; r < rows; ++r) s += a[r * m + i] * b[r * n + j];
      out[i * n + j] = s;
    }
  return out;
}

// The first position of each position's document (0 for every one without documents).
std::vector<int64_t> document_firsts(const BlockDims& d) {
  std::vector<int64_t> first(static_cast<size_t>(d.seq), 0);
  int64_t at = 0;
  for (const int64_t n : d.doc_lens) {
    for (int64_t i = at; i < at + n && i < d.seq; ++i) first[i] = at;
    at += n;
  }
  return first;
}

// The first key query i sees: its document's first token, or the window's.
int64_t first_key(const BlockDims& d, const std::vector<int64_t>& firsts, int64_t i) {
  int64_t lo = firsts[i];
  if (d.window > 0 && i - d.window + 1 > lo) lo = i - d.window + 1;
  return lo;
}

// RoPE (rotate_half) on x (S, heads, D) at each token's position in its document; sign = +1
// forward, -1 inverse.
template <typename T>
void rope(std::vector<T>& x, const BlockDims& d, int64_t heads, int sign) {
  const int64_t D = d.head_dim, half = D / 2;
  const std::vector<int64_t> firsts = document_firsts(d);
  for (int64_t s = 0; s < d.seq; ++s)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(s - firsts[s]) * std::pow(d.theta, -2.0 * static_cast<double>(i) / D);
      const T c = static_cast<T>(std::cos(angle)), sn = static_cast<T>(sign * std::sin(angle));
      for (int64_t h = 0; h < heads; ++h) {
        T* v = &x[(s * heads + h) * D];
        const T a = v[i], b = v[i + half];
        v[i] = a * c - b * sn;
        v[i + half] = b * c + a * sn;
      }
    }
}

// Everything the forward computes, for the backward to reuse.
template <typename T>
struct Forward {
  std::vector<T> q, k, v;  // after RoPE: (S, H, D), (S, G, D), (S, G, D)
  std::vector<T> p;        // (H, S, S) softmax probabilities, 0 where masked
  std::vector<T> attn;     // (S, H, D)
};

template <typename T>
Forward<T> run_forward(const BlockDims& d, const std::vector<T>& x, const BlockWeights<T>& w) {
  const int64_t S = d.seq, E = d.hidden, H = d.heads, G = d.kv_heads, D = d.head_dim;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  Forward<T> f;
  f.q = matmul_bt(x, w.wq, S, H * D, E);
  f.k = matmul_bt(x, w.wk, S, G * D, E);
  f.v = matmul_bt(x, w.wv, S, G * D, E);
  rope(f.q, d, H, +1);
  rope(f.k, d, G, +1);
  f.p.assign(static_cast<size_t>(H * S * S), T(0));
  f.attn.assign(static_cast<size_t>(S * H * D), T(0));
  const std::vector<int64_t> firsts = document_firsts(d);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kvh = h / (H / G);
    for (int64_t i = 0; i < S; ++i) {
      T* p = &f.p[(h * S + i) * S];
      T mx = -std::numeric_limits<T>::infinity();
      const int64_t j0 = first_key(d, firsts, i);
      for (int64_t j = j0; j <= i; ++j) {
        T s = 0;
        for (int64_t c = 0; c < D; ++c) s += f.q[(i * H + h) * D + c] * f.k[(j * G + kvh) * D + c];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
      }
      T l = 0;
      for (int64_t j = j0; j <= i; ++j) {
        p[j] = std::exp(p[j] - mx);
        l += p[j];
      }
      for (int64_t j = j0; j <= i; ++j) p[j] /= l;
      for (int64_t c = 0; c < D; ++c) {
        T o = 0;
        for (int64_t j = j0; j <= i; ++j) o += p[j] * f.v[(j * G + kvh) * D + c];
        f.attn[(i * H + h) * D + c] = o;
      }
    }
  }
  return f;
}

}  // namespace

template <typename T>
std::vector<T> block_forward(const BlockDims& d, const std::vector<T>& x, const BlockWeights<T>& w) {
  const Forward<T> f = run_forward(d, x, w);
  return matmul_bt(f.attn, w.wo, d.seq, d.hidden, d.heads * d.head_dim);
}

template <typename T>
void block_backward(const BlockDims& d, const std::vector<T>& x, const BlockWeights<T>& w,
                    const std::vector<T>& dy, BlockGrads<T>& g) {
  const int64_t S = d.seq, E = d.hidden, H = d.heads, G = d.kv_heads, D = d.head_dim;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const Forward<T> f = run_forward(d, x, w);
  // y = attn wo^T:  dwo = dy^T attn,  dattn = dy wo
  g.dwo = matmul_at(dy, f.attn, S, E, H * D);
  std::vector<T> dattn(static_cast<size_t>(S * H * D), T(0));
  matmul_acc(dattn, dy, w.wo, S, H * D, E);
  // attention: dP = dO v^T, dS = P (dP - rowsum(P dP)), dq = scale dS k, dk = scale dS^T q, dv = P^T dO
  std::vector<T> dq(f.q.size(), T(0)), dk(f.k.size(), T(0)), dv(f.v.size(), T(0));
  std::vector<T> dp(static_cast<size_t>(S));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t kvh = h / (H / G);
    for (int64_t i = 0; i < S; ++i) {
      const T* p = &f.p[(h * S + i) * S];
      const T* dout = &dattn[(i * H + h) * D];
      T rowsum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        T s = 0;
        for (int64_t c = 0; c < D; ++c) s += dout[c] * f.v[(j * G + kvh) * D + c];
        dp[j] = s;
        rowsum += p[j] * s;
      }
      for (int64_t j = 0; j <= i; ++j) {
        const T ds = p[j] * (dp[j] - rowsum) * scale;
        for (int64_t c = 0; c < D; ++c) {
          dq[(i * H + h) * D + c] += ds * f.k[(j * G + kvh) * D + c];
          dk[(j * G + kvh) * D + c] += ds * f.q[(i * H + h) * D + c];
          dv[(j * G + kvh) * D + c] += p[j] * dout[c];
        }
      }
    }
  }
  // RoPE is a rotation: its backward is the inverse rotation.
  rope(dq, d, H, -1);
  rope(dk, d, G, -1);
  // q = x wq^T etc.:  dx = dq wq + dk wk + dv wv,  dwq = dq^T x etc.
  g.dx.assign(static_cast<size_t>(S * E), T(0));
  matmul_acc(g.dx, dq, w.wq, S, E, H * D);
  matmul_acc(g.dx, dk, w.wk, S, E, G * D);
  matmul_acc(g.dx, dv, w.wv, S, E, G * D);
  g.dwq = matmul_at(dq, x, S, H * D, E);
  g.dwk = matmul_at(dk, x, S, G * D, E);
  g.dwv = matmul_at(dv, x, S, G * D, E);
}

template std::vector<float> block_forward(const BlockDims&, const std::vector<float>&, const BlockWeights<float>&);
template std::vector<double> block_forward(const BlockDims&, const std::vector<double>&,
                                           const BlockWeights<double>&);
template void block_backward(const BlockDims&, const std::vector<float>&, const BlockWeights<float>&,
                             const std::vector<float>&, BlockGrads<float>&);
template void block_backward(const BlockDims&, const std::vector<double>&, const BlockWeights<double>&,
                             const std::vector<double>&, BlockGrads<double>&);

}  // namespace untied::blockref
