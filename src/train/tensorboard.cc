#include "untied/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace untied {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

uint32_t masked_crc(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol buffer wire format: a key is (field << 3) | wire type.
void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void put_double(std::string* out, int field, double v) {  // wire type 1: 64 bits
  put_varint(out, static_cast<uint64_t>(field) << 3 | 1);
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_le(out, bits, 8);
}
void put_float(std::string* out, int field, float v) {  // wire type 5: 32 bits
  put_varint(out, static_cast<uint64_t>(field) << 3 | 5);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_le(out, bits, 4);
}
void put_int(std::string* out, int field, int64_t v) {  // wire type 0: varint
  put_varint(out, static_cast<uint64_t>(field) << 3 | 0);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string* out, int field, std::string_view v) {  // wire type 2: length-delimited
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, v.size());
  out->append(v);
}

void flatten(const Json& j, const std::string& prefix, std::vector<std::pair<std::string, double>>* out) {
  for (const auto& [key, value] : j.items()) {
    const std::string tag = prefix.empty() ? key : prefix + "/" + key;
    if (prefix.empty() && key == "step") continue;
    if (value.is_object()) flatten(value, tag, out);
    else if (value.is_number()) out->emplace_back(tag, value.get<double>());
  }
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char ch : data) crc = kCrcTable[(crc ^ static_cast<unsigned char>(ch)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

StatusOr<TensorBoardWriter> TensorBoardWriter::open(const std::string& dir, double wall_time) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error("cannot create the TensorBoard directory " + dir + ": " + ec.message());
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  TensorBoardWriter w;
  w.path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time)) + "." + host + ".untied";
  w.file_.reset(std::fopen(w.path_.c_str(), "wb"));
  if (w.file_ == nullptr)
    return Status::io_error("cannot write the TensorBoard file " + w.path_ + ": " + std::strerror(errno));
  std::string event;
  put_double(&event, 1, wall_time);
  put_bytes(&event, 3, "brain.Event:2");
  if (Status s = w.write_record(event); !s.ok()) return s;
  return w;
}

Status TensorBoardWriter::add_scalars(int64_t step, double wall_time,
                                      const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(&v, 1, tag);
    put_float(&v, 2, static_cast<float>(value));
    put_bytes(&summary, 1, v);
  }
  std::string event;
  put_double(&event, 1, wall_time);
  put_int(&event, 2, step);
  put_bytes(&event, 5, summary);
  return write_record(event);
}

Status TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  put_le(&record, data.size(), 8);
  put_le(&record, masked_crc(record), 4);
  record += data;
  put_le(&record, masked_crc(data), 4);
  errno = 0;
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size() || std::fflush(file_.get()) != 0)
    return Status::io_error("cannot write the TensorBoard file " + path_ + ": " +
                            (errno != 0 ? std::strerror(errno) : "write failed") +
                            " (free space there, or give --tensorboard another directory)");
  return Status::ok_status();
}

std::vector<std::pair<std::string, double>> metrics_scalars(const Json& line) {
  std::vector<std::pair<std::string, double>> out;
  flatten(line, "", &out);
  return out;
}

}  // namespace untied
