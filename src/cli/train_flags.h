// The flags of `untied train`, shared with `untied plan` (which plans the step they describe), and
// the rehearsal both use.
#pragma once

#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/rank_device.h"
#include "untied/train/data.h"
#include "untied/train/trainer.h"

namespace untied::cli {

void add_train_flags(FlagSet& f);
// The options the flags give for `ranks` ranks per node; the message names the flag to change.
Status options_from_flags(const FlagSet& f, int ranks, TrainOptions* o, DataOptions* d, DeviceChoice* device);
// " x ring 2 (4 ranks per group)", or "" without a ring.
std::string ring_note(const AttentionConfig& c, int ranks);
// The rehearsal's peaks as `train --rehearsal` prints them.
void print_peaks(const TrainOptions& o, int ranks, const MemoryStats& m, int64_t host_peak,
                 const std::vector<LiveBuffers>& live);
// One rehearsed step of o at `seq` on `ranks` in-process ranks: false when it does not fit
// o.budget_bytes (or o is not valid there); the peaks (max over ranks), the host peak and rank 0's
// buffers at its peak otherwise.
bool rehearse_fits(TrainOptions o, const DataSource& data, int ranks, int64_t seq, MemoryStats* peak, int64_t* host,
                   std::vector<LiveBuffers>* live);

}  // namespace untied::cli
