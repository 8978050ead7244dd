// Fuzz target: a Hugging Face config.json parsed into a model.
#include <string>

#include "untied/model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)untied::parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
  return 0;
}
