// The driver of a fuzz target in a build without libFuzzer (the test suite's bounded fuzz run):
// every file of the corpus directories through LLVMFuzzerTestOneInput, then random mutations of
// them (byte flips, inserts, deletes, splices; a fixed seed, so a failure reproduces) for
// --seconds. A crash or a sanitizer report fails the run as it would under libFuzzer.
//   fuzz_X [--seconds S] CORPUS_DIR...
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  double seconds = 0;
  std::vector<std::vector<uint8_t>> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
      continue;
    }
    for (const auto& e : std::filesystem::directory_iterator(a)) {
      std::ifstream f(e.path(), std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "usage: %s [--seconds S] CORPUS_DIR...: no corpus files\n", argv[0]);
    return 2;
  }
  for (const auto& c : corpus) LLVMFuzzerTestOneInput(c.data(), c.size());
  std::mt19937_64 rng(20261202);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    std::vector<uint8_t> x = corpus[pick(corpus.size())];
    for (int m = 0, edits = 1 + static_cast<int>(pick(8)); m < edits; ++m) {
      switch (pick(5)) {
        case 0:  // flip a byte
          if (!x.empty()) x[pick(x.size())] ^= static_cast<uint8_t>(1u << pick(8));
          break;
        case 1:  // an interesting value
          if (!x.empty()) x[pick(x.size())] = static_cast<uint8_t>(std::vector<int>{0, 1, 0x7f, 0x80, 0xff, '"', '{', '9'}[pick(8)]);
          break;
        case 2:  // insert bytes
          x.insert(x.begin() + static_cast<std::ptrdiff_t>(pick(x.size() + 1)), pick(16) + 1, static_cast<uint8_t>(rng()));
          break;
        case 3:  // delete a range
          if (!x.empty()) {
            const size_t at = pick(x.size()), n = std::min(x.size() - at, pick(64) + 1);
            x.erase(x.begin() + static_cast<std::ptrdiff_t>(at), x.begin() + static_cast<std::ptrdiff_t>(at + n));
          }
          break;
        default: {  // splice in a piece of another input
          const auto& y = corpus[pick(corpus.size())];
          if (!y.empty()) {
            const size_t from = pick(y.size()), n = std::min(y.size() - from, pick(256) + 1);
            x.insert(x.begin() + static_cast<std::ptrdiff_t>(pick(x.size() + 1)), y.begin() + static_cast<std::ptrdiff_t>(from),
                     y.begin() + static_cast<std::ptrdiff_t>(from + n));
          }
        }
      }
    }
    LLVMFuzzerTestOneInput(x.data(), x.size());
    ++runs;
  }
  std::printf("%zu corpus inputs and %lld mutated inputs in %.1f s: no crash\n", corpus.size(), (long long)runs, seconds);
  return 0;
}
