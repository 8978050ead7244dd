// Checkpoints: each rank writes its own shard of the fp32 master weights and AdamW moments.
//
// Layout: DIR/step_NNNNNNNN/rank_RRRRR.bin, and DIR/latest naming the newest complete step.
// A rank file is: magic "UNTIEDCK", format version, world size, rank, step, the run's identity
// text (model shapes, sequence length, dtype: what must match to resume), then per parameter
// its name, shard length and the master / m / v shards, and an FNV-1a 64 checksum of all that
// precedes it. Every file is written to a temporary name, flushed to disk (fsync) and renamed,
// and its directory flushed; `latest` is replaced the same way only after every rank has
// written its file, so a crash mid-save (process or OS) leaves the previous checkpoint intact.
// The checksum is verified before any field is read, so damage reads as damage.
// Loading checks everything (magic, version, world size, rank, identity, names, sizes,
// checksum) and reports what differs; nothing is modified unless every rank's file is good.
#pragma once

#include <string>

#include "untied/comm/communicator.h"
#include "untied/core/status.h"
#include "untied/dist/sharded_params.h"

namespace untied {

// Collective. Writes step `step` of `params` under `dir` (created if needed).
Status save_checkpoint(Communicator& comm, const std::string& dir, int64_t step, const std::string& identity,
                       const ShardedParams& params);

// Collective. Reads the checkpoint `latest` points to into `params` and returns its step; a
// non-ok Status (the same on every rank) when any rank's file is missing, corrupt or from
// another run. `params` is untouched on failure.
StatusOr<int64_t> load_checkpoint(Communicator& comm, const std::string& dir, const std::string& identity,
                                  ShardedParams& params);

// True when `dir` holds a `latest` file.
bool checkpoint_exists(const std::string& dir);

}  // namespace untied
