// What rank 0 reports of each training step: one JSON line in the metrics file, and the progress
// line on stderr.
//
// MetricsFile owns the file: it is opened (a resumed run first drops the lines after its
// checkpoint's step, so no step appears twice), written a line at a time (flushed, so that a
// killed run keeps every step it finished), and closed by close() or its destructor. A write that
// fails (a full disk, a file size limit) is reported: write() and close() return the error, which
// names the file and the system's reason. Not thread-safe; one per run, on rank 0.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "untied/core/allocator.h"
#include "untied/core/json.h"
#include "untied/core/status.h"
#include "untied/device/device.h"

namespace untied {

class MetricsFile {
 public:
  MetricsFile() = default;  // no file: write() and close() do nothing
  // Opens `path` for a run that starts after step `resume_step` (0: a new run, the file is
  // truncated; > 0: lines of later steps are dropped, the rest kept and appended to).
  static StatusOr<MetricsFile> open(const std::string& path, int64_t resume_step);

  bool is_open() const { return file_ != nullptr; }
  // Appends `line` (one JSON object) and flushes; the first failure is kept and returned again
  // by every later call.
  Status write(const Json& line);
  // Flushes and closes; the first write error, or the close's own.
  Status close();

 private:
  struct Closer {
    void operator()(std::FILE* f) const;
  };
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
  Status error_;
};

// One step's figures, as its metrics line gives them (times in seconds here, ms in the line).
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, accuracy = -1;  // accuracy < 0: the data has no answers (null)
  double lr = 0, grad_norm = 0, tokens_per_s_per_rank = 0;
  double step_s = 0, data_s = 0, forward_backward_s = 0, optimizer_s = 0;
  const MemoryStats* mem = nullptr;  // peaks since the start of the run, max over ranks
  const OpTimes* ops = nullptr;      // rank 0's kernel ops in this step; null: none timed (a GPU, rehearsal)
};
// {"step", "loss", "accuracy", "lr", "grad_norm", "tokens_per_s_per_rank", "step_ms", "phase_ms",
// ["op_ms",] "peak_bytes_by_tag"}; the trainer adds model_tflops_per_rank, hardware_tflops_per_rank,
// mfu (flops.h), tokens_seen, peak_bytes, data_passes [, epoch] [, eval_*].
Json metrics_line(const StepMetrics& m);

// The progress line of rank 0 (stderr): a bar redrawn in place on a terminal, else about 20
// plain lines per run, each with the loss, the answer accuracy (where the data has answers),
// tokens/s per rank and the time left.
class Progress {
 public:
  // Steps first_step + 1 .. end of a run of `steps` (the bar's scale); on: print at all.
  // accuracy_name: what the accuracy is ("answer acc" for the kv task, "next-token acc" for text).
  Progress(int64_t first_step, int64_t end, int64_t steps, bool on, std::string accuracy_name = "answer acc");
  // After step `step` (1-based) is done.
  void step_done(int64_t step, double loss, double accuracy, double tokens_per_s_per_rank);

 private:
  int64_t first_, end_, steps_;
  bool on_, tty_;
  std::string accuracy_name_;
  double t_begin_;
};

}  // namespace untied
