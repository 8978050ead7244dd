// TensorBoard event files (tensorboard.h): CRC-32C against its published check value; a file
// written from fixed scalars and wall times is byte for byte the committed fixture, which
// TensorBoard's own reader read into reference/fixtures/tensorboard/scalars.json (by
// reference/read_tensorboard.py); and the records parse back (lengths, CRCs, fields) to those
// scalars; a metrics line flattens into its tags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "untied/train/tensorboard.h"

namespace untied {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The fixture's scalars: steps 1..3, tags loss, lr and phase_ms/data.
std::vector<std::pair<std::string, double>> scalars_of(int64_t step) {
  return {{"loss", 4.0 / static_cast<double>(step)}, {"lr", 1e-3 * static_cast<double>(step)},
          {"phase_ms/data", 0.25 + static_cast<double>(step)}};
}

std::string write_fixture_events(const std::string& dir) {
  std::filesystem::remove_all(dir);
  auto opened = TensorBoardWriter::open(dir, 1700000000.5);
  EXPECT_TRUE(opened.ok()) << opened.status().message();
  TensorBoardWriter w = std::move(opened).value();
  for (int64_t step = 1; step <= 3; ++step)
    EXPECT_TRUE(w.add_scalars(step, 1700000000.5 + static_cast<double>(step), scalars_of(step)).ok());
  return w.path();
}

uint32_t get_u32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u);
}

TEST(TensorBoard, FileIsTheFixtureTensorBoardRead) {
  const std::string dir = ::testing::TempDir() + "tb_" + std::to_string(::getpid());
  const std::string path = write_fixture_events(dir);
  const std::string got = read_all(path);
  const std::string fixture_dir = std::string(UNTIED_FIXTURES) + "/tensorboard";
  if (std::getenv("UNTIED_WRITE_TENSORBOARD_FIXTURE") != nullptr) {
    std::ofstream(fixture_dir + "/events.out.tfevents.fixture", std::ios::binary) << got;
    GTEST_SKIP() << "wrote the fixture";
  }
  EXPECT_EQ(got, read_all(fixture_dir + "/events.out.tfevents.fixture"))
      << "the writer's bytes changed: re-check them with TensorBoard's reader (reference/read_tensorboard.py)";
  // The records: length, its CRC, data, its CRC; 4 events.
  size_t at = 0;
  int records = 0;
  while (at < got.size()) {
    ASSERT_LE(at + 12, got.size());
    uint64_t len;
    std::memcpy(&len, got.data() + at, 8);
    EXPECT_EQ(get_u32(got, at + 8), masked(crc32c(std::string_view(got).substr(at, 8))));
    ASSERT_LE(at + 12 + len + 4, got.size());
    EXPECT_EQ(get_u32(got, at + 12 + len), masked(crc32c(std::string_view(got).substr(at + 12, len))));
    at += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 4);
  // What TensorBoard's reader read from the fixture: each scalar, as float32.
  const Json read_back = Json::parse(read_all(fixture_dir + "/scalars.json"));
  for (int64_t step = 1; step <= 3; ++step)
    for (const auto& [tag, value] : scalars_of(step)) {
      ASSERT_TRUE(read_back.contains(tag)) << tag;
      const Json& points = read_back[tag];
      ASSERT_EQ(points.size(), 3u);
      EXPECT_EQ(points[static_cast<size_t>(step - 1)][0].get<int64_t>(), step);
      EXPECT_EQ(points[static_cast<size_t>(step - 1)][1].get<double>(), static_cast<double>(static_cast<float>(value)))
          << tag << " at step " << step;
    }
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, MetricsLineFlattens) {
  const Json line = Json::parse(R"({"step": 7, "loss": 1.5, "accuracy": null, "phase_ms": {"data": 0.5, "optimizer": 2},
                                    "skipped": true, "note": "x"})");
  const auto s = metrics_scalars(line);
  std::map<std::string, double> m(s.begin(), s.end());
  EXPECT_EQ(m, (std::map<std::string, double>{{"loss", 1.5}, {"phase_ms/data", 0.5}, {"phase_ms/optimizer", 2}}));
}

TEST(TensorBoard, UnwritableDirectoryIsAnError) {
  auto w = TensorBoardWriter::open("/proc/untied-no/such", 1.0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("TensorBoard"), std::string::npos);
}

}  // namespace
}  // namespace untied
