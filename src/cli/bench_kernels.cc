// `untied bench kernels`: flash attention forward and backward at several sequence lengths next
// to this machine's GEMM rate, measured in the same run; with several ranks, an all-to-all row.
//
// Every rank runs the same work at the same time (as ranks do in training); a row reports the
// slowest rank. Each attention configuration is verified before it is timed: sampled rows of
// out, lse, dq, dk and dv are recomputed in double directly from the definition (from host
// copies of the device's tensors). The all-to-all's first call is checked byte for byte before
// it is timed: each sent byte comes from its global coordinates (sender, receiver, offset), so
// each rank knows what it must receive (as tests/comm/comm_checks.h); a wrong byte on any rank
// fails the command. Its bandwidths are nccl-tests' (doc/PERFORMANCE.md): algbw = the bytes of a
// rank's send buffer / time, busbw = algbw (n-1)/n, the bytes a rank sends to its peers / time.
//
// --device cuda: the GPU table (bf16, causal, D = 128 at S = 8K, 32K with H 32, G 8 and at 128K
// with H 8, G 2 by default) next to cuBLAS GEMM rates (8192^3 and a q-projection shape) in the
// same run, in TFLOP/s. GPU times are host clock reads around Device::synchronize(), after
// warm-ups; each row is the median of several runs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "untied/core/json.h"
#include "cli/launch.h"
#include "cli/rank_device.h"
#include "untied/comm/communicator.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/attention/sequence_mask.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/cpu_kernels_info.h"
#include "untied/kernels/gemm.h"

namespace untied::cli {
namespace {

struct Row {
  std::string op;
  int64_t seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  double ms = 0, gflops = 0;
  double max_rel_err = -1;  // < 0: not verified (gemm)
  int64_t workspace_bytes = 0;
  // all_to_all only: the bandwidths (GB/s, nccl-tests' algbw and busbw: see the top of the file)
  // and the wrong bytes received, over all ranks (a row is made only when it is 0).
  double algbw_gbps = 0, busbw_gbps = 0;
  int64_t wrong_bytes = -1;  // < 0: not an all_to_all row
  std::string note = {};  // printed after the row (GEMM shapes on the GPU)
};

// Uniform values made on the host; stored in t's dtype on the device.
void fill_uniform(Device& dev, const Tensor& t, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> tmp(static_cast<size_t>(t.numel()));
  for (auto& x : tmp) x = u(rng);
  if (dev.kind() == DeviceKind::kCpu) return store_f32(t.data(), t.dtype(), tmp.data(), t.numel());
  std::vector<unsigned char> stored(static_cast<size_t>(t.bytes()));
  store_f32(stored.data(), t.dtype(), tmp.data(), t.numel());
  copy_to_device(dev, t, stored.data());
}

// Host float32 copies of an attention call's tensors, for the verification.
struct HostAttention {
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
};

// Sampled-row verification in double: out and lse of sampled query rows, dq of those rows, dk
// and dv of sampled key rows, each recomputed from the definition. Returns the largest error
// relative to the magnitude of its quantity.
// Every product and sum is in double (float32 values widen exactly).
// mask: packed documents and window (causal only; null = plain).
double verify_attention(const AttentionShape& s, const HostAttention& t, const SequenceMask* mask = nullptr) {
  const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim, S = s.seq_q, g = H / G;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<float> &Q = t.q, &K = t.k, &V = t.v, &O = t.out, &dO = t.dout, &lse = t.lse;
  const std::vector<float> &dQ = t.dq, &dK = t.dk, &dV = t.dv;
  auto qv = [&](int64_t i, int64_t h) { return &Q[(i * H + h) * D]; };
  auto kv = [&](int64_t j, int64_t gk) { return &K[(j * G + gk) * D]; };
  auto vv = [&](int64_t j, int64_t gk) { return &V[(j * G + gk) * D]; };
  auto dot = [&](const float* a, const float* b) {
    double r = 0;
    for (int64_t c = 0; c < D; ++c) r += static_cast<double>(a[c]) * static_cast<double>(b[c]);
    return r;
  };
  auto nkeys = [&](int64_t i) { return s.causal ? i + 1 : S; };
  auto first_key = [&](int64_t i) { return mask != nullptr ? mask->key_lo(i) : int64_t{0}; };
  // Per quantity (out, dq, dk, dv): largest error and largest reference magnitude over all
  // sampled rows, so that rows whose exact value is ~0 (dq of row 0) are judged on the scale
  // of the quantity.
  struct Scale {
    double err = 0, ref = 0;
    void add(const std::vector<double>& r, const float* got, int64_t n) {
      for (int64_t c = 0; c < n; ++c) {
        ref = std::max(ref, std::fabs(r[c]));
        err = std::max(err, std::fabs(r[c] - static_cast<double>(got[c])));
      }
    }
    double rel() const { return ref > 0 ? err / ref : err; }
  };
  Scale so, sdq, sdk, sdv;
  double worst = 0;
  const std::vector<int64_t> rows = {0, 1, S / 3, S / 2, S - 2, S - 1};
  for (int64_t r : rows) {
    if (r < 0 || r >= S) continue;
    for (int64_t h : {int64_t{0}, H - 1}) {
      const int64_t gk = h / g;
      // Forward row: out and lse.
      std::vector<double> sc(static_cast<size_t>(nkeys(r)));
      double m = -1e300;
      const int64_t j0 = first_key(r);
      for (int64_t j = j0; j < nkeys(r); ++j) m = std::max(m, sc[j] = scale * dot(qv(r, h), kv(j, gk)));
      double l = 0;
      std::vector<double> o(D, 0.0);
      for (int64_t j = j0; j < nkeys(r); ++j) {
        const double p = std::exp(sc[j] - m);
        l += p;
        for (int64_t c = 0; c < D; ++c) o[c] += p * static_cast<double>(vv(j, gk)[c]);
      }
      for (auto& x : o) x /= l;
      so.add(o, &O[(r * H + h) * D], D);
      worst = std::max(worst, std::fabs(m + std::log(l) - lse[h * S + r]) / std::max(1.0, std::fabs(m)));
      // dq row r: scale * sum_j P_rj (dO_r . v_j - D_r) k_j.
      const double d_r = dot(&dO[(r * H + h) * D], &O[(r * H + h) * D]);
      std::vector<double> dqr(D, 0.0);
      for (int64_t j = j0; j < nkeys(r); ++j) {
        const double p = std::exp(sc[j] - lse[h * S + r]);
        const double ds = p * (dot(&dO[(r * H + h) * D], vv(j, gk)) - d_r);
        for (int64_t c = 0; c < D; ++c) dqr[c] += scale * ds * static_cast<double>(kv(j, gk)[c]);
      }
      sdq.add(dqr, &dQ[(r * H + h) * D], D);
    }
    // dk, dv of key row r: sums over all query heads of its group and all rows that see it.
    for (int64_t gk : {int64_t{0}, G - 1}) {
      std::vector<double> dkr(D, 0.0), dvr(D, 0.0);
      for (int64_t h = gk * g; h < (gk + 1) * g; ++h) {
        for (int64_t i = s.causal ? r : 0; i < S && first_key(i) <= r; ++i) {
          const double p = std::exp(scale * dot(qv(i, h), kv(r, gk)) - lse[h * S + i]);
          const double d_i = dot(&dO[(i * H + h) * D], &O[(i * H + h) * D]);
          const double ds = p * (dot(&dO[(i * H + h) * D], vv(r, gk)) - d_i);
          for (int64_t c = 0; c < D; ++c) {
            dvr[c] += p * static_cast<double>(dO[(i * H + h) * D + c]);
            dkr[c] += scale * ds * static_cast<double>(qv(i, h)[c]);
          }
        }
      }
      sdk.add(dkr, &dK[(r * G + gk) * D], D);
      sdv.add(dvr, &dV[(r * G + gk) * D], D);
    }
  }
  for (const Scale* sc : {&so, &sdq, &sdk, &sdv}) worst = std::max(worst, sc->rel());
  return worst;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over `repeat` runs of the slowest rank's time of fn(). The clock is read with the
// device idle before and after (synchronize is a no-op on the CPU; on a GPU it waits for the
// stream, so the time covers the kernels, not their launch).
template <typename Fn>
double time_ms(Communicator& world, Device& dev, int repeat, Fn&& fn) {
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    dev.synchronize();
    world.barrier();
    const double t0 = now_ms();
    fn();
    dev.synchronize();
    double t = now_ms() - t0;
    world.all_reduce(&t, &t, 1, DType::kF64, ReduceOp::kMax);
    times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What the flags ask for, each default chosen by --device where it depends on it.
struct KernelBenchOptions {
  DeviceChoice device = DeviceChoice::kCpu;
  DType dtype = DType::kF32;  // the attention's storage
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t long_seq = 0, long_heads = 0, long_kv_heads = 0;  // long_seq 0: none
  std::vector<int64_t> seqs;
  bool causal = true;
  int64_t gemm_n = 0;
  std::vector<int64_t> proj;  // M, N, K of the projection-shaped GEMM; empty: none
  int64_t a2a_bytes = 0;
  int warmup = 0, repeat = 0;
  int64_t ratio_seq = 0;
  int64_t doc_len = 0;        // > 0: also time each length packed with documents of this many tokens
  int threads = 1;
  bool verify = true;
  bool json = false;
  bool gpu() const { return device == DeviceChoice::kCuda; }
  // The CPU's GEMM rows stay f32 (its rate); a GPU's run in the attention's storage type
  // (bf16: cuBLAS with fp32 accumulation, the tensor-core rate attention is compared with).
  DType gemm_dtype() const { return gpu() ? dtype : DType::kF32; }
};

void add_bench_kernels_flags(FlagSet& flags) {
  add_device_flag(flags, "cpu or cuda (under mpirun: one GPU per rank, NCCL)");
  flags.add("seqs", FlagKind::kIntList, "", "sequence lengths (default: cpu 1K,2K,4K,8K; cuda 8K,32K,128K)");
  flags.add("heads", FlagKind::kInt, "", "query heads H (default: cpu 8; cuda 32)");
  flags.add("kv-heads", FlagKind::kInt, "", "KV heads G, dividing H (default: cpu 2; cuda 8)");
  flags.add("long-seq", FlagKind::kInt, "",
            "lengths from this one on use --long-heads and --long-kv-heads, so that one run stays short "
            "(default: cpu none; cuda 128K)");
  flags.add("long-heads", FlagKind::kInt, "8", "query heads at lengths >= --long-seq");
  flags.add("long-kv-heads", FlagKind::kInt, "2", "KV heads at lengths >= --long-seq");
  flags.add("head-dim", FlagKind::kInt, "128", "head dimension D");
  flags.add("causal", FlagKind::kBool, "true", "causal attention (--no-causal for full)");
  add_dtype_flag(flags, "", std::string(kDtypeHelp) + " (default: cpu f32; cuda bf16)");
  add_threads_flag(flags, "cores / ranks on this node");
  flags.add("gemm-size", FlagKind::kInt, "",
            "N of the square GEMM row: f32 on the CPU, --dtype on a GPU (default: cpu 2048; cuda 8192)");
  flags.add("proj-gemm", FlagKind::kIntList, "",
            "M,N,K of a GEMM shaped like the attention's q projection, x (M tokens, K = E) wq^T (N = H*D, K), "
            "in the GEMM row's dtype (default: cpu none; cuda 16K,4096,4096)");
  flags.add("a2a-bytes", FlagKind::kBytes, "8M", "bytes per peer of the all-to-all row (several ranks)");
  flags.add_int("warmup", "",
            "untimed calls of each op before its timed runs; an attention's or the all-to-all's verified call is "
            "the first (default: cpu 1; cuda 3)",
                {0, 1000000});
  flags.add_int("repeat", "", "timed runs per row, the median is reported (default: cpu 3; cuda 10)", {1, 1000000});
  flags.add("ratio-seq", FlagKind::kInt, "", "sequence length of the attention/GEMM ratio line (default: cpu 4096; cuda 32768)");
  flags.add("doc-len", FlagKind::kInt, "",
            "also time each attention length packed with documents of this many tokens (causal inside each; "
            "the mask skips the rest), next to one causal sequence, with the time and FLOP ratios");
  flags.add("verify", FlagKind::kBool, "true", "verify sampled rows against a double-precision recomputation");
  flags.add("json", FlagKind::kBool, "false", "print a JSON array (one object per row) instead of the table");
}

// A flag whose default depends on --device: its value when given, else `cpu` or `cuda`.
int64_t int_or(const FlagSet& f, const char* name, bool gpu, int64_t cpu, int64_t cuda) {
  return f.was_set(name) ? f.get_int(name) : (gpu ? cuda : cpu);
}

// Reads the parsed flags into *o; a non-empty answer says which flag to change.
std::string read_bench_kernels_flags(const FlagSet& flags, KernelBenchOptions* o) {
  auto device = parse_device_choice(flags.get_string("device"));
  const bool gpu = device.ok() && device.value() == DeviceChoice::kCuda;
  auto dtype = parse_dtype(flags.was_set("dtype") ? flags.get_string("dtype") : (gpu ? "bf16" : "f32"));
  const int64_t H = int_or(flags, "heads", gpu, 8, 32), G = int_or(flags, "kv-heads", gpu, 2, 8),
                D = flags.get_int("head-dim");
  const int64_t long_seq = int_or(flags, "long-seq", gpu, 0, 128 * 1024), LH = flags.get_int("long-heads"),
                LG = flags.get_int("long-kv-heads");
  const std::vector<int64_t> seqs = flags.was_set("seqs") ? flags.get_int_list("seqs")
                                    : gpu                 ? std::vector<int64_t>{8192, 32768, 131072}
                                                          : std::vector<int64_t>{1024, 2048, 4096, 8192};
  const int64_t gemm_n = int_or(flags, "gemm-size", gpu, 2048, 8192);
  std::vector<int64_t> proj = flags.was_set("proj-gemm") ? flags.get_int_list("proj-gemm")
                              : gpu                      ? std::vector<int64_t>{16384, 4096, 4096}
                                                         : std::vector<int64_t>{};
  const int repeat = static_cast<int>(int_or(flags, "repeat", gpu, 3, 10));
  const int warmup = static_cast<int>(int_or(flags, "warmup", gpu, 1, 3));
  const int threads = threads_from_flags(flags, launch_info().launched ? local_ranks_launched() : 1);
  if (H < 1 || G < 1 || H % G != 0)
    return "--heads must be a positive multiple of --kv-heads (got " + std::to_string(H) + " and " + std::to_string(G) + ")";
  if (long_seq > 0 && (LH < 1 || LG < 1 || LH % LG != 0))
    return "--long-heads must be a positive multiple of --long-kv-heads (got " + std::to_string(LH) + " and " + std::to_string(LG) + ")";
  if (D < 2 || D > 1024) return "--head-dim must be in [2, 1024]";
  if (gemm_n < 1) return "--gemm-size must be >= 1";
  if (!proj.empty() && (proj.size() != 3 || proj[0] < 1 || proj[1] < 1 || proj[2] < 1))
    return "--proj-gemm takes three sizes M,N,K, each >= 1";
  for (int64_t s : seqs)
    if (s < 2) return "--seqs: every length must be >= 2";
  const int64_t doc_len = flags.get_string("doc-len").empty() ? 0 : flags.get_int("doc-len");
  if (!flags.get_string("doc-len").empty() && doc_len < 1) return "--doc-len must be >= 1";
  if (doc_len > 0 && !flags.get_bool("causal")) return "--doc-len needs causal attention: drop --no-causal";
  *o = KernelBenchOptions{.device = device.value(), .dtype = dtype.value(), .heads = H, .kv_heads = G, .head_dim = D,
                          .long_seq = long_seq, .long_heads = LH, .long_kv_heads = LG, .seqs = seqs,
                          .causal = flags.get_bool("causal"), .gemm_n = gemm_n, .proj = proj,
                          .a2a_bytes = flags.get_bytes("a2a-bytes"), .warmup = warmup, .repeat = repeat,
                          .ratio_seq = int_or(flags, "ratio-seq", gpu, 4096, 32768), .doc_len = doc_len,
                          .threads = threads,
                          .verify = flags.get_bool("verify"), .json = flags.get_bool("json")};
  return "";
}

// GEMM rates of this device, same threads: C (m, n) = A (m, k) B^T when trans_b.
Row gemm_row(Communicator& world, Device& dev, const KernelBenchOptions& o, const std::string& op, DType t, int64_t m,
             int64_t n, int64_t k, bool trans_b, std::string note) {
  Allocator& alloc = dev.allocator();
  TensorBuffer a(alloc, t, {m, k}, Tag::kOther, "bench gemm A");
  TensorBuffer b(alloc, t, trans_b ? Shape{n, k} : Shape{k, n}, Tag::kOther, "bench gemm B");
  TensorBuffer c(alloc, t, {m, n}, Tag::kOther, "bench gemm C");
  fill_uniform(dev, a, 1, -1, 1);
  fill_uniform(dev, b, 2, -1, 1);
  GemmParams p{.trans_b = trans_b, .m = m, .n = n, .k = k, .a = a.data(), .lda = k, .a_dtype = t,
               .b = b.data(), .ldb = trans_b ? k : n, .b_dtype = t, .c = c.data(), .ldc = n, .c_dtype = t};
  for (int i = 0; i < o.warmup; ++i) gemm(dev, p);
  const double ms = time_ms(world, dev, o.repeat, [&] { gemm(dev, p); });
  return Row{.op = op, .seq = m, .ms = ms, .gflops = 2.0 * static_cast<double>(m) * n * k / (ms * 1e6),
             .note = std::move(note)};
}

// The square GEMM row, then the projection-shaped one if asked for. On the CPU with bf16 storage,
// both again with bf16 operands and C (the projections' path: gemm.h), as gemm_bf16 and
// gemm_proj_bf16; the f32 square row stays the rate attention is compared with.
void add_gemm_rows(Communicator& world, Device& dev, const KernelBenchOptions& o, std::vector<Row>* rows) {
  std::vector<DType> types{o.gemm_dtype()};
  if (!o.gpu() && o.dtype != DType::kF32) types.push_back(o.dtype);
  for (DType t : types) {
    const std::string type(dtype_name(t));
    const std::string suffix = t == o.gemm_dtype() ? "" : "_" + type;
    const int64_t n = o.gemm_n;
    rows->push_back(gemm_row(world, dev, o, "gemm" + suffix, t, n, n, n, false,
                             o.gpu() || !suffix.empty() ? std::to_string(n) + "^3 " + type : ""));
    if (!o.proj.empty()) {
      const int64_t M = o.proj[0], N = o.proj[1], K = o.proj[2];
      rows->push_back(gemm_row(world, dev, o, "gemm_proj" + suffix, t, M, N, K, true,
                               std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " " + type +
                                   ": x (M, K) wq^T (N, K)"));
    }
  }
}

// Flash attention at one length: forward, backward and both, verified (--verify) on the first
// call of each before the timed runs.
// doc_len > 0: the sequence is packed with documents of doc_len tokens (the last one shorter).
void add_attention_rows(Communicator& world, Device& dev, const KernelBenchOptions& o, int64_t S,
                        std::vector<Row>* rows, int64_t doc_len = 0) {
  Allocator& alloc = dev.allocator();
  const bool long_row = o.long_seq > 0 && S >= o.long_seq;
  const int64_t h = long_row ? o.long_heads : o.heads, kvh = long_row ? o.long_kv_heads : o.kv_heads,
                D = o.head_dim;
  AttentionShape s{.seq_q = S, .seq_k = S, .heads = h, .kv_heads = kvh, .head_dim = D, .causal = o.causal,
                   .dtype = o.dtype};
  SequenceMask mask(S);
  TensorBuffer starts;
  if (doc_len > 0) {
    std::vector<int64_t> st;
    for (int64_t at = 0; at < S; at += doc_len) st.push_back(at);
    mask = SequenceMask::from_starts(S, st).value();
    starts = TensorBuffer(alloc, DType::kI64, {mask.num_docs()}, Tag::kOther, "bench document starts");
    dev.copy(starts.data(), st.data(), mask.num_docs() * 8);
    s.doc_starts = starts.as<int64_t>();
    s.num_docs = mask.num_docs();
  }
  TensorBuffer q(alloc, s.dtype, {S, h, D}, Tag::kActivations, "bench q");
  TensorBuffer k(alloc, s.dtype, {S, kvh, D}, Tag::kActivations, "bench k");
  TensorBuffer v(alloc, s.dtype, {S, kvh, D}, Tag::kActivations, "bench v");
  TensorBuffer out(alloc, s.dtype, {S, h, D}, Tag::kActivations, "bench out");
  TensorBuffer dout(alloc, s.dtype, {S, h, D}, Tag::kActivations, "bench dout");
  TensorBuffer dq(alloc, s.dtype, {S, h, D}, Tag::kGradients, "bench dq");
  TensorBuffer dk(alloc, s.dtype, {S, kvh, D}, Tag::kGradients, "bench dk");
  TensorBuffer dv(alloc, s.dtype, {S, kvh, D}, Tag::kGradients, "bench dv");
  TensorBuffer lse(alloc, DType::kF32, {h, S}, Tag::kActivations, "bench lse");
  const uint64_t seed = 1000 * static_cast<uint64_t>(S) + static_cast<uint64_t>(world.rank());
  fill_uniform(dev, q, seed + 1, -1, 1);
  fill_uniform(dev, k, seed + 2, -1, 1);
  fill_uniform(dev, v, seed + 3, -1, 1);
  fill_uniform(dev, dout, seed + 4, -1, 1);

  auto fwd = [&] {
    attention_forward(dev, s, {.out = out.data(), .lse = lse.as<float>(), .q = q.data(), .k = k.data(), .v = v.data()});
  };
  auto bwd = [&] {
    attention_backward(dev, s,
                       {.dq = dq.data(), .dk = dk.data(), .dv = dv.data(), .q = q.data(), .k = k.data(), .v = v.data(),
                        .out = out.data(), .lse = lse.as<float>(), .dout = dout.data()});
  };
  // The first call of each: its workspace, and the results that are verified.
  alloc.reset_peaks();
  const int64_t ws0 = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)];
  fwd();
  const int64_t ws_fwd = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)] - ws0;
  alloc.reset_peaks();
  bwd();
  const int64_t ws_bwd = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)] - ws0;
  double err = -1;
  if (o.verify) {
    const HostAttention ht{host_f32(dev, q),    host_f32(dev, k),  host_f32(dev, v),
                           host_f32(dev, out),  host_f32(dev, lse), host_f32(dev, dout),
                           host_f32(dev, dq),   host_f32(dev, dk), host_f32(dev, dv)};
    err = verify_attention(s, ht, doc_len > 0 ? &mask : nullptr);
    world.all_reduce(&err, &err, 1, DType::kF64, ReduceOp::kMax);
    // Sampled rows against double: fp32 sums of S terms stay near 1e-5 relative; bf16
    // storage rounds every stored value (2^-8 relative), so outputs differ by ~1e-2. A GPU
    // kernel with bf16 storage also feeds P and dS to its tensor-core products as bf16
    // (2^-9 relative per term, independent between terms, summed in fp32), which adds
    // about 2^-9 of each quantity's scale: the same bound holds.
    const double tol = s.dtype == DType::kBF16 ? 5e-2 : 1e-3;
    UNTIED_CHECK_KIND(ErrorKind::kInternal, err <= tol, "attention at S=", S,
                      " failed verification: max relative error ", err, " > ", tol);
  }
  for (int i = 1; i < o.warmup; ++i) fwd(), bwd();
  const double tf = time_ms(world, dev, o.repeat, fwd);
  const double tb = time_ms(world, dev, o.repeat, bwd);
  double ff = attention_forward_flops(s), fb = attention_backward_flops(s);
  if (doc_len > 0) {  // the FLOPs of the pairs the mask lets through (4 D per pair and head, forward)
    ff = 4.0 * mask.visible_pairs() * static_cast<double>(D * h);
    fb = 2.5 * ff;
  }
  Row base{.op = "", .seq = S, .heads = h, .kv_heads = kvh, .head_dim = D, .causal = o.causal, .max_rel_err = err};
  Row rf = base, rb = base, rfb = base;
  const std::string suffix = doc_len > 0 ? "_docs" + std::to_string(doc_len) : "";
  rf.op = "attn_fwd" + suffix, rf.ms = tf, rf.gflops = ff / (tf * 1e6), rf.workspace_bytes = ws_fwd;
  rb.op = "attn_bwd" + suffix, rb.ms = tb, rb.gflops = fb / (tb * 1e6), rb.workspace_bytes = ws_bwd;
  rfb.op = "attn_fwd_bwd" + suffix, rfb.ms = tf + tb, rfb.gflops = (ff + fb) / ((tf + tb) * 1e6),
  rfb.workspace_bytes = std::max(ws_fwd, ws_bwd);
  rows->push_back(rf);
  rows->push_back(rb);
  rows->push_back(rfb);
}

// The byte rank `src` sends rank `dst` at offset i of its block: a hash of the coordinates,
// so that every rank knows what it must receive without communicating.
uint8_t a2a_byte(int src, int dst, int64_t i) {
  uint64_t x = static_cast<uint64_t>(src) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(dst + 1) * 0xC2B2AE3D27D4EB4Full ^ static_cast<uint64_t>(i);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x);
}

// One all_to_all of `block` bytes per peer, checked exactly: send block p = a2a_byte(me, p, i);
// recv starts as the complement of what must arrive, so that a byte left unwritten counts too.
// send, recv: n blocks each, memory of dev. Returns the wrong bytes this rank received; the first
// few are printed to stderr with the rank, the sender and the offset.
int64_t checked_all_to_all(Device& dev, Communicator& comm, void* send, void* recv, int64_t block) {
  const int n = comm.size(), me = comm.rank();
  std::vector<uint8_t> host(static_cast<size_t>(block * n));
  auto at = [&](int p, int64_t i) -> uint8_t& { return host[static_cast<size_t>(p * block + i)]; };
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < block; ++i) at(p, i) = a2a_byte(me, p, i);
  dev.copy(send, host.data(), block * n);
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < block; ++i) at(p, i) = static_cast<uint8_t>(~a2a_byte(p, me, i));
  dev.copy(recv, host.data(), block * n);
  comm.all_to_all(send, recv, block);
  dev.copy(host.data(), recv, block * n);
  constexpr int64_t kPrinted = 5;
  int64_t wrong = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < block; ++i) {
      const uint8_t want = a2a_byte(p, me, i);
      if (at(p, i) == want) continue;
      if (wrong++ < kPrinted)
        std::fprintf(stderr,
                     "bench all_to_all: rank %d of %d (%s): byte %lld of the block from rank %d: got %d, expected %d\n",
                     me, n, comm.backend().c_str(), static_cast<long long>(i), p, at(p, i), want);
    }
  return wrong;
}

// The all-to-all over the rank's communicator, --a2a-bytes per peer: its first call checked on
// every rank (a wrong byte anywhere fails every rank alike), then timed.
Row all_to_all_row(Communicator& world, Device& dev, Communicator& comm, const KernelBenchOptions& o) {
  Allocator& alloc = dev.allocator();
  const int n = comm.size();
  const int64_t block = o.a2a_bytes;
  Buffer send = alloc.allocate(block * n, Tag::kCommunication, "bench all_to_all send");
  Buffer recv = alloc.allocate(block * n, Tag::kCommunication, "bench all_to_all recv");
  const int64_t wrong = checked_all_to_all(dev, comm, send.data(), recv.data(), block);
  std::vector<int64_t> wrong_by_rank(static_cast<size_t>(world.size()));
  world.all_gather(&wrong, wrong_by_rank.data(), sizeof wrong);
  std::string failed;
  for (int r = 0; r < world.size(); ++r)
    if (wrong_by_rank[static_cast<size_t>(r)] > 0)
      failed += str_cat(failed.empty() ? "" : ", ", "rank ", r, " received ", wrong_by_rank[static_cast<size_t>(r)],
                        " wrong bytes");
  UNTIED_CHECK_KIND(ErrorKind::kInternal, failed.empty(), "all_to_all of ", block, " bytes per peer on ", n,
                    " ranks (", comm.backend(), ") failed verification: ", failed, " (of ", block * n,
                    " bytes each)");
  for (int i = 1; i < o.warmup; ++i) comm.all_to_all(send.data(), recv.data(), block);
  const double ms = time_ms(world, dev, o.repeat, [&] { comm.all_to_all(send.data(), recv.data(), block); });
  const double algbw = static_cast<double>(block) * n / (ms * 1e6);  // the send buffer, own block included
  return Row{.op = "all_to_all", .ms = ms, .workspace_bytes = block, .algbw_gbps = algbw,
             .busbw_gbps = algbw * (n - 1) / n, .wrong_bytes = 0,
             .note = format_bytes(block * n) + " per rank, " + format_bytes(block) + " per peer"};
}

void print_rows_json(const std::vector<Row>& rows) {
  std::vector<Json> out;
  for (const Row& r : rows) {
    Json j;
    j["op"] = r.op;
    j["seq"] = r.seq;
    j["heads"] = r.heads;
    j["kv_heads"] = r.kv_heads;
    j["head_dim"] = r.head_dim;
    j["causal"] = r.causal;
    j["ms"] = as_printed("%.4f", r.ms);
    j["gflops"] = as_printed("%.3f", r.gflops);
    j["workspace_bytes"] = r.workspace_bytes;
    j["max_rel_err"] = r.max_rel_err < 0 ? Json(nullptr) : Json(as_printed("%.6g", r.max_rel_err));
    j["algbw_gbps"] = as_printed("%.4f", r.algbw_gbps);
    j["busbw_gbps"] = as_printed("%.4f", r.busbw_gbps);
    if (r.wrong_bytes >= 0) j["wrong_bytes"] = r.wrong_bytes;
    if (!r.note.empty()) j["note"] = r.note;
    out.push_back(std::move(j));
  }
  print_json_rows(out);
}

// How rates are printed: GFLOP/s on the CPU; TFLOP/s and the share of the square GEMM's rate
// on a GPU.
struct Units {
  bool tflops = false;
  std::string gemm_label = "the GEMM rate";
};

// The table's one-line environment header, and its units.
std::string table_header(Device& dev, Communicator& comm, const KernelBenchOptions& o, Units* units) {
  const std::string ranks_text = std::to_string(comm.size()) +
                                 (comm.size() > 1 ? " ranks (" + comm.backend() + ")" : " rank");
  const std::string storage(dtype_name(o.dtype));
  if (!o.gpu())
    return "untied bench kernels | " + dev.name() + " x " + ranks_text + " | " + storage +
           " storage, fp32 compute | " + cpu_kernels_description() + " | median of " + std::to_string(o.repeat) +
           " runs, slowest rank";
  const std::string gemm_type(dtype_name(o.gemm_dtype()));
  units->tflops = true;
  units->gemm_label = "the cuBLAS " + gemm_type + " GEMM rate";
  return "untied bench kernels | " + dev.name() + " x " + ranks_text + " | " + storage +
         " storage, fp32 accumulation | cuBLAS " + gemm_type + " GEMM | median of " + std::to_string(o.repeat) +
         " runs after " + std::to_string(o.warmup) + " warm-up" + (o.warmup == 1 ? "" : "s") +
         ", slowest rank; of_gemm: share of the " + std::to_string(o.gemm_n) + "^3 GEMM's rate";
}

void print_rows_table(const std::vector<Row>& rows, const std::string& header, double ratio_seq, const Units& units) {
  const double scale = units.tflops ? 1e-3 : 1.0;  // GFLOP/s -> the printed unit
  double gemm_rate = 0, attn_rate = 0;
  for (const Row& r : rows) {
    if (r.op == "gemm") gemm_rate = r.gflops;
    if (r.op == "attn_fwd_bwd" && r.seq == ratio_seq) attn_rate = r.gflops;
  }
  int w = 13;  // the op column: as wide as its longest name
  for (const Row& r : rows) w = std::max(w, static_cast<int>(r.op.size()));
  std::printf("%s\n", header.c_str());
  std::printf("%-*s %7s %6s %9s %9s %7s %11s %10s %14s %10s%s\n", w, "op", "seq", "heads", "kv_heads",
              "head_dim", "causal", "ms", units.tflops ? "TFLOP/s" : "GFLOP/s", "workspace", "max_err",
              units.tflops ? "    of_gemm" : "");
  bool all_to_all = false;
  for (const Row& r : rows) {
    if (r.op == "all_to_all") {
      all_to_all = true;
      const std::string wrong = std::to_string(r.wrong_bytes) + " wrong";
      std::printf("%-*s %7s %6s %9s %9s %7s %11.3f %10s %14s %10s%s   algbw %.3f GB/s, busbw %.3f GB/s; %s\n", w,
                  r.op.c_str(), "-", "-", "-", "-", "-", r.ms, "-", "-", wrong.c_str(),
                  units.tflops ? "          -" : "", r.algbw_gbps, r.busbw_gbps, r.note.c_str());
      continue;
    }
    const bool g = r.op.rfind("gemm", 0) == 0;
    char err[32] = "-";
    if (r.max_rel_err >= 0) std::snprintf(err, sizeof err, "%.1e", r.max_rel_err);
    char share[32] = "";
    if (units.tflops) {
      if (gemm_rate > 0) std::snprintf(share, sizeof share, " %9.0f%%", 100.0 * r.gflops / gemm_rate);
      else std::snprintf(share, sizeof share, " %10s", "-");
    }
    std::printf("%-*s %7lld %6s %9s %9s %7s %11.3f %10.2f %14s %10s%s%s%s\n", w, r.op.c_str(), (long long)r.seq,
                g ? "-" : std::to_string(r.heads).c_str(), g ? "-" : std::to_string(r.kv_heads).c_str(),
                g ? "-" : std::to_string(r.head_dim).c_str(), g ? "-" : (r.causal ? "yes" : "no"), r.ms,
                r.gflops * scale, r.workspace_bytes ? format_bytes(r.workspace_bytes).c_str() : "-", err, share,
                r.note.empty() ? "" : "   ", r.note.c_str());
  }
  if (all_to_all)
    std::printf("all_to_all: algbw = bytes per rank / time, busbw = algbw * (n-1)/n (nccl-tests' definitions); "
                "every byte received was checked before timing\n");
  if (gemm_rate > 0 && attn_rate > 0)
    std::printf("attention fwd+bwd at S=%lld: %.2f %s = %.0f%% of %s (%.2f %s)\n", (long long)ratio_seq,
                attn_rate * scale, units.tflops ? "TFLOP/s" : "GFLOP/s", 100.0 * attn_rate / gemm_rate,
                units.gemm_label.c_str(), gemm_rate * scale, units.tflops ? "TFLOP/s" : "GFLOP/s");
  // Packed documents against one causal sequence of the same length: time against FLOPs.
  for (const Row& d : rows) {
    if (d.op.rfind("attn_fwd_bwd_docs", 0) != 0) continue;
    for (const Row& c : rows)
      if (c.op == "attn_fwd_bwd" && c.seq == d.seq && c.heads == d.heads) {
        const double flop_ratio = (c.gflops * c.ms) / (d.gflops * d.ms);
        std::printf("packed documents (%s) at S=%lld: fwd+bwd %.1f ms against %.1f ms for one causal sequence: "
                    "%.1fx faster, the FLOPs %.1fx fewer\n",
                    d.op.substr(std::string("attn_fwd_bwd_").size()).c_str(), (long long)d.seq, d.ms, c.ms,
                    c.ms / d.ms, flop_ratio);
      }
  }
}

}  // namespace

int bench_kernels_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied bench kernels",
                "Times flash attention forward and backward at several sequence lengths and GEMMs\n"
                "in the same run, and under mpirun an all-to-all; every attention result and every\n"
                "byte the all-to-all delivers are verified before they are timed.");
  add_bench_kernels_flags(flags);
  const bool root = launch_info().world_rank == 0;
  if (auto exit = parse_command_line(flags, args, root)) return *exit;
  KernelBenchOptions o;
  if (const std::string bad = read_bench_kernels_flags(flags, &o); !bad.empty())
    return refuse(flags, Status::invalid_argument(bad), root);

  return run_ranks(argc, argv, 1, [&](Communicator& world) {
    // The rank's device and the communicator of its buffers; a GPU that cannot be used is
    // refused here on every rank, before any compute.
    RankDevice rd = make_rank_device(world, RankDeviceOptions{.device = o.device, .threads = o.threads});
    std::vector<Row> rows;
    add_gemm_rows(world, rd.dev(), o, &rows);
    for (int64_t S : o.seqs) {
      add_attention_rows(world, rd.dev(), o, S, &rows);
      if (o.doc_len > 0) add_attention_rows(world, rd.dev(), o, S, &rows, o.doc_len);
    }
    if (rd.comm().size() > 1) rows.push_back(all_to_all_row(world, rd.dev(), rd.comm(), o));
    if (world.rank() != 0) return;
    if (o.json) return print_rows_json(rows);
    Units units;
    const std::string header = table_header(rd.dev(), rd.comm(), o, &units);
    print_rows_table(rows, header, static_cast<double>(o.ratio_seq), units);
    if (o.gpu()) std::fputs(cpu_kernels_lines(o.device).c_str(), stdout);  // which attention kernels ran, and why
  });
}

}  // namespace untied::cli
