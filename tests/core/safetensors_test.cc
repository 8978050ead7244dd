// Safetensors files: the byte layout, round trips through every float dtype, ranged reads, and
// each kind of bad file refused with a message that names the file and the tensor.
#include "untied/core/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "untied/core/dtype.h"

namespace untied {
namespace {

std::string temp_path(const std::string& name) {
  return (::testing::TempDir().empty() ? std::string("/tmp/") : ::testing::TempDir()) + "st_" +
         std::to_string(::getpid()) + "_" + name;
}

// A file from a header text and `data_bytes` bytes of data (value i & 0xff).
std::string raw_file(const std::string& name, const std::string& header, int64_t data_bytes, int64_t claim = -1) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = claim >= 0 ? static_cast<uint64_t>(claim) : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (int64_t i = 0; i < data_bytes; ++i) f.put(static_cast<char>(i & 0xff));
  return path;
}

::testing::AssertionResult refused(const std::string& path, Status::Code code, const std::vector<std::string>& words) {
  auto f = SafetensorsFile::open(path);
  if (f.ok()) return ::testing::AssertionFailure() << path << " was accepted";
  if (f.status().code() != code) return ::testing::AssertionFailure() << "wrong code: " << f.status().message();
  for (const std::string& w : words)
    if (f.status().message().find(w) == std::string::npos)
      return ::testing::AssertionFailure() << "'" << w << "' not in: " << f.status().message();
  return ::testing::AssertionSuccess() << f.status().message();
}

TEST(Safetensors, RoundTripEveryFloatDtypeAndRangedReads) {
  std::vector<float> a(6 * 5), b(7), c(3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i)) * 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = round_to_bf16(0.25f * static_cast<float>(i) - 1.0f);
  c = {1.5f, -0.000061035156f, 65504.0f};  // exact in f16 (the smallest normal, the largest finite)
  const std::string path = temp_path("ok.safetensors");
  ASSERT_TRUE(write_safetensors(path,
                                {{"model.a", "F32", {6, 5}, a.data()}, {"b", "BF16", {7}, b.data()},
                                 {"c", "F16", {3}, c.data()}},
                                {{"format", "pt"}})
                  .ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().metadata().at("format"), "pt");
  ASSERT_NE(f.value().find("model.a"), nullptr);
  EXPECT_EQ(f.value().find("model.a")->shape, (std::vector<int64_t>{6, 5}));
  EXPECT_EQ(f.value().find("b")->dtype, "BF16");
  std::vector<float> got(30);
  ASSERT_TRUE(f.value().read("model.a", 0, 30, got.data()).ok());
  EXPECT_EQ(got, a);
  ASSERT_TRUE(f.value().read("model.a", 11, 7, got.data()).ok());  // a row-major range
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 7), std::vector<float>(a.begin() + 11, a.begin() + 18));
  ASSERT_TRUE(f.value().read("b", 0, 7, got.data()).ok());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 7), b);
  ASSERT_TRUE(f.value().read("c", 0, 3, got.data()).ok());
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3), c);
  EXPECT_EQ(f.value().read("nope", 0, 1, got.data()).code(), Status::Code::kNotFound);
  EXPECT_EQ(f.value().read("b", 5, 3, got.data()).code(), Status::Code::kInvalidArgument);
  std::remove(path.c_str());
}

// A file written by the `safetensors` library itself (reference/make_safetensors_fixture.py).
TEST(Safetensors, ReadsWhatTheSafetensorsLibraryWrote) {
  auto f = SafetensorsFile::open(std::string(UNTIED_FIXTURES) + "/safetensors/small.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f.value().metadata().at("format"), "pt");
  for (const auto& [name, n] : {std::pair<std::string, int64_t>{"f32", 6}, {"bf16", 4}, {"f16", 5}}) {
    std::vector<float> got(static_cast<size_t>(n));
    ASSERT_TRUE(f.value().read(name, 0, n, got.data()).ok()) << name;
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], 0.5f * static_cast<float>(i) - 1.0f) << name << " " << i;
  }
  EXPECT_EQ(f.value().find("f32")->shape, (std::vector<int64_t>{2, 3}));
}

TEST(Safetensors, BadFilesAreRefusedNamingTheProblem) {
  using C = Status::Code;
  const std::string t = R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  EXPECT_TRUE(SafetensorsFile::open(raw_file("good", t, 16)).ok());
  EXPECT_TRUE(refused(temp_path("missing"), C::kNotFound, {"cannot open"}));
  EXPECT_TRUE(refused(raw_file("short", "", 0, -1).substr(0), C::kCorrupt, {"is not a valid safetensors file"}));
  EXPECT_TRUE(refused(raw_file("truncated", t, 10), C::kCorrupt, {"'w'", "outside the 10 data bytes"}));
  EXPECT_TRUE(refused(raw_file("header_too_long", t, 16, 1000), C::kCorrupt, {"header size 1000"}));
  EXPECT_TRUE(refused(raw_file("not_json", "{not json", 0), C::kCorrupt, {"not JSON"}));
  EXPECT_TRUE(refused(raw_file("bad_dtype", R"({"w": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2),
                      C::kCorrupt, {"'w'", "unknown dtype 'F8'"}));
  EXPECT_TRUE(refused(raw_file("wrong_size", R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})", 8),
                      C::kCorrupt, {"'w'", "spans 8 bytes", "need 6"}));
  EXPECT_TRUE(refused(raw_file("overlap", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                               12),
                      C::kCorrupt, {"'b'", "overlaps"}));
  EXPECT_TRUE(refused(raw_file("gap", R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
                      C::kCorrupt, {"'a'", "a gap"}));
  EXPECT_TRUE(refused(raw_file("no_offsets", R"({"a": {"dtype": "F32", "shape": [1]}})", 4), C::kCorrupt,
                      {"'a'", "data_offsets"}));
  // A tensor of an integer dtype opens, but is not read as weights.
  auto f = SafetensorsFile::open(raw_file("int", R"({"ids": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})", 8));
  ASSERT_TRUE(f.ok());
  float out[2];
  EXPECT_EQ(f.value().read("ids", 0, 2, out).code(), C::kUnsupported);
}

}  // namespace
}  // namespace untied
