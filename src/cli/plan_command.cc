// `untied plan`: a training step's memory per rank from closed forms (memory_plan.h), before any
// job starts: the peak by tag and by moment, the host memory offload needs, the longest S that
// fits (--fit), a comparison with the rehearsal (--check), JSON (--json) and an SVG plot (--svg).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "cli/attn_runner.h"
#include "cli/commands.h"
#include "cli/fit_search.h"
#include "cli/common_flags.h"
#include "cli/launch.h"
#include "cli/train_flags.h"
#include "untied/attention/attention_block.h"
#include "untied/comm/inproc.h"
#include "untied/core/npy.h"
#include "untied/train/memory_plan.h"
#include "untied/train/time_plan.h"

namespace untied::cli {
namespace {

// The rule plan --fit and train --fit-seq share.
constexpr const char* kFitRule =
    "(a step fits when its peak of counted buffers is at most --mem-budget, with no headroom added: the budget is "
    "what untied's allocator may hold; on a GPU the CUDA context, cuBLAS workspace and NCCL buffers are outside it)";

struct PlanRun {
  TrainOptions o;
  int ranks = 1;
  bool cuda = false;  // --device cuda: the GPU's fixed costs are printed beside the plan
  std::string recompute_why;  // what --recompute auto chose and why ("" when given)
};

std::string gib(int64_t b) {
  char s[32];
  const double g = static_cast<double>(b) / (1 << 30);
  std::snprintf(s, sizeof s, g >= 10 ? "%.0f" : "%.1f", g);
  return s;
}

std::string header(const PlanRun& p) {
  const AttentionConfig ac = attention_config(p.o.model, p.o.decoder);
  const int64_t U = stage_heads_of(ac, p.ranks);
  std::ostringstream s;
  s << p.o.model.name << ", " << p.o.model.layers << " layers | " << strategy_name(p.o.decoder.strategy)
    << ring_note(ac, p.ranks) << " U=" << U << " on " << p.ranks << " ranks | S=" << p.o.decoder.seq << " | "
    << dtype_name(p.o.decoder.dtype);
  if (p.o.offload_inputs)
    s << " | " << offloaded_inputs(p.o.model, p.o.decoder) << " of " << p.o.model.layers << " inputs offloaded";
  if (p.o.decoder.recompute == Recompute::kSelective)
    s << " | selective recompute (attention outputs kept)";
  else if (p.o.decoder.strategy == Strategy::kUPipe && validate_plan(p.o, p.ranks).ok())
    s << " | last stage " << (plan_memory(p.o, p.ranks).keeps_last_stage ? "kept" : "recomputed") << " for the backward";
  return s.str();
}

// The offload pattern that fits the host budget at S: as many blocks' inputs offloaded as the
// node's share per rank holds beside what else a block keeps there (host_memory: dhm, the kept
// gradients, the saved attention output), the first ones kept on the device; all without a budget.
void fit_offload(TrainOptions& o, int ranks) {
  if (!o.offload_inputs) return;
  o.decoder.offload_every = 1;
  o.decoder.offload_keep_first = 0;
  if (o.host_budget_bytes <= 0) return;
  const RunGeometry g = run_geometry(o, ranks);
  const int64_t one = g.L * g.E * g.es;
  const int64_t share = o.host_budget_bytes / o.ranks_per_node - host_memory(g).beside_inputs();
  o.decoder.offload_keep_first = std::clamp<int64_t>(o.model.layers - std::max<int64_t>(share, 0) / one, 0, o.model.layers);
}

// The host-memory options to try (DecoderOptions::grads_on_host, dh_on_host, attn_out_on_host):
// under a host budget, each that is on also off (the host memory it takes can hold block inputs
// instead); the given ones otherwise.
std::vector<DecoderOptions> host_option_sets(const TrainOptions& o) {
  std::vector<DecoderOptions> out = {o.decoder};
  if (!o.offload_inputs || o.host_budget_bytes <= 0) return out;
  for (bool DecoderOptions::*f : {&DecoderOptions::grads_on_host, &DecoderOptions::dh_on_host,
                                  &DecoderOptions::attn_out_on_host}) {
    if (!(o.decoder.*f)) continue;
    const size_t n = out.size();
    for (size_t i = 0; i < n; ++i) {
      out.push_back(out[i]);
      out.back().*f = false;
    }
  }
  return out;
}

// The flags that give a fit's host-memory options, where they are not the defaults.
std::string host_option_flags(const DecoderOptions& d) {
  std::string s;
  if (!d.grads_on_host) s += " --no-grads-on-host";
  if (!d.dh_on_host) s += " --no-dh-on-host";
  if (!d.attn_out_on_host) s += " --no-attn-out-on-host";
  return s;
}

bool plan_fits(const TrainOptions& o, int ranks) {
  return validate_plan(o, ranks).ok() && plan_memory(o, ranks).peak_total() <= o.budget_bytes;
}

// The stage sizes to try for upipe: every U whose schedule exists; the given one otherwise.
std::vector<int64_t> stage_sizes(const TrainOptions& o, int ranks) {
  if (o.decoder.strategy != Strategy::kUPipe) return {o.decoder.upipe_heads};
  std::vector<int64_t> out;
  for (int64_t U = 1; U <= o.model.heads; ++U) {
    TrainOptions t = o;
    t.decoder.upipe_heads = U;
    if (validate_plan(t, ranks).ok()) out.push_back(U);
  }
  return out;
}

// The longest S (a multiple of ranks * 1024) that fits o.budget_bytes, over the stage sizes and
// the offload pattern the host budget allows; false when not even the first does. With
// --recompute auto, at each S selective where it fits (its own offload pattern), else full.
bool fit(const PlanRun& in, PlanRun* best) {
  const int64_t grain = static_cast<int64_t>(in.ranks) * 1024;
  const bool automatic = in.o.decoder.recompute == Recompute::kAuto;
  const std::vector<Recompute> tries =
      automatic ? std::vector<Recompute>{Recompute::kSelective, Recompute::kFull} : std::vector{in.o.decoder.recompute};
  TrainOptions base = in.o;
  base.decoder.recompute = tries.back();  // (what the stage sizes are checked with)
  bool any = false;
  for (const DecoderOptions& host_set : host_option_sets(base))
    for (int64_t U : stage_sizes(base, in.ranks)) {
      TrainOptions o = base;
      o.decoder = host_set;
      o.decoder.upipe_heads = U;
      auto fits_at = [&](int64_t k) {
        o.decoder.seq = k * grain;
        for (Recompute r : tries) {
          o.decoder.recompute = r;
          if (!validate(o.model, o.decoder, in.ranks).ok()) return false;  // (why_nothing_fits says why)
          fit_offload(o, in.ranks);
          if (plan_fits(o, in.ranks)) return true;
        }
        return false;
      };
      const int64_t lo = largest_fitting(fits_at);
      if (lo == 0) continue;
      fits_at(lo);  // o at the answer (the search's last call may have been past it)
      if (!any || o.decoder.seq > best->o.decoder.seq) {
        *best = PlanRun{o, in.ranks, in.cuda, ""};
        if (automatic)
          best->recompute_why = o.decoder.recompute == Recompute::kSelective
                                    ? "selective (auto: it fits at this S)"
                                    : "full (auto: selective does not fit at this S)";
      }
      any = true;
    }
  return any;
}

// A time in the unit that reads best: "812.4 ms", "41.2 s", "12.5 min", "5.77 h".
std::string readable_time(double ms) {
  char b[32];
  if (ms < 1e4) std::snprintf(b, sizeof b, "%.1f ms", ms);
  else if (ms < 600e3) std::snprintf(b, sizeof b, "%.1f s", ms / 1e3);
  else if (ms < 7200e3) std::snprintf(b, sizeof b, "%.1f min", ms / 60e3);
  else std::snprintf(b, sizeof b, "%.2f h", ms / 3600e3);
  return b;
}

// Why --fit found nothing: the step at the shortest S tried, planned, what its peak holds, and what
// would shrink it.
std::string why_nothing_fits(const PlanRun& p) {
  TrainOptions o = p.o;
  o.decoder.seq = int64_t{p.ranks} * 1024;
  if (o.decoder.recompute == Recompute::kAuto) o.decoder.recompute = Recompute::kFull;
  if (const Status v = validate(o.model, o.decoder, p.ranks); !v.ok()) return "no S runs: " + v.message() + "\n";
  fit_offload(o, p.ranks);
  std::ostringstream s;
  s << "not even S = " << o.decoder.seq << " fits in " << format_bytes(o.budget_bytes) << " per rank";
  if (const Status v = validate_plan(o, p.ranks); !v.ok()) return s.str() + ": " + v.message() + "\n";
  const MemoryPlan plan = plan_memory(o, p.ranks);
  const std::array<int64_t, kNumTags> tags = plan.moments[plan.peak].by_tag();
  const int64_t state = tags[static_cast<int>(Tag::kParameters)] + tags[static_cast<int>(Tag::kGradients)] +
                        tags[static_cast<int>(Tag::kOptimizer)];
  s << ": there the step's peak is " << format_bytes(plan.peak_total()) << " (at the "
    << plan.moments[plan.peak].name << "), of which the sharded weights, gradients and AdamW state and the gathered "
    << "group take " << format_bytes(state) << " and activations and workspaces the rest.\nTo fit:";
  s << " more ranks (--ranks " << 2 * p.ranks << " halves the sharded state per rank)";
  if (o.decoder.dtype == DType::kF32) s << "; --dtype bf16 (halves the gathered weights and every activation)";
  if (!o.offload_inputs) s << "; --offload-inputs (each block's saved input in host memory)";
  s << "; or a larger --mem-budget.\n";
  return s.str();
}

void print_time(const PlanRun& p, const DeviceRates& rates) {
  const std::vector<PhaseWork> phases = plan_time(p.o, p.ranks, rates);
  std::printf("work per rank for one sequence, and its time at %s, nothing overlapped:\n", rates.source.c_str());
  std::printf("  %-10s %14s %16s %12s %12s %10s\n", "phase", "GEMM TFLOP", "attention TFLOP", "GB sent", "ms", "time");
  double total = 0;
  for (const PhaseWork& w : phases) {
    std::printf("  %-10s %14.2f %16.2f %12.2f %12.1f %10s\n", w.name.c_str(), w.gemm_flops / 1e12,
                w.attention_flops / 1e12, w.bytes_sent / 1e9, w.ms, readable_time(w.ms).c_str());
    total += w.ms;
  }
  std::printf("  %-10s %14s %16s %12s %12.1f %10s\n", "step", "", "", "", total, readable_time(total).c_str());
  if (p.o.decoder.strategy != Strategy::kUPipe) return;
  // UPipe against Ulysses on the same step: the work its backward adds (block_work.h), which
  // bounds how close its time can come to Ulysses' where compute is the time.
  TrainOptions uly = p.o;
  uly.decoder.strategy = Strategy::kUlysses;
  if (!validate(uly, p.ranks).ok()) return;
  double flops[2] = {0, 0}, ms[2] = {0, 0};
  for (int i = 0; i < 2; ++i)
    for (const PhaseWork& w : plan_time(i == 0 ? p.o : uly, p.ranks, rates)) {
      flops[i] += w.gemm_flops + w.attention_flops;
      ms[i] += w.ms;
    }
  const char* why = p.o.decoder.recompute == Recompute::kSelective
                        ? "selective recompute: upipe's backward projects the q, k and v that ulysses' recompute does"
                    : p.o.decoder.keep_last_stage == KeepLastStage::kOn
                        ? "the backward's second q/k/v projection, last stage kept"
                        : "the backward's second q/k/v projection";
  std::printf("  upipe over ulysses on this step: work %.4f, time %.4f at these rates (%s)\n", flops[0] / flops[1],
              ms[0] / ms[1], why);
}

void print_plan(const PlanRun& p, const MemoryPlan& plan) {
  std::printf("one training step, planned | %s\n", header(p).c_str());
  if (!p.recompute_why.empty()) std::printf("recompute: %s\n", p.recompute_why.c_str());
  if (const ModelConfig& m = p.o.model; m.experts > 0) {
    const bool ep = experts_parallel(m, p.o.decoder, p.ranks);
    std::printf("mixture of experts: %lld experts, %lld a token; %s; routing planned balanced",
                (long long)m.experts, (long long)m.experts_per_token,
                ep ? str_cat(m.experts / p.ranks, " experts per rank (expert parallelism)").c_str()
                   : "every expert on every rank (no expert parallelism)");
    if (ep) std::printf(", each rank's experts receiving %g times their share (--moe-skew)", p.o.decoder.moe_skew);
    std::printf("\n");
  }
  const PlanMoment& peak = plan.moments[plan.peak];
  std::printf("peak per rank: %s at the %s", format_bytes(plan.peak_total()).c_str(), peak.name.c_str());
  if (p.o.budget_bytes > 0)
    std::printf(" (--mem-budget %s: %s)", format_bytes(p.o.budget_bytes).c_str(),
                plan.peak_total() <= p.o.budget_bytes ? "fits" : "does not fit");
  std::printf("\n");
  if (p.o.budget_bytes > 0) std::printf("%s\n", kFitRule);
  const auto tags = peak.by_tag();
  for (int t = 0; t < kNumTags; ++t)
    std::printf("  %-16s %14s\n", std::string(tag_name(static_cast<Tag>(t))).c_str(), format_bytes(tags[t]).c_str());
  std::printf("moments:\n");
  for (const PlanMoment& m : plan.moments) std::printf("  %-36s %14s\n", m.name.c_str(), format_bytes(m.total()).c_str());
  std::printf("at the peak, largest first:\n");
  std::vector<PlanItem> items = peak.items;
  std::stable_sort(items.begin(), items.end(), [](const PlanItem& a, const PlanItem& b) { return a.bytes > b.bytes; });
  for (const PlanItem& i : items)
    if (i.bytes > 0)
      std::printf("  %-52s %-15s %12s\n", i.what.c_str(), std::string(tag_name(i.tag)).c_str(),
                  format_bytes(i.bytes).c_str());
  if (p.cuda) {
    const int comms = ring_degree(attention_config(p.o.model, p.o.decoder), p.ranks) > 1 ? 3 : 1;
    int64_t fixed = 0;
    std::printf("a GPU's fixed costs, outside --mem-budget (assumed, not measured: memory_plan.h gives the sources):\n");
    for (const PlanItem& i : assumed_cuda_fixed_costs(comms)) {
      std::printf("  %-52s %12s\n", i.what.c_str(), format_bytes(i.bytes).c_str());
      fixed += i.bytes;
    }
    std::printf("  %-52s %12s: give --mem-budget the GPU's memory less this\n", "total", format_bytes(fixed).c_str());
  }
  if (p.o.offload_inputs) {
    std::printf("host: %s per rank, %s per node of %d ranks", format_bytes(plan.host_per_rank).c_str(),
                format_bytes(plan.host_per_rank * p.o.ranks_per_node).c_str(), p.o.ranks_per_node);
    if (p.o.host_budget_bytes > 0)
      std::printf(" (--host-budget %s: %s)", format_bytes(p.o.host_budget_bytes).c_str(),
                  plan.host_per_rank * p.o.ranks_per_node <= p.o.host_budget_bytes ? "fits" : "does not fit");
    std::printf("\n");
  }
}

nlohmann::json plan_json(const PlanRun& p, const MemoryPlan& plan, const DeviceRates& rates) {
  nlohmann::json j;
  for (const PhaseWork& w : plan_time(p.o, p.ranks, rates))
    j["phases"].push_back({{"name", w.name}, {"gemm_flops", w.gemm_flops}, {"attention_flops", w.attention_flops},
                           {"bytes_sent", w.bytes_sent}, {"ms", w.ms}});
  j["rates"] = {{"gemm_flops", rates.gemm_flops}, {"attention_flops", rates.attention_flops},
                {"link_bytes", rates.link_bytes}, {"source", rates.source}};
  const AttentionConfig ac = attention_config(p.o.model, p.o.decoder);
  j["model"] = p.o.model.name;
  j["layers"] = p.o.model.layers;
  j["strategy"] = std::string(strategy_name(p.o.decoder.strategy));
  j["ranks"] = p.ranks;
  j["ring"] = ring_degree(ac, p.ranks);
  j["upipe_heads"] = stage_heads_of(ac, p.ranks);
  j["seq"] = p.o.decoder.seq;
  j["tokens_per_rank"] = plan.rows;
  j["dtype"] = std::string(dtype_name(p.o.decoder.dtype));
  j["recompute"] = p.o.decoder.recompute == Recompute::kSelective ? "selective" : "full";
  j["offloaded_inputs"] = p.o.offload_inputs ? offloaded_inputs(p.o.model, p.o.decoder) : 0;
  j["keep_inputs"] = p.o.decoder.offload_keep_first;
  j["grads_on_host"] = p.o.decoder.grads_on_host;
  j["dh_on_host"] = p.o.decoder.dh_on_host;
  j["attn_out_on_host"] = p.o.decoder.attn_out_on_host;
  j["offload_every"] = p.o.decoder.offload_every;
  j["peak_bytes"] = plan.peak_total();
  j["peak_moment"] = plan.moments[plan.peak].name;
  j["host_bytes_per_rank"] = plan.host_per_rank;
  j["ranks_per_node"] = p.o.ranks_per_node;
  j["budget_bytes"] = p.o.budget_bytes;
  j["host_budget_bytes"] = p.o.host_budget_bytes;
  for (const PlanMoment& m : plan.moments) {
    nlohmann::json jm;
    jm["name"] = m.name;
    jm["total_bytes"] = m.total();
    const auto tags = m.by_tag();
    for (int t = 0; t < kNumTags; ++t) jm["by_tag"][std::string(tag_name(static_cast<Tag>(t)))] = tags[t];
    for (const PlanItem& i : m.items)
      jm["items"].push_back({{"what", i.what}, {"tag", std::string(tag_name(i.tag))}, {"bytes", i.bytes}});
    j["moments"].push_back(jm);
  }
  return j;
}

// The plan against a rehearsal of the same step: the total and each tag at the total peak.
int check(const PlanRun& p, const MemoryPlan& plan, const DataSource& data) {
  TrainOptions r = p.o;
  r.rehearsal = true, r.steps = 1, r.warmup = 0, r.progress = false, r.budget_bytes = 0;
  MemoryStats peak;
  int64_t host = 0;
  std::vector<LiveBuffers> live;
  if (!rehearse_fits(r, data, p.ranks, p.o.decoder.seq, &peak, &host, &live)) {
    std::fprintf(stderr, "untied plan: the rehearsal did not run\n");
    return 1;
  }
  const int64_t planned = plan.peak_total(), rehearsed = peak.peak_total;
  const double err = 100.0 * static_cast<double>(planned - rehearsed) / static_cast<double>(rehearsed);
  const double host_err =
      host > 0 ? 100.0 * static_cast<double>(plan.host_per_rank - host) / static_cast<double>(host) : 0.0;
  std::printf("check against the rehearsal: planned %s, rehearsed %s, error %+.2f%% (host %+.2f%%)\n",
              format_bytes(planned).c_str(), format_bytes(rehearsed).c_str(), err, host_err);
  const auto tags = plan.moments[plan.peak].by_tag();
  for (int t = 0; t < kNumTags; ++t)
    std::printf("  %-16s planned %12s  rehearsed at its peak %12s\n", std::string(tag_name(static_cast<Tag>(t))).c_str(),
                format_bytes(tags[t]).c_str(), format_bytes(peak.at_total_peak[t]).c_str());
  const bool ok = std::fabs(err) <= 2.0 && std::fabs(host_err) <= 2.0;
  if (!ok) std::printf("the plan is off by more than 2%%\n");
  return ok ? 0 : 1;
}

// peak by tag against S for each strategy, stacked, one panel per strategy (SVG).
std::string svg(const PlanRun& base, const std::vector<Strategy>& strategies) {
  const int W = 420, Hh = 300, ml = 60, mb = 40, mt = 30;
  const int64_t grain = static_cast<int64_t>(base.ranks) * 1024;
  int64_t s_max = std::max<int64_t>(base.o.decoder.seq, grain);
  double y_max = 0;
  struct Series {
    Strategy st;
    std::vector<std::pair<int64_t, std::array<int64_t, kNumTags>>> pts;
  };
  std::vector<Series> all;
  for (Strategy st : strategies) {
    Series se{st, {}};
    for (int k = 1; k <= 24; ++k) {
      TrainOptions o = base.o;
      o.decoder.strategy = st;
      o.decoder.upipe_heads = st == Strategy::kUPipe ? base.o.decoder.upipe_heads : 0;
      o.decoder.seq = std::max<int64_t>(grain, s_max * k / 24 / grain * grain);
      if (!validate_plan(o, base.ranks).ok()) continue;
      const MemoryPlan pl = plan_memory(o, base.ranks);
      se.pts.push_back({o.decoder.seq, pl.moments[pl.peak].by_tag()});
      y_max = std::max(y_max, static_cast<double>(pl.peak_total()));
    }
    all.push_back(se);
  }
  if (base.o.budget_bytes > 0) y_max = std::max(y_max, static_cast<double>(base.o.budget_bytes));
  y_max *= 1.05;
  const char* colors[kNumTags] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1"};
  std::ostringstream s;
  const int total_w = W * static_cast<int>(all.size());
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << total_w << "\" height=\"" << Hh + 40
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t pi = 0; pi < all.size(); ++pi) {
    const int x0 = static_cast<int>(pi) * W;
    const double pw = W - ml - 20, ph = Hh - mb - mt;
    auto X = [&](int64_t S) { return x0 + ml + pw * static_cast<double>(S) / static_cast<double>(s_max); };
    auto Y = [&](double b) { return mt + ph - ph * b / y_max; };
    s << "<text x=\"" << x0 + ml << "\" y=\"18\" font-size=\"13\">" << strategy_name(all[pi].st) << ", "
      << base.o.model.name << " on " << base.ranks << " ranks, " << dtype_name(base.o.decoder.dtype) << "</text>\n";
    // Stacked areas, tag by tag.
    std::vector<double> below(all[pi].pts.size(), 0.0);
    for (int t = 0; t < kNumTags; ++t) {
      std::ostringstream poly;
      for (size_t i = 0; i < all[pi].pts.size(); ++i)
        poly << X(all[pi].pts[i].first) << "," << Y(below[i] + static_cast<double>(all[pi].pts[i].second[t])) << " ";
      for (size_t i = all[pi].pts.size(); i-- > 0;) poly << X(all[pi].pts[i].first) << "," << Y(below[i]) << " ";
      for (size_t i = 0; i < all[pi].pts.size(); ++i) below[i] += static_cast<double>(all[pi].pts[i].second[t]);
      s << "<polygon points=\"" << poly.str() << "\" fill=\"" << colors[t] << "\" stroke=\"none\"/>\n";
    }
    s << "<line x1=\"" << x0 + ml << "\" y1=\"" << mt + ph << "\" x2=\"" << x0 + ml + pw << "\" y2=\"" << mt + ph
      << "\" stroke=\"black\"/>\n<line x1=\"" << x0 + ml << "\" y1=\"" << mt << "\" x2=\"" << x0 + ml << "\" y2=\""
      << mt + ph << "\" stroke=\"black\"/>\n";
    for (int k = 0; k <= 4; ++k) {
      const double b = y_max * k / 4, S = static_cast<double>(s_max) * k / 4;
      s << "<text x=\"" << x0 + ml - 4 << "\" y=\"" << Y(b) + 4 << "\" text-anchor=\"end\">" << gib(static_cast<int64_t>(b))
        << "</text>\n<text x=\"" << X(static_cast<int64_t>(S)) << "\" y=\"" << mt + ph + 14
        << "\" text-anchor=\"middle\">" << std::round(S / 1e5) / 10 << "M</text>\n";
    }
    s << "<text x=\"" << x0 + ml + pw / 2 << "\" y=\"" << mt + ph + 30 << "\" text-anchor=\"middle\">S (tokens)</text>\n";
    s << "<text x=\"" << x0 + 12 << "\" y=\"" << mt + ph / 2 << "\" transform=\"rotate(-90 " << x0 + 12 << " "
      << mt + ph / 2 << ")\" text-anchor=\"middle\">peak per rank (GiB)</text>\n";
    if (base.o.budget_bytes > 0)
      s << "<line x1=\"" << x0 + ml << "\" y1=\"" << Y(static_cast<double>(base.o.budget_bytes)) << "\" x2=\""
        << x0 + ml + pw << "\" y2=\"" << Y(static_cast<double>(base.o.budget_bytes))
        << "\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n";
  }
  for (int t = 0; t < kNumTags; ++t)
    s << "<rect x=\"" << ml + t * 110 << "\" y=\"" << Hh + 14 << "\" width=\"10\" height=\"10\" fill=\"" << colors[t]
      << "\"/><text x=\"" << ml + t * 110 + 14 << "\" y=\"" << Hh + 23 << "\">" << tag_name(static_cast<Tag>(t))
      << "</text>\n";
  s << "</svg>\n";
  return s.str();
}

// ---- plan --paper: the paper's memory tables, planned, beside its numbers ----

struct PaperRow {
  const char* setting;  // "Llama3-8B, 8 x 80 GiB"
  const char* preset;
  int ranks;
  Strategy strategy;
  int64_t ring;
  const char* name;   // the paper's name for the strategy
  const char* paper;  // the paper's longest S
};

const PaperRow kPaperRows[] = {
    {"Llama3-8B, 8 x 80 GiB", "llama3-8b", 8, Strategy::kUlysses, 1, "Ulysses", "3M"},
    {"Llama3-8B, 8 x 80 GiB", "llama3-8b", 8, Strategy::kRing, 1, "Ring", "3M"},
    {"Llama3-8B, 8 x 80 GiB", "llama3-8b", 8, Strategy::kUPipe, 1, "UPipe", "5M"},
    {"Llama3-8B, 16 x 80 GiB (8u2r)", "llama3-8b", 16, Strategy::kUlysses, 2, "USP-hybrid", "6M"},
    {"Llama3-8B, 16 x 80 GiB (8u2r)", "llama3-8b", 16, Strategy::kUPipe, 2, "UPipe", "8M"},
    {"Qwen3-32B, 16 x 80 GiB", "qwen3-32b", 16, Strategy::kUlysses, 1, "Ulysses", "2M"},
    {"Qwen3-32B, 16 x 80 GiB", "qwen3-32b", 16, Strategy::kUPipe, 1, "UPipe", "4M"},
};

std::string millions(int64_t S) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2fM", static_cast<double>(S) / 1e6);
  return b;
}

// The attention block of `cfg` on `ranks` in-process ranks against local on one, at cfg.seq, f32:
// the largest |difference| over y, dx and the weight gradients, relative to the largest |local|
// value of each (the inputs are the same global tensors for any rank count: attn_runner.h).
double compare_to_local(AttentionConfig cfg, int ranks, const std::string& dir) {
  cfg.dtype = DType::kF32;
  auto run = [&](const AttentionConfig& c, int n, const std::string& out) {
    std::filesystem::create_directories(out);
    run_in_process(n, [&](Communicator& world) {
      run_attention(world, c, AttnRunOptions{.threads = 1, .dump_dir = out, .warmup = 0});
    });
  };
  AttentionConfig local = cfg;
  local.strategy = Strategy::kLocal, local.ring = 1, local.upipe_heads = 0, local.overlap = false;
  run(local, 1, dir + "/local");
  run(cfg, ranks, dir + "/parallel");
  double worst = 0;
  for (const char* f : {"y.npy", "dx.npy", "dwq.npy", "dwk.npy", "dwv.npy", "dwo.npy"}) {
    std::vector<int64_t> sa, sb;
    std::vector<float> a, b;
    UNTIED_CHECK(read_npy(dir + "/parallel/" + f, &sa, &a).ok() && read_npy(dir + "/local/" + f, &sb, &b).ok() &&
                     a.size() == b.size(),
                 "plan --paper: the check's ", f, " did not come back");
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

int paper(const FlagSet& flags, int64_t budget, int64_t host_budget, bool check) {
  std::printf("The paper's longest sequences (arXiv 2602.21196), planned by untied: bf16, %s per GPU, every block's\n"
              "input offloaded to the host%s, the real vocabularies; the paper's runs are on H100s.\n\n",
              format_bytes(budget).c_str(),
              host_budget > 0 ? (" (--host-budget " + format_bytes(host_budget) + " per node of 8)").c_str() : "");
  std::printf("| setting | strategy | untied plan: longest S | U | host per node | paper |\n|---|---|---|---|---|---|\n");
  const std::string tmp = (std::filesystem::temp_directory_path() / ("untied_plan_paper_" + std::to_string(::getpid()))).string();
  std::vector<std::pair<std::string, double>> checks;
  for (const PaperRow& row : kPaperRows) {
    PlanRun p;
    p.ranks = row.ranks;
    auto m = model_preset(row.preset);
    UNTIED_CHECK(m.ok(), m.status().message());
    p.o.model = m.value();
    p.o.decoder = DecoderOptions{.seq = p.ranks * 1024LL, .strategy = row.strategy, .ring = row.ring, .dtype = DType::kBF16};
    p.o.offload_inputs = true;
    p.o.budget_bytes = budget;
    p.o.host_budget_bytes = host_budget;
    p.o.ranks_per_node = std::min(p.ranks, 8);
    PlanRun best;
    const bool ok = fit(p, &best);
    const MemoryPlan plan = ok ? plan_memory(best.o, best.ranks) : MemoryPlan{};
    std::printf("| %s | %s | %s | %lld | %s | %s |\n", row.setting, row.name,
                ok ? millions(best.o.decoder.seq).c_str() : "none fits",
                ok ? (long long)stage_heads_of(attention_config(best.o.model, best.o.decoder), best.ranks) : 0LL,
                ok ? format_bytes(plan.host_per_rank * best.o.ranks_per_node).c_str() : "-", row.paper);
    if (check) {
      // The strategy's attention block at a small S, against local: the model's heads (H, G, D),
      // the row's ranks, ring and U, a narrow hidden size (what the exchanges and stages move
      // does not depend on E), and no q/k norms or biases (the attention runner has none).
      AttentionConfig c = attention_config(p.o.model, p.o.decoder);
      c.seq = 4LL * p.ranks * 8;
      c.hidden = 256;
      c.qk_norm = false;
      c.qkv_bias = false;
      const std::string label = std::string(row.name) + " on " + std::to_string(row.ranks) + " ranks (" + row.preset + ")";
      checks.push_back({label, compare_to_local(padded_config(c, p.ranks), p.ranks, tmp + "/" + std::to_string(checks.size()))});
    }
  }
  std::filesystem::remove_all(tmp);
  (void)flags;
  if (!check) return 0;
  std::printf("\ncorrectness: each strategy's attention block with the model's heads (E 256, no q/k norms), S = 32 x ranks, "
              "f32, against local on one rank (y, dx and the weight gradients; max |difference| / max |local|):\n");
  bool all = true;
  for (const auto& [label, err] : checks) {
    const bool ok = err <= 1e-4;
    all = all && ok;
    std::printf("  %-40s %.2e  %s\n", label.c_str(), err, ok ? "ok" : "WRONG");
  }
  return all ? 0 : 1;
}

}  // namespace

int plan_main(int*, char***, const std::vector<std::string>& args) {
  FlagSet flags("untied plan",
                "Plans one training step's memory per rank from closed forms, before any job starts: the peak by\n"
                "tag and by moment, and the host memory offload needs. It takes train's flags; --ranks is the\n"
                "job's number of ranks.");
  add_train_flags(flags);
  flags.add_int("ranks-per-node", "0", "ranks per node, for --host-budget (0 = min(--ranks, 8))", {0, 1024});
  flags.add("fit", FlagKind::kBool, "false",
            "with --mem-budget: the longest S that fits, over upipe's stage sizes and the offload pattern "
            "--host-budget allows");
  flags.add("check", FlagKind::kBool, "false", "rehearse the same step and print the plan's error (exit 1 over 2%)");
  flags.add("json", FlagKind::kBool, "false", "print the plan as JSON");
  flags.add("svg", FlagKind::kString, "", "write a plot of the peak by tag against S, for ulysses, upipe and ring, here");
  flags.add_number("gemm-tflops", "", "GEMM TFLOP/s a rank achieves, for the phase times (default: an H100's, assumed)",
                   positive_number());
  flags.add_number("attn-tflops", "", "flash attention TFLOP/s a rank achieves (default: an H100's, assumed)",
                   positive_number());
  flags.add_number("link-gbps", "", "GB/s a rank sends in collectives (default: NVLink 4's, assumed)", positive_number());
  flags.add("paper", FlagKind::kBool, "false",
            "the paper's tables: the longest S of each of its settings and strategies at --mem-budget (default 80G), "
            "beside its numbers, and each strategy's attention block checked against local at a small S");
  flags.add("paper-check", FlagKind::kBool, "true", "with --paper: run the correctness checks (--no-paper-check: the table only)");
  if (auto exit = parse_command_line(flags, args, /*root=*/true)) return *exit;
  auto refuse = [&](const Status& s) { return cli::refuse(flags, s); };
  Status st;
  if (launch_info().launched) return refuse(Status::invalid_argument("plan runs in one process: drop mpirun, pass --ranks"));
  for (const char* f : {"rehearsal", "fit-seq", "checkpoint-dir", "resume", "resume-from", "metrics"})
    if (flags.was_set(f))
      return refuse(Status::invalid_argument(std::string("plan takes no --") + f +
                                             (std::string(f) == "rehearsal" || std::string(f) == "fit-seq"
                                                  ? " (--check compares with a rehearsal, --fit finds the longest S)"
                                                  : "")));
  if (flags.get_bool("paper"))
    return paper(flags, flags.get_bytes("mem-budget") > 0 ? flags.get_bytes("mem-budget") : int64_t{80} << 30,
                 flags.get_bytes("host-budget"), flags.get_bool("paper-check"));
  PlanRun p;
  p.ranks = static_cast<int>(flags.get_int("ranks"));  // (in kRanksRange: the flag's range)
  const int64_t per_node = flags.get_int("ranks-per-node");
  DataOptions dopts;
  DeviceChoice device = DeviceChoice::kCpu;
  st = options_from_flags(flags, p.ranks, &p.o, &dopts, &device);
  if (!st.ok()) return refuse(st);
  p.cuda = device == DeviceChoice::kCuda;
  p.o.ranks_per_node = per_node > 0 ? static_cast<int>(per_node) : std::min(p.ranks, 8);
  auto data = make_data_source(flags.get_string("data"), flags.get_string("data-path"), dopts);
  if (!data.ok()) return refuse(data.status());
  if (flags.get_int("vocab") == 0 && p.o.hf_model.empty() && !preset_keeps_vocabulary(p.o.model.name))
    p.o.model.vocab = data.value()->vocab_size();
  if (flags.get_bool("fit")) {
    if (p.o.budget_bytes <= 0) return refuse(Status::invalid_argument("--fit needs --mem-budget"));
    if (flags.get_bool("check") && flags.get_bool("json"))
      return refuse(Status::invalid_argument("--check prints text: drop --json"));
    PlanRun best;
    TrainOptions given = p.o;
    if (given.decoder.recompute == Recompute::kAuto) given.decoder.recompute = Recompute::kFull;
    Status vs = validate_plan(given, p.ranks);
    // The length given does not matter to --fit, only whether the rest is covered.
    if (!vs.ok() && vs.message().find("plan ") == 0) return refuse(vs);
    if (!fit(p, &best)) {
      std::fprintf(stderr, "untied plan: %s", why_nothing_fits(p).c_str());
      return 1;
    }
    p = best;
    if (!flags.get_bool("json"))
      std::printf("longest sequence that fits %s per rank: S = %lld, U = %lld, %s\n", format_bytes(p.o.budget_bytes).c_str(),
                  (long long)p.o.decoder.seq, (long long)stage_heads_of(attention_config(p.o.model, p.o.decoder), p.ranks),
                  p.o.offload_inputs ? ("--keep-inputs " + std::to_string(p.o.decoder.offload_keep_first) +
                                        host_option_flags(p.o.decoder)).c_str()
                                     : "no offload");
  }
  // Every auto resolved (the recompute chosen by --fit stays), checked first as a full recompute
  // against what the closed forms cover, so that such a refusal is reported as itself.
  TrainOptions full = p.o;
  if (full.decoder.recompute == Recompute::kAuto) full.decoder.recompute = Recompute::kFull;
  st = validate_plan(full, p.ranks);
  if (!st.ok()) return refuse(st);
  auto run = resolve_run(p.o, p.ranks, MachineMemory{});
  if (!run.ok()) return refuse(run.status());
  p.o = run.value().o;
  if (p.recompute_why.empty()) p.recompute_why = run.value().recompute_why;
  st = validate_plan(p.o, p.ranks);
  if (!st.ok()) return refuse(st);
  DeviceRates rates = assumed_h100_rates();
  bool given = false;
  for (auto [flag, dst, unit] : {std::tuple{"gemm-tflops", &rates.gemm_flops, 1e12},
                                 {"attn-tflops", &rates.attention_flops, 1e12}, {"link-gbps", &rates.link_bytes, 1e9}}) {
    if (flags.get_string(flag).empty()) continue;  // not given
    *dst = flags.get_number(flag) * unit;
    given = true;
  }
  if (given) {
    char b[160];
    std::snprintf(b, sizeof b, "GEMM %.3g TFLOP/s, attention %.3g TFLOP/s, links %.3g GB/s", rates.gemm_flops / 1e12,
                  rates.attention_flops / 1e12, rates.link_bytes / 1e9);
    rates.source = b;
  }
  const MemoryPlan plan = plan_memory(p.o, p.ranks);
  if (flags.get_bool("json")) {
    std::printf("%s\n", plan_json(p, plan, rates).dump(2).c_str());
  } else {
    print_plan(p, plan);
    print_time(p, rates);
  }
  if (!flags.get_string("svg").empty()) {
    std::vector<Strategy> strategies = {Strategy::kUlysses, Strategy::kUPipe};
    if (p.o.decoder.ring == 1) strategies.push_back(Strategy::kRing);
    std::ofstream out(flags.get_string("svg"));
    out << svg(p, strategies);
    if (!out) return refuse(Status::invalid_argument("--svg: cannot write " + flags.get_string("svg")));
  }
  if (flags.get_bool("check")) return check(p, plan, *data.value());
  return 0;
}

}  // namespace untied::cli
