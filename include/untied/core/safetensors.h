// Safetensors files (the Hugging Face weight format): open and validate, read any element range of
// a tensor as float32, and write.
//
// Layout: an unsigned little-endian 64-bit header size N; N bytes of JSON,
//   {"NAME": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}   (the metadata is optional, strings only)
// then the data: each tensor's bytes (row-major, little-endian) at [8 + N + begin, 8 + N + end).
//
// open() validates before anything is read (each failure names the file and the tensor or key):
// the file is at least 8 bytes; N is at most 100 MB and inside the file; the header is a JSON
// object of tensor entries; every dtype is known (F64, F32, F16, BF16, I64, I32, I16, I8, U8,
// BOOL); every shape is non-negative; end - begin equals the element count times the element size;
// the tensors, in offset order, tile the data exactly (no gap, no overlap, nothing past the end of
// the file). read() fetches only the bytes of the requested elements (pread; never the whole
// file) and converts F32, BF16, F16 and F64 to float32; other dtypes are refused.
// A SafetensorsFile is immutable after open: read() may be called from several threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "untied/core/status.h"

namespace untied {

struct SafetensorsEntry {
  std::string dtype;            // "BF16", "F32", ...
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;   // byte offsets in the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Null when the file has no tensor of that name.
  const SafetensorsEntry* find(const std::string& name) const;

  // out[i] = element first + i of tensor `name` (row-major), as float32, for i < count.
  // Errors: not_found (no such tensor), unsupported (a dtype that is not F32, BF16, F16 or F64),
  // invalid_argument (the range is outside the tensor), io_error / corrupt (the read failed, the
  // file shrank since open).
  Status read(const std::string& name, int64_t first, int64_t count, float* out) const;

 private:
  SafetensorsFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;  // 8 + N
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: float32 values stored as `dtype` ("F32", "BF16" (rounded to nearest even)
// or "F16").
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // shape's element count of values
};

// Writes a file tensor by tensor, so that a large model never needs to be in memory at once: the
// header (from every tensor's name, dtype and shape, in order) goes out first, then each tensor's
// values as add() is called in the same order; finish() renames the temporary over `path`.
class SafetensorsWriter {
 public:
  // invalid_argument for an unknown dtype or a repeated or empty name; io_error when the
  // temporary cannot be created.
  static StatusOr<SafetensorsWriter> create(const std::string& path, const std::vector<SafetensorsTensor>& specs,
                                            const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&&) noexcept;
  ~SafetensorsWriter();
  // The next tensor's values (its shape's element count of them). REQUIRES: in the specs' order.
  Status add(const std::string& name, const float* data);
  Status finish();

 private:
  SafetensorsWriter() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes the tensors (in the order given) and the metadata to path, atomically (a temporary file
// renamed over the target). invalid_argument for an unknown dtype or a repeated or empty name;
// io_error when the file cannot be written.
Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace untied
