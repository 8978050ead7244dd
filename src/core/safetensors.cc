// Safetensors reading and writing (safetensors.h).
#include "untied/core/safetensors.h"

#include "untied/core/checked_math.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "untied/core/check.h"
#include "untied/core/file_io.h"
#include "untied/core/dtype.h"
#include "untied/core/json.h"

namespace untied {
namespace {

constexpr int64_t kMaxHeaderBytes = 100'000'000;

// Bytes per element of a safetensors dtype; 0 for an unknown one.
int64_t element_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

float f16_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);                 // subnormal or zero
  else if (exp == 31) v = man ? std::numeric_limits<float>::quiet_NaN() : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return sign ? -v : v;
}

uint16_t float_to_f16(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00);  // overflows to infinity
  if (a < 6.103515625e-05f) {                                       // subnormal: units of 2^-24
    const float units = std::nearbyint(a * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  float mant = std::nearbyint((m * 2.0f - 1.0f) * 1024.0f);  // 10 fraction bits
  int exp = e - 1 + 15;
  if (mant == 1024.0f) {
    mant = 0;
    ++exp;
  }
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | static_cast<uint32_t>(mant));
}


}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d).value_or(-1);  // -1: a shape no file could hold
  return n;
}

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  StatusOr<int> opened = open_regular_file(path, "safetensors file");  // (a FIFO or a device: refused)
  if (!opened.ok()) return opened.status();
  const int fd = opened.value();
  SafetensorsFile f(path, fd);  // owns fd from here
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::io_error("cannot stat " + path);
  const int64_t size = st.st_size;
  auto corrupt = [&](const std::string& why) {
    return Status::corrupt(path + " is not a valid safetensors file: " + why +
                           "; re-download or re-export it");
  };
  if (size < 8) return corrupt("shorter than the 8-byte header size (" + std::to_string(size) + " bytes)");
  unsigned char nb[8];
  if (pread_all(fd, nb, 8, 0) != 0) return Status::io_error("cannot read " + path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(nb[i]) << (8 * i);
  if (n > static_cast<uint64_t>(kMaxHeaderBytes) || static_cast<int64_t>(n) > size - 8)
    return corrupt("the header size " + std::to_string(n) + " is larger than the file (" + std::to_string(size) +
                   " bytes) or than 100 MB (truncated?)");
  std::string text(n, '\0');
  if (n > 0 && pread_all(fd, text.data(), n, 8) != 0) return Status::io_error("cannot read the header of " + path);
  Json h;
  try {
    h = Json::parse(text);
  } catch (const std::exception& e) {
    return corrupt(std::string("the header is not JSON (") + e.what() + ")");
  }
  if (!h.is_object()) return corrupt("the header is not a JSON object");
  f.data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_bytes = size - f.data_start_;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const Json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) return corrupt("__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) return corrupt("__metadata__." + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      return corrupt("tensor '" + name + "' lacks a dtype string, a shape list or two data_offsets");
    SafetensorsEntry t;
    t.dtype = e["dtype"].get<std::string>();
    const int64_t es = element_bytes(t.dtype);
    if (es == 0) return corrupt("tensor '" + name + "' has the unknown dtype '" + t.dtype + "'");
    for (const Json& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return corrupt("tensor '" + name + "' has a bad shape");
      t.shape.push_back(d.get<int64_t>());
    }
    const Json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return corrupt("tensor '" + name + "' has non-integer data_offsets");
    t.begin = off[0].get<int64_t>();
    t.end = off[1].get<int64_t>();
    if (t.begin < 0 || t.end < t.begin || t.end > data_bytes)
      return corrupt("tensor '" + name + "' has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                     "] outside the " + std::to_string(data_bytes) + " data bytes (truncated?)");
    const std::optional<int64_t> need = checked_mul(t.numel(), es);
    if (!need) return corrupt("tensor '" + name + "' has a shape whose size does not fit a 64-bit count");
    if (t.end - t.begin != *need)
      return corrupt("tensor '" + name + "' spans " + std::to_string(t.end - t.begin) + " bytes, but its shape and " +
                     t.dtype + " need " + std::to_string(*need));
    f.tensors_.emplace(name, std::move(t));
  }
  // The tensors must tile the data: sorted by offset, each starts where the previous one ends.
  std::vector<std::pair<int64_t, const std::string*>> order;
  for (const auto& [name, t] : f.tensors_) order.emplace_back(t.begin, &name);
  std::sort(order.begin(), order.end());
  int64_t at = 0;
  for (const auto& [begin, name] : order) {
    const SafetensorsEntry& t = f.tensors_.at(*name);
    if (t.begin != at)
      return corrupt("tensor '" + *name + "' starts at byte " + std::to_string(t.begin) + " of the data, not at " +
                     std::to_string(at) + (t.begin < at ? " (it overlaps the previous tensor)" : " (a gap)"));
    at = t.end;
  }
  if (at != data_bytes)
    return corrupt("the tensors cover " + std::to_string(at) + " of the " + std::to_string(data_bytes) + " data bytes");
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), data_start_(o.data_start_), tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {
  o.fd_ = -1;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
    o.fd_ = -1;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsFile::read(const std::string& name, int64_t first, int64_t count, float* out) const {
  const SafetensorsEntry* t = find(name);
  if (t == nullptr) return Status::not_found(path_ + " has no tensor '" + name + "'");
  if (first < 0 || count < 0 || first + count > t->numel())
    return Status::invalid_argument("elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
                                    ") are outside tensor '" + name + "' (" + std::to_string(t->numel()) + ") of " +
                                    path_);
  const int64_t es = element_bytes(t->dtype);
  if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16" && t->dtype != "F64")
    return Status::unsupported("tensor '" + name + "' of " + path_ + " is " + t->dtype +
                               "; weights must be F32, BF16, F16 or F64");
  if (count == 0) return Status::ok_status();
  std::vector<unsigned char> raw(static_cast<size_t>(count * es));
  const int rc = pread_all(fd_, raw.data(), raw.size(), static_cast<off_t>(data_start_ + t->begin + first * es));
  if (rc < 0) return Status::corrupt(path_ + " ended inside tensor '" + name + "': it was truncated after it was opened");
  if (rc > 0) return Status::io_error("reading tensor '" + name + "' of " + path_ + " failed: " + std::strerror(rc));
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* p = raw.data() + i * es;
    if (t->dtype == "F32") {
      std::memcpy(&out[i], p, 4);
    } else if (t->dtype == "F64") {
      double d;
      std::memcpy(&d, p, 8);
      out[i] = static_cast<float>(d);
    } else {
      const uint16_t h = static_cast<uint16_t>(p[0] | (p[1] << 8));
      out[i] = t->dtype == "BF16" ? bf16_to_float(bf16{h}) : f16_to_float(h);
    }
  }
  return Status::ok_status();
}

struct SafetensorsWriter::Impl {
  std::string path, tmp;
  std::ofstream f;
  std::vector<SafetensorsTensor> specs;
  size_t next = 0;
};

StatusOr<SafetensorsWriter> SafetensorsWriter::create(const std::string& path,
                                                      const std::vector<SafetensorsTensor>& specs,
                                                      const std::map<std::string, std::string>& metadata) {
  Json h = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  int64_t at = 0;
  for (const SafetensorsTensor& t : specs) {
    if (t.name.empty() || t.name == "__metadata__" || h.contains(t.name))
      return Status::invalid_argument("safetensors: tensor name '" + t.name + "' is empty, reserved or repeated");
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      return Status::invalid_argument("safetensors: tensor '" + t.name + "': write F32, BF16 or F16, not " + t.dtype);
    int64_t n = 1;
    for (int64_t d : t.shape) n = mul_or_throw(n, d, "safetensors: tensor '" + t.name + "'");
    const int64_t bytes = mul_or_throw(n, element_bytes(t.dtype), "safetensors: tensor '" + t.name + "'");
    h[t.name] = Json{{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data stays 8-byte aligned
  SafetensorsWriter w;
  w.impl_ = std::make_unique<Impl>();
  Impl& x = *w.impl_;
  x.path = path;
  x.tmp = path + ".tmp";
  x.specs = specs;
  x.f.open(x.tmp, std::ios::binary | std::ios::trunc);
  if (!x.f) return Status::io_error("cannot write " + x.tmp + ": check that the directory exists and is writable");
  unsigned char nb[8];
  for (int i = 0; i < 8; ++i) nb[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  x.f.write(reinterpret_cast<const char*>(nb), 8);
  x.f.write(text.data(), static_cast<std::streamsize>(text.size()));
  return w;
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&&) noexcept = default;

SafetensorsWriter::~SafetensorsWriter() {
  if (impl_ && impl_->f.is_open()) {  // not finished: leave nothing behind
    impl_->f.close();
    std::remove(impl_->tmp.c_str());
  }
}

Status SafetensorsWriter::add(const std::string& name, const float* data) {
  Impl& x = *impl_;
  UNTIED_CHECK(x.next < x.specs.size() && x.specs[x.next].name == name, "safetensors: tensor ", name,
               " added out of order");
  const SafetensorsTensor& t = x.specs[x.next++];
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  const int64_t es = element_bytes(t.dtype);
  std::vector<unsigned char> buf(static_cast<size_t>(n * es));
  for (int64_t i = 0; i < n; ++i) {
    if (es == 4) {
      std::memcpy(buf.data() + 4 * i, &data[i], 4);
    } else {
      const uint16_t v = t.dtype == "BF16" ? float_to_bf16(data[i]).bits : float_to_f16(data[i]);
      buf[2 * i] = static_cast<unsigned char>(v & 0xff);
      buf[2 * i + 1] = static_cast<unsigned char>(v >> 8);
    }
  }
  x.f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  if (!x.f) return Status::io_error("short write to " + x.tmp + " (disk full?)");
  return Status::ok_status();
}

Status SafetensorsWriter::finish() {
  Impl& x = *impl_;
  UNTIED_CHECK(x.next == x.specs.size(), "safetensors: finish() after ", x.next, " of ", x.specs.size(), " tensors");
  x.f.close();
  if (!x.f) return Status::io_error("closing " + x.tmp + " failed (disk full?)");
  if (std::rename(x.tmp.c_str(), x.path.c_str()) != 0) return Status::io_error("cannot rename " + x.tmp + " to " + x.path);
  return Status::ok_status();
}

Status write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  auto created = SafetensorsWriter::create(path, tensors, metadata);
  if (!created.ok()) return created.status();
  SafetensorsWriter w = std::move(created).value();
  for (const SafetensorsTensor& t : tensors) {
    Status s = w.add(t.name, t.data);
    if (!s.ok()) return s;
  }
  return w.finish();
}

}  // namespace untied
