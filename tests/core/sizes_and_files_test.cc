// Sizes that cannot lie and inputs that are not files: a product of counts past int64 is an
// error naming what was sized (never a wrapped count), and a path that is not a regular file (a
// FIFO, a device, a directory) is refused without blocking on it or reading it without end.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/expect_error.h"
#include "untied/core/allocator.h"
#include "untied/core/checked_math.h"
#include "untied/core/file_io.h"
#include "untied/core/tensor.h"

namespace untied {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedMath, ProductsPastInt64HaveNoValue) {
  EXPECT_EQ(checked_mul(1 << 20, 1 << 20).value_or(-1), int64_t{1} << 40);
  EXPECT_EQ(checked_mul(kMax, 1).value_or(-1), kMax);
  EXPECT_EQ(checked_mul(0, kMax).value_or(-1), 0);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 31).has_value());  // 2^63
  EXPECT_FALSE(checked_mul(kMax / 2 + 1, 2).has_value());
  EXPECT_FALSE(checked_mul(-1, 5).has_value());
  EXPECT_TRUE(testing::throws_error([] { mul_or_throw(int64_t{1} << 40, int64_t{1} << 40, "the bytes of x"); },
                                    ErrorKind::kInvalidArgument, {"the bytes of x", "does not fit"}));
}

// A shape whose element count wraps (2^56 x 2^8 = 2^64 = 0 in 64-bit arithmetic) is refused,
// naming the shape, before any allocation: no small buffer for a huge tensor.
TEST(CheckedMath, ShapesAndBuffersPastInt64AreRefused) {
  const Shape wraps{int64_t{1} << 56, int64_t{1} << 8};
  EXPECT_TRUE(testing::throws_error([&] { (void)wraps.numel(); }, ErrorKind::kInvalidArgument, {"elements of shape"}));
  Allocator alloc(make_counting_memory(), Allocator::Options{});
  // 2^61 elements of 4 bytes: the element count fits, the bytes do not.
  EXPECT_TRUE(testing::throws_error([&] { TensorBuffer b(alloc, DType::kF32, {int64_t{1} << 61}, Tag::kOther, "huge"); },
                                    ErrorKind::kInvalidArgument, {"the bytes of 'huge'"}));
  EXPECT_EQ(alloc.stats().num_allocations, 0);
}

TEST(RegularFiles, WhatIsNotOneIsRefusedWithoutBlocking) {
  const std::string dir = ::testing::TempDir() + "untied_files_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/pipe", file = dir + "/small.txt", big = dir + "/big.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(file) << "name = value\n";
  std::ofstream(big) << std::string(4096, 'x');
  // (A FIFO with no writer would block a plain open for ever: here it returns at once.)
  auto r = read_regular_file(fifo, 1 << 20, "--config");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--config " + fifo + " is a FIFO"), std::string::npos) << r.status().message();
  r = read_regular_file("/dev/zero", 1 << 20, "text file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is a character device"), std::string::npos) << r.status().message();
  r = read_regular_file(dir, 1 << 20, "token file");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is a directory"), std::string::npos) << r.status().message();
  r = read_regular_file(dir + "/missing", 1 << 20, "--config");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kNotFound);
  r = read_regular_file(big, 1024, "--config");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than the 1.00 KiB"), std::string::npos) << r.status().message();
  r = read_regular_file(file, 1024, "--config");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value(), "name = value\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace untied
