// Fuzz target: a token file (header, widths, vocab, the document index) opened and read.
#include <algorithm>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "untied/train/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = untied::fuzz::temp_path("data.tok");
  untied::fuzz::write_file(path, data, size);
  auto f = untied::TokenFile::open(path);
  if (!f.ok()) return 0;
  const int64_t n = std::min<int64_t>(f.value().size(), 4096);
  std::vector<int32_t> out(static_cast<size_t>(n));
  (void)f.value().read(0, n, out.data());
  return 0;
}
