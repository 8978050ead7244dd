// The CUDA flash attention (src/kernels/cuda/attention_{forward,backward}.cu), compiled for the
// host and run in the CPU emulator of emu_runtime.h, against a naive fp64 reference. It checks
// the kernels' index arithmetic, masking, ragged edges, barrier placement (under the schedules
// tried) and the tensor-core fragment bookkeeping on a machine without a GPU; emu_runtime.h says
// what it cannot check. Both paths are run: the tensor-core one (bf16, D 64 and 128) and the
// portable SIMT one (f32, bf16 with other D, an sm_70 device), each through attention_forward,
// attention_backward (delta from out) and attention_backward with delta given.
//
// Default run (ctest, label "emu"; about 10 s): the kDefaultCases under three schedules: lanes in
// reverse order with cp.async copies landing only at the wait; warps one at a time in a random
// order with copies landing at issue; warps one at a time in order with copies at the wait. The
// warp-at-a-time schedules are the ones that catch a missing __syncthreads.
//
// Exhaustive sweep: UNTIED_EMU_SWEEP=1 runs the default and the kSweepCases (larger sizes, more
// offsets) under every schedule, each with copies deferred and eager:
//   UNTIED_EMU_SWEEP=1 ./tests/cuda_emu/cuda_attention_emu_test
// It takes about 8 minutes (one core, Release build). UNTIED_EMU_SWEEP=quick runs only the
// default cases under every schedule and copy mode (under a minute).
//
// Exit status 0 when every comparison passes; the emulator aborts on a deadlock, an out-of-range
// or misaligned shared-memory access or a cp.async left pending.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/cuda/cuda_device.h"  // the emulator's host_device/ version
#include "kernels/cuda/cuda_kernels.h"
#include "emu_test_util.h"

namespace {

using namespace untied;

// The kernel path a case must take (attention_tiles.cuh chooses it at run time).
enum class Path { kTensorCores, kPortable };
constexpr Path kMma = Path::kTensorCores, kSimt = Path::kPortable;

struct Case {
  const char* what;
  Path path;
  DType dtype;
  int64_t sq, sk, heads, kv_heads, head_dim;
  int64_t q_offset = 0, k_offset = 0;
  bool causal = true;
  int64_t q_pad = 0, kv_pad = 0;  // row stride = heads * head_dim + pad
  float scale = 0.0f;             // 0: 1/sqrt(D)
  int cc_major = 9;               // the emulated device's compute capability
};

constexpr DType kB = DType::kBF16, kF = DType::kF32;

// Ragged sizes throughout (none a multiple of the 64/128-row tiles).
// clang-format off
const Case kDefaultCases[] = {
    {.what = "mma D64 GQA", .path = kMma, .dtype = kB,
     .sq = 130, .sk = 130, .heads = 2, .kv_heads = 1, .head_dim = 64},
    {.what = "mma D128 GQA q_offset strides", .path = kMma, .dtype = kB,
     .sq = 100, .sk = 170, .heads = 4, .kv_heads = 2, .head_dim = 128, .q_offset = 40, .q_pad = 8, .kv_pad = 16},
    {.what = "mma D128 rows 0..29 see no key", .path = kMma, .dtype = kB,
     .sq = 70, .sk = 200, .heads = 2, .kv_heads = 1, .head_dim = 128, .k_offset = 30, .kv_pad = 8},
    {.what = "mma D128 long key prefix", .path = kMma, .dtype = kB,
     .sq = 90, .sk = 300, .heads = 2, .kv_heads = 1, .head_dim = 128, .q_offset = 250},
    {.what = "mma D64 H3 G1 offsets scale", .path = kMma, .dtype = kB,
     .sq = 129, .sk = 257, .heads = 3, .kv_heads = 1, .head_dim = 64, .q_offset = 1000, .k_offset = 1100,
     .scale = 0.3f},
    {.what = "mma D64 non-causal", .path = kMma, .dtype = kB,
     .sq = 90, .sk = 75, .heads = 2, .kv_heads = 2, .head_dim = 64, .causal = false},
    {.what = "simt f32 D40 GQA q_offset strides", .path = kSimt, .dtype = kF,
     .sq = 50, .sk = 90, .heads = 4, .kv_heads = 2, .head_dim = 40, .q_offset = 30, .q_pad = 3, .kv_pad = 5},
    {.what = "simt bf16 D96 k_offset odd stride", .path = kSimt, .dtype = kB,
     .sq = 60, .sk = 45, .heads = 2, .kv_heads = 1, .head_dim = 96, .k_offset = 20, .q_pad = 1},
    {.what = "simt f32 D200 non-causal", .path = kSimt, .dtype = kF,
     .sq = 33, .sk = 40, .heads = 2, .kv_heads = 2, .head_dim = 200, .causal = false},
    {.what = "simt f32 D17 no row sees a key", .path = kSimt, .dtype = kF,
     .sq = 20, .sk = 30, .heads = 2, .kv_heads = 1, .head_dim = 17, .k_offset = 50},
    {.what = "simt bf16 D64 stride not a multiple of 8", .path = kSimt, .dtype = kB,
     .sq = 70, .sk = 70, .heads = 2, .kv_heads = 1, .head_dim = 64, .q_pad = 2, .kv_pad = 2},
    {.what = "simt bf16 D64 on sm_70", .path = kSimt, .dtype = kB,
     .sq = 40, .sk = 50, .heads = 2, .kv_heads = 1, .head_dim = 64, .cc_major = 7},
};

const Case kSweepCases[] = {
    {.what = "mma D64 causal", .path = kMma, .dtype = kB,
     .sq = 77, .sk = 77, .heads = 2, .kv_heads = 1, .head_dim = 64},
    {.what = "mma D64 no row sees a key", .path = kMma, .dtype = kB,
     .sq = 64, .sk = 128, .heads = 2, .kv_heads = 1, .head_dim = 64, .k_offset = 500},
    {.what = "mma D128 one token", .path = kMma, .dtype = kB,
     .sq = 1, .sk = 1, .heads = 1, .kv_heads = 1, .head_dim = 128},
    {.what = "mma D128 large", .path = kMma, .dtype = kB,
     .sq = 1000, .sk = 1000, .heads = 4, .kv_heads = 2, .head_dim = 128},
    {.what = "mma D64 large q_offset", .path = kMma, .dtype = kB,
     .sq = 600, .sk = 1000, .heads = 2, .kv_heads = 1, .head_dim = 64, .q_offset = 400, .q_pad = 8},
    {.what = "simt f32 D64 causal", .path = kSimt, .dtype = kF,
     .sq = 77, .sk = 77, .heads = 2, .kv_heads = 1, .head_dim = 64},
    {.what = "simt f32 D128 non-causal", .path = kSimt, .dtype = kF,
     .sq = 40, .sk = 70, .heads = 2, .kv_heads = 1, .head_dim = 128, .causal = false},
    {.what = "simt f32 D200 q_offset", .path = kSimt, .dtype = kF,
     .sq = 33, .sk = 40, .heads = 2, .kv_heads = 2, .head_dim = 200, .q_offset = 5},
    {.what = "simt bf16 D128 on sm_70", .path = kSimt, .dtype = kB,
     .sq = 70, .sk = 60, .heads = 2, .kv_heads = 1, .head_dim = 128, .cc_major = 7},
};
// clang-format on

// Tolerances, relative to the largest reference element of each tensor.
//  f32 storage: every operand exact in fp32 and fp32 accumulation over at most a few hundred
//    terms of size <= 1: a few hundred fp32 ulps (2^-24 each) at most, so 1e-4 leaves a wide
//    margin while any masking or indexing error (an O(1) change) fails it.
//  bf16 storage: the outputs are rounded to bf16 (2^-9 relative), and the tensor-core path also
//    rounds P and dS to bf16 before its products; summed with random signs over the keys these
//    stay within a few 2^-8, so 2e-2 (5 x 2^-8) passes them and still fails O(1) errors.
double tolerance(DType t) { return t == DType::kF32 ? 1e-4 : 2e-2; }
// lse (absolute): fp32 on both paths and from the exact stored inputs (bf16 values are exact in
// fp32 and the scores accumulate in fp32), |lse| < 10 here, where an fp32 ulp is < 1e-6: 1e-4
// leaves about a hundred ulps.
constexpr double kLseTolerance = 1e-4;


// A host tensor of n elements stored as `dtype` (bf16 as bits), read and written as float.
struct HostTensor {
  DType dtype;
  int64_t n;
  std::vector<unsigned char> raw;
  HostTensor(DType t, int64_t elems) : dtype(t), n(elems), raw(static_cast<size_t>(elems * dtype_size(t))) {}
  float get(int64_t i) const {
    float f;
    load_f32(&f, raw.data() + i * dtype_size(dtype), dtype, 1);
    return f;
  }
  void set(int64_t i, float f) { store_f32(raw.data() + i * dtype_size(dtype), dtype, &f, 1); }
  void fill_random() {
    for (int64_t i = 0; i < n; ++i) set(i, uniform_pm1());
  }
};

// A copy of a host tensor in emulated GPU memory.
struct GpuTensor {
  Buffer buf;
  GpuTensor(Device& dev, const HostTensor& host) {
    buf = dev.allocator().allocate(static_cast<int64_t>(host.raw.size()), Tag::kOther, "emu tensor");
    std::memcpy(buf.data(), host.raw.data(), host.raw.size());
  }
  void copy_to(HostTensor& host) const { std::memcpy(host.raw.data(), buf.data(), host.raw.size()); }
};

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // out/dq (sq, H, D), lse (H, sq), dk/dv (sk, G, D): dense
};

// Naive fp64 attention and its gradient, written for clarity.
Reference reference(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                    const HostTensor& dout) {
  const int64_t H = c.heads, G = c.kv_heads, D = c.head_dim, sq = c.sq, sk = c.sk, group = H / G;
  const int64_t q_rs = H * D + c.q_pad, kv_rs = G * D + c.kv_pad;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<float>(D));
  Reference r;
  r.out.assign(sq * H * D, 0.0);
  r.lse.assign(H * sq, -INFINITY);
  r.dq.assign(sq * H * D, 0.0);
  r.dk.assign(sk * G * D, 0.0);
  r.dv.assign(sk * G * D, 0.0);
  auto Q = [&](int64_t i, int64_t h, int64_t d) { return static_cast<double>(q.get(i * q_rs + h * D + d)); };
  auto K = [&](int64_t j, int64_t g, int64_t d) { return static_cast<double>(k.get(j * kv_rs + g * D + d)); };
  auto V = [&](int64_t j, int64_t g, int64_t d) { return static_cast<double>(v.get(j * kv_rs + g * D + d)); };
  auto dO = [&](int64_t i, int64_t h, int64_t d) { return static_cast<double>(dout.get(i * q_rs + h * D + d)); };
  std::vector<double> s(sk), p(sk);
  std::vector<bool> visible(sk);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / group;
    for (int64_t i = 0; i < sq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < sk; ++j) {
        visible[j] = !c.causal || c.k_offset + j <= c.q_offset + i;
        if (!visible[j]) continue;
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += Q(i, h, d) * K(j, g, d);
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -INFINITY) continue;  // sees no key: out 0, lse -inf, no gradient
      double sum = 0;
      for (int64_t j = 0; j < sk; ++j) sum += visible[j] ? std::exp(s[j] - mx) : 0.0;
      const double lse = mx + std::log(sum);
      r.lse[h * sq + i] = lse;
      for (int64_t j = 0; j < sk; ++j) p[j] = visible[j] ? std::exp(s[j] - lse) : 0.0;
      double* o = &r.out[(i * H + h) * D];
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < sk; ++j) o[d] += p[j] * V(j, g, d);
      double delta = 0;  // rowsum(dout * out)
      for (int64_t d = 0; d < D; ++d) delta += o[d] * dO(i, h, d);
      for (int64_t j = 0; j < sk; ++j) {
        if (!visible[j]) continue;
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += dO(i, h, d) * V(j, g, d);
        const double ds = p[j] * (dp - delta);
        for (int64_t d = 0; d < D; ++d) {
          r.dq[(i * H + h) * D + d] += scale * ds * K(j, g, d);
          r.dk[(j * G + g) * D + d] += scale * ds * Q(i, h, d);
          r.dv[(j * G + g) * D + d] += p[j] * dO(i, h, d);
        }
      }
    }
  }
  return r;
}

int g_failures = 0;

// Compares the (rows, cols) block of `got` (row stride rs) with the dense `want`: max error
// relative to max |want|, NaN (an element never written) fails. The stride gaps must still hold
// the 0xAB sentinel bytes the test wrote.
void compare(const char* what, const HostTensor& got, const std::vector<double>& want, int64_t rows, int64_t cols,
             int64_t rs) {
  double err = 0, ref_max = 0;
  int64_t nan_at = -1, gap_at = -1;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got.get(i * rs + c), w = want[i * cols + c];
      if (std::isnan(g) && nan_at < 0) nan_at = i * cols + c;
      err = std::max(err, std::fabs(g - w));
      ref_max = std::max(ref_max, std::fabs(w));
    }
    const size_t es = static_cast<size_t>(dtype_size(got.dtype));
    for (int64_t c = cols; c < rs && gap_at < 0; ++c)
      for (size_t b = 0; b < es; ++b)
        if (got.raw[static_cast<size_t>(i * rs + c) * es + b] != 0xAB) gap_at = i;
  }
  const double rel = err / (ref_max > 0 ? ref_max : 1.0);
  const double tol = tolerance(got.dtype);
  const bool ok = nan_at < 0 && gap_at < 0 && rel <= tol;
  if (!ok) ++g_failures;
  std::printf("    %-4s rel err %.2e (tol %.0e)", what, rel, tol);
  if (nan_at >= 0) std::printf(", NaN at element %ld", static_cast<long>(nan_at));
  if (gap_at >= 0) std::printf(", stride gap of row %ld written", static_cast<long>(gap_at));
  std::printf("%s\n", ok ? "" : "  FAIL");
}

void compare_lse(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0;
  int64_t bad_inf = -1;
  for (size_t x = 0; x < got.size(); ++x) {
    const bool want_inf = std::isinf(want[x]), got_neg_inf = std::isinf(got[x]) && got[x] < 0;
    if (want_inf != got_neg_inf || std::isnan(got[x])) {
      if (bad_inf < 0) bad_inf = static_cast<int64_t>(x);
      continue;
    }
    if (!want_inf) err = std::max(err, std::fabs(got[x] - want[x]));
  }
  const bool ok = bad_inf < 0 && err <= kLseTolerance;
  if (!ok) ++g_failures;
  std::printf("    lse  abs err %.2e (tol %.0e)", err, kLseTolerance);
  if (bad_inf >= 0) std::printf(", -inf / finite mismatch at %ld", static_cast<long>(bad_inf));
  std::printf("%s\n", ok ? "" : "  FAIL");
}

// The kernel ran on the path the case is meant to cover (mma instructions executed or not), so
// that a change in the path choice cannot quietly move a case's coverage elsewhere.
void check_path(const char* what, const Case& c, long long mma_before) {
  const bool used_mma = emu::g_mma_ops > mma_before;
  if (used_mma == (c.path == Path::kTensorCores)) return;
  ++g_failures;
  std::printf("    %s ran the %s path  FAIL\n", what, used_mma ? "tensor-core" : "portable");
}

void run_case(const Case& c) {
  emu::set_compute_capability(c.cc_major);
  const int64_t H = c.heads, G = c.kv_heads, D = c.head_dim, sq = c.sq, sk = c.sk;
  const int64_t q_rs = H * D + c.q_pad, kv_rs = G * D + c.kv_pad;
  std::printf("  %s: %s sq=%ld sk=%ld H=%ld G=%ld D=%ld q_off=%ld k_off=%ld causal=%d strides=%ld/%ld sm_%d0\n", c.what,
              c.dtype == kF ? "f32" : "bf16", static_cast<long>(sq), static_cast<long>(sk), static_cast<long>(H),
              static_cast<long>(G), static_cast<long>(D), static_cast<long>(c.q_offset), static_cast<long>(c.k_offset),
              c.causal ? 1 : 0, static_cast<long>(q_rs), static_cast<long>(kv_rs), c.cc_major);
  HostTensor q(c.dtype, sq * q_rs), k(c.dtype, sk * kv_rs), v(c.dtype, sk * kv_rs), dout(c.dtype, sq * q_rs);
  q.fill_random();
  k.fill_random();
  v.fill_random();
  dout.fill_random();
  const Reference ref = reference(c, q, k, v, dout);

  CudaDevice dev;
  const AttentionShape shape{.seq_q = sq,
                             .seq_k = sk,
                             .heads = H,
                             .kv_heads = G,
                             .head_dim = D,
                             .q_offset = c.q_offset,
                             .k_offset = c.k_offset,
                             .causal = c.causal,
                             .scale = c.scale,
                             .q_row_stride = q_rs,
                             .kv_row_stride = kv_rs,
                             .dtype = c.dtype};
  const GpuTensor gq(dev, q), gk(dev, k), gv(dev, v), gdout(dev, dout);
  HostTensor out(c.dtype, sq * q_rs);
  std::memset(out.raw.data(), 0xAB, out.raw.size());  // sentinel in the stride gaps
  GpuTensor gout(dev, out);
  Buffer glse = dev.allocator().allocate(H * sq * 4, Tag::kOther, "emu lse");
  const long long mma_before = emu::g_mma_ops;
  cuda::attention_forward(dev, shape, gout.buf.data(), glse.as<float>(), gq.buf.data(), gk.buf.data(), gv.buf.data());
  check_path("forward", c, mma_before);
  gout.copy_to(out);
  std::vector<float> lse(static_cast<size_t>(H * sq));
  std::memcpy(lse.data(), glse.data(), lse.size() * 4);
  std::printf("   forward\n");
  compare("out", out, ref.out, sq, H * D, q_rs);
  compare_lse(lse, ref.lse);

  for (const bool delta_given : {false, true}) {
    HostTensor dq(c.dtype, sq * q_rs), dk(c.dtype, sk * kv_rs), dv(c.dtype, sk * kv_rs);
    for (HostTensor* t : {&dq, &dk, &dv}) std::memset(t->raw.data(), 0xAB, t->raw.size());
    GpuTensor gdq(dev, dq), gdk(dev, dk), gdv(dev, dv);
    Buffer gdelta;
    if (delta_given) {
      // delta = rowsum(dout * out) from the kernel's own out, as a context-parallel caller has it.
      gdelta = dev.allocator().allocate(H * sq * 4, Tag::kOther, "emu delta");
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < sq; ++i) {
          float acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += out.get(i * q_rs + h * D + d) * dout.get(i * q_rs + h * D + d);
          gdelta.as<float>()[h * sq + i] = acc;
        }
    }
    const long long mma_before_bwd = emu::g_mma_ops;
    cuda::attention_backward(dev, shape, gdq.buf.data(), gdk.buf.data(), gdv.buf.data(), gq.buf.data(), gk.buf.data(),
                             gv.buf.data(), delta_given ? nullptr : gout.buf.data(),
                             delta_given ? gdelta.as<float>() : nullptr, glse.as<float>(), gdout.buf.data());
    check_path("backward", c, mma_before_bwd);
    gdq.copy_to(dq);
    gdk.copy_to(dk);
    gdv.copy_to(dv);
    std::printf("   backward%s\n", delta_given ? " (delta given)" : " (delta from out)");
    compare("dq", dq, ref.dq, sq, H * D, q_rs);
    compare("dk", dk, ref.dk, sk, G * D, kv_rs);
    compare("dv", dv, ref.dv, sk, G * D, kv_rs);
  }
}

template <size_t N>
void run_cases(const Case (&cases)[N], const emu::Options& opts) {
  std::printf("schedule %s, cp.async copies %s\n", emu::schedule_name(opts.schedule),
              opts.eager_copies ? "land at issue" : "land at the wait");
  emu::g_options = opts;
  for (const Case& c : cases) run_case(c);
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress of a long sweep shows as it runs
  const char* sweep_env = std::getenv("UNTIED_EMU_SWEEP");
  const std::string sweep = sweep_env != nullptr ? sweep_env : "";
  if (sweep.empty() || sweep == "0") {
    run_cases(kDefaultCases, {.schedule = emu::Schedule::kLanesReverse, .eager_copies = false});
    run_cases(kDefaultCases, {.schedule = emu::Schedule::kWarpsRandom, .eager_copies = true, .seed = 7});
    run_cases(kDefaultCases, {.schedule = emu::Schedule::kWarpsForward, .eager_copies = false});
  } else {
    for (const emu::Schedule s : emu::kAllSchedules)
      for (const bool eager : {false, true}) {
        run_cases(kDefaultCases, {.schedule = s, .eager_copies = eager});
        if (sweep != "quick") run_cases(kSweepCases, {.schedule = s, .eager_copies = eager});
      }
  }
  std::printf("%d failed comparison%s, %lld fiber switches\n", g_failures, g_failures == 1 ? "" : "s", emu::g_switches);
  return g_failures == 0 ? 0 : 1;
}
