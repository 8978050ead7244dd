// The CPU device: its allocator (host or counting), budget, copies, and the unsupported() error.
#include "untied/device/device.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/expect_error.h"
#include "untied/core/tensor.h"

namespace untied {
namespace {

using testing::throws_error;

TEST(CpuDevice, HostBacked) {
  auto dev = make_cpu_device({.threads = 1});
  EXPECT_EQ(dev->kind(), DeviceKind::kCpu);
  EXPECT_EQ(dev->name(), "cpu (1 thread)");
  EXPECT_EQ(dev->threads(), 1);
  EXPECT_TRUE(dev->backed());
  EXPECT_EQ(dev->allocator().name(), "cpu");
  EXPECT_EQ(dev->allocator().budget_bytes(), 0);

  Buffer a = dev->allocator().allocate(256, Tag::kActivations, "a");
  Buffer b = dev->allocator().allocate(256, Tag::kActivations, "b");
  ASSERT_NE(a.data(), nullptr);
  auto* pa = a.as<unsigned char>();
  for (int i = 0; i < 256; ++i) pa[i] = static_cast<unsigned char>(255 - i);
  dev->copy(b.data(), a.data(), 256);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 256), 0);
  dev->fill_zero(a.data(), 100);
  int64_t wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += pa[i] != (i < 100 ? 0 : static_cast<unsigned char>(255 - i));
  EXPECT_EQ(wrong, 0);
  dev->synchronize();
  EXPECT_EQ(dev->allocator().stats().live[static_cast<int>(Tag::kActivations)], 512);
}

TEST(CpuDevice, NameCountsThreads) {
  auto dev = make_cpu_device({.threads = 2});
  EXPECT_EQ(dev->name(), "cpu (2 threads)");
  EXPECT_EQ(dev->threads(), 2);
}

TEST(CpuDevice, ThreadsMustBePositive) {
  EXPECT_TRUE(throws_error([] { make_cpu_device({.threads = 0}); }, ErrorKind::kInvalidArgument,
                           {"threads must be >= 1", "got 0"}));
}

TEST(CpuDevice, RehearsalCountsWithoutBacking) {
  auto dev = make_cpu_device({.threads = 1, .budget_bytes = 1 << 20, .rehearsal = true});
  EXPECT_FALSE(dev->backed());
  Allocator& alloc = dev->allocator();
  EXPECT_FALSE(alloc.backed());
  EXPECT_EQ(alloc.name(), "cpu-rehearsal");
  EXPECT_EQ(alloc.budget_bytes(), 1 << 20);

  TensorBuffer q(alloc, DType::kBF16, {512, 8, 64}, Tag::kAttnWorkspace, "q");  // 512 KiB
  TensorBuffer w(alloc, DType::kF32, {256, 256}, Tag::kParameters, "w");        // 256 KiB
  EXPECT_EQ(q.data(), nullptr);
  EXPECT_EQ(w.data(), nullptr);
  EXPECT_EQ(q.view().slice0(1, 2).data(), nullptr);
  // Copies and fills are skipped on a rehearsal device (null pointers are fine).
  dev->copy(q.data(), w.data(), 1024);
  dev->fill_zero(q.data(), 1024);

  MemoryStats s = alloc.stats();
  EXPECT_EQ(s.live[static_cast<int>(Tag::kAttnWorkspace)], 512 * 8 * 64 * 2);
  EXPECT_EQ(s.live[static_cast<int>(Tag::kParameters)], 256 * 256 * 4);
  EXPECT_EQ(s.live_total, 768 * 1024);
  // The budget is enforced in rehearsal too: 256 KiB fit exactly, one more byte does not.
  TensorBuffer x(alloc, DType::kF32, {64, 1024}, Tag::kActivations, "x");
  EXPECT_EQ(alloc.stats().live_total, 1 << 20);
  EXPECT_TRUE(throws_error([&] { alloc.allocate(1, Tag::kOther, "one more"); },
                           ErrorKind::kOutOfBudget, {"'one more'", "budget of 1.00 MiB"}));
}

TEST(CpuDevice, Unsupported) {
  auto dev = make_cpu_device({.threads = 1});
  EXPECT_TRUE(throws_error([&] { unsupported(*dev, "fp8_gemm"); }, ErrorKind::kUnsupported,
                           {"cpu (1 thread) does not support fp8_gemm"}));
}

}  // namespace
}  // namespace untied
