// Fuzz target: a safetensors file (header JSON, dtypes, shapes, offsets) opened and read.
#include <algorithm>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "untied/core/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = untied::fuzz::temp_path("model.safetensors");
  untied::fuzz::write_file(path, data, size);
  auto f = untied::SafetensorsFile::open(path);
  if (!f.ok()) return 0;
  std::vector<float> out;
  for (const auto& [name, t] : f.value().tensors()) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    n = std::min<int64_t>(n, 4096);
    out.resize(static_cast<size_t>(n));
    (void)f.value().read(name, 0, n, out.data());
  }
  return 0;
}
