// Fuzz target: a checkpoint rank file (header, identity, parameter table, data, checksum) opened
// as a one-rank checkpoint, checked against a tiny model and read.
#include <fstream>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "untied/model/model_config.h"
#include "untied/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = untied::fuzz::temp_path("ck");
  std::filesystem::create_directories(dir + "/step_00000001");
  std::ofstream(dir + "/latest") << "step_00000001\n";
  untied::fuzz::write_file(dir + "/step_00000001/rank_00000.bin", data, size);
  for (bool verify : {false, true}) {
    auto w = untied::CheckpointWeights::open(dir, verify);
    if (!w.ok()) continue;
    untied::ModelConfig m = untied::model_preset("tiny").value();
    m.vocab = 16, m.layers = 1;
    if (!w.value().check(m).ok()) continue;
    std::vector<float> out(16);
    (void)w.value().read(0, 16 * m.hidden, 0, 16, out.data());
  }
  return 0;
}
