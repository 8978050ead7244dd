// The device under test on a real GPU (device_under_test.h): GPU 0 when one is visible.
#include "common/gpu.h"
#include "ops/device_under_test.h"

namespace untied::ops {

bool emulated() { return false; }

std::unique_ptr<Device> make_device_under_test(std::string* why) {
  *why = test::gpu_unavailable();
  if (!why->empty()) return nullptr;
  return test::gpu_device();
}

std::vector<std::string> schedules(bool) { return {"gpu"}; }
void use_schedule(size_t, bool) {}
bool sweep_cases() { return false; }
void set_compute_capability(int) {}
long long tensor_core_ops() { return -1; }

}  // namespace untied::ops
