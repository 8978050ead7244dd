// Status and StatusOr.
#include "untied/core/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "core/expect_error.h"

namespace untied {
namespace {

using testing::throws_error;

TEST(Status, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.to_string(), "ok");
  EXPECT_TRUE(Status::ok_status().ok());
  EXPECT_EQ(Status::ok_status().to_string(), "ok");
}

TEST(Status, FactoriesCodesAndText) {
  struct Case {
    Status s;
    Status::Code code;
    const char* text;
  };
  const Case cases[] = {
      {Status::invalid_argument("bad --heads"), Status::Code::kInvalidArgument,
       "invalid argument: bad --heads"},
      {Status::not_found("no file x.bin"), Status::Code::kNotFound, "not found: no file x.bin"},
      {Status::corrupt("bad magic"), Status::Code::kCorrupt, "corrupt: bad magic"},
      {Status::io_error("disk full"), Status::Code::kIoError, "I/O error: disk full"},
      {Status::unsupported("fp8"), Status::Code::kUnsupported, "unsupported: fp8"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.s.ok()) << c.text;
    EXPECT_EQ(c.s.code(), c.code) << c.text;
    EXPECT_EQ(c.s.to_string(), c.text);
  }
  EXPECT_EQ(Status::corrupt("bad magic").message(), "bad magic");
}

TEST(Status, CopyKeepsCodeAndMessage) {
  Status a = Status::not_found("checkpoint step 7");
  Status b = a;
  EXPECT_EQ(b.code(), Status::Code::kNotFound);
  EXPECT_EQ(b.message(), "checkpoint step 7");
  b = Status();
  EXPECT_TRUE(b.ok());
  EXPECT_EQ(a.message(), "checkpoint step 7");
}

StatusOr<int> half(int x) {
  if (x % 2 != 0) return Status::invalid_argument("odd: " + std::to_string(x));
  return x / 2;
}

TEST(StatusOr, ValueAndError) {
  StatusOr<int> v = half(10);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(v.value(), 5);

  StatusOr<int> e = half(7);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "odd: 7");
}

TEST(StatusOr, ValueOfAFailureThrowsInternal) {
  StatusOr<int> e = half(3);
  EXPECT_TRUE(throws_error([&] { (void)e.value(); }, ErrorKind::kInternal,
                           {"value() of a failed StatusOr", "odd: 3"}));
  EXPECT_TRUE(throws_error([&] { (void)std::move(e).value(); }, ErrorKind::kInternal,
                           {"odd: 3"}));
}

TEST(StatusOr, BuiltFromOkStatusThrowsInternal) {
  EXPECT_TRUE(throws_error([] { StatusOr<int> s(Status::ok_status()); }, ErrorKind::kInternal,
                           {"ok Status without a value"}));
}

TEST(StatusOr, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> s(std::make_unique<int>(42));
  ASSERT_TRUE(s.ok());
  std::unique_ptr<int> p = std::move(s).value();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 42);

  StatusOr<std::string> str(std::string("abc"));
  EXPECT_EQ(str.value(), "abc");
  std::string taken = std::move(str).value();
  EXPECT_EQ(taken, "abc");
}

}  // namespace
}  // namespace untied
