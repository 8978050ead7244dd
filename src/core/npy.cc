#include "untied/core/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>

namespace untied {

Status write_npy(const std::string& path, const std::vector<int64_t>& shape, const float* data) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::io_error("cannot write " + tmp + ": check that the directory exists and is writable");
    const unsigned char pre[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    f.write(reinterpret_cast<const char*>(pre), 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    const unsigned char lenb[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
    f.write(reinterpret_cast<const char*>(lenb), 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * 4));
    if (!f) return Status::io_error("short write to " + tmp + " (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Status::io_error("cannot rename " + tmp + " to " + path);
  return Status::ok_status();
}

Status read_npy(const std::string& path, std::vector<int64_t>* shape, std::vector<float>* data) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::not_found("cannot open " + path);
  unsigned char pre[10];
  f.read(reinterpret_cast<char*>(pre), 10);
  if (!f || std::memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] != 1)
    return Status::corrupt(path + " is not a version 1 .npy file");
  const size_t len = pre[8] | (static_cast<size_t>(pre[9]) << 8);
  std::string header(len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(len));
  if (!f) return Status::corrupt(path + ": truncated header");
  if (header.find("'descr': '<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    return Status::corrupt(path + ": only little-endian float32 C-order arrays are supported");
  auto open = header.find("'shape': (");
  auto close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return Status::corrupt(path + ": no shape in header");
  shape->clear();
  int64_t n = 1;
  std::string dims = header.substr(open + 10, close - open - 10);
  size_t pos = 0;
  while (pos < dims.size()) {
    size_t comma = dims.find(',', pos);
    std::string item = dims.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? dims.size() : comma + 1;
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    const int64_t d = std::stoll(item);
    if (d < 0) return Status::corrupt(path + ": negative dimension");
    shape->push_back(d);
    n *= d;
  }
  data->resize(static_cast<size_t>(n));
  f.read(reinterpret_cast<char*>(data->data()), static_cast<std::streamsize>(n * 4));
  if (!f) return Status::corrupt(path + ": data shorter than its shape says");
  return Status::ok_status();
}

}  // namespace untied
