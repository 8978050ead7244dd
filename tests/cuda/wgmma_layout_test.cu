// The shared-memory layouts and descriptors of the Hopper attention kernels (src/backends/cuda/
// wgmma.cuh, *_sm90.cu), on the GPU against a CPU product. Two warpgroups (warpgroup w on rows
// [64 w, 64 w + 64), as in the kernels) run every wgmma form the kernels use, with the kernels'
// own primitives and as they call them:
//   S   = A K^T        m64n128, both operands K-major from 128-byte swizzled tiles (forward S);
//   S64 = A K[:64]^T   m64n64, likewise (backward S^T and dP^T);
//   O   = P V          m64n128, P from registers, V read N-major (forward P V, backward dV, dK);
//   O64 = P V[:, :64]  m64n64, likewise (forward P V at D = 64);
//   Q   = T^T K        m64n64 per warpgroup on K's column block w, A = T (keys x queries) read
//                      M-major, B N-major (backward dQ).
// Where the kernels' reading of the N/M-major descriptors fails, the run is repeated with their two
// offsets swapped, so that the failure says which reading the GPU has (the tiles have room for the
// swapped reach). The emulator (emu/emu_wgmma_primitives.h) models the kernels' reading; the
// attention op cases check the whole kernels on both.
// Exit 0: the kernels' conventions hold; 1: they do not; 77: no compute capability 9.0 GPU
// (skipped).
#include "backends/cuda/wgmma.cuh"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace wgmma_layout {

using namespace untied::cuda::attn;
constexpr int kD = 128;       // columns of A, K, V; rows of K, V, T (the keys)
constexpr int kM = 128;       // rows of A and P: 64 per warpgroup
constexpr int kQ = 64;        // columns of T (queries)
constexpr int kTile = 32768;  // bytes per tile in shared memory (T's 16 KiB, with room for the swapped reach)

struct Out {
  float *s, *s64, *o, *o64, *q;
};

template <int kN>
__device__ void store(float* out, int ld, int row0, int col0, const float* d) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane >> 2, t2 = (lane & 3) * 2;
  for (int nt = 0; nt < kN / 8; ++nt)
    for (int e = 0; e < 4; ++e)
      out[(row0 + warp * 16 + g + (e >> 1) * 8) * ld + col0 + nt * 8 + t2 + (e & 1)] = d[nt * 4 + e];
}

#if UNTIED_WGMMA
// One product into d as the kernels run one: d zeroed and pinned, the fence, the wgmma
// instructions `issue` makes, commit, wait, d pinned.
template <int kN, typename Issue>
__device__ void product(float (&d)[kN], Issue issue) {
  for (int i = 0; i < kN; ++i) d[i] = 0.0f;
  wgmma_hold(d);
  wgmma_fence();
  issue();
  wgmma_commit();
  wgmma_wait_all();
  wgmma_hold(d);
}
#endif

__global__ void products(const bf16* a, const bf16* k, const bf16* v, const float* p, const bf16* t, Out out,
                         uint32_t mn_lbo, uint32_t mn_sbo) {
#if UNTIED_WGMMA
  unsigned char* as = aligned_smem();
  unsigned char* ks = as + kTile;
  unsigned char* vs = ks + kTile;
  unsigned char* ts = vs + kTile;
  const int tid = threadIdx.x, wg = tid / 128;
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane >> 2, t2 = (lane & 3) * 2;
  load_swizzled_async<kM, kD, 256>(as, a, 0, kM, kD, 0, tid);
  load_swizzled_async<kD, kD, 256>(ks, k, 0, kD, kD, 0, tid);
  load_swizzled_async<kD, kD, 256>(vs, v, 0, kD, kD, 0, tid);
  load_swizzled_async<kD, kQ, 256>(ts, t, 0, kD, kQ, 0, tid);
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();
  const int a_row = wg * 64 * 128;  // this warpgroup's first row of A, in bytes

  float s[64];
  product(s, [&] {
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n128<0, 0>(s, smem_desc(as + (kk / 4) * kM * 128 + a_row + (kk % 4) * 32, 16, 1024),
                          smem_desc(ks + (kk / 4) * kD * 128 + (kk % 4) * 32, 16, 1024), kk > 0 ? 1 : 0);
  });
  store<128>(out.s, 128, wg * 64, 0, s);

  float s64[32];
  product(s64, [&] {
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n64<0, 0>(s64, smem_desc(as + (kk / 4) * kM * 128 + a_row + (kk % 4) * 32, 16, 1024),
                         smem_desc(ks + (kk / 4) * kD * 128 + (kk % 4) * 32, 16, 1024), kk > 0 ? 1 : 0);
  });
  store<64>(out.s64, 64, wg * 64, 0, s64);

  // P's rows of this warpgroup as A fragments (rounded to bf16), key slice kk; pinned from before
  // the first product that reads them to after the last.
  uint32_t pa[kD / 16][4];
  for (int kk = 0; kk < kD / 16; ++kk)
    for (int j = 0; j < 4; ++j) {
      const float* row = p + (wg * 64 + warp * 16 + g + (j & 1) * 8) * kD + kk * 16 + t2 + (j >> 1) * 8;
      pa[kk][j] = pack_bf16(row[0], row[1]);
    }
  wgmma_hold(pa);
  float o[64];
  product(o, [&] {
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_rs_n128(o, pa[kk], smem_desc(vs + kk * 16 * 128, mn_lbo, mn_sbo));
  });
  store<128>(out.o, 128, wg * 64, 0, o);

  float o64[32];
  product(o64, [&] {
    for (int kk = 0; kk < kD / 16; ++kk) wgmma_rs_n64(o64, pa[kk], smem_desc(vs + kk * 16 * 128, mn_lbo, mn_sbo));
  });
  wgmma_hold(pa);
  store<64>(out.o64, 64, wg * 64, 0, o64);

  float q[32];
  product(q, [&] {
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n64<1, 1>(q, smem_desc(ts + kk * 16 * 128, mn_lbo, mn_sbo),
                         smem_desc(ks + wg * kD * 128 + kk * 16 * 128, mn_lbo, mn_sbo), kk > 0 ? 1 : 0);
  });
  store<64>(out.q, 128, 0, wg * 64, q);
#endif
}

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "wgmma_layout_test: %s: %s\n", #call, cudaGetErrorString(e_)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// c (rows x cols) = sum over r < n of x(i, r) y(r, j), each a function of its indices.
template <typename X, typename Y>
std::vector<double> product(int rows, int cols, int n, X x, Y y) {
  std::vector<double> c(static_cast<size_t>(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      double acc = 0;
      for (int r = 0; r < n; ++r) acc += static_cast<double>(x(i, r)) * y(r, j);
      c[static_cast<size_t>(i) * cols + j] = acc;
    }
  return c;
}

// Max error over max |reference|; NaN (an element never written) counts as infinite.
double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e = std::max(e, std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return e / scale;
}

}  // namespace wgmma_layout

int main() {
  using namespace wgmma_layout;
  int devices = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("wgmma_layout_test: skipped: no GPU visible\n");
    return 77;
  }
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  if (major != 9 || minor != 0) {
    std::printf("wgmma_layout_test: skipped: GPU 0 has compute capability %d.%d, not 9.0\n", major, minor);
    return 77;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(kM * kD), k(kD * kD), v(kD * kD), p(kM * kD), t(kD * kQ);
  for (auto* x : {&a, &k, &v, &p, &t})
    for (float& e : *x) e = round_bf16(u(rng));
  auto to_bf16 = [](const std::vector<float>& x) {
    std::vector<bf16> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = __float2bfloat16_rn(x[i]);
    return b;
  };
  // The references: S = A K^T, S64 its first 64 columns, O = P V, O64 its first 64 columns,
  // Q = T^T K (64 x 128).
  const auto s_ref = product(kM, kD, kD, [&](int i, int c) { return a[i * kD + c]; },
                             [&](int c, int j) { return k[j * kD + c]; });
  const auto s64_ref = product(kM, 64, kD, [&](int i, int c) { return a[i * kD + c]; },
                               [&](int c, int j) { return k[j * kD + c]; });
  const auto o_ref = product(kM, kD, kD, [&](int i, int j) { return p[i * kD + j]; },
                             [&](int j, int c) { return v[j * kD + c]; });
  const auto o64_ref = product(kM, 64, kD, [&](int i, int j) { return p[i * kD + j]; },
                               [&](int j, int c) { return v[j * kD + c]; });
  const auto q_ref = product(kQ, kD, kD, [&](int i, int j) { return t[j * kQ + i]; },
                             [&](int j, int c) { return k[j * kD + c]; });

  std::vector<void*> buffers;
  auto upload = [&](const auto& host) {
    void* d = nullptr;
    if (cudaMalloc(&d, host.size() * sizeof(host[0])) != cudaSuccess) return d;
    buffers.push_back(d);
    cudaMemcpy(d, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice);
    return d;
  };
  const std::vector<bf16> ab = to_bf16(a), kb = to_bf16(k), vb = to_bf16(v), tb = to_bf16(t);
  auto* da = static_cast<bf16*>(upload(ab));
  auto* dk = static_cast<bf16*>(upload(kb));
  auto* dv = static_cast<bf16*>(upload(vb));
  auto* dt = static_cast<bf16*>(upload(tb));
  auto* dp = static_cast<float*>(upload(p));
  Out out{};
  for (auto [ptr, n] : {std::pair{&out.s, kM * kD}, {&out.s64, kM * 64}, {&out.o, kM * kD}, {&out.o64, kM * 64},
                        {&out.q, kQ * kD}})
    CHECK(cudaMalloc(ptr, n * 4));
  if (!da || !dk || !dv || !dt || !dp) {
    std::fprintf(stderr, "wgmma_layout_test: cudaMalloc failed\n");
    return 1;
  }
  const int smem = 4 * kTile + 1024;
  CHECK(cudaFuncSetAttribute(products, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));

  // The kernels' reading of the N/M-major descriptors (LBO between 64-element blocks, SBO
  // between 8-row groups), then, only if it fails, the two swapped.
  const uint32_t conventions[2][2] = {{kD * 128, 1024}, {1024, kD * 128}};
  bool kernel_ok = false;
  for (int c = 0; c < 2 && !kernel_ok; ++c) {
    for (auto [ptr, n] : {std::pair{out.s, kM * kD}, {out.s64, kM * 64}, {out.o, kM * kD}, {out.o64, kM * 64},
                          {out.q, kQ * kD}})
      CHECK(cudaMemset(ptr, 0xFF, n * 4));
    products<<<1, 256, smem>>>(da, dk, dv, dp, dt, out, conventions[c][0], conventions[c][1]);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    auto fetch = [](const float* d, int n) {
      std::vector<float> h(n);
      cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost);
      return h;
    };
    const double errs[5] = {rel_error(fetch(out.s, kM * kD), s_ref), rel_error(fetch(out.s64, kM * 64), s64_ref),
                            rel_error(fetch(out.o, kM * kD), o_ref), rel_error(fetch(out.o64, kM * 64), o64_ref),
                            rel_error(fetch(out.q, kQ * kD), q_ref)};
    const char* names[5] = {"S = A K^T (m64n128)", "S64 (m64n64)", "O = P V (m64n128, N-major B)",
                            "O64 (m64n64, N-major B)", "Q = T^T K (m64n64, M-major A, N-major B)"};
    bool all = true;
    std::printf("wgmma_layout_test: N/M-major LBO %u, SBO %u%s:\n", conventions[c][0], conventions[c][1],
                c == 0 ? " (the kernels')" : " (swapped)");
    for (int i = 0; i < 5; ++i) {
      // Exact bf16 products summed in fp32: a few fp32 ulps of the largest element.
      const bool ok = errs[i] < 1e-5;
      all = all && ok;
      std::printf("  %-42s max error %.2e  %s\n", names[i], errs[i], ok ? "ok" : "WRONG");
    }
    if (c == 0) kernel_ok = all;
  }
  std::printf("wgmma_layout_test: %s\n", kernel_ok ? "the kernels' conventions hold" : "FAILED");
  for (void* b : buffers) cudaFree(b);
  return kernel_ok ? 0 : 1;
}
