// TensorBoard event files: the scalars of a run, written where TensorBoard (and W&B's TensorBoard
// sync) reads them.
//
// The file is DIR/events.out.tfevents.<seconds>.<host>.untied, a sequence of records, each
//     u64 length (little-endian) | u32 masked CRC-32C of those 8 bytes | data | u32 masked CRC-32C of data
// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8), whose data is one serialized Event protocol
// buffer. The first event says the file version ("brain.Event:2"); then one event per step holds
// that step's scalars (Summary.Value: tag and simple_value). Five fields of two messages are all
// that is written, so they are encoded here (wire types 0, 1, 2 and 5) rather than through
// generated protobuf code:
//     Event   1 wall_time (double)  2 step (int64)  3 file_version (string)  5 summary (Summary)
//     Summary 1 value (repeated Value)
//     Value   1 tag (string)  2 simple_value (float)
// Each step's event is flushed to the file when written, so a reader sees a run as it goes; a
// failed write is an error naming the file (never a silent gap).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "untied/core/json.h"
#include "untied/core/status.h"

namespace untied {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of data, continuing from `crc` (0 to start).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

class TensorBoardWriter {
 public:
  // Creates DIR (and its parents) and the event file in it, writing the file-version event at
  // wall_time (seconds since the epoch). io_error naming the path when it cannot.
  static StatusOr<TensorBoardWriter> open(const std::string& dir, double wall_time);
  TensorBoardWriter(TensorBoardWriter&&) noexcept = default;
  TensorBoardWriter& operator=(TensorBoardWriter&&) noexcept = default;

  // One event: the scalars (tag, value) of `step` at wall_time, flushed.
  Status add_scalars(int64_t step, double wall_time, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter() = default;
  Status write_record(const std::string& data);
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file_;
  std::string path_;
};

// The numbers of a metrics line as scalars: each number under its key, a nested object's under
// "key/inner" ("phase_ms/data", "peak_bytes_by_tag/activations"); "step", strings, booleans and
// nulls are left out.
std::vector<std::pair<std::string, double>> metrics_scalars(const Json& line);

}  // namespace untied
