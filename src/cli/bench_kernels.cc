// `untied bench kernels`: flash attention forward and backward at several sequence lengths next
// to this machine's GEMM rate, measured in the same run; with several ranks, an all-to-all row.
//
// Every rank runs the same work at the same time (as ranks do in training); a row reports the
// slowest rank. Each attention configuration is verified before it is timed: sampled rows of
// out, lse, dq, dk and dv are recomputed in double directly from the definition.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "untied/comm/communicator.h"
#include "untied/core/tensor.h"
#include "untied/device/device.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"

namespace untied::cli {
namespace {

struct Row {
  std::string op;
  int64_t seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  double ms = 0, gflops = 0;
  double max_rel_err = -1;  // < 0: not verified (gemm, all_to_all)
  int64_t workspace_bytes = 0;
  double gbps = 0;  // all_to_all only
};

void fill_uniform(Device& dev, const Tensor& t, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> tmp(static_cast<size_t>(t.numel()));
  for (auto& x : tmp) x = u(rng);
  store_f32(t.data(), t.dtype(), tmp.data(), t.numel());
}

std::vector<double> to_double(const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  load_f32(f.data(), t.data(), t.dtype(), t.numel());
  return std::vector<double>(f.begin(), f.end());
}

// Sampled-row verification in double: out and lse of sampled query rows, dq of those rows, dk
// and dv of sampled key rows, each recomputed from the definition. Returns the largest error
// relative to the magnitude of its quantity.
double verify_attention(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const std::vector<float>& lse, const Tensor& dout,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim, S = s.seq_q, g = H / G;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto Q = to_double(q), K = to_double(k), V = to_double(v), O = to_double(out), dO = to_double(dout);
  auto dQ = to_double(dq), dK = to_double(dk), dV = to_double(dv);
  auto qv = [&](int64_t i, int64_t h) { return &Q[(i * H + h) * D]; };
  auto kv = [&](int64_t j, int64_t gk) { return &K[(j * G + gk) * D]; };
  auto vv = [&](int64_t j, int64_t gk) { return &V[(j * G + gk) * D]; };
  auto dot = [&](const double* a, const double* b) {
    double r = 0;
    for (int64_t c = 0; c < D; ++c) r += a[c] * b[c];
    return r;
  };
  auto nkeys = [&](int64_t i) { return s.causal ? i + 1 : S; };
  // Per quantity (out, dq, dk, dv): largest error and largest reference magnitude over all
  // sampled rows, so that rows whose exact value is ~0 (dq of row 0) are judged on the scale
  // of the quantity.
  struct Scale {
    double err = 0, ref = 0;
    void add(const std::vector<double>& r, const double* got, int64_t n) {
      for (int64_t c = 0; c < n; ++c) {
        ref = std::max(ref, std::fabs(r[c]));
        err = std::max(err, std::fabs(r[c] - got[c]));
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
      for (int64_t j = 0; j < nkeys(r); ++j) m = std::max(m, sc[j] = scale * dot(qv(r, h), kv(j, gk)));
      double l = 0;
      std::vector<double> o(D, 0.0);
      for (int64_t j = 0; j < nkeys(r); ++j) {
        const double p = std::exp(sc[j] - m);
        l += p;
        for (int64_t c = 0; c < D; ++c) o[c] += p * vv(j, gk)[c];
      }
      for (auto& x : o) x /= l;
      so.add(o, &O[(r * H + h) * D], D);
      worst = std::max(worst, std::fabs(m + std::log(l) - lse[h * S + r]) / std::max(1.0, std::fabs(m)));
      // dq row r: scale * sum_j P_rj (dO_r . v_j - D_r) k_j.
      const double d_r = dot(&dO[(r * H + h) * D], &O[(r * H + h) * D]);
      std::vector<double> dqr(D, 0.0);
      for (int64_t j = 0; j < nkeys(r); ++j) {
        const double p = std::exp(sc[j] - lse[h * S + r]);
        const double ds = p * (dot(&dO[(r * H + h) * D], vv(j, gk)) - d_r);
        for (int64_t c = 0; c < D; ++c) dqr[c] += scale * ds * kv(j, gk)[c];
      }
      sdq.add(dqr, &dQ[(r * H + h) * D], D);
    }
    // dk, dv of key row r: sums over all query heads of its group and all rows that see it.
    for (int64_t gk : {int64_t{0}, G - 1}) {
      std::vector<double> dkr(D, 0.0), dvr(D, 0.0);
      for (int64_t h = gk * g; h < (gk + 1) * g; ++h) {
        for (int64_t i = s.causal ? r : 0; i < S; ++i) {
          const double p = std::exp(scale * dot(qv(i, h), kv(r, gk)) - lse[h * S + i]);
          const double d_i = dot(&dO[(i * H + h) * D], &O[(i * H + h) * D]);
          const double ds = p * (dot(&dO[(i * H + h) * D], vv(r, gk)) - d_i);
          for (int64_t c = 0; c < D; ++c) {
            dvr[c] += p * dO[(i * H + h) * D + c];
            dkr[c] += scale * ds * qv(i, h)[c];
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

// Median over `repeat` runs of the slowest rank's time of fn().
template <typename Fn>
double time_ms(Communicator& comm, int repeat, Fn&& fn) {
  std::vector<double> times;
  for (int r = 0; r < repeat; ++r) {
    comm.barrier();
    const double t0 = now_ms();
    fn();
    double t = now_ms() - t0;
    comm.all_reduce(&t, &t, 1, DType::kF64, ReduceOp::kMax);
    times.push_back(t);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void print_rows(const std::vector<Row>& rows, bool json, const std::string& header, double ratio_seq) {
  if (json) {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "  {\"op\": \"%s\", \"seq\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
          "\"causal\": %s, \"ms\": %.4f, \"gflops\": %.3f, \"workspace_bytes\": %lld, "
          "\"max_rel_err\": %s, \"gbps\": %.4f}%s\n",
          r.op.c_str(), (long long)r.seq, (long long)r.heads, (long long)r.kv_heads, (long long)r.head_dim,
          r.causal ? "true" : "false", r.ms, r.gflops, (long long)r.workspace_bytes,
          r.max_rel_err < 0 ? "null" : std::to_string(r.max_rel_err).c_str(), r.gbps,
          i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
    return;
  }
  std::printf("%s\n", header.c_str());
  std::printf("%-13s %7s %6s %9s %9s %7s %11s %10s %14s %10s\n", "op", "seq", "heads", "kv_heads",
              "head_dim", "causal", "ms", "GFLOP/s", "workspace", "max_err");
  double gemm_rate = 0, attn_rate = 0;
  for (const Row& r : rows) {
    if (r.op == "all_to_all") {
      std::printf("%-13s %7s %6s %9s %9s %7s %11.3f %10s %14s %10s   %.3f GB/s per rank, %s per peer\n",
                  r.op.c_str(), "-", "-", "-", "-", "-", r.ms, "-", "-", "-", r.gbps,
                  format_bytes(r.workspace_bytes).c_str());
      continue;
    }
    if (r.op == "gemm") gemm_rate = r.gflops;
    if (r.op == "attn_fwd_bwd" && r.seq == ratio_seq) attn_rate = r.gflops;
    char err[32] = "-";
    if (r.max_rel_err >= 0) std::snprintf(err, sizeof err, "%.1e", r.max_rel_err);
    std::printf("%-13s %7lld %6s %9s %9s %7s %11.3f %10.2f %14s %10s\n", r.op.c_str(), (long long)r.seq,
                r.op == "gemm" ? "-" : std::to_string(r.heads).c_str(),
                r.op == "gemm" ? "-" : std::to_string(r.kv_heads).c_str(),
                r.op == "gemm" ? "-" : std::to_string(r.head_dim).c_str(),
                r.op == "gemm" ? "-" : (r.causal ? "yes" : "no"), r.ms, r.gflops,
                r.workspace_bytes ? format_bytes(r.workspace_bytes).c_str() : "-", err);
  }
  if (gemm_rate > 0 && attn_rate > 0)
    std::printf("attention fwd+bwd at S=%lld: %.2f GFLOP/s = %.0f%% of the GEMM rate (%.2f GFLOP/s)\n",
                (long long)ratio_seq, attn_rate, 100.0 * attn_rate / gemm_rate, gemm_rate);
}

}  // namespace

int bench_kernels_main(int* argc, char*** argv, const std::vector<std::string>& args) {
  FlagSet flags("untied bench kernels",
                "Times flash attention forward and backward at several sequence lengths and a square\n"
                "GEMM in the same run; every attention result is verified before it is timed.");
  flags.add("seqs", FlagKind::kIntList, "1K,2K,4K,8K", "sequence lengths (comma separated)");
  flags.add("heads", FlagKind::kInt, "8", "query heads H");
  flags.add("kv-heads", FlagKind::kInt, "2", "KV heads G (divides H)");
  flags.add("head-dim", FlagKind::kInt, "128", "head dimension D");
  flags.add("causal", FlagKind::kBool, "true", "causal attention (--no-causal for full)");
  flags.add("dtype", FlagKind::kString, "f32", "storage type: f32 or bf16");
  flags.add("threads", FlagKind::kInt, "", "BLAS/OpenMP threads per rank (default: cores / ranks on this node)");
  flags.add("gemm-size", FlagKind::kInt, "2048", "N of the square f32 GEMM row");
  flags.add("a2a-bytes", FlagKind::kBytes, "8M", "bytes per peer of the all-to-all row (several ranks)");
  flags.add("repeat", FlagKind::kInt, "3", "timed runs per row (the median is reported)");
  flags.add("ratio-seq", FlagKind::kInt, "4096", "sequence length of the attention/GEMM ratio line");
  flags.add("verify", FlagKind::kBool, "true", "verify sampled rows against a double-precision recomputation");
  flags.add("json", FlagKind::kBool, "false", "print a JSON array (one object per row) instead of the table");
  const bool root = launch_info().world_rank == 0;
  Status st = flags.parse(args);
  if (!st.ok() || flags.wants_help()) {
    if (root) std::fprintf(st.ok() ? stdout : stderr, "%s\n", st.ok() ? flags.usage().c_str() : ("untied: " + st.message()).c_str());
    return st.ok() ? 0 : 2;
  }
  auto dtype = parse_dtype(flags.get_string("dtype"));
  std::string bad;
  const int64_t H = flags.get_int("heads"), G = flags.get_int("kv-heads"), D = flags.get_int("head-dim");
  const std::vector<int64_t> seqs = flags.get_int_list("seqs");
  const int repeat = static_cast<int>(flags.get_int("repeat"));
  const int threads = flags.get_string("threads").empty()
                          ? default_threads_per_rank(launch_info().mpi ? local_ranks_under_mpirun() : 1)
                          : static_cast<int>(flags.get_int("threads"));
  if (!dtype.ok()) bad = "--dtype: " + dtype.status().message();
  else if (H < 1 || G < 1 || H % G != 0) bad = "--heads must be a positive multiple of --kv-heads (got " + std::to_string(H) + " and " + std::to_string(G) + ")";
  else if (D < 2 || D > 1024) bad = "--head-dim must be in [2, 1024]";
  else if (repeat < 1) bad = "--repeat must be >= 1";
  else if (threads < 1) bad = "--threads must be >= 1";
  else if (flags.get_int("gemm-size") < 1) bad = "--gemm-size must be >= 1";
  for (int64_t s : seqs)
    if (s < 2 && bad.empty()) bad = "--seqs: every length must be >= 2";
  if (!bad.empty()) {
    if (root) std::fprintf(stderr, "untied: %s\n", bad.c_str());
    return 2;
  }

  return run_ranks(argc, argv, 1, [&](Communicator& comm) {
    auto dev = make_cpu_device(CpuDeviceOptions{.threads = threads});
    Allocator& alloc = dev->allocator();
    std::vector<Row> rows;
    const bool causal = flags.get_bool("causal");

    // GEMM rate of this machine, same threads.
    {
      const int64_t n = flags.get_int("gemm-size");
      TensorBuffer a(alloc, DType::kF32, {n, n}, Tag::kOther, "bench gemm A");
      TensorBuffer b(alloc, DType::kF32, {n, n}, Tag::kOther, "bench gemm B");
      TensorBuffer c(alloc, DType::kF32, {n, n}, Tag::kOther, "bench gemm C");
      fill_uniform(*dev, a, 1, -1, 1);
      fill_uniform(*dev, b, 2, -1, 1);
      GemmParams p{.m = n, .n = n, .k = n, .a = a.data(), .lda = n, .b = b.data(), .ldb = n, .c = c.data(), .ldc = n};
      gemm(*dev, p);  // warm-up
      const double ms = time_ms(comm, repeat, [&] { gemm(*dev, p); });
      rows.push_back(Row{.op = "gemm", .seq = n, .ms = ms, .gflops = 2.0 * n * n * n / (ms * 1e6)});
    }

    for (int64_t S : seqs) {
      AttentionShape s{.seq_q = S, .seq_k = S, .heads = H, .kv_heads = G, .head_dim = D, .causal = causal,
                       .dtype = dtype.value()};
      TensorBuffer q(alloc, s.dtype, {S, H, D}, Tag::kActivations, "bench q");
      TensorBuffer k(alloc, s.dtype, {S, G, D}, Tag::kActivations, "bench k");
      TensorBuffer v(alloc, s.dtype, {S, G, D}, Tag::kActivations, "bench v");
      TensorBuffer o(alloc, s.dtype, {S, H, D}, Tag::kActivations, "bench out");
      TensorBuffer dout(alloc, s.dtype, {S, H, D}, Tag::kActivations, "bench dout");
      TensorBuffer dq(alloc, s.dtype, {S, H, D}, Tag::kGradients, "bench dq");
      TensorBuffer dk(alloc, s.dtype, {S, G, D}, Tag::kGradients, "bench dk");
      TensorBuffer dv(alloc, s.dtype, {S, G, D}, Tag::kGradients, "bench dv");
      TensorBuffer lse(alloc, DType::kF32, {H, S}, Tag::kActivations, "bench lse");
      const uint64_t seed = 1000 * static_cast<uint64_t>(S) + static_cast<uint64_t>(comm.rank());
      fill_uniform(*dev, q, seed + 1, -1, 1);
      fill_uniform(*dev, k, seed + 2, -1, 1);
      fill_uniform(*dev, v, seed + 3, -1, 1);
      fill_uniform(*dev, dout, seed + 4, -1, 1);

      auto fwd = [&] { attention_forward(*dev, s, o.data(), lse.as<float>(), q.data(), k.data(), v.data()); };
      auto bwd = [&] {
        attention_backward(*dev, s, dq.data(), dk.data(), dv.data(), q.data(), k.data(), v.data(), o.data(),
                           lse.as<float>(), dout.data());
      };
      alloc.reset_peaks();
      const int64_t ws0 = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)];
      fwd();
      const int64_t ws_fwd = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)] - ws0;
      alloc.reset_peaks();
      bwd();
      const int64_t ws_bwd = alloc.stats().peak[static_cast<int>(Tag::kAttnWorkspace)] - ws0;
      double err = -1;
      if (flags.get_bool("verify")) {
        std::vector<float> lse_v(lse.as<float>(), lse.as<float>() + H * S);
        err = verify_attention(s, q, k, v, o, lse_v, dout, dq, dk, dv);
        comm.all_reduce(&err, &err, 1, DType::kF64, ReduceOp::kMax);
        // Sampled rows against double: fp32 sums of S terms stay near 1e-5 relative; bf16
        // storage rounds every stored value (2^-8 relative), so outputs differ by ~1e-2.
        const double tol = s.dtype == DType::kBF16 ? 5e-2 : 1e-3;
        UNTIED_CHECK_KIND(ErrorKind::kInternal, err <= tol, "attention at S=", S,
                          " failed verification: max relative error ", err, " > ", tol);
      }
      const double tf = time_ms(comm, repeat, fwd);
      const double tb = time_ms(comm, repeat, bwd);
      const double ff = attention_forward_flops(s), fb = attention_backward_flops(s);
      Row base{.op = "", .seq = S, .heads = H, .kv_heads = G, .head_dim = D, .causal = causal, .max_rel_err = err};
      Row rf = base, rb = base, rfb = base;
      rf.op = "attn_fwd", rf.ms = tf, rf.gflops = ff / (tf * 1e6), rf.workspace_bytes = ws_fwd;
      rb.op = "attn_bwd", rb.ms = tb, rb.gflops = fb / (tb * 1e6), rb.workspace_bytes = ws_bwd;
      rfb.op = "attn_fwd_bwd", rfb.ms = tf + tb, rfb.gflops = (ff + fb) / ((tf + tb) * 1e6),
      rfb.workspace_bytes = std::max(ws_fwd, ws_bwd);
      rows.push_back(rf);
      rows.push_back(rb);
      rows.push_back(rfb);
    }

    if (comm.size() > 1) {
      const int64_t block = flags.get_bytes("a2a-bytes");
      Buffer send = alloc.allocate(block * comm.size(), Tag::kCommunication, "bench all_to_all send");
      Buffer recv = alloc.allocate(block * comm.size(), Tag::kCommunication, "bench all_to_all recv");
      std::fill(send.as<char>(), send.as<char>() + block * comm.size(), static_cast<char>(comm.rank()));
      comm.all_to_all(send.data(), recv.data(), block);
      const double ms = time_ms(comm, repeat, [&] { comm.all_to_all(send.data(), recv.data(), block); });
      // Bytes each rank sends to its peers (its own block stays local).
      const double bytes = static_cast<double>(block) * (comm.size() - 1);
      rows.push_back(Row{.op = "all_to_all", .ms = ms, .workspace_bytes = block, .gbps = bytes / (ms * 1e6)});
    }

    if (comm.rank() == 0) {
      std::string header = "untied bench kernels | " + dev->name() + " x " + std::to_string(comm.size()) +
                           (comm.size() > 1 ? " ranks (" + comm.backend() + ")" : " rank") + " | " +
                           std::string(dtype_name(dtype.value())) + " storage, fp32 compute | " +
                           blas_description() + " | median of " + std::to_string(repeat) + " runs, slowest rank";
      print_rows(rows, flags.get_bool("json"), header, static_cast<double>(flags.get_int("ratio-seq")));
    }
  });
}

}  // namespace untied::cli
