// Small helpers shared by the model kernel tests (the comparisons are tests/common/compare.h:
// expect_close, make_budget, to_float, to_double; strided storage tests/kernels/test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/compare.h"
#include "untied/core/check.h"
#include "untied/device/device.h"

namespace untied::test {

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
