// The device under test on the emulated GPU (device_under_test.h): the backend's own CudaDevice
// over the emulated runtime (emu/). Compiled with emu_runtime.h force-included, for its
// schedule options and instruction counts.
#include <cstdlib>
#include <string>

#include "common/gpu.h"
#include "ops/device_under_test.h"

namespace untied::ops {
namespace {

struct Run {
  emu::Options options;
  std::string name;
};

std::string sweep_env() {
  const char* e = std::getenv("UNTIED_EMU_SWEEP");
  return e != nullptr ? e : "";
}

std::vector<Run> runs(bool one_schedule) {
  const std::string sweep = sweep_env();
  std::vector<Run> r;
  if (sweep.empty() || sweep == "0") {
    r.push_back({{.schedule = emu::Schedule::kLanesReverse, .eager_copies = false}, ""});
    if (!one_schedule) {
      r.push_back({{.schedule = emu::Schedule::kWarpsRandom, .eager_copies = true, .seed = 7}, ""});
      r.push_back({{.schedule = emu::Schedule::kWarpsForward, .eager_copies = false}, ""});
    }
  } else {
    for (const emu::Schedule s : emu::kAllSchedules)
      for (const bool eager : {false, true}) r.push_back({{.schedule = s, .eager_copies = eager}, ""});
  }
  for (Run& x : r)
    x.name = std::string(emu::schedule_name(x.options.schedule)) +
             (x.options.eager_copies ? ", copies at issue" : ", copies at the wait");
  return r;
}

}  // namespace

bool emulated() { return true; }

std::unique_ptr<Device> make_device_under_test(std::string* why) {
  *why = test::gpu_unavailable();
  if (!why->empty()) return nullptr;
  return test::gpu_device();
}

std::vector<std::string> schedules(bool one_schedule) {
  std::vector<std::string> names;
  for (const Run& r : runs(one_schedule)) names.push_back(r.name);
  return names;
}

void use_schedule(size_t i, bool one_schedule) { emu::g_options = runs(one_schedule).at(i).options; }

bool sweep_cases() {
  const std::string s = sweep_env();
  return !s.empty() && s != "0" && s != "quick";
}

// The emulator presents compute capability `major` as a device of its own (emu_cuda_api.cc);
// 0 goes back to GPU 0.
void set_compute_capability(int major) {
  if (major > 0) {
    emu::set_compute_capability(major);
  } else {
    cudaSetDevice(0);
  }
}

long long tensor_core_ops() { return emu::g_mma_ops + emu::g_wgmma_ops; }

}  // namespace untied::ops
