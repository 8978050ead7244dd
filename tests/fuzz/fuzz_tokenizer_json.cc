// Fuzz target: a tokenizer.json loaded, and (when it loads) a short text encoded and decoded.
#include <string>
#include <utility>

#include "untied/train/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto loaded = untied::HfTokenizer::from_json(std::string(reinterpret_cast<const char*>(data), size), "tokenizer.json");
  if (!loaded.ok()) return 0;
  untied::HfTokenizer t = std::move(loaded).value();
  const std::vector<int32_t> ids = t.encode("Hello, world! 123 \xe4\xb8\xad\xe6\x96\x87  \n\n<|endoftext|>");
  (void)t.decode(ids);
  return 0;
}
