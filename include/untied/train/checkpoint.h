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
// checksum) and reports what differs; nothing is modified unless every rank's file is good. Then
// each rank reads its file a parameter at a time: a process never stages more than one
// parameter's state per rank in host memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "untied/comm/communicator.h"
#include "untied/core/status.h"
#include "untied/dist/sharded_params.h"
#include "untied/model/model_config.h"

namespace untied {

// Collective. Writes step `step` of `params` under `dir` (created if needed).
Status save_checkpoint(Communicator& comm, const std::string& dir, int64_t step, const std::string& identity,
                       const ShardedParams& params);

// Collective. Reads the checkpoint `latest` points to into `params` and returns its step; a
// non-ok Status (the same on every rank) when any rank's file is missing, corrupt or from
// another run. `params` is untouched on failure.
StatusOr<int64_t> load_checkpoint(Communicator& comm, const std::string& dir, const std::string& identity,
                                  ShardedParams& params);

// The model's part of a run's identity: its shapes, RoPE and norms ("V=.. E=.. N=.. ..."), which a
// checkpoint records and a reader of it checks against the model it is told.
std::string model_identity(const ModelConfig& m);

// Removes all but the newest `keep` step directories of dir (never the one `latest` names).
// Not collective: one rank calls it after a save.
Status remove_old_checkpoints(const std::string& dir, int64_t keep);

// True when `dir` holds a `latest` file.
bool checkpoint_exists(const std::string& dir);

// A checkpoint's master weights, read at any rank count (evaluation, export): the rank files of
// the step `latest` names. open() validates every file's structure (magic, version, world size,
// rank, step, identity and parameter table equal in all files, exact file size) and, with
// verify, its checksum too (a full read of every file; export does it, evaluation does not).
// read() fetches elements of a parameter's full tensor from the files that hold them, by pread
// of just those bytes. Thread-safe after open (in-process ranks share one).
class CheckpointWeights {
 public:
  static StatusOr<CheckpointWeights> open(const std::string& dir, bool verify);
  CheckpointWeights(CheckpointWeights&&) noexcept;
  CheckpointWeights& operator=(CheckpointWeights&&) noexcept;
  ~CheckpointWeights();

  int64_t step() const;
  int world() const;  // the ranks that wrote it
  const std::string& identity() const;
  // The checkpoint is of model m: the model its identity records is m's (model_identity), and the
  // parameters match (names in order, shard lengths ceil(numel / world)); the message says what
  // differs.
  Status check(const ModelConfig& m) const;
  // out = elements [first, first + count) of parameter i's full (unsharded) tensor, whose numel
  // is `numel`. REQUIRES: check(descs).ok(), 0 <= first, first + count <= numel.
  Status read(int i, int64_t numel, int64_t first, int64_t count, float* out) const;

 private:
  CheckpointWeights();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fills every parameter's shard (master copies; moments zero) on this rank from w. REQUIRES:
// w.check(the model).ok(). Returns the first read error.
Status load_checkpoint_weights(const CheckpointWeights& w, ShardedParams& params);

}  // namespace untied
