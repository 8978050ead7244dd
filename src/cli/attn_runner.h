// One attention block forward + backward on this rank, with the inputs the `attn` and
// `bench attn` commands use: x, dy and the weights from counter-based random numbers (the same
// global tensors for any number of ranks), timings per phase and the allocator's peaks. On a
// GPU the inputs are made on the host exactly as on the CPU and copied over, and --dump copies
// the results back before writing them.
#pragma once

#include <string>
#include <vector>

#include "cli/rank_device.h"
#include "untied/attention/attention_block.h"
#include "untied/comm/communicator.h"
#include "untied/core/allocator.h"

namespace untied::cli {

struct AttnRunOptions {
  DeviceChoice device = DeviceChoice::kCpu;  // rank devices as in rank_device.h
  int threads = 1;                           // CPU kernels only
  int64_t budget_bytes = 0;
  bool rehearsal = false;   // count memory, skip compute and communication (CPU counting device)
  uint64_t seed = 1;
  std::string dump_dir;     // non-empty: write .npy files and meta.json there (rank 0)
  int warmup = 1;           // untimed forward+backward passes first (first-touch page faults)
  // The sequence's documents (lengths summing to cfg.seq; empty = one) and window (0 = none).
  std::vector<int64_t> doc_lens;
  int64_t window = 0;
  bool keep_last = false;   // upipe: AttentionSaved::keep_last_stage
};

struct AttnRunResult {
  double fwd_ms = 0, bwd_ms = 0;  // slowest rank
  MemoryStats mem;                // max over ranks, field by field
  int64_t intermediates_fwd = 0;  // peak live attn_workspace + communication, forward (max over ranks)
  int64_t intermediates_bwd = 0;  // the same in backward
  // GPU: the most bytes a rank's caching allocator held from cudaMalloc, warm-up included
  // (max over ranks): the real footprint, against mem.peak_total (live). 0 on the CPU.
  int64_t reserved_peak = 0;
  int64_t stage_heads = 0;
  // Ring strategies, the timed forward + backward only: rank 0's exchanges and bytes; the most
  // any rank waited for exchanges; the most and least time a rank spent in ring attention compute.
  RingStats ring;
  double ring_compute_min_s = 0;
  std::string device_name;  // rank 0's device, "cuda:0 (NVIDIA H200)"
  std::string backend;      // the communicator that moved the device buffers
  int64_t padded_seq = 0;   // the length run: cfg.seq padded to what the ranks divide
};

// Collective over `world` (which moves only host memory): makes each rank's device and its
// communicator (make_rank_device; refusals stop every rank together), runs the block, and
// agrees the figures over the world. Any cfg.seq runs: padded (padded_config) with zero inputs and
// gradients on the padding, which the mask keeps every real token from seeing; --dump writes
// the cfg.seq real rows. Throws untied::Error on failure (budget included).
// GPU times are taken with the device synchronized before each clock read.
AttnRunResult run_attention(Communicator& world, const AttentionConfig& cfg, const AttnRunOptions& opts);

// Head presets: "llama3-8b" (H 32, G 8, D 128, E 4096), "qwen3-32b" (H 64, G 8, D 128, E 5120).
Status apply_heads_preset(const std::string& name, AttentionConfig* cfg);

// The paper's closed forms for attention intermediates on one rank, bytes (element size es):
// MHA-style 6*es*L*U*D (QKV projections + their all-to-all buffers, K/V counted with U heads),
// and the exact GQA count es*2*L*D*(U + 2*C*w) (projections and receive buffers of q, k, v at
// the first stage of a KV round; U = H, w = G/C for Ulysses).
int64_t paper_mha_bytes(const AttentionConfig& cfg, int ranks, int64_t stage_heads);
int64_t gqa_exact_bytes(const AttentionConfig& cfg, int ranks, int64_t stage_heads);

// Creates `dir` if needed and checks that it is a writable directory (before any compute).
Status prepare_dump_dir(const std::string& dir);

}  // namespace untied::cli
