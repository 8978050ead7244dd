// The device under test of the cross-backend op test and what only the emulated GPU can do:
// thread schedules, another compute capability, a count of tensor-core instructions. Two
// implementations: device_under_test_gpu.cc (a real GPU, or none: the plain build) and
// device_under_test_emu.cc (the emulated GPU of emu/, built in tests/cuda_emu, with the emulator's
// runtime force-included).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "untied/device/device.h"

namespace untied::ops {

// True in the emulated build (the device under test is the emulated GPU).
bool emulated();
// Null, with *why set, where there is no device under test (no GPU visible, no CUDA backend).
std::unique_ptr<Device> make_device_under_test(std::string* why);

// The thread schedules to run each case under (names for the log). A real GPU has one: its own.
// The emulated GPU: the default three (lanes in reverse order with cp.async copies landing only
// at the wait; warps one at a time in a random order with copies landing at issue; warps one at a
// time in order, copies at the wait: the warp-at-a-time ones catch a missing __syncthreads), or,
// with UNTIED_EMU_SWEEP=1 (or =quick) in the environment, every schedule with copies deferred
// and eager.
std::vector<std::string> schedules(bool one_schedule);
void use_schedule(size_t i, bool one_schedule);
// True where UNTIED_EMU_SWEEP asks for the larger sweep cases (set, and neither "0" nor "quick").
bool sweep_cases();

// The compute capability the device presents to the kernels (0: its own). Emulated GPU only.
void set_compute_capability(int major);
// mma.sync instructions executed so far, or -1 where they cannot be counted (a real GPU).
long long tensor_core_ops();

}  // namespace untied::ops
