// The shared-memory layouts and descriptors of the Hopper attention kernels (src/kernels/cuda/
// wgmma.cuh, *_sm90.cu), on the GPU against a CPU product: one warpgroup runs, with the kernels'
// own primitives and as they call them, S = A K^T (both operands K-major from 128-byte swizzled
// tiles, m64n128), O = P V (P from registers, V MN-major, m64n128) and Q = T^T K0 (A read M-major
// from a 128 x 64 tile, B = K's first 64-column block read N-major, m64n64: the backward's dQ). For each
// product it also tries the other reading of the MN-major descriptor's two offsets, so that a
// failure says which convention the GPU follows. The emulator (emu/emu_wgmma_primitives.h)
// models the kernel's reading; the attention op tests check the whole kernel on both.
// Exit 0: the kernels' conventions hold; 1: they do not; 77: no compute capability 9.0 GPU
// (skipped).
#include "kernels/cuda/wgmma.cuh"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace wgmma_layout {

using namespace untied::cuda::attn;
constexpr int kD = 128, kM = 64, kN = 128;

__global__ void products(const bf16* a, const bf16* k, const bf16* v, const float* p, const bf16* tt, float* s_out,
                         float* o_out, float* q_out, uint32_t mn_lbo, uint32_t mn_sbo) {
#if UNTIED_WGMMA
  unsigned char* as = aligned_smem();
  unsigned char* ks = as + kM * kD * 2;
  unsigned char* vs = ks + kN * kD * 2;
  unsigned char* ts = vs + kN * kD * 2;  // T: kN rows of kM
  const int tid = threadIdx.x;
  load_swizzled_async<kM, kD, 128>(as, a, 0, kM, kD, 0, tid);
  load_swizzled_async<kN, kD, 128>(ks, k, 0, kN, kD, 0, tid);
  load_swizzled_async<kN, kD, 128>(vs, v, 0, kN, kD, 0, tid);
  load_swizzled_async<kN, kM, 128>(ts, tt, 0, kN, kM, 0, tid);
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async();
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32, g = lane >> 2, t2 = (lane & 3) * 2;
  float s[kN / 2];
  for (int i = 0; i < kN / 2; ++i) s[i] = 0.0f;
  wgmma_fence();
  for (int kk = 0; kk < kD / 16; ++kk)
    wgmma_ss_n128<0, 0>(s, smem_desc(as + (kk / 4) * kM * 128 + (kk % 4) * 32, 16, 1024),
                  smem_desc(ks + (kk / 4) * kN * 128 + (kk % 4) * 32, 16, 1024), kk > 0 ? 1 : 0);
  wgmma_commit();
  wgmma_wait_all();
  for (int nt = 0; nt < kN / 8; ++nt)
    for (int e = 0; e < 4; ++e) s_out[(warp * 16 + g + (e >> 1) * 8) * kN + nt * 8 + t2 + (e & 1)] = s[nt * 4 + e];
  uint32_t pa[kN / 16][4];
  for (int kk = 0; kk < kN / 16; ++kk)
    for (int j = 0; j < 4; ++j) {
      const float* row = p + (warp * 16 + g + (j & 1) * 8) * kN + kk * 16 + t2 + (j >> 1) * 8;
      pa[kk][j] = pack_bf16(row[0], row[1]);
    }
  float o[kD / 2];
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  wgmma_fence();
  for (int kk = 0; kk < kN / 16; ++kk) wgmma_rs_n128(o, pa[kk], smem_desc(vs + kk * 16 * 128, mn_lbo, mn_sbo));
  wgmma_commit();
  wgmma_wait_all();
  for (int dt = 0; dt < kD / 8; ++dt)
    for (int e = 0; e < 4; ++e) o_out[(warp * 16 + g + (e >> 1) * 8) * kD + dt * 8 + t2 + (e & 1)] = o[dt * 4 + e];
  float q[32];
  for (int i = 0; i < 32; ++i) q[i] = 0.0f;
  wgmma_fence();
  for (int kk = 0; kk < kN / 16; ++kk)
    wgmma_ss_n64<1, 1>(q, smem_desc(ts + kk * 16 * 128, mn_lbo, mn_sbo), smem_desc(ks + kk * 16 * 128, mn_lbo, mn_sbo),
                       kk > 0 ? 1 : 0);
  wgmma_commit();
  wgmma_wait_all();
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e) q_out[(warp * 16 + g + (e >> 1) * 8) * 64 + nt * 8 + t2 + (e & 1)] = q[nt * 4 + e];
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
  std::vector<float> a(kM * kD), k(kN * kD), v(kN * kD), p(kM * kN), tt(kN * kM);
  for (auto* t : {&a, &k, &v, &p, &tt})
    for (float& x : *t) x = round_bf16(u(rng));
  auto to_bf16 = [](const std::vector<float>& x) {
    std::vector<bf16> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = __float2bfloat16_rn(x[i]);
    return b;
  };
  const std::vector<bf16> ab = to_bf16(a), kb = to_bf16(k), vb = to_bf16(v), tb = to_bf16(tt);
  bf16 *da, *dk, *dv, *dt;
  float *dp, *ds, *dout, *dq;
  CHECK(cudaMalloc(&da, ab.size() * 2));
  CHECK(cudaMalloc(&dk, kb.size() * 2));
  CHECK(cudaMalloc(&dv, vb.size() * 2));
  CHECK(cudaMalloc(&dp, p.size() * 4));
  CHECK(cudaMalloc(&ds, kM * kN * 4));
  CHECK(cudaMalloc(&dout, kM * kD * 4));
  CHECK(cudaMalloc(&dt, tb.size() * 2));
  CHECK(cudaMalloc(&dq, kM * 64 * 4));
  CHECK(cudaMemcpy(dt, tb.data(), tb.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(da, ab.data(), ab.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dk, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dv, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dp, p.data(), p.size() * 4, cudaMemcpyHostToDevice));
  std::vector<double> s_ref(kM * kN), o_ref(kM * kD), q_ref(kM * 64);
  double s_max = 0, o_max = 0, q_max = 0;
  for (int i = 0; i < kM; ++i)
    for (int c = 0; c < 64; ++c) {
      double acc = 0;
      for (int j = 0; j < kN; ++j) acc += static_cast<double>(tt[j * kM + i]) * k[j * kD + c];
      q_ref[i * 64 + c] = acc;
      q_max = std::max(q_max, std::fabs(acc));
    }
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += static_cast<double>(a[i * kD + c]) * k[j * kD + c];
      s_ref[i * kN + j] = acc;
      s_max = std::max(s_max, std::fabs(acc));
    }
  for (int i = 0; i < kM; ++i)
    for (int c = 0; c < kD; ++c) {
      double acc = 0;
      for (int j = 0; j < kN; ++j) acc += static_cast<double>(p[i * kN + j]) * v[j * kD + c];
      o_ref[i * kD + c] = acc;
      o_max = std::max(o_max, std::fabs(acc));
    }
  const int smem = (kM + 2 * kN) * kD * 2 + kN * kM * 2 + 1024;
  CHECK(cudaFuncSetAttribute(products, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // The kernels' reading of the MN-major descriptors first: LBO between 64-column blocks, SBO
  // between 8-row groups; then the two swapped.
  const uint32_t conventions[2][2] = {{kN * 128, 1024}, {1024, kN * 128}};
  bool kernel_ok = false;
  for (int c = 0; c < 2; ++c) {
    CHECK(cudaMemset(ds, 0xFF, kM * kN * 4));
    CHECK(cudaMemset(dout, 0xFF, kM * kD * 4));
    CHECK(cudaMemset(dq, 0xFF, kM * 64 * 4));
    products<<<1, 128, smem>>>(da, dk, dv, dp, dt, ds, dout, dq, conventions[c][0], conventions[c][1]);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> s(kM * kN), o(kM * kD), qv(kM * 64);
    CHECK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(qv.data(), dq, qv.size() * 4, cudaMemcpyDeviceToHost));
    // Max error over max |reference|; NaN (an element never written) counts as infinite.
    auto rel_err = [](const std::vector<float>& got, const std::vector<double>& want, double scale) {
      double e = 0;
      for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - want[i]));
      return e / scale;
    };
    const double s_err = rel_err(s, s_ref, s_max), o_err = rel_err(o, o_ref, o_max), q_err = rel_err(qv, q_ref, q_max);
    // Exact bf16 products summed in fp32: a few fp32 ulps of the largest element.
    const bool s_ok = s_err < 1e-5, o_ok = o_err < 1e-5, q_ok = q_err < 1e-5;
    std::printf("wgmma_layout_test: MN-major LBO %u, SBO %u%s: S = A K^T max error %.2e (%s), O = P V %.2e (%s), "
                "Q = T^T K0 %.2e (%s)\n",
                conventions[c][0], conventions[c][1], c == 0 ? " (the kernels')" : " (swapped)", s_err,
                s_ok ? "ok" : "WRONG", o_err, o_ok ? "ok" : "WRONG", q_err, q_ok ? "ok" : "WRONG");
    if (c == 0) kernel_ok = s_ok && o_ok && q_ok;
  }
  std::printf("wgmma_layout_test: %s\n", kernel_ok ? "the kernels' conventions hold" : "FAILED");
  return kernel_ok ? 0 : 1;
}
