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

// Collective. Writes step `step` of `params` under `dir` (created if needed). A non-finite weight
// or moment is not saved: the save fails on every rank (the previous checkpoint stays), naming the
// parameter and the rank.
Status save_checkpoint(Communicator& comm, const std::string& dir, int64_t step, const std::string& identity,
                       const ShardedParams& params);

// Collective. Reads a checkpoint of `dir` into `params` (master weights and AdamW moments) and
// returns its step: step `step_wanted`, or (0) the one `latest` names; where that one is damaged (a
// rank file missing, truncated or failing its checksum), the newest intact step, with a line per
// step skipped and why in *notes. The checkpoint may have been written at any rank count, with any
// strategy, ring or U (identity: what must match, the layout's words aside): where its rank count
// differs from comm's, each rank reads its new shard of every parameter from the files that hold
// it (*notes says so). A non-ok Status, the same on every rank, when no step can be read (a
// checkpoint of another configuration is never passed over for an older one); `params` is
// untouched then. A non-finite value read is an error naming the parameter.
StatusOr<int64_t> load_checkpoint(Communicator& comm, const std::string& dir, const std::string& identity,
                                  ShardedParams& params, int64_t step_wanted = 0, std::string* notes = nullptr);

// The model's part of a run's identity: its shapes, RoPE and norms ("V=.. E=.. N=.. ..."), which a
// checkpoint records and a reader of it checks against the model it is told.
std::string model_identity(const ModelConfig& m);

// Removes all but the newest `keep` step directories of dir (never the one `latest` names).
// Not collective: one rank calls it after a save.
Status remove_old_checkpoints(const std::string& dir, int64_t keep);

// True when `dir` holds a `latest` file.
bool checkpoint_exists(const std::string& dir);

// One job per checkpoint directory: an exclusive flock on DIR/lock (created with dir where
// missing), which records its holder (host, process, run id, start time), held until the lock is
// dropped or the process ends (a killed job's lock goes with it). acquire() fails at once where
// another job holds it, naming that job. Move-only.
class CheckpointLock {
 public:
  CheckpointLock() = default;
  static StatusOr<CheckpointLock> acquire(const std::string& dir);
  CheckpointLock(CheckpointLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  CheckpointLock& operator=(CheckpointLock&& o) noexcept;
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;
  ~CheckpointLock();

 private:
  int fd_ = -1;
};

// A checkpoint's master weights, read at any rank count (evaluation, export): the rank files of
// the step `latest` names. open() validates every file's structure (magic, version, world size,
// rank, step, identity and parameter table equal in all files, exact file size) and, with
// verify, its checksum too (a full read of every file; export does it, evaluation does not).
// read() fetches elements of a parameter's full tensor from the files that hold them, by pread
// of just those bytes. Thread-safe after open (in-process ranks share one).
class CheckpointWeights {
 public:
  // step_wanted 0: the step `latest` names (which must be a step directory inside dir).
  static StatusOr<CheckpointWeights> open(const std::string& dir, bool verify, int64_t step_wanted = 0);
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
  // The same of part 0 (the master weights), 1 (AdamW's m) or 2 (its v).
  Status read_part(int i, int part, int64_t numel, int64_t first, int64_t count, float* out) const;

 private:
  CheckpointWeights();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fills every parameter's shard (master copies; moments zero) on this rank from w. REQUIRES:
// w.check(the model).ok(). Returns the first read error.
Status load_checkpoint_weights(const CheckpointWeights& w, ShardedParams& params);

}  // namespace untied
