// Evaluation over a data source (evaluator.h).
#include "untied/train/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "untied/attention/token_layout.h"
#include "untied/core/check.h"
#include "untied/core/npy.h"
#include "untied/dist/sharded_params.h"
#include "untied/train/checkpoint.h"
#include "untied/train/hf_weights.h"
#include "untied/train/rank_sample.h"

namespace untied {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The weights: a Hugging Face directory, a checkpoint, or the initialisation. Every rank opens
// and checks the files, then reads its own shards; the same Status on every rank.
Status load_weights(const EvalOptions& o, Communicator& comm, Device& dev, ShardedParams& params,
                    int64_t* step) {
  Status st;
  if (o.hf_model.empty() && o.checkpoint_dir.empty()) {
    params.init(parameter_init(o.model, o.seed));
  } else if (!o.hf_model.empty()) {
    auto w = HfWeights::open(o.hf_model);
    st = w.ok() ? w.value().check(o.model) : w.status();
    if (st.ok() && dev.backed()) st = load_hf_weights(w.value(), params);
  } else if (!o.checkpoint_dir.empty()) {
    auto w = CheckpointWeights::open(o.checkpoint_dir, false, o.checkpoint_step);
    st = w.ok() ? w.value().check(o.model) : w.status();
    if (st.ok() && dev.backed()) st = load_checkpoint_weights(w.value(), params);
    if (st.ok()) *step = w.value().step();
  }
  return first_failure(comm, st);
}

}  // namespace

Status validate(const EvalOptions& o, int ranks) {
  Status s = validate(o.model, o.decoder, ranks);
  if (!s.ok()) return s;
  if (o.samples < 0) return Status::invalid_argument("--samples must be >= 0 (0 = every whole sequence of the data)");
  if (o.buckets < 1 || o.buckets > o.decoder.seq)
    return Status::invalid_argument("--buckets must be in [1, --seq]");
  if (!o.hf_model.empty() && !o.checkpoint_dir.empty())
    return Status::invalid_argument("give --hf-model or --checkpoint-dir, not both");
  if (o.window < 0) return Status::invalid_argument("--window must be >= 1 (or absent)");
  return Status::ok_status();
}

StatusOr<EvalResult> evaluate(Device& dev, Communicator& dev_comm, Communicator& comm, const DataSource& data,
                              const EvalOptions& o) {
  Status vs = validate(o, comm.size());
  if (!vs.ok()) return vs;
  // What each process sees of its data, agreed before any other collective (under mpirun every
  // process opens its own copy of the file).
  const int64_t S = o.decoder.seq;
  int64_t samples = o.samples;
  Status ds;
  if (data.vocab_size() > o.model.vocab)
    ds = Status::invalid_argument("the data's vocabulary (" + std::to_string(data.vocab_size()) +
                                  ") is larger than the model's (" + std::to_string(o.model.vocab) +
                                  "): tokenize with the model's own tokenizer");
  else if (samples == 0 && data.stream_tokens() == 0)
    ds = Status::invalid_argument("--samples is needed: data '" + std::string(data.kind()) + "' has no end");
  else if (samples == 0 && data.samples_per_pass(S) == 0)
    ds = Status::invalid_argument("the data holds " + std::to_string(data.stream_tokens()) +
                                  " tokens, fewer than one sequence of --seq " + std::to_string(S) +
                                  ": lower --seq or pass --samples (samples then wrap around the data)");
  if (ds.ok() && samples == 0) samples = data.samples_per_pass(S);
  int64_t lo = samples, hi = samples;
  comm.all_reduce(&lo, &lo, 1, DType::kI64, ReduceOp::kMin);
  comm.all_reduce(&hi, &hi, 1, DType::kI64, ReduceOp::kMax);
  if (ds.ok() && lo != hi)
    ds = Status::invalid_argument("the ranks see data files of different lengths: give every rank the same file");
  // The logits of --dump-logits: (Sp, V) floats gathered on every rank.
  const RunGeometry g = run_geometry(o.model, o.decoder, comm.size(), /*offload=*/false);
  const int64_t logit_bytes = g.Sp * g.V * 4;
  if (ds.ok() && !o.logits_path.empty() && logit_bytes > (int64_t{1} << 30))
    ds = Status::invalid_argument("--dump-logits gathers S x V floats (" + format_bytes(logit_bytes) +
                                  ") on every rank; it is for comparisons at small --seq (at most 1 GiB)");
  ds = first_failure(comm, ds);
  if (!ds.ok()) return ds;

  ShardedParams params(dev, dev_comm, parameter_descriptors(o.model), o.decoder.dtype, ShardedState::kWeightsOnly,
                       experts_parallel(o.model, o.decoder, dev_comm.size()));
  int64_t checkpoint_step = -1;
  Status ws = load_weights(o, comm, dev, params, &checkpoint_step);
  if (!ws.ok()) return ws;
  Decoder decoder(dev, dev_comm, o.model, o.decoder);
  EvalOptions resolved = o;
  resolved.samples = samples;
  auto r = evaluate_weights(dev, comm, data, resolved, params, decoder);
  if (!r.ok()) return r.status();
  EvalResult out = std::move(r).value();
  out.checkpoint_step = checkpoint_step;
  return out;
}

StatusOr<EvalResult> evaluate_weights(Device& dev, Communicator& comm, const DataSource& data, const EvalOptions& o,
                                      ShardedParams& params, Decoder& decoder) {
  UNTIED_CHECK(o.samples > 0, "evaluate_weights needs a number of samples");
  const int64_t S = o.decoder.seq, samples = o.samples;
  const RunGeometry g = run_geometry(o.model, o.decoder, comm.size(), /*offload=*/false);
  Allocator& alloc = dev.allocator();
  EvalResult r;
  const int64_t Sp = g.Sp, L = g.L, V = g.V;
  const std::vector<TokenSegment> segments = g.layout.rank_segments(comm.rank());
  const SampleShape shape{.seq = S, .padded_seq = Sp, .window = o.window, .doc_mask = o.doc_mask};

  // Buckets: B equal ranges of [0, S).
  const int64_t B = o.buckets;
  for (int64_t b = 0; b <= B; ++b) r.bucket_begin.push_back(b * S / B);
  r.by_doc_position = o.by_doc_position;
  // By document position, one more bucket [S, inf) for the tail of documents longer than S.
  const int64_t buckets = B + (o.by_doc_position ? 1 : 0);
  if (o.by_doc_position) r.bucket_begin.push_back(std::numeric_limits<int64_t>::max());
  std::vector<double> bucket_sum(static_cast<size_t>(buckets), 0.0);
  std::vector<int64_t> bucket_count(static_cast<size_t>(buckets), 0);
  // The b with bucket_begin[b] <= p < bucket_begin[b + 1].
  auto bucket_of = [&](int64_t p) {
    return static_cast<int64_t>(std::upper_bound(r.bucket_begin.begin(), r.bucket_begin.end(), p) -
                                r.bucket_begin.begin()) - 1;
  };

  std::vector<int32_t> tokens(static_cast<size_t>(L)), labels(tokens.size());
  std::vector<uint8_t> answer(tokens.size());
  std::vector<double> row_loss(tokens.size());
  std::vector<float> logits;
  double loss_sum = 0, forward_s = 0;
  int64_t count = 0, correct = 0;
  for (int64_t i = 0; i < samples; ++i) {
    SequenceMask mask = SequenceMask(S, o.window).padded_to(Sp);
    Status ds = dev.backed() ? fill_rank_sample(data, i, shape, segments, tokens.data(), labels.data(), answer.data(), &mask)
                             : Status::ok_status();
    ds = first_failure(comm, ds);
    if (!ds.ok()) return ds;
    const bool dump = i == 0 && !o.logits_path.empty();
    if (dump) logits.assign(static_cast<size_t>(L * V), 0.0f);
    comm.barrier();
    const double t0 = now_s();
    const EvalSums e = decoder.evaluate(params, tokens.data(), labels.data(), mask, row_loss.data(),
                                        dump ? logits.data() : nullptr);
    dev.synchronize();
    forward_s += now_s() - t0;
    loss_sum += e.loss_sum;
    count += e.count;
    correct += e.correct;
    // Where each position counts: its place in the window, or in its document (the starts of the
    // sample's documents, the first one's tokens before the sample).
    std::vector<int64_t> doc_starts;
    int64_t first_offset = 0;
    if (o.by_doc_position && dev.backed()) {
      auto starts = data.document_starts(i, S);
      if (!starts.ok()) return starts.status();
      doc_starts = std::move(starts).value();
      first_offset = data.first_document_offset(i, S);
    }
    const auto counted_at = [&](int64_t p) {
      if (!o.by_doc_position) return p;
      const auto it = std::upper_bound(doc_starts.begin(), doc_starts.end(), p) - 1;
      return p - *it + (it == doc_starts.begin() ? first_offset : 0);
    };
    if (dev.backed())
      for (const TokenSegment& seg : segments)
        for (int64_t k = 0; k < seg.length; ++k) {
          const int64_t row = seg.first_row + k, p = seg.first_position + k;
          if (p >= S || labels[static_cast<size_t>(row)] == kIgnoreIndex) continue;
          const auto b = static_cast<size_t>(bucket_of(counted_at(p)));
          bucket_sum[b] += row_loss[static_cast<size_t>(row)];
          bucket_count[b] += 1;
        }
    if (dump) {  // every rank's rows to rank 0, which writes them in sequence order
      std::vector<float> all(comm.rank() == 0 ? static_cast<size_t>(Sp * V) : 0);
      std::vector<float> gathered(static_cast<size_t>(L * V) * static_cast<size_t>(comm.size()));
      comm.all_gather(logits.data(), gathered.data(), L * V * 4);
      Status st;
      if (comm.rank() == 0) {
        for (int rk = 0; rk < comm.size(); ++rk)
          for (const TokenSegment& seg : g.layout.rank_segments(rk))
            std::copy_n(gathered.begin() + (static_cast<int64_t>(rk) * L + seg.first_row) * V, seg.length * V,
                        all.begin() + seg.first_position * V);
        st = write_npy(o.logits_path, {S, V}, all.data());
      }
      st = first_failure(comm, st);
      if (!st.ok()) return st;
    }
  }

  double sums[3] = {loss_sum, static_cast<double>(count), static_cast<double>(correct)};
  comm.all_reduce(sums, sums, 3, DType::kF64, ReduceOp::kSum);
  comm.all_reduce(bucket_sum.data(), bucket_sum.data(), buckets, DType::kF64, ReduceOp::kSum);
  comm.all_reduce(bucket_count.data(), bucket_count.data(), buckets, DType::kI64, ReduceOp::kSum);
  if (o.by_doc_position && bucket_count.back() == 0) {  // no document reached S: no overflow bucket
    bucket_sum.pop_back();
    bucket_count.pop_back();
    r.bucket_begin.pop_back();
  }
  comm.all_reduce(&forward_s, &forward_s, 1, DType::kF64, ReduceOp::kMax);
  r.samples = samples;
  r.tokens = static_cast<int64_t>(sums[1]);
  r.loss = r.tokens > 0 ? sums[0] / sums[1] : 0.0;
  r.perplexity = std::exp(r.loss);
  r.accuracy = r.tokens > 0 ? sums[2] / sums[1] : 0.0;
  r.seconds = forward_s;
  r.tokens_per_s = forward_s > 0 ? static_cast<double>(samples * S) / forward_s : 0.0;
  r.bucket_tokens = bucket_count;
  for (size_t b = 0; b < bucket_count.size(); ++b)
    r.bucket_loss.push_back(bucket_count[b] > 0 ? bucket_sum[b] / static_cast<double>(bucket_count[b]) : 0.0);
  r.peak = alloc.stats();
  for (auto& p : r.peak.peak) comm.all_reduce(&p, &p, 1, DType::kI64, ReduceOp::kMax);
  comm.all_reduce(&r.peak.peak_total, &r.peak.peak_total, 1, DType::kI64, ReduceOp::kMax);
  // (Every rank has the same sums: the same answer everywhere.)
  if (dev.backed() && !std::isfinite(r.loss))
    return Status::invalid_argument("the loss is not finite (NaN or Inf) although every weight is: the model "
                                    "overflows on this data (try --dtype f32, or check the model)");
  return r;
}

namespace {

// o for the needle's sequences of `length` tokens: one bucket, no logits dump.
EvalOptions at_length(const EvalOptions& o, int64_t length) {
  EvalOptions at = o;
  at.decoder.seq = length;
  at.buckets = 1;
  at.logits_path.clear();
  return at;
}

// What both needle evaluations start with: every length checked (with `check` too, when given),
// then the weights loaded.
Status start_needle(Device& dev, Communicator& comm, const EvalOptions& o, const NeedleOptions& n,
                    ShardedParams& params, const std::function<Status(int64_t length)>& check = nullptr) {
  for (const int64_t length : n.lengths) {
    if (Status vs = validate(at_length(o, length), comm.size()); !vs.ok()) return vs;
    if (Status cs = check ? check(length) : Status::ok_status(); !cs.ok()) return cs;
  }
  int64_t checkpoint_step = -1;
  return load_weights(o, comm, dev, params, &checkpoint_step);
}

}  // namespace

StatusOr<std::vector<NeedleCell>> evaluate_needle(Device& dev, Communicator& dev_comm, Communicator& comm,
                                                  const NeedleTokenizer& tok, const DataSource* haystack,
                                                  const EvalOptions& o, const NeedleOptions& n) {
  ShardedParams params(dev, dev_comm, parameter_descriptors(o.model), o.decoder.dtype, ShardedState::kWeightsOnly,
                       experts_parallel(o.model, o.decoder, dev_comm.size()));
  if (Status s = start_needle(dev, comm, o, n, params); !s.ok()) return s;
  std::vector<NeedleCell> cells;
  for (const int64_t length : n.lengths) {
    EvalOptions at = at_length(o, length);
    at.samples = 1;
    at.doc_mask = false;  // one document
    Decoder decoder(dev, dev_comm, o.model, at.decoder);
    for (const int64_t depth : n.depths) {
      auto seqs = make_needle_cell(tok, haystack, n, length, depth);
      Status cs = seqs.ok() ? Status::ok_status() : seqs.status();
      for (size_t q = 0; cs.ok() && q < seqs.value().size(); ++q)
        for (const int32_t id : seqs.value()[q].tokens)
          if (id < 0 || id >= o.model.vocab) {
            cs = Status::invalid_argument("the needle's token " + std::to_string(id) + " is outside the model's "
                                          "vocabulary (" + std::to_string(o.model.vocab) +
                                          "): give the model's own tokenizer (--tokenizer)");
            break;
          }
      cs = first_failure(comm, cs);
      if (!cs.ok()) return cs;
      NeedleCell cell{.length = length, .depth = depth, .trials = n.trials};
      double correct = 0, tokens = 0, exact = 0, loglik = 0;
      for (const NeedleSequence& s : seqs.value()) {
        const NeedleCellSource one({s}, o.model.vocab);
        auto r = evaluate_weights(dev, comm, one, at, params, decoder);
        if (!r.ok()) return r.status();
        const double t = static_cast<double>(r.value().tokens), c = r.value().accuracy * t;
        correct += c;
        tokens += t;
        exact += std::llround(c) == r.value().tokens ? 1 : 0;
        loglik += -r.value().loss * t;
      }
      cell.key_tokens = static_cast<int64_t>(tokens);
      cell.accuracy = tokens > 0 ? correct / tokens : 0;
      cell.exact = exact / static_cast<double>(n.trials);
      cell.loglik = loglik / static_cast<double>(n.trials);
      cells.push_back(cell);
    }
  }
  return cells;
}

namespace {

// The kv task's answers whose pair lies nearest to one depth of the grid: the others unlabelled.
class KvDepthSource final : public DataSource {
 public:
  KvDepthSource(const KvTask& kv, std::vector<int64_t> depths, size_t which)
      : kv_(kv), depths_(std::move(depths)), which_(which) {}
  std::string_view kind() const override { return "kv"; }
  int64_t vocab_size() const override { return kv_.vocab_size(); }
  Status fill(int64_t sample_index, int64_t seq_len, int64_t start, int64_t count, int32_t* tokens, int32_t* labels,
              uint8_t* is_answer) const override {
    std::vector<uint8_t> answer(static_cast<size_t>(count));
    if (Status s = kv_.fill(sample_index, seq_len, start, count, tokens, labels, answer.data()); !s.ok()) return s;
    auto l = kv_.layout(seq_len);
    auto depth = kv_.answer_depths(sample_index, seq_len);
    if (!l.ok()) return l.status();
    if (!depth.ok()) return depth.status();
    for (int64_t k = 0; k < count; ++k) {
      bool keep = false;
      if (answer[static_cast<size_t>(k)] != 0) {
        const int64_t i = (start + k - l.value().query_begin - 1) / 3;
        keep = nearest(100.0 * depth.value()[static_cast<size_t>(i)]) == which_;
      }
      if (!keep) labels[k] = kIgnoreIndex;
      if (is_answer != nullptr) is_answer[k] = keep ? 1 : 0;
    }
    return Status::ok_status();
  }

 private:
  size_t nearest(double percent) const {
    size_t best = 0;
    for (size_t b = 1; b < depths_.size(); ++b)
      if (std::abs(static_cast<double>(depths_[b]) - percent) < std::abs(static_cast<double>(depths_[best]) - percent))
        best = b;
    return best;
  }
  const KvTask& kv_;
  std::vector<int64_t> depths_;
  size_t which_;
};

}  // namespace

StatusOr<std::vector<NeedleCell>> evaluate_kv_needle(Device& dev, Communicator& dev_comm, Communicator& comm,
                                                     const KvTask& kv, const EvalOptions& o, const NeedleOptions& n) {
  ShardedParams params(dev, dev_comm, parameter_descriptors(o.model), o.decoder.dtype, ShardedState::kWeightsOnly,
                       experts_parallel(o.model, o.decoder, dev_comm.size()));
  if (Status s = start_needle(dev, comm, o, n, params, [&](int64_t length) { return kv.layout(length).status(); });
      !s.ok())
    return s;
  std::vector<NeedleCell> cells;
  for (const int64_t length : n.lengths) {
    EvalOptions at = at_length(o, length);
    at.samples = n.trials;
    Decoder decoder(dev, dev_comm, o.model, at.decoder);
    for (size_t b = 0; b < n.depths.size(); ++b) {
      const KvDepthSource source(kv, n.depths, b);
      auto r = evaluate_weights(dev, comm, source, at, params, decoder);
      if (!r.ok()) return r.status();
      NeedleCell cell{.length = length, .depth = n.depths[b], .trials = n.trials, .key_tokens = r.value().tokens};
      cell.accuracy = r.value().tokens > 0 ? r.value().accuracy : 0;
      cell.exact = cell.accuracy;
      cell.loglik = -r.value().loss * static_cast<double>(r.value().tokens) / static_cast<double>(n.trials);
      cells.push_back(cell);
    }
  }
  return cells;
}

LossCurve loss_curve(const EvalResult& r, const std::string& label) {
  LossCurve c;
  c.label = label;
  c.axis_end = static_cast<double>(r.bucket_begin[std::min(r.bucket_loss.size(), r.bucket_begin.size() - 1)]);
  for (size_t b = 0; b < r.bucket_loss.size(); ++b) {
    if (r.bucket_tokens[b] == 0 || r.bucket_begin[b + 1] == std::numeric_limits<int64_t>::max()) continue;
    c.position.push_back(0.5 * static_cast<double>(r.bucket_begin[b] + r.bucket_begin[b + 1]));
    c.loss.push_back(r.bucket_loss[b]);
  }
  return c;
}

std::string position_loss_svg(const std::vector<LossCurve>& curves, const std::string& title, const std::string& x_label) {
  const double W = 720, H = 420, left = 70, right = 20, top = 40, bottom = 60;
  double x_max = 1, y_min = 1e300, y_max = -1e300;
  for (const LossCurve& c : curves) x_max = std::max(x_max, c.axis_end < 1e300 ? c.axis_end : 1.0);
  for (const LossCurve& c : curves)
    for (size_t i = 0; i < c.loss.size(); ++i) {
      x_max = std::max(x_max, c.position[i]);
      y_min = std::min(y_min, c.loss[i]);
      y_max = std::max(y_max, c.loss[i]);
    }
  if (y_min > y_max) y_min = 0, y_max = 1;
  const double pad = std::max(1e-3, 0.08 * (y_max - y_min));
  y_min -= pad, y_max += pad;
  auto X = [&](double x) { return left + (W - left - right) * x / x_max; };
  auto Y = [&](double y) { return top + (H - top - bottom) * (y_max - y) / (y_max - y_min); };
  auto esc = [](const std::string& s) {
    std::string o;
    for (char ch : s) o += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
    return o;
  };
  std::string svg;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H);
  svg += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
  svg += buf + esc(title) + "</text>\n";
  // Axes, ticks and grid.
  for (int k = 0; k <= 5; ++k) {
    const double yv = y_min + (y_max - y_min) * k / 5, xv = x_max * k / 5;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n",
                  left, Y(yv), W - right, Y(yv), left - 6, Y(yv) + 4, yv);
    svg += buf;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                  X(xv), top, X(xv), H - bottom, X(xv), H - bottom + 16, xv);
    svg += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
                "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">mean next-token "
                "loss (nats)</text>\n",
                left, top, W - left - right, H - top - bottom, (left + W - right) / 2, H - 18, esc(x_label).c_str(),
                (top + H - bottom) / 2,
                (top + H - bottom) / 2);
  svg += buf;
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  for (size_t c = 0; c < curves.size(); ++c) {
    const char* color = kColors[c % 6];
    std::string points;
    for (size_t i = 0; i < curves[c].loss.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%s%.1f,%.1f", points.empty() ? "" : " ", X(curves[c].position[i]),
                    Y(curves[c].loss[i]));
      points += buf;
    }
    svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(color) + "\" points=\"" + points + "\"/>\n";
    for (size_t i = 0; i < curves[c].loss.size(); ++i) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", X(curves[c].position[i]),
                    Y(curves[c].loss[i]), color);
      svg += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%.1f\" y=\"%.1f\">",
                  W - right - 200, top + 16 + 16.0 * c, W - right - 180, top + 16 + 16.0 * c, color, W - right - 174,
                  top + 20 + 16.0 * c);
    svg += buf + esc(curves[c].label) + "</text>\n";
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace untied
