#include "attention/block_harness.h"

#include "untied/kernels/tensor_ops.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <tuple>

#include "common/random_inputs.h"
#include "untied/comm/inproc.h"
#include "untied/core/tensor.h"
#include "untied/device/cuda.h"
#include "untied/device/device.h"

namespace untied::attntest {

int64_t output_cols(const BlockDims& d, int i) { return i == 5 ? d.heads * d.head_dim : d.hidden; }

BlockInputs random_inputs(const BlockDims& d, uint64_t seed, DType exact_in) {
  test::Rng rng(seed);
  auto draw = [&](int64_t n, double sigma) { return test::normal_values(rng, n, exact_in, sigma); };
  const int64_t S = d.seq, E = d.hidden, HD = d.heads * d.head_dim, GD = d.kv_heads * d.head_dim;
  BlockInputs in;
  in.dims = d;
  in.x = draw(S * E, 1.0);
  in.dy = draw(S * E, 1.0);
  in.wq = draw(HD * E, 1.0 / std::sqrt(static_cast<double>(E)));
  in.wk = draw(GD * E, 1.0 / std::sqrt(static_cast<double>(E)));
  in.wv = draw(GD * E, 1.0 / std::sqrt(static_cast<double>(E)));
  in.wo = draw(E * HD, 1.0 / std::sqrt(static_cast<double>(HD)));
  return in;
}

namespace {

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <typename T>
Outputs reference_as(const BlockInputs& in) {
  blockref::BlockWeights<T> w{cast<T>(in.wq), cast<T>(in.wk), cast<T>(in.wv), cast<T>(in.wo)};
  const std::vector<T> x = cast<T>(in.x);
  const std::vector<T> y = blockref::block_forward(in.dims, x, w);
  blockref::BlockGrads<T> g;
  blockref::block_backward(in.dims, x, w, cast<T>(in.dy), g);
  auto d = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  return Outputs{d(y), d(g.dx), d(g.dwq), d(g.dwk), d(g.dwv), d(g.dwo)};
}

// A dense tensor in f32 or bf16 storage.
class Stored {
 public:
  Stored(DType t, const std::vector<double>& v) : t_(t) {
    if (t == DType::kF32) f_.assign(v.begin(), v.end());
    else
      for (double x : v) b_.push_back(float_to_bf16(static_cast<float>(x)));
  }
  Stored(DType t, int64_t n) : Stored(t, std::vector<double>(static_cast<size_t>(n), 0.0)) {}
  void* at(int64_t elem) {
    return t_ == DType::kF32 ? static_cast<void*>(f_.data() + elem) : static_cast<void*>(b_.data() + elem);
  }
  std::vector<double> get() const {
    std::vector<double> v;
    if (t_ == DType::kF32) v.assign(f_.begin(), f_.end());
    else
      for (bf16 x : b_) v.push_back(bf16_to_float(x));
    return v;
  }

 private:
  DType t_;
  std::vector<float> f_;
  std::vector<bf16> b_;
};

// Rows of a global (S, cols) tensor in rank-major order (rank 0's L rows, then rank 1's, ...) as
// the layout hands them out, or (gather) the inverse: rank-major rows back in sequence order.
std::vector<double> rows_by_rank(const std::vector<double>& v, const TokenLayout& layout, int64_t cols, bool gather) {
  std::vector<double> out(v.size());
  const int64_t L = layout.local_tokens();
  for (int r = 0; r < layout.ranks(); ++r)
    for (const TokenSegment& s : layout.rank_segments(r)) {
      const int64_t rank_row = r * L + s.first_row, seq_row = s.first_position;
      const int64_t from = (gather ? rank_row : seq_row) * cols, to = (gather ? seq_row : rank_row) * cols;
      std::copy(v.begin() + from, v.begin() + from + s.length * cols, out.begin() + to);
    }
  return out;
}

}  // namespace

Outputs reference_outputs(const BlockInputs& in, bool fp64) {
  return fp64 ? reference_as<double>(in) : reference_as<float>(in);
}

std::string RunSpec::name() const {
  std::string s = std::string(strategy_name(strategy)) + " C=" + std::to_string(ranks);
  if (strategy == Strategy::kUPipe) s += " U=" + std::to_string(upipe_heads > 0 ? upipe_heads : ranks / ring);
  if (ring > 1) s += " R=" + std::to_string(ring);
  s += " ";
  s += dtype_name(dtype);
  if (overlap) s += " overlap";
  if (keep_last) s += " keep-last";
  if (!early_delta) s += " late-delta";
  if (input_tile > 0) s += " tile=" + std::to_string(input_tile);
  if (output_tile > 0) s += " out-tile=" + std::to_string(output_tile);
  if (grads_on_host) s += " grads-on-host";
  if (out_on_host) s += " out-on-host";
  if (dy_tile > 0) s += " dy-tile=" + std::to_string(dy_tile);
  if (rehearsal) s += " rehearsal";
  return s;
}

BlockRun run_block(const BlockInputs& in, const RunSpec& spec) {
  const BlockDims& d = in.dims;
  const int64_t S = d.seq, E = d.hidden, H = d.heads, G = d.kv_heads, D = d.head_dim;
  const int C = spec.ranks;
  const int64_t L = S / C;
  const DType t = spec.dtype;
  const AttentionConfig cfg{.seq = S, .hidden = E, .heads = H, .kv_heads = G, .head_dim = D,
                            .rope_theta = d.theta, .dtype = t, .strategy = spec.strategy,
                            .upipe_heads = spec.upipe_heads, .ring = spec.ring, .overlap = spec.overlap,
                            .early_delta = spec.early_delta};
  const TokenLayout layout = token_layout(cfg, C);
  // Each rank's rows of x and dy, at its positions.
  const std::vector<double> x_by_rank = rows_by_rank(in.x, layout, E, /*gather=*/false),
                            dy_by_rank = rows_by_rank(in.dy, layout, E, /*gather=*/false);
  Stored x(t, x_by_rank), dy(t, dy_by_rank), wq(t, in.wq), wk(t, in.wk), wv(t, in.wv), wo(t, in.wo);

  BlockRun run;
  run.per_rank.resize(static_cast<size_t>(C));
  run.stats.resize(static_cast<size_t>(C));
  run.stats_after_forward.resize(static_cast<size_t>(C));
  std::mutex mu;
  run_in_process(C, [&](Communicator& comm) {
    std::unique_ptr<Device> dev;
    if (spec.gpu) {
      dev = std::move(make_cuda_device({})).value();
      comm.bind_device(*dev);
    } else {
      dev = make_cpu_device({.threads = 1, .rehearsal = spec.rehearsal});
    }
    auto block = make_attention_block(*dev, comm, cfg);
    const int r = comm.rank();
    Stored y(t, L * E), dx(t, L * E), dwq(t, H * D * E), dwk(t, G * D * E), dwv(t, G * D * E), dwo(t, E * H * D);
    // In rehearsal nothing may be touched: every tensor is passed without data. On a GPU every
    // tensor is a device copy of its host slice (outputs are copied back below).
    std::vector<std::tuple<Buffer, void*, int64_t>> on_gpu;  // device buffer, host pointer, bytes
    auto p = [&](Stored& s, int64_t elem = 0, int64_t n = 0) -> void* {
      if (spec.rehearsal) return nullptr;
      if (!spec.gpu) return s.at(elem);
      const int64_t bytes = n * dtype_size(t);
      Buffer b = dev->allocator().allocate(bytes, Tag::kOther, "test tensor");
      dev->copy(b.data(), s.at(elem), bytes);
      void* d = b.data();
      on_gpu.emplace_back(std::move(b), s.at(elem), bytes);
      return d;
    };
    const AttentionWeights w{Tensor(p(wq, 0, H * D * E), t, {H * D, E}), Tensor(p(wk, 0, G * D * E), t, {G * D, E}),
                             Tensor(p(wv, 0, G * D * E), t, {G * D, E}), Tensor(p(wo, 0, E * H * D), t, {E, H * D})};
    AttentionGrads g{Tensor(p(dwq, 0, H * D * E), t, {H * D, E}), Tensor(p(dwk, 0, G * D * E), t, {G * D, E}),
                     Tensor(p(dwv, 0, G * D * E), t, {G * D, E}), Tensor(p(dwo, 0, E * H * D), t, {E, H * D})};
    const Tensor xt(p(x, r * L * E, L * E), t, {L, E}), dyt(p(dy, r * L * E, L * E), t, {L, E});
    const Tensor yt(p(y, 0, L * E), t, {L, E}), dxt(p(dx, 0, L * E), t, {L, E});
    // The test's own copies are not the block's memory: measure from here.
    dev->allocator().reset_peaks();
    AttentionSaved saved;
    saved.keep_last_stage = spec.keep_last;
    dev->allocator().set_phase(Phase::kForward);
    const SequenceMask mask = d.doc_lens.empty() ? SequenceMask(S, d.window)
                                                 : SequenceMask::from_lengths(d.doc_lens, d.window).value();
    // spec.input_tile: x by tiles, each copied from x's rows (as the decoder's norm tiles are).
    const TiledInput tiled{.tile = spec.input_tile, .rows = [&](int64_t r0, int64_t n, void* dst) {
      dev->copy(dst, xt.data() == nullptr ? nullptr : static_cast<const char*>(xt.data()) + r0 * E * dtype_size(t),
                n * E * dtype_size(t));
    }};
    // spec.output_tile: y handed out by tiles, each copied into y's rows.
    // spec.out_on_host: the saved output in host memory the device copies to and from.
    Allocator host(spec.rehearsal ? make_counting_memory() : dev->host_memory(), Allocator::Options{.name = "host"});
    const TiledOutput tiled_y{.tile = spec.output_tile,
                              .consume = [&](int64_t r0, int64_t n, const void* rows) {
                                dev->copy(yt.data() == nullptr ? nullptr : static_cast<char*>(yt.data()) + r0 * E * dtype_size(t),
                                          rows, n * E * dtype_size(t));
                              },
                              .host = spec.out_on_host ? &host : nullptr};
    UNTIED_CHECK(spec.output_tile == 0 || spec.input_tile > 0, "run_block: output_tile needs input_tile");
    if (spec.output_tile > 0) block->forward(tiled_y, tiled, w, mask, saved);
    else if (spec.input_tile > 0) block->forward(yt, tiled, w, mask, saved);
    else block->forward(yt, xt, w, mask, saved);
    const MemoryStats after_forward = dev->allocator().stats();
    dev->allocator().set_phase(Phase::kBackward);
    // spec.grad_tile: dx handed out by tiles, each written into dx's rows in the block's dtype.
    // spec.grads_on_host: the kept gradients there too.
    const TiledGrad tiled_dx{.tile = spec.grad_tile,
                             .consume = [&](int64_t r0, int64_t n, const float* rows) {
                               convert(*dev, dxt.data() == nullptr ? nullptr : static_cast<char*>(dxt.data()) + r0 * E * dtype_size(t),
                                       t, rows, DType::kF32, n * E);
                             },
                             .host = spec.grads_on_host ? &host : nullptr};
    // spec.dy_tile: dy by tiles, each copied from dy's rows.
    const TiledInput tiled_dy{.tile = spec.dy_tile, .rows = [&](int64_t r0, int64_t n, void* dst) {
      dev->copy(dst, dyt.data() == nullptr ? nullptr : static_cast<const char*>(dyt.data()) + r0 * E * dtype_size(t),
                n * E * dtype_size(t));
    }};
    UNTIED_CHECK(spec.dy_tile == 0 || (spec.grad_tile > 0 && spec.input_tile > 0), "run_block: dy_tile needs grad_tile and input_tile");
    if (spec.dy_tile > 0) block->backward(tiled_dx, g, tiled_dy, tiled, w, saved);
    else if (spec.grad_tile > 0 && spec.input_tile > 0) block->backward(tiled_dx, g, dyt, tiled, w, saved);
    else if (spec.grad_tile > 0) block->backward(tiled_dx, g, dyt, xt, w, saved);
    else if (spec.input_tile > 0) block->backward(dxt, g, dyt, tiled, w, saved);
    else block->backward(dxt, g, dyt, xt, w, saved);
    dev->synchronize();
    for (auto& [b, host, bytes] : on_gpu) dev->copy(host, b.data(), bytes);  // inputs come back unchanged
    std::lock_guard<std::mutex> lock(mu);
    run.per_rank[r] = Outputs{y.get(), dx.get(), dwq.get(), dwk.get(), dwv.get(), dwo.get()};
    run.stats[r] = dev->allocator().stats();
    run.stats_after_forward[r] = after_forward;
    run.stage_heads = block->stage_heads();
  });

  // Gather y and dx; sum the weight-gradient partials over ranks in rank order (fp64).
  for (int i = 0; i < kNumOutputs; ++i) {
    const size_t n = i < 2 ? static_cast<size_t>(S * E) : run.per_rank[0][i].size();
    run.out[i].assign(n, 0.0);
    run.abs_partials[i].assign(n, 0.0);
    for (int r = 0; r < C; ++r) {
      const std::vector<double>& part = run.per_rank[r][i];
      const size_t base = i < 2 ? static_cast<size_t>(r * L * E) : 0;
      for (size_t j = 0; j < part.size(); ++j) {
        if (i < 2) run.out[i][base + j] = part[j];
        else run.out[i][j] += part[j];
        run.abs_partials[i][base + j] += std::fabs(part[j]);
      }
    }
    if (i < 2) {  // rank-major rows back into sequence order
      run.out[i] = rows_by_rank(run.out[i], layout, E, /*gather=*/true);
      run.abs_partials[i] = rows_by_rank(run.abs_partials[i], layout, E, /*gather=*/true);
    }
  }
  return run;
}

double partial_sum_floor(const std::vector<double>& abs_partials, DType storage, int64_t stored_adds) {
  const double u = storage == DType::kBF16 ? kBf16UnitRoundoff : kF32UnitRoundoff;
  return static_cast<double>(1 + stored_adds) * u * max_abs(abs_partials);
}

int64_t stored_adds(const BlockDims& d, int C, int output) {
  if (output != 3 && output != 4) return 0;
  const int64_t kv_eff = d.kv_heads % C == 0 ? d.kv_heads : C;
  return kv_eff / d.kv_heads - 1;
}

}  // namespace untied::attntest
