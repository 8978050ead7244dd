// Closed forms of a training step's device memory (memory_plan.h). Every item names the buffer of
// the schedule it stands for, as the allocator names it (train --rehearsal lists them).
#include "untied/train/memory_plan.h"

#include <algorithm>

#include "untied/attention/attention_block.h"
#include "untied/attention/head_schedule.h"
#include "untied/attention/token_layout.h"
#include "untied/kernels/attention.h"
#include "untied/kernels/gemm.h"
#include "untied/kernels/lm_head_loss.h"

namespace untied {

std::vector<std::string> counted_buffers(const PlanItem& item) {
  return item.buffers.empty() ? std::vector<std::string>{item.what} : item.buffers;
}

int64_t PlanMoment::total() const {
  int64_t t = 0;
  for (const PlanItem& i : items) t += i.bytes;
  return t;
}

std::array<int64_t, kNumTags> PlanMoment::by_tag() const {
  std::array<int64_t, kNumTags> t{};
  for (const PlanItem& i : items) t[static_cast<int>(i.tag)] += i.bytes;
  return t;
}

std::vector<PlanItem> assumed_cuda_fixed_costs(int communicators) {
  const int64_t nccl_buffsize = int64_t{4} << 20, channels = 32;
  return {{"CUDA context and kernels", Tag::kOther, int64_t{512} << 20},
          {"cuBLAS workspace", Tag::kOther, int64_t{32} << 20},
          {"NCCL buffers (" + std::to_string(communicators) + " communicators)", Tag::kCommunication,
           communicators * channels * 2 * nccl_buffsize}};
}

int64_t HostMemory::total() const { return inputs + dh + kept_outputs + std::max(grad_stash, attn_out); }

HostMemory host_memory(const RunGeometry& g) {
  HostMemory h;
  if (!g.offload) return h;
  h.inputs = g.offloaded_blocks * g.L * g.E * g.es;
  if (g.host.grads && g.attention.strategy != Strategy::kLocal) {
    const int64_t rounds = g.sched.stages / g.sched.stages_per_round;
    h.grad_stash = g.Sg * (g.sched.stages * g.sched.q_per_rank + 2 * rounds * g.sched.kv_per_rank) * g.D * g.es;
  }
  if (g.host.dh) h.dh = g.L * g.E * g.es;
  if (g.host.attn_out) h.attn_out = g.L * g.H * g.D * g.es;
  if (g.selective) h.kept_outputs = (g.N - 1) * h.attn_out;
  return h;
}

HostMemory host_memory(const TrainOptions& o, int ranks) { return host_memory(run_geometry(o, ranks)); }

Status validate_plan(const TrainOptions& o, int ranks) {
  Status s = validate(o, ranks);
  if (!s.ok()) return s;
  if (o.decoder.strategy == Strategy::kLocal)
    return Status::invalid_argument("plan covers ulysses, upipe and ring (and their ring hybrids), not local");
  if (o.window > 0) return Status::invalid_argument("plan does not cover --window yet: rehearse");
  return Status::ok_status();
}

namespace {

// The schedule's buffers an item counts, by the allocator's names (head_pipeline.cc, block_ops.cc,
// ring_attention.cc; PlanItem::buffers). With qk_norm a projection's send buffer is the normed one.
const std::vector<std::string> kKvResident = {"k all-to-all receive (resident)", "v all-to-all receive (resident)"};
const std::vector<std::string> kQNormInput = {"q projection (send layout)", "q/k norm rstd"};
const std::vector<std::string> kKNormInput = {"k projection (send layout)", "q/k norm rstd"};
const std::vector<std::string> kQkNormInputs = {"q projection (send layout)", "k projection (send layout)",
                                                "q/k norm rstd"};
// A stage's returned gradient (dq, dk or dv) kept for dx: the all-to-all's receive, or with the
// q/k norm undone the norm's gradient.
std::vector<std::string> kept_grad(const std::string& which, bool qk_norm) {
  return {qk_norm ? "d pre-norm q/k" : which + " all-to-all receive"};
}

// The ZeRO-3 state: each parameter's fp32 master, gradient, and AdamW m and v, ceil(n / P)
// elements of each per rank (sharded_params.cc).
void add_state(const std::vector<ParamDesc>& descs, const RunGeometry& d, std::vector<PlanItem>& out) {
  int64_t shard = 0;
  for (const ParamDesc& p : descs) shard += (p.shape.numel() + d.P - 1) / d.P;
  out.push_back({"parameter shards (fp32 master)", Tag::kParameters, shard * 4});
  out.push_back({"gradient shards (fp32)", Tag::kGradients, shard * 4});
  out.push_back({"AdamW m and v shards (fp32)", Tag::kOptimizer, 2 * shard * 4});
}

// A group's weights gathered in the block dtype and its full-size fp32 gradients, each padded to
// P shards; with expert parallelism a MoE layer's experts are this rank's alone (X / P of them).
// The elements a parameter takes gathered: padded to P shards, or this rank's experts alone.
int64_t gathered_elems(const ParamDesc& p, const RunGeometry& d) {
  const bool own = d.experts_parallel && p.kind == ParamKind::kExperts;
  return own ? p.shape.numel() / d.P : d.P * ((p.shape.numel() + d.P - 1) / d.P);
}

int64_t gathered_elems(const std::vector<ParamDesc>& descs, int group, const RunGeometry& d) {
  int64_t padded = 0;
  for (const ParamDesc& p : descs)
    if (p.group == group) padded += gathered_elems(p, d);
  return padded;
}

void add_group(const std::vector<ParamDesc>& descs, int group, const RunGeometry& d, const char* name,
               std::vector<PlanItem>& out, bool grads = true) {
  const int64_t padded = gathered_elems(descs, group, d);
  out.push_back({std::string(name) + " (gathered)", Tag::kParameters, padded * d.es});
  if (grads) out.push_back({std::string(name) + " (full grad, fp32)", Tag::kGradients, padded * 4});
}

// The block whose gathered weights are the largest (the last among equals): every block's where
// the blocks differ (a mixture of experts with dense layers), which the plan then weighs as the
// last block's, an upper bound.
int largest_block(const std::vector<ParamDesc>& descs, const RunGeometry& d) {
  std::vector<int64_t> elems(static_cast<size_t>(d.N) + 2, 0);  // by group, in one pass
  for (const ParamDesc& p : descs)
    if (p.group >= 1 && p.group <= d.N) elems[static_cast<size_t>(p.group)] += gathered_elems(p, d);
  int best = static_cast<int>(d.N);
  for (int g = 1; g < d.N; ++g)
    if (elems[static_cast<size_t>(g)] > elems[static_cast<size_t>(best)]) best = g;
  return best;
}

// Block inputs saved on the device: every block's that is not offloaded (all N while the last
// block runs).
void add_saved_inputs(const TrainOptions& o, const RunGeometry& d, std::vector<PlanItem>& out) {
  const int64_t on_device = d.N - d.offloaded_blocks;
  if (on_device > 0)
    out.push_back({std::to_string(on_device) + " block inputs (saved)", Tag::kActivations, on_device * d.L * d.E * d.es});
}

// Recompute::kSelective: `blocks` blocks' attention outputs (on the device unless they wait in
// host memory) and every stage's LSE, kept from the forward pass for their recompute.
void add_kept_outputs(const RunGeometry& d, int64_t blocks, std::vector<PlanItem>& out) {
  if (!d.selective || blocks == 0) return;
  const std::string n = std::to_string(blocks);
  if (!d.host.attn_out)
    out.push_back({n + " blocks' attention outputs (kept)", Tag::kActivations, blocks * d.L * d.H * d.D * d.es});
  out.push_back({n + " blocks' attention LSEs (kept)", Tag::kActivations,
                 blocks * d.sched.stages * d.sched.q_per_rank * d.Sg * 4});
}

// What every moment of the last block's backward holds before its own buffers (decoder.cc
// forward_backward, block_backward): the state, the block's gathered weights and full gradients,
// the saved inputs on the device, the token ids, the block's input when it was fetched whole
// (refetch_inputs off) or, with `input_tile`, the tile of it read from the host, attn_norm(x)
// when whole, its rstd and dhm (in the buffer the last block's output was made in: decoder.cc
// kDhName), unless `dh` is false (dhm in host memory through the attention's backward).
void add_block_backward(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs, bool input_tile,
                        std::vector<PlanItem>& it, bool dh = true) {
  const int64_t L = d.L, E = d.E, es = d.es;
  add_state(descs, d, it);
  add_group(descs, largest_block(descs, d), d, "block weights", it);
  add_saved_inputs(o, d, it);
  add_kept_outputs(d, d.N - 1, it);
  it.push_back({"token ids", Tag::kOther, L * 4});
  const bool offloaded = o.offload_inputs && input_offloaded(o.decoder, d.N - 1);
  if (offloaded && !o.decoder.refetch_inputs)
    it.push_back({"block input (fetched)", Tag::kActivations, L * E * es});
  else if (offloaded && input_tile && d.attn_tile > 0)
    it.push_back({"block input (tile, fetched)", Tag::kOther, d.attn_tile * E * es});
  if (d.attn_tile == 0) it.push_back({"attn_norm output", Tag::kOther, L * E * es});
  it.push_back({"attn_norm rstd", Tag::kOther, L * 4});
  if (dh) it.push_back({"last block output, then dh", Tag::kActivations, L * E * es});
}

// A bf16 block's attention weight gradients in the compute dtype, added into the fp32 ones after
// the attention's backward (decoder.cc block_backward).
void add_attention_weight_grads(const TrainOptions& o, const RunGeometry& d, std::vector<PlanItem>& it) {
  if (d.dtype == DType::kF32) return;
  it.push_back({"attention weight gradients (compute dtype)", Tag::kGradients,
                (2 * d.H * d.D * d.E + 2 * d.G * d.D * d.E + (o.model.qk_norm ? 2 * d.D : 0) +
                 (o.model.qkv_bias ? (d.H + 2 * d.G) * d.D : 0)) * d.es});
}

// What the attention's forward saved for its backward, before the backward frees any of it: the
// output (sequence layout), every stage's LSE, and (ulysses, ring) every stage's q, k and v, or
// (upipe) the last stage's.
void add_attention_saved(const TrainOptions& o, const RunGeometry& d, std::vector<PlanItem>& it);

// What ulysses and ring keep of every stage and round from the forward to its backward
// (head_pipeline.cc, Saving::kKeepStages): q after norm and RoPE, k and v, and with qk_norm the
// norms' inputs and rstd.
void add_kept_stages(const TrainOptions& o, const RunGeometry& d, std::vector<PlanItem>& it) {
  const int64_t Sg = d.Sg, D = d.D, es = d.es, u = d.sched.q_per_rank, w = d.sched.kv_per_rank;
  const int64_t stages = d.sched.stages, rounds = stages / d.sched.stages_per_round;
  it.push_back({"q all-to-all receive (all stages)", Tag::kCommunication, stages * Sg * u * D * es, {"q all-to-all receive"}});
  it.push_back({"k and v all-to-all receives (resident, all rounds)", Tag::kCommunication, rounds * 2 * Sg * w * D * es, kKvResident});
  if (o.model.qk_norm)
    it.push_back({"q/k norm inputs and rstd (all stages)", Tag::kAttnWorkspace,
                  stages * Sg * u * (D * es + 4) + rounds * Sg * w * (D * es + 4), kQkNormInputs});
}

// What upipe's recompute keeps of its last stage for the backward, which starts with that stage
// (head_pipeline.cc, AttentionSaved::keep_last_stage): its q and its round's k and v, and with
// qk_norm the norms' inputs and rstd. `q` and `kv`: which of them exist yet (the forward's stages
// make them).
// The norms' part alone (qk_norm; nothing otherwise).
void add_kept_norms(const TrainOptions& o, const RunGeometry& d, bool q, bool kv, std::vector<PlanItem>& it) {
  const int64_t Sg = d.Sg, D = d.D, es = d.es, u = d.sched.q_per_rank, w = d.sched.kv_per_rank;
  if (!o.model.qk_norm) return;
  if (q) it.push_back({"q norm input and rstd (last stage, kept)", Tag::kAttnWorkspace, Sg * u * (D * es + 4), kQNormInput});
  if (kv) it.push_back({"k norm input and rstd (last round, kept)", Tag::kAttnWorkspace, Sg * w * (D * es + 4), kKNormInput});
}

void add_kept_last_stage(const TrainOptions& o, const RunGeometry& d, bool q, bool kv, std::vector<PlanItem>& it) {
  const int64_t Sg = d.Sg, D = d.D, es = d.es, u = d.sched.q_per_rank, w = d.sched.kv_per_rank;
  if (q) it.push_back({"q all-to-all receive (last stage, kept)", Tag::kCommunication, Sg * u * D * es, {"q all-to-all receive"}});
  if (kv) it.push_back({"k and v all-to-all receives (last round, kept)", Tag::kCommunication, 2 * Sg * w * D * es, kKvResident});
  add_kept_norms(o, d, q, kv, it);
}

void add_attention_saved(const TrainOptions& o, const RunGeometry& d, std::vector<PlanItem>& it) {
  if (!d.host.attn_out) it.push_back({"attention output (saved)", Tag::kActivations, d.L * d.H * d.D * d.es});
  it.push_back({"attention LSE (saved)", Tag::kActivations, d.sched.stages * d.sched.q_per_rank * d.Sg * 4});
  if (o.decoder.strategy != Strategy::kUPipe) add_kept_stages(o, d, it);
  else if (d.keep_last) add_kept_last_stage(o, d, /*q=*/true, /*kv=*/true, it);
}

// The CPU attention backward kernel's scratch (cpu_attention_backward_scratch_bytes) for a call
// of sq query rows and u heads, D given: dQ accumulators, one per thread but the first, plus the
// first's when dq is not fp32; and each thread's tiles.
void add_attention_backward_scratch(int64_t sq, int64_t u, const RunGeometry& d, bool dq_f32, int threads,
                                    std::vector<PlanItem>& out) {
  const AttentionShape s{.seq_q = sq, .seq_k = sq, .heads = u, .kv_heads = 1, .head_dim = d.D, .dtype = d.dtype,
                         .f32_results = dq_f32};
  const CpuAttentionBackwardScratch b = cpu_attention_backward_scratch_bytes(s, /*delta_from_out=*/false, threads);
  if (b.dq_accumulators > 0) out.push_back({"attention backward dQ accumulators", Tag::kAttnWorkspace, b.dq_accumulators});
  out.push_back({"attention backward tiles", Tag::kAttnWorkspace, b.tiles});
}

// What one projection of a stage's heads (q of stage s, or its dO) for every rank at once holds
// while it runs (block_ops.cc project_blocks), `rows` the run of input rows it reads: its output
// rows (at most kProjectionRows, with more than one rank) and, where the stage's heads are not
// consecutive, their weight rows (or wo's columns) gathered: a copy where D is not a multiple of
// 32, else read by the GEMM as it packs them (no copy; fp32 weights are gathered into the CPU
// gemm's fp32 scratch).
void add_projection_scratch(const RunGeometry& d, int64_t s, int64_t rows, std::vector<PlanItem>& it) {
  if (d.C == 1) return;
  const int64_t U = d.sched.stage_heads;
  it.push_back({"projection of every block's heads (rows)", Tag::kAttnWorkspace,
                std::min(rows, kProjectionRows) * U * d.D * d.es});
  if (consecutive_heads(d.sched.stage_q_heads(s))) return;
  if (d.D % 32 != 0)
    it.push_back({"weights of the stage's heads (copy)", Tag::kAttnWorkspace, U * d.D * d.E * d.es, {"weight rows of a block of heads", "wo columns of a block of heads"}});
  else if (d.es == 4)
    it.push_back({"gemm B in fp32 (the stage's heads gathered)", Tag::kOther, U * d.D * d.E * 4});
}

// The inputs of UPipe's next stage s1, sent off during this stage's attention with --overlap
// (head_pipeline.cc send_inputs): its recomputed q (send and receive), at a round's first stage
// its k and v, and its dO with D; with qk_norm the norms' inputs and rstd kept for the backward.
void add_next_stage(const TrainOptions& o, const RunGeometry& d, int64_t s1, bool backward, std::vector<PlanItem>& it) {
  const int64_t Sg = d.Sg, D = d.D, es = d.es, u = d.sched.q_per_rank, w = d.sched.kv_per_rank;
  const bool qk = o.model.qk_norm;
  it.push_back({"next stage: q projection and receive", Tag::kCommunication, 2 * Sg * u * D * es, {"q projection (send layout)", "q/k normed (send layout)", "q all-to-all receive"}});
  if (qk && backward) it.push_back({"next stage: q norm input and rstd", Tag::kAttnWorkspace, Sg * u * (D * es + 4), kQNormInput});
  if (d.sched.first_of_round(s1)) {
    it.push_back({"next round: k, v projections and receives", Tag::kCommunication, 4 * Sg * w * D * es, {"k projection (send layout)", "q/k normed (send layout)", "v projection (send layout)", "k all-to-all receive (resident)", "v all-to-all receive (resident)"}});
    if (qk && backward) it.push_back({"next round: k norm input and rstd", Tag::kAttnWorkspace, Sg * w * (D * es + 4), kKNormInput});
  }
  if (backward)
    it.push_back({"next stage: dO projection and receive, D (send, receive, head-sharded)", Tag::kCommunication,
                  2 * Sg * u * D * es + 3 * u * Sg * 4, {"dO projection (send layout)", "dO all-to-all receive", "attention D (send layout)", "attention D receive", "attention D (head-sharded)"}});
}

// The last block's attention backward inside the attention kernel of the stage it runs s-th
// (head_pipeline.cc run_backward; it runs the stages last first, and as every round has the same
// number of stages, a round is entered at every multiple of stages_per_round in that order just as
// in stage order): plan_memory takes the stage that holds the most. upipe's recomputed q, k and v
// of the first one run (the last stage) are the ones its forward kept: the same buffers.
// Two more moments of stage s, before its kernel:
//   kReturning (UPipe with overlap, s >= 1): stage s+1's inputs have been sent off and stage s-1's
//     dq is still coming back (its send and receive, its q norm's inputs);
//   kSending (without overlap): stage s's dO is being projected and sent (its send buffers, and
//     the round's sums only once the round's first stage has begun);
// empty where the schedule has no such moment.
enum class BwdMoment { kKernel, kReturning, kSending };

PlanMoment attention_backward(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs, int64_t s,
                              BwdMoment at = BwdMoment::kKernel) {
  const int64_t L = d.L, E = d.E, Sg = d.Sg, D = d.D, es = d.es;
  const int64_t u = d.sched.q_per_rank, w = d.sched.kv_per_rank, stages = d.sched.stages;
  const bool recompute = o.decoder.strategy == Strategy::kUPipe;
  const bool qk = o.model.qk_norm;
  const bool overlapped = recompute && o.decoder.overlap && stages > 1;
  const bool returning = at == BwdMoment::kReturning, sending = at == BwdMoment::kSending;
  PlanMoment m{.name = returning ? "attention backward (last block, the previous stage's dq returning)"
                       : sending ? "attention backward (last block, the stage's dO sent)"
                                 : "attention backward (last block)"};
  if (returning && !(overlapped && s >= 1)) return m;
  if (sending && (overlapped || d.R > 1)) return m;
  auto& it = m.items;
  add_block_backward(o, d, descs, /*input_tile=*/true, it, /*dh=*/!d.host.dh);
  if (!o.decoder.tiled_dx) it.push_back({"d attn_norm output (fp32)", Tag::kOther, L * E * 4});
  add_attention_weight_grads(o, d, it);
  // With dx by tiles, the q gradients of the stages done (before s, or before s-1 while s-1's
  // returns) and the k/v gradients of the rounds done, kept for dx.
  const int64_t done_stages = returning ? s - 1 : s, done_rounds = d.sched.round(returning ? s - 1 : s);
  if (returning) {
    it.push_back({"previous stage: dq send and receive", Tag::kCommunication, 2 * Sg * u * D * es, {"dq (head-sharded)", "dq all-to-all receive"}});
    if (qk) {
      it.push_back({"previous stage: q norm input and rstd", Tag::kAttnWorkspace, Sg * u * (D * es + 4), kQNormInput});
      if (d.sched.first_of_round(s))
        it.push_back({"previous round: k norm input and rstd", Tag::kAttnWorkspace, Sg * w * (D * es + 4), kKNormInput});
    }
  }
  if (o.decoder.tiled_dx && !d.host.grads) {
    if (done_stages > 0)
      it.push_back({"dq of the earlier stages (kept for dx)", qk ? Tag::kAttnWorkspace : Tag::kCommunication,
                    done_stages * Sg * u * D * es, kept_grad("dq", qk)});
    if (done_rounds > 0) {
      it.push_back({"dk of the earlier rounds (kept for dx)", qk ? Tag::kAttnWorkspace : Tag::kCommunication,
                    done_rounds * Sg * w * D * es, kept_grad("dk", qk)});
      it.push_back({"dv of the earlier rounds (kept for dx)", Tag::kCommunication, done_rounds * Sg * w * D * es, kept_grad("dv", false)});
    }
  }
  // What the attention's forward saved (kept through its backward).
  it.push_back({"attention LSE (saved)", Tag::kActivations, stages * u * Sg * 4});
  if (o.decoder.early_delta) it.push_back({"attention D (every head)", Tag::kAttnWorkspace, d.H * L * 4});
  else it.push_back({"attention output (saved)", Tag::kActivations, L * d.H * D * es});
  if (!recompute) {
    add_kept_stages(o, d, it);
  } else {  // upipe recomputes this stage's q and its round's k and v
    it.push_back({"q all-to-all receive", Tag::kCommunication, Sg * u * D * es});
    it.push_back({"k and v all-to-all receives (resident)", Tag::kCommunication, 2 * Sg * w * D * es, kKvResident});
    if (qk) it.push_back({"q/k norm inputs and rstd", Tag::kAttnWorkspace, Sg * u * (D * es + 4) + Sg * w * (D * es + 4), kQkNormInputs});
  }
  it.push_back({"dO all-to-all receive", Tag::kCommunication, Sg * u * D * es});
  it.push_back({"attention D (head-sharded)", Tag::kAttnWorkspace, u * Sg * 4});
  if (!(sending && d.sched.first_of_round(s)))
    it.push_back({"dk and dv accumulators (round, fp32)", Tag::kAttnWorkspace, 2 * Sg * w * D * 4, {"dk accumulator (round)", "dv accumulator (round)"}});
  if (recompute && o.decoder.overlap && s + 1 < stages) add_next_stage(o, d, s + 1, /*backward=*/true, it);
  const int64_t dy_rows = d.host.dh ? d.attn_tile : L;  // the runs of dy's rows the dO projection reads
  if (sending) {  // (at its height as the dO is projected, from a tile of dhm fetched with dh_on_host)
    it.push_back({"dO projection (send layout)", Tag::kAttnWorkspace, Sg * u * D * es});
    it.push_back({"attention D (send layout and receive)", Tag::kAttnWorkspace, 2 * u * Sg * 4, {"attention D (send layout)", "attention D receive"}});
    if (d.host.dh) it.push_back({"d block output (tile, fetched)", Tag::kAttnWorkspace, d.attn_tile * E * es});
    add_projection_scratch(d, s, dy_rows, it);
    return m;
  }
  if (returning) {  // (at its height as the next stage's dO is projected from a tile of dhm fetched)
    if (s + 1 < stages && d.host.dh)
      it.push_back({"d block output (tile, fetched)", Tag::kAttnWorkspace, d.attn_tile * E * es});
    if (s + 1 < stages) add_projection_scratch(d, s + 1, dy_rows, it);
    return m;
  }
  if (d.R == 1) {  // the kernel's fp32 results: dq its own accumulator, dk and dv added into the sums
    it.push_back({"dq (head-sharded, fp32)", Tag::kAttnWorkspace, Sg * u * D * 4});
    add_attention_backward_scratch(Sg, u, d, /*dq_f32=*/true, o.threads, it);
  } else {
    // ring_attention.cc backward: two K/V blocks in flight, fp32 dq and dk/dv sums
    it.push_back({"dq (head-sharded)", Tag::kAttnWorkspace, Sg * u * D * es});
    const int64_t lc = Sg / 2;  // a zig-zag chunk
    it.push_back({"ring K/V blocks (two)", Tag::kCommunication, 2 * 2 * Sg * w * D * es, {"ring K/V block", "ring K/V block (receive)"}});
    it.push_back({"ring D and LSE (chunks)", Tag::kAttnWorkspace, 4 * u * lc * 4, {"ring D (chunk)", "ring LSE (chunk)"}});
    it.push_back({"ring dq (fp32)", Tag::kAttnWorkspace, Sg * u * D * 4});
    it.push_back({"ring dk/dv sums (two)", Tag::kCommunication, 2 * 2 * Sg * w * D * 4, {"ring dk/dv sums", "ring dk/dv sums (receive)"}});
    it.push_back({"ring dk/dv of one step", Tag::kAttnWorkspace, 2 * Sg * w * D * 4});
    it.push_back({"ring partial dq, dk, dv", Tag::kAttnWorkspace, lc * (u + 2 * w) * D * 4, {"ring partial dq", "ring partial dk", "ring partial dv"}});
    add_attention_backward_scratch(lc, u, d, /*dq_f32=*/true, o.threads, it);
  }
  return m;
}

// The fused LM head forward and backward (decoder.cc, "Loss, fused with its backward"), a chunk of
// rows at a time with dh written over the last block's output: inside the kernel, with a chunk of
// logits; or after it, as the head's gradient is reduce-scattered
// (a receive of its largest shard) with the loss's buffers still live.
std::vector<PlanMoment> loss(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  PlanMoment m{.name = "loss (LM head kernel)"};
  auto& it = m.items;
  const int64_t L = d.L, E = d.E, es = d.es;
  const int head_group = static_cast<int>(d.N) + 1;
  add_state(descs, d, it);
  add_group(descs, head_group, d, "final norm and LM head", it);
  if (o.model.tied_embeddings) add_group(descs, 0, d, "embedding (the tied head)", it);
  add_saved_inputs(o, d, it);
  add_kept_outputs(d, d.N, it);
  it.push_back({"token ids", Tag::kOther, L * 4});
  it.push_back({"last block output, then dh", Tag::kActivations, L * E * es});
  it.push_back({"predictions, labels", Tag::kOther, 2 * L * 4});
  const LmHeadLossShape ce{.tokens = L, .dim = E, .vocab = d.V, .chunk_tokens = o.decoder.loss_chunk,
                           .dtype = d.dtype, .weight_dtype = d.dtype};
  const int64_t chunk = std::max<int64_t>(lm_head_loss_chunk(ce), 1);
  it.push_back({"final_norm output (then dh) and its gradient (chunk)", Tag::kOther, 2 * chunk * E * es});
  it.push_back({"final_norm rstd (chunk)", Tag::kOther, chunk * 4});
  PlanMoment reduce = m;
  reduce.name = "loss (LM head gradient reduce-scatter)";
  it.push_back({"lm head workspace (a chunk of logits)", Tag::kOther, lm_head_loss_workspace_bytes(ce, true)});
  int64_t shard = 0;
  for (const ParamDesc& p : descs)
    if (p.group == head_group || (o.model.tied_embeddings && p.group == 0))
      shard = std::max(shard, (p.shape.numel() + d.P - 1) / d.P);
  reduce.items.push_back({"gradient shard receive (the largest)", Tag::kCommunication, shard * 4, {"<parameter> (grad shard recv)"}});
  return {m, reduce};
}

// The last block's recompute, in its last stage (head_pipeline.cc run_forward): the block's
// output gradient and full weight gradients are already there, and the forward's saved attention
// output and every stage's LSE. The moments: inside the attention kernel; as the stage's output is
// sent back, its receive beside it (ulysses and ring, which keep the stage's q, k and v, and upipe's
// recompute keeping its last stage); the output projection after the stages; and (upipe with
// overlap) the next stage's projection.
std::vector<PlanMoment> attention_forward(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs,
                                          int64_t s, bool in_backward) {
  const std::string pass = in_backward ? "recompute" : "forward pass";
  PlanMoment m{.name = "attention forward (last block, " + pass + ")"};
  auto& it = m.items;
  const int64_t L = d.L, E = d.E, Sg = d.Sg, D = d.D, es = d.es;
  const int64_t u = d.sched.q_per_rank, w = d.sched.kv_per_rank, stages = d.sched.stages;
  const bool recompute = o.decoder.strategy == Strategy::kUPipe;
  const bool offloaded = o.offload_inputs && input_offloaded(o.decoder, d.N - 1);
  add_state(descs, d, it);
  add_group(descs, largest_block(descs, d), d, "block weights", it, /*grads=*/in_backward);
  it.push_back({"token ids", Tag::kOther, L * 4});
  add_kept_outputs(d, d.N - 1, it);  // the other blocks' (the forward pass: the blocks before)
  if (in_backward) {
    add_saved_inputs(o, d, it);
    // The offloaded input read from the host a tile at a time (refetch_inputs, tiles), or fetched.
    if (offloaded && o.decoder.refetch_inputs && d.attn_tile > 0)
      it.push_back({"block input (tile, fetched)", Tag::kOther, d.attn_tile * E * es});
    else if (offloaded)
      it.push_back({"block input (fetched)", Tag::kActivations, L * E * es});
    it.push_back({"last block output, then dh", Tag::kActivations, L * E * es});
  } else {  // the inputs kept so far and the block's own (its output is hm, made in place)
    int64_t kept = 0;
    for (int64_t l = 0; l + 1 < d.N; ++l) kept += !(o.offload_inputs && input_offloaded(o.decoder, l));
    if (kept > 0) it.push_back({std::to_string(kept) + " block inputs (saved)", Tag::kActivations, kept * L * E * es});
    it.push_back({"the block's input", Tag::kActivations, L * E * es});
  }
  // hm, the residual after attention (the forward pass: the block's output, made in place): with
  // the attention's tiles made as its output's first tile comes, so only in the output projection.
  const PlanItem hm{in_backward ? "residual after attention" : "residual after attention (the block's output)",
                    in_backward ? Tag::kOther : Tag::kActivations, L * E * es};
  if (d.attn_tile == 0) it.push_back(hm);
  if (d.attn_tile == 0) it.push_back({"attn_norm output", Tag::kOther, L * E * es});
  it.push_back({"attn_norm rstd", Tag::kOther, L * 4});
  const bool out_host = d.host.attn_out;
  if (!out_host) it.push_back({"attention output (saved)", Tag::kActivations, L * d.H * D * es});
  // (A recompute from the kept output has every stage's LSE from the start.)
  const bool rerun = in_backward && d.selective;
  it.push_back({"attention LSE (saved)", Tag::kActivations, (rerun ? stages : s + 1) * u * Sg * 4});
  it.push_back({"attention output (head-sharded)", Tag::kAttnWorkspace, Sg * u * D * es});
  if (recompute && o.decoder.overlap && s + 1 < stages) add_next_stage(o, d, s + 1, /*backward=*/false, it);
  if (!recompute) {  // every stage's q, every round's k and v, kept for the backward
    add_kept_stages(o, d, it);
  } else {
    it.push_back({"q all-to-all receive", Tag::kCommunication, Sg * u * D * es});
    it.push_back({"k and v all-to-all receives (resident)", Tag::kCommunication, 2 * Sg * w * D * es, kKvResident});
    // The recompute keeps the norms' inputs of the last stage and of its round once projected
    // (with overlap stage s+1 is projected by now).
    const int64_t projected = o.decoder.overlap && s + 1 < stages ? s + 1 : s;
    const bool last_round = d.sched.round(projected) == d.sched.round(stages - 1);
    if (in_backward && d.keep_last) add_kept_norms(o, d, projected == stages - 1, last_round, it);
  }
  // After the stages: y = attn_out wo^T, with the CPU gemm's scratch for bf16 operands
  // (cpu_gemm_scratch_bytes: fp32 widening, or the bf16 kernel's packing and C rows).
  PlanMoment projection = m;
  projection.name = "attention forward (last block, " + pass + ": output projection)";
  std::erase_if(projection.items, [](const PlanItem& i) {
    return i.what == "attention output (head-sharded)" || i.what == "q all-to-all receive" ||
           i.what == "k and v all-to-all receives (resident)" || i.what.ends_with(", kept)") ||
           i.what.starts_with("next stage: ") || i.what.starts_with("next round: ");  // the stages are over
  });
  if (recompute && in_backward && d.keep_last) add_kept_last_stage(o, d, true, true, projection.items);
  // With tiles (decoder.cc block_forward): a tile of y at a time, added to x's rows (fetched from
  // the host a tile at a time when x is there) into hm.
  if (d.attn_tile > 0) {
    projection.items.push_back(hm);
    projection.items.push_back({"attention block output (tile)", Tag::kOther, d.attn_tile * E * es});
    if (in_backward && offloaded && o.decoder.refetch_inputs)
      projection.items.push_back({"block input (tile, fetched for the residual)", Tag::kOther, d.attn_tile * E * es});
    if (out_host)
      projection.items.push_back({"attention output rows (tile, fetched)", Tag::kAttnWorkspace, d.attn_tile * d.H * D * es});
  }
  const GemmParams wo{.trans_b = true, .m = d.attn_tile > 0 ? d.attn_tile : L, .n = E, .k = d.H * D, .a_dtype = d.dtype,
                      .b_dtype = d.dtype, .c_dtype = d.dtype};
  if (const int64_t b = cpu_gemm_scratch_bytes(wo, o.threads); b > 0)
    projection.items.push_back({"gemm scratch", Tag::kOther, b});
  PlanMoment exchange = m;
  exchange.name = "attention forward (last block, " + pass + ": output exchange)";
  exchange.items.push_back({"attention output all-to-all receive", Tag::kCommunication, Sg * u * D * es});
  // The CPU attention forward kernel's tiles per thread (cpu_attention_forward_scratch_bytes).
  auto forward_tiles = [&](int64_t rows) {
    const AttentionShape s{.seq_q = rows, .seq_k = rows, .heads = u, .kv_heads = 1, .head_dim = D, .dtype = d.dtype};
    return cpu_attention_forward_scratch_bytes(s, o.threads);
  };
  if (d.R == 1) {
    it.push_back({"attention forward tiles", Tag::kAttnWorkspace, forward_tiles(Sg)});
  } else {  // ring_attention.cc forward: two K/V blocks in flight, fp32 output, chunk LSEs
    const int64_t lc = Sg / 2;
    it.push_back({"ring K/V blocks (two)", Tag::kCommunication, 2 * 2 * Sg * w * D * es, {"ring K/V block", "ring K/V block (receive)"}});
    it.push_back({"ring attention output (fp32)", Tag::kAttnWorkspace, Sg * u * D * 4});
    it.push_back({"ring LSE (chunks) and partial LSE", Tag::kAttnWorkspace, 3 * u * lc * 4, {"ring LSE (chunk 0)", "ring LSE (chunk 1)", "ring partial LSE"}});
    it.push_back({"ring partial output (fp32)", Tag::kAttnWorkspace, lc * u * D * 4});
    it.push_back({"attention forward tiles", Tag::kAttnWorkspace, forward_tiles(lc)});
  }
  if (rerun) {
    // Recompute::kSelective (head_pipeline.cc rerun_forward): no attention and no output exchange.
    // Ulysses and ring project q, k and v again, kept for the backward: the moment as v's
    // projection is sent (every q and k receive there already), no kernel beside it; upipe projects
    // nothing: only the output projection.
    exchange.items.clear();
    if (recompute) {
      m.items.clear();
    } else {
      m.name = "attention forward (last block, recompute: q, k and v projected again)";
      std::erase_if(m.items, [](const PlanItem& i) {
        return i.what == "attention output (head-sharded)" || i.what == "attention forward tiles" ||
               i.what.starts_with("ring ");
      });
      m.items.push_back({"v projection (send layout)", Tag::kAttnWorkspace, Sg * w * D * es});
    }
    return {m, exchange, projection};
  }
  if (!recompute) return {m, exchange, projection};
  // UPipe frees the stage's q (and the round's k, v) before the exchange, but for the last stage's
  // in the recompute, which stay for the backward: that exchange has them beside its receive. With
  // overlap, stage s+1 is projected and sent while stage s-1's output is still coming back (before
  // stage s's output and LSE exist).
  PlanMoment next = exchange;
  next.name = "attention forward (last block, " + pass + ": next stage's projection)";
  for (PlanItem& i : next.items)
    if (i.what == "attention LSE (saved)") i.bytes = s * u * Sg * 4;
  if (!(o.decoder.overlap && s >= 1 && s + 1 < stages)) next.items.clear();
  if (!(in_backward && d.keep_last && s + 1 == stages)) exchange.items.clear();
  return {m, projection, next, exchange};
}

// The last block's attention backward as it begins: dwo = dy^T attn_out, with the CPU gemm's
// scratch for bf16 operands (cpu_gemm_scratch_bytes), the saved output and every saved stage
// still there. The largest moment
// only for small models, where those blocks are whole.
PlanMoment dwo_gemm(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  PlanMoment m{.name = "attention backward (dwo gemm)"};
  auto& it = m.items;
  const int64_t L = d.L, E = d.E, HD = d.H * d.D;
  const bool dh_host = d.host.dh;
  add_block_backward(o, d, descs, /*input_tile=*/false, it, /*dh=*/!dh_host);
  if (!o.decoder.tiled_dx) it.push_back({"d attn_norm output (fp32)", Tag::kOther, L * E * 4});
  add_attention_weight_grads(o, d, it);
  add_attention_saved(o, d, it);
  // dhm and the saved output in host memory: each read a tile at a time, dwo's sums over tiles in
  // fp32.
  const bool out_host = d.host.attn_out, by_tiles = dh_host || out_host;
  if (out_host) it.push_back({"attention output rows (tile, fetched)", Tag::kAttnWorkspace, d.attn_tile * HD * d.es});
  if (dh_host) it.push_back({"d block output (tile, fetched)", Tag::kAttnWorkspace, d.attn_tile * E * d.es});
  if (by_tiles && d.dtype != DType::kF32) it.push_back({"dwo fp32 sums (tiles)", Tag::kAttnWorkspace, E * HD * 4});
  const GemmParams dwo{.trans_a = true, .m = E, .n = HD, .k = by_tiles ? d.attn_tile : L, .a_dtype = d.dtype,
                       .b_dtype = d.dtype, .c_dtype = by_tiles && d.dtype != DType::kF32 ? DType::kF32 : d.dtype};
  if (const int64_t b = cpu_gemm_scratch_bytes(dwo, o.threads); b > 0) it.push_back({"gemm scratch", Tag::kOther, b});
  return m;
}

// The last block's attention backward as it computes D = rowsum(dO * O) of every head (early_delta,
// head_pipeline.cc run_backward), after dwo and before the stages: dwo's moment without that
// gemm's buffers, with D of every head, the dO of U heads for a run of rows (a tile of them when
// dhm or the saved output is in host memory) and that projection's gemm scratch. Empty without
// early_delta.
PlanMoment early_delta(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  PlanMoment m = dwo_gemm(o, d, descs);
  m.name = "attention backward (D of every head)";
  if (!o.decoder.early_delta) {
    m.items.clear();
    return m;
  }
  std::erase_if(m.items,
                [](const PlanItem& i) { return i.what == "dwo fp32 sums (tiles)" || i.what == "gemm scratch"; });
  const bool by_tiles = d.host.dh || d.host.attn_out;
  const int64_t rows = by_tiles ? std::min(d.attn_tile, d.L) : d.L, U = d.sched.stage_heads;
  m.items.push_back({"attention D (every head)", Tag::kAttnWorkspace, d.H * d.L * 4});
  m.items.push_back({"dO projection (U heads)", Tag::kAttnWorkspace, rows * U * d.D * d.es});
  const GemmParams proj{.m = rows, .n = U * d.D, .k = d.E, .a_dtype = d.dtype, .b_dtype = d.dtype, .c_dtype = d.dtype};
  if (const int64_t b = cpu_gemm_scratch_bytes(proj, o.threads); b > 0) m.items.push_back({"gemm scratch", Tag::kOther, b});
  return m;
}

// The last block's MLP backward, in a tile (decoder.cc mlp_backward): its gate, up, SwiGLU and
// their gradient per tile, beside the block's output gradient (turned into dhm in place), the
// residual hm and what the attention saved.
PlanMoment mlp_backward(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  PlanMoment m{.name = "MLP backward (last block)"};
  auto& it = m.items;
  const int64_t L = d.L, E = d.E, es = d.es, T = d.mlp_tile, F = o.model.ffn;
  add_block_backward(o, d, descs, /*input_tile=*/false, it);
  it.push_back({"residual after attention", Tag::kOther, L * E * es});
  add_attention_saved(o, d, it);
  it.push_back({"mlp gate, up, swiglu and dswiglu (tile)", Tag::kOther, 4 * T * F * es});
  it.push_back({"mlp_norm output and its gradient (tile)", Tag::kOther, 2 * T * E * es});
  it.push_back({"mlp_norm rstd (tile)", Tag::kOther, T * 4});
  // The CPU gemm's scratch (cpu_gemm_scratch_bytes) of the products made while the tile's SwiGLU
  // and its gradient are live: dw_down += dy_t^T s and ds = dy_t w_down.
  const GemmParams dw_down{.trans_a = true, .m = E, .n = F, .k = T, .a_dtype = d.dtype, .b_dtype = d.dtype},
      ds{.m = T, .n = F, .k = E, .a_dtype = d.dtype, .b_dtype = d.dtype, .c_dtype = d.dtype};
  if (const int64_t b = std::max(cpu_gemm_scratch_bytes(dw_down, o.threads), cpu_gemm_scratch_bytes(ds, o.threads));
      b > 0)
    it.push_back({"gemm scratch", Tag::kOther, b});
  return m;
}

// The last block's MLP backward when it is a mixture of experts (moe.cc MoeMlp::backward), a tile
// of T rows at a time: the moments where it holds the most, each beside what the dense MLP's
// backward holds beside its own (the block's state, hm, the attention's saved) and the tile's
// normed input, rstd, its gradient and the routing (rows in expert order, each token's rows, the
// weights). The experts' rows: m = T k at the tokens' ranks; M at the experts (moe_planned_rows:
// balanced routing, times --moe-skew under expert parallelism; the rehearsal's too). With expert
// parallelism each exchange holds its send and its receive at once.
std::vector<PlanMoment> moe_backward(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  const ModelConfig& mc = o.model;
  const int64_t E = d.E, es = d.es, T = d.mlp_tile, k = mc.experts_per_token, m = T * k, Fe = mc.expert_ffn;
  const int64_t M = moe_planned_rows(mc, o.decoder, static_cast<int>(d.P), T);
  const bool ep = d.experts_parallel;
  auto base = [&](const char* name) {
    PlanMoment pm{.name = std::string("MoE backward (last block): ") + name};
    add_block_backward(o, d, descs, /*input_tile=*/false, pm.items);
    pm.items.push_back({"residual after attention", Tag::kOther, d.L * E * es});
    add_attention_saved(o, d, pm.items);
    pm.items.push_back({"mlp_norm output, its gradient (tile)", Tag::kOther, 2 * T * E * es});
    pm.items.push_back({"mlp_norm rstd (tile)", Tag::kOther, T * 4});
    pm.items.push_back({"moe routing (tile)", Tag::kOther, m * 4 * 3});
    return pm;
  };
  auto rows = [&](PlanMoment& pm, const char* what, int64_t n, int64_t width, int64_t bytes, Tag tag = Tag::kOther) {
    pm.items.push_back({what, tag, n * width * bytes});
  };
  std::vector<PlanMoment> out;
  {  // the experts' outputs back at the tokens' ranks (or, without expert parallelism, made there)
    PlanMoment pm = base("expert outputs");
    rows(pm, "moe input rows at the experts", M, E, es, ep ? Tag::kCommunication : Tag::kOther);
    rows(pm, "moe gate, up and swiglu", M, 3 * Fe, es);
    rows(pm, "moe expert outputs", M, E, es);
    if (ep) rows(pm, "moe expert outputs returned", m, E, es, Tag::kCommunication);
    out.push_back(std::move(pm));
  }
  {  // their gradient at the tokens' ranks
    PlanMoment pm = base("d expert outputs");
    rows(pm, "moe input rows at the experts", M, E, es, ep ? Tag::kCommunication : Tag::kOther);
    rows(pm, "moe gate, up and swiglu", M, 3 * Fe, es);
    rows(pm, "moe expert outputs (returned)", m, E, es, ep ? Tag::kCommunication : Tag::kOther);
    rows(pm, "moe d expert outputs", m, E, es);
    rows(pm, "moe d routing weights", T, k, 4);
    out.push_back(std::move(pm));
  }
  if (ep) {  // the gradient sent to the experts
    PlanMoment pm = base("d expert outputs sent");
    rows(pm, "moe input rows at the experts", M, E, es, Tag::kCommunication);
    rows(pm, "moe gate, up and swiglu", M, 3 * Fe, es);
    rows(pm, "moe d expert outputs, sent and received", m + M, E, es, Tag::kCommunication);
    rows(pm, "moe d routing weights", T, k, 4);
    out.push_back(std::move(pm));
  }
  {  // the SwiGLU's gradient
    PlanMoment pm = base("dswiglu");
    rows(pm, "moe input rows at the experts", M, E, es, ep ? Tag::kCommunication : Tag::kOther);
    rows(pm, "moe gate and up", M, 2 * Fe, es);
    rows(pm, "moe d expert outputs (at the experts)", M, E, es, ep ? Tag::kCommunication : Tag::kOther);
    rows(pm, "moe dswiglu", M, Fe, es);
    rows(pm, "moe d routing weights", T, k, 4);
    out.push_back(std::move(pm));
  }
  {  // the inputs' gradient (fp32), and its return
    PlanMoment pm = base("d input rows");
    rows(pm, "moe gate and up", M, 2 * Fe, es);
    rows(pm, "moe d input rows", M, E, 4);
    rows(pm, "moe d routing weights", T, k, 4);
    out.push_back(std::move(pm));
    if (ep) {
      PlanMoment back = base("d input rows returned");
      rows(back, "moe d input rows, sent and returned", M + m, E, 4, Tag::kCommunication);
      rows(back, "moe d routing weights", T, k, 4);
      out.push_back(std::move(back));
    }
  }
  return out;
}

// The last block's dx handed out by tiles (head_pipeline.cc hand_out_dx, with tiled_dx): every
// stage's dq and every round's dk and dv kept, an fp32 dx tile, and the decoder's tiles for the
// norm backward.
PlanMoment dx_tiles(const TrainOptions& o, const RunGeometry& d, const std::vector<ParamDesc>& descs) {
  PlanMoment m{.name = "attention backward (dx by tiles)"};
  auto& it = m.items;
  const int64_t L = d.L, E = d.E, Sg = d.Sg, D = d.D, es = d.es, T = d.mlp_tile;
  const int64_t u = d.sched.q_per_rank, w = d.sched.kv_per_rank, stages = d.sched.stages;
  const int64_t rounds = stages / d.sched.stages_per_round;
  const bool qk = o.model.qk_norm;
  const bool offloaded = o.offload_inputs && input_offloaded(o.decoder, d.N - 1);
  add_block_backward(o, d, descs, /*input_tile=*/true, it);
  add_attention_weight_grads(o, d, it);
  if (o.decoder.early_delta) it.push_back({"attention D (every head)", Tag::kAttnWorkspace, d.H * L * 4});
  if (d.host.grads) {  // each gradient's rows of the tile fetched from the host
    it.push_back({"dq rows (tile, fetched)", Tag::kOther, d.C * std::min(T, L) * u * D * es});
    it.push_back({"dk or dv rows (tile, fetched)", Tag::kOther, d.C * std::min(T, L) * w * D * es});
  } else {
    it.push_back({"dq of every stage (kept for dx)", qk ? Tag::kAttnWorkspace : Tag::kCommunication,
                  stages * Sg * u * D * es, kept_grad("dq", qk)});
    it.push_back({"dk of every round (kept for dx)", qk ? Tag::kAttnWorkspace : Tag::kCommunication,
                  rounds * Sg * w * D * es, kept_grad("dk", qk)});
    it.push_back({"dv of every round (kept for dx)", Tag::kCommunication, rounds * Sg * w * D * es, kept_grad("dv", false)});
  }
  it.push_back({"dx (tile, fp32)", Tag::kOther, std::min(T, L) * E * 4});
  const bool x_on_host = offloaded && o.decoder.refetch_inputs;
  it.push_back({"d block input and d attn_norm output (tiles)", Tag::kOther,
                (d.dtype != DType::kF32 ? 2 : 1) * std::min(T, L) * E * es});
  if (x_on_host) it.push_back({"block input (tile, fetched for the norm)", Tag::kOther, std::min(T, L) * E * es});
  return m;
}

// plan_memory with keep_last_stage resolved (kOn or kOff).
MemoryPlan plan_resolved(const TrainOptions& o, int ranks) {
  const RunGeometry d = run_geometry(o, ranks);
  const std::vector<ParamDesc> descs = parameter_descriptors(o.model);
  MemoryPlan p;
  p.rows = d.L;
  // The attention's moments at the stage that holds the most (the last, or with overlap one
  // whose next stage is in flight).
  auto largest = [](std::vector<PlanMoment> a, std::vector<PlanMoment> b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (b[i].total() > a[i].total()) a[i] = std::move(b[i]);
    return a;
  };
  std::vector<PlanMoment> fwd = attention_forward(o, d, descs, 0, false), re = attention_forward(o, d, descs, 0, true);
  auto backward_moments = [&](int64_t s) {
    return std::vector<PlanMoment>{attention_backward(o, d, descs, s),
                                   attention_backward(o, d, descs, s, BwdMoment::kReturning),
                                   attention_backward(o, d, descs, s, BwdMoment::kSending)};
  };
  std::vector<PlanMoment> bwd = backward_moments(0);
  for (int64_t s = 1; s < d.sched.stages; ++s) {
    fwd = largest(std::move(fwd), attention_forward(o, d, descs, s, false));
    re = largest(std::move(re), attention_forward(o, d, descs, s, true));
    bwd = largest(std::move(bwd), backward_moments(s));
  }
  for (PlanMoment& m : bwd) p.moments.push_back(std::move(m));
  for (PlanMoment& m : re) p.moments.push_back(std::move(m));
  for (PlanMoment& m : fwd) p.moments.push_back(std::move(m));
  p.moments.push_back(dwo_gemm(o, d, descs));
  p.moments.push_back(early_delta(o, d, descs));
  // A MoE model with dense layers has both backwards; each is weighed as the last block's (an upper
  // bound for the kind the last block is not).
  bool moe = false, dense = false;
  for (int64_t l = 0; l < d.N; ++l) (moe_layer(o.model, l) ? moe : dense) = true;
  if (moe)
    for (PlanMoment& m : moe_backward(o, d, descs)) p.moments.push_back(std::move(m));
  if (dense) p.moments.push_back(mlp_backward(o, d, descs));
  if (o.decoder.tiled_dx) p.moments.push_back(dx_tiles(o, d, descs));
  for (PlanMoment& m : loss(o, d, descs)) p.moments.push_back(std::move(m));
  std::erase_if(p.moments, [](const PlanMoment& m) { return m.items.empty(); });  // moments this run lacks
  for (size_t i = 1; i < p.moments.size(); ++i)
    if (p.moments[i].total() > p.moments[p.peak].total()) p.peak = i;
  p.host_per_rank = host_memory(d).total();
  p.keeps_last_stage = d.keep_last;
  return p;
}

}  // namespace

MemoryPlan plan_memory(const TrainOptions& o, int ranks) {
  const Status valid = validate_plan(o, ranks);
  UNTIED_CHECK(valid.ok(), valid.message());
  if (o.decoder.strategy != Strategy::kUPipe || o.decoder.keep_last_stage != KeepLastStage::kAuto ||
      o.decoder.recompute == Recompute::kSelective)  // (nothing of upipe's recompute to keep)
    return plan_resolved(o, ranks);
  TrainOptions on = o, off = o;
  on.decoder.keep_last_stage = KeepLastStage::kOn;
  off.decoder.keep_last_stage = KeepLastStage::kOff;
  MemoryPlan kept = plan_resolved(on, ranks), not_kept = plan_resolved(off, ranks);
  return kept.peak_total() <= not_kept.peak_total() ? kept : not_kept;
}

}  // namespace untied
