// Small helpers shared by the model kernel tests (the comparison itself is
// tests/kernels/test_util.h: expect_close, make_budget, Stored).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "untied/core/check.h"
#include "untied/device/device.h"

namespace untied::test {

inline std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }
inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

inline std::unique_ptr<Device> cpu(int threads = 2) {
  return make_cpu_device(CpuDeviceOptions{.threads = threads});
}
inline std::unique_ptr<Device> rehearsal() {
  return make_cpu_device(CpuDeviceOptions{.threads = 2, .rehearsal = true});
}

// Expects `call` to throw Error(kInvalidArgument) whose message contains `field`.
inline void expect_invalid(const std::function<void()>& call, const std::string& field) {
  SCOPED_TRACE("field " + field);
  try {
    call();
    ADD_FAILURE() << "accepted a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos)
        << "message does not name `" << field << "`: " << e.what();
  }
}

}  // namespace untied::test
