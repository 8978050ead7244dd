// A run's shapes, derived once: the ranks and how they split (P = R C), the sequence as each rank
// and ring group holds it (S padded to what the ranks divide), the model's dimensions, UPipe's head
// schedule, the decoder's tiles and what its backward keeps in host memory. Every layer above the
// model (the decoder, the memory and time plans, the host-memory figures, train, eval and the
// commands) reads these instead of deriving them again. The letters are docs/glossary.md's.
//
// A value, cheap to copy; a pure function of (model, decoder options, ranks, offload): the same on
// every rank.
#pragma once

#include <cstdint>

#include "untied/attention/attention_block.h"
#include "untied/attention/head_schedule.h"
#include "untied/attention/token_layout.h"
#include "untied/model/decoder_options.h"
#include "untied/model/model_config.h"

namespace untied {

struct RunGeometry {
  // Ranks: P in all, R ring groups of C (the Ulysses degree; C = 1 for the ring strategy).
  int64_t P = 0, C = 0, R = 0;
  // Sequence: S as asked; Sp padded to what the ranks divide (the padding is masked and counted
  // in no loss); L = Sp / P rows per rank; Sg = C L rows per ring group (the head-sharded buffers'
  // rows: S without a ring).
  int64_t S = 0, Sp = 0, L = 0, Sg = 0;
  // Model: width, query and KV heads, head dim, MLP width, vocabulary, blocks.
  int64_t E = 0, H = 0, G = 0, D = 0, F = 0, V = 0, N = 0;
  DType dtype = DType::kF32;  // the blocks' storage
  int64_t es = 0;             // bytes per element of dtype
  AttentionConfig attention;  // every block's attention, padded (padded_config)
  TokenLayout layout{0, 1, 1};  // which positions each rank holds (token_layout.h)
  HeadSchedule sched;         // stages of U = sched.stage_heads heads (one stage but for upipe)
  int64_t mlp_tile = 0;       // rows per MLP tile (decoder_tiles)
  int64_t attn_tile = 0;      // rows per tile of the attention's input; 0: made whole
  bool offload = false;       // block inputs may go to host memory (a host allocator exists)
  int64_t offloaded_blocks = 0;  // how many blocks' inputs do (0 without offload)
  HostParts host;             // what else waits in host memory in a block's backward (host_parts)
  bool selective = false;     // Recompute::kSelective: each block's attention output and LSE kept
  // upipe: the recompute keeps its last stage for the backward (KeepLastStage kOn, or kAuto as the
  // Decoder takes it; never with a selective recompute, which projects no stage).
  bool keep_last = false;
  // A mixture of experts whose experts are spread over the ranks (experts_parallel).
  bool experts_parallel = false;
};

// REQUIRES: validate(m, o, ranks).ok() (so o.recompute is resolved: not kAuto). offload: the run
// has a host allocator for block inputs (--offload-inputs).
RunGeometry run_geometry(const ModelConfig& m, const DecoderOptions& o, int ranks, bool offload);

}  // namespace untied
