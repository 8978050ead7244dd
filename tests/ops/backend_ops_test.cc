// The cross-backend op test: every case of the registry (op_case.h, cases_*.cc) on the CPU device
// and on the device under test, compared buffer by buffer. For each case:
//   1. every buffer is filled once on the host (its fill, from a generator seeded by the case's
//      name), then `prepare` derives inputs on the CPU;
//   2. the CPU runs the op on a copy of those bytes (host memory is the CPU device's memory);
//   3. the device under test gets the same bytes (Device::copy), runs the op under each thread
//      schedule (the emulated GPU: three by default, UNTIED_EMU_SWEEP=1 every one), and its
//      buffers come back;
//   4. outputs are compared with the CPU's inside the region the op writes, by the buffer's rule
//      (the emulated GPU's rule or a real GPU's); every other byte of every buffer (inputs, stride
//      gaps, the skew) must be the bytes it started with, on both devices; the call's host results
//      by their rules; then the case's own checks (fp64 references, exact zeros, the kernel path).
// Refusals: the device must throw the case's error before writing anything (every byte as it
// was); where both devices refuse, with the same message. Determinism (case.repeat): a second
// run from the same bytes gives the first's outputs by each buffer's repeat rule. Scratch
// (dut_scratch_bytes): what the call allocates on the device under test.
//
// Without a device under test (the plain build on a machine without a GPU) each case skips with
// the reason, after the CPU-side checks of refusal cases. In the emulated build
// (backend_ops_emu_test) the device under test is the emulated GPU: cases marked slow there run
// only with -DUNTIED_EMU_SLOW_TESTS=ON (UNTIED_OPS_EMU_SLOW) or UNTIED_EMU_SLOW_TESTS=1 in the
// environment, the larger sweep cases only with UNTIED_EMU_SWEEP=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/compare.h"
#include "ops/device_under_test.h"
#include "ops/op_case.h"

#ifndef UNTIED_OPS_EMU_SLOW
#define UNTIED_OPS_EMU_SLOW 0
#endif

namespace untied::ops {
namespace {

// UNTIED_EMU_SLOW_TESTS=1 in the environment: the slow cases run in a build without the option.
bool slow_cases_asked() {
  const char* e = std::getenv("UNTIED_EMU_SLOW_TESTS");
  return e != nullptr && std::string(e) != "0" && std::string(e) != "";
}

uint64_t seed_of(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::vector<HostBuffer> fill(const OpCase& c) {
  test::Rng rng(seed_of(c.name));
  std::vector<HostBuffer> out;
  for (const BufferSpec& s : c.buffers) {
    HostBuffer b(s.elem, s.elems, s.skew);
    if (s.fill) {
      s.fill(b, rng);
    } else {
      const std::vector<double> v = test::uniform_values(rng, b.total(), DType::kF32, s.lo, s.hi);
      for (int64_t i = 0; i < b.total(); ++i) b.set(i - b.skew, v[static_cast<size_t>(i)]);
    }
    out.push_back(std::move(b));
  }
  return out;
}

// The message after check.h's "file:line: check `cond` failed: " prefix.
std::string message_tail(const std::string& what) {
  const size_t at = what.find("failed: ");
  return at == std::string::npos ? what : what.substr(at + 8);
}

struct Outcome {
  RunResult result{};
  bool threw = false;
  std::string error{};  // the message tail
  ErrorKind kind = ErrorKind::kInternal;
  std::vector<Ctx::Step> steps{};
};

// Every buffer is surrounded by kGuardBytes of kGuardByte on each side (a multiple of 16: the
// buffer keeps its allocation's alignment); a write past either end fails the case.
constexpr int64_t kGuardBytes = 256;
constexpr unsigned char kGuardByte = 0x5A;

// Runs the op on `dev` from the bytes of `init`. On the CPU (host memory is its device memory)
// and for host buffers the memory is a host vector; otherwise the device's allocator.
Outcome run_on(Device& dev, const OpCase& c, const std::vector<HostBuffer>& init, bool is_dut) {
  Outcome o;
  o.result.buffers = init;
  const bool on_host = dev.kind() == DeviceKind::kCpu;
  std::vector<Buffer> device_bufs(init.size());
  std::vector<std::vector<unsigned char>> host_bufs(init.size());
  std::vector<unsigned char*> bases(init.size());  // the first guard byte
  std::vector<void*> ptrs(init.size());
  for (size_t i = 0; i < init.size(); ++i) {
    const HostBuffer& h = init[i];
    const int64_t bytes = static_cast<int64_t>(h.bytes.size());
    std::vector<unsigned char> padded(static_cast<size_t>(bytes + 2 * kGuardBytes), kGuardByte);
    std::copy(h.bytes.begin(), h.bytes.end(), padded.begin() + kGuardBytes);
    if (on_host || c.buffers[i].host) {
      host_bufs[i] = std::move(padded);
      bases[i] = host_bufs[i].data();
    } else {
      device_bufs[i] = dev.allocator().allocate(bytes + 2 * kGuardBytes, Tag::kOther, c.buffers[i].name.c_str());
      bases[i] = static_cast<unsigned char*>(device_bufs[i].data());
      dev.copy(bases[i], padded.data(), static_cast<int64_t>(padded.size()));
    }
    ptrs[i] = bases[i] + kGuardBytes + h.skew * elem_size(h.elem);
  }
  Ctx ctx(dev, ptrs, is_dut && emulated() ? std::function<long long()>(tensor_core_ops) : nullptr);
  Allocator& alloc = dev.allocator();
  alloc.reset_peaks();
  const int other = static_cast<int>(Tag::kOther);
  const MemoryStats before = alloc.stats();
  if (is_dut) set_compute_capability(c.cc_major);
  try {
    o.result.scalars = c.run(ctx);
    dev.synchronize();
  } catch (const Error& e) {
    o.threw = true;
    o.kind = e.kind();
    o.error = message_tail(e.what());
  }
  if (is_dut) set_compute_capability(0);
  if (is_dut && !o.threw) {
    const MemoryStats after = alloc.stats();
    if (c.dut_scratch_bytes) {
      EXPECT_EQ(after.peak[other] - before.live[other], *c.dut_scratch_bytes) << "the scratch the call allocated";
      EXPECT_EQ(after.live[other], before.live[other]) << "scratch still live after the call";
    }
    if (c.dut_allocates_nothing) {
      EXPECT_EQ(after.num_allocations, before.num_allocations) << "the call allocated memory";
    }
  }
  o.steps = ctx.steps();
  for (size_t i = 0; i < init.size(); ++i) {
    HostBuffer& h = o.result.buffers[i];
    const int64_t bytes = static_cast<int64_t>(h.bytes.size());
    std::vector<unsigned char> padded(static_cast<size_t>(bytes + 2 * kGuardBytes));
    if (device_bufs[i].data() != nullptr) {
      dev.copy(padded.data(), bases[i], static_cast<int64_t>(padded.size()));
    } else {
      padded = host_bufs[i];
    }
    std::copy(padded.begin() + kGuardBytes, padded.begin() + kGuardBytes + bytes, h.bytes.begin());
    int64_t guard_written = 0;
    for (int64_t k = 0; k < kGuardBytes; ++k)
      guard_written += (padded[static_cast<size_t>(k)] != kGuardByte) +
                       (padded[static_cast<size_t>(kGuardBytes + bytes + k)] != kGuardByte);
    EXPECT_EQ(guard_written, 0) << c.buffers[i].name << ": bytes written outside the buffer ("
                                << (on_host ? "the CPU" : "the device under test") << ")";
  }
  return o;
}

// Elements (from -skew) whose bytes differ between a and b, outside `region` (or everywhere).
::testing::AssertionResult untouched(const std::string& what, const HostBuffer& got, const HostBuffer& init,
                                     const Region* region) {
  const int64_t es = elem_size(got.elem);
  int64_t bad = 0, first = 0;
  for (int64_t i = -got.skew; i < got.elems; ++i) {
    if (region != nullptr && region->contains(i)) continue;
    const size_t at = static_cast<size_t>((i + got.skew) * es);
    if (std::memcmp(got.bytes.data() + at, init.bytes.data() + at, static_cast<size_t>(es)) != 0 && bad++ == 0)
      first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " element(s) "
                                       << (region ? "outside the region the op writes " : "")
                                       << "changed, first at element " << first << " (" << got.get(first) << ", was "
                                       << init.get(first) << ")";
}

// The region of an output, compared by `rule` (op_case.h).
::testing::AssertionResult compare_region(const std::string& what, const Rule& rule, const Region& region,
                                          const HostBuffer& got, const HostBuffer& want, const HostBuffer& init) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < got.elems; ++i)
    if (region.contains(i)) idx.push_back(i);
  if (rule.kind == Rule::Kind::kCustom) return ::testing::AssertionSuccess();
  if (rule.kind == Rule::Kind::kBits) {
    const int64_t es = elem_size(got.elem);
    int64_t bad = 0;
    std::ostringstream first;
    for (int64_t i : idx) {
      const size_t at = static_cast<size_t>((i + got.skew) * es);
      if (std::memcmp(got.bytes.data() + at, want.bytes.data() + at, static_cast<size_t>(es)) != 0 && bad++ < 5)
        first << "\n    [" << i << "] got " << got.get(i) << " want " << want.get(i);
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << bad << " of " << idx.size()
                                         << " elements differ in their bits, first:" << first.str();
  }
  std::vector<double> g, w, z;
  for (int64_t i : idx) {
    g.push_back(got.get(i));
    w.push_back(want.get(i));
    z.push_back(init.get(i));
  }
  if (rule.kind == Rule::Kind::kSameValues) return test::expect_same_values(what, g, w);
  double scale = 1.0;
  if (!rule.absolute) {
    std::vector<double> d = w;
    if (rule.increment)
      for (size_t k = 0; k < d.size(); ++k) d[k] = w[k] - z[k];
    const double mx = test::max_abs(d);
    scale = mx > 0 ? std::max(mx, rule.min_scale) : 1.0;
  }
  return test::expect_close_each(
      what, g, w,
      [&](size_t k) {
        double tol = rule.rel * scale;
        if (rule.per_elem_rel > 0) tol += rule.per_elem_rel * std::fabs(w[k]);
        if (rule.init_rel > 0) tol += rule.init_rel * std::fabs(z[k]);  // (prior contents may be a NaN pattern)
        return tol;
      },
      test::CheckOptions{.note = rule.describe(), .print = false});
}

::testing::AssertionResult compare_scalar(const std::string& what, const Rule& rule, double got, double want) {
  if (rule.kind == Rule::Kind::kCustom) return ::testing::AssertionSuccess();
  if (rule.kind == Rule::Kind::kBits || rule.kind == Rule::Kind::kSameValues) {
    if (std::memcmp(&got, &want, sizeof got) == 0 ||
        (rule.kind == Rule::Kind::kSameValues && got != got && want != want))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": " << got << " vs " << want << " (must be identical)";
  }
  const double tol = rule.rel * (rule.absolute ? 1.0 : std::fabs(want));
  if (test::elem_error(got, want) <= tol) return ::testing::AssertionSuccess();
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s: %.17g vs %.17g, |diff| %.3e > %.3e (%s)", what.c_str(), got, want,
                test::elem_error(got, want), tol, rule.describe().c_str());
  return ::testing::AssertionFailure() << buf;
}

// Every buffer of a device's run against the initial bytes and, for outputs, against `want`.
void compare_run(const OpCase& c, const std::vector<HostBuffer>& init, const RunResult& want, const RunResult& got,
                 bool dut, const char* who) {
  for (size_t i = 0; i < c.buffers.size(); ++i) {
    const BufferSpec& s = c.buffers[i];
    const std::string what = std::string(who) + " " + s.name;
    if (!s.output) {
      EXPECT_TRUE(untouched(what + " (an input)", got.buffers[i], init[i], nullptr));
      continue;
    }
    EXPECT_TRUE(untouched(what, got.buffers[i], init[i], &s.region));
    if (dut) {
      EXPECT_TRUE(compare_region(what + " against the CPU", emulated() ? s.cmp.emu : s.cmp.gpu, s.region,
                                 got.buffers[i], want.buffers[i], init[i]));
    }
  }
  if (!dut) return;
  ASSERT_EQ(got.scalars.size(), want.scalars.size()) << "host results";
  ASSERT_EQ(got.scalars.size(), c.scalars.size()) << "host results and their rules";
  for (size_t k = 0; k < c.scalars.size(); ++k) {
    const Compare& r = c.scalars[k].second;
    EXPECT_TRUE(compare_scalar(std::string(who) + " " + c.scalars[k].first, emulated() ? r.emu : r.gpu, got.scalars[k],
                               want.scalars[k]));
  }
}

void expect_refused(const Outcome& o, const Refusal& r, const std::vector<HostBuffer>& init, const char* who) {
  EXPECT_TRUE(o.threw) << who << " accepted a call it must refuse (expected: " << r.message << ")";
  if (!o.threw) return;
  EXPECT_EQ(static_cast<int>(o.kind), static_cast<int>(r.kind)) << who << ": " << o.error;
  EXPECT_NE(o.error.find(r.message), std::string::npos)
      << who << "'s message lacks \"" << r.message << "\": " << o.error;
  for (size_t i = 0; i < init.size(); ++i)
    EXPECT_TRUE(untouched(std::string(who) + " buffer " + std::to_string(i) + " after the refusal", o.result.buffers[i],
                          init[i], nullptr));
}

class BackendOps : public ::testing::TestWithParam<size_t> {};

TEST_P(BackendOps, MatchesTheCpu) {
  const OpCase& c = all_cases()[GetParam()];
  std::string why;
  std::unique_ptr<Device> dut = make_device_under_test(&why);
  if (dut == nullptr && (!c.refused_on_cpu || c.dut_only)) GTEST_SKIP() << why;
  if (dut != nullptr && emulated() && c.slow_on_emu && !UNTIED_OPS_EMU_SLOW && !slow_cases_asked())
    GTEST_SKIP() << "slow on the emulated GPU: built with -DUNTIED_EMU_SLOW_TESTS=ON (or UNTIED_EMU_SLOW_TESTS=1 in "
                    "the environment) it runs";
  if (dut != nullptr && emulated() && c.sweep_only && !sweep_cases())
    GTEST_SKIP() << "a sweep case: UNTIED_EMU_SWEEP=1 runs it";

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<HostBuffer> init_bytes = [&] {
    std::vector<HostBuffer> b = fill(c);
    auto cpu = make_cpu_device({.threads = 1});
    if (c.prepare) c.prepare(*cpu, b);
    return b;
  }();
  const RunResult init{init_bytes, {}};
  auto cpu = make_cpu_device({.threads = 1});
  const Outcome on_cpu = c.dut_only ? Outcome{.result = init} : run_on(*cpu, c, init_bytes, false);
  if (c.dut_only) {
  } else if (c.refused_on_cpu) {
    expect_refused(on_cpu, *c.refused_on_cpu, init_bytes, "the CPU");
  } else {
    ASSERT_FALSE(on_cpu.threw) << "the CPU refused: " << on_cpu.error;
    compare_run(c, init_bytes, on_cpu.result, on_cpu.result, false, "the CPU's");
  }
  if (dut == nullptr) GTEST_SKIP() << why << " (the CPU-side checks ran)";

  const std::vector<std::string> names = schedules(c.one_schedule);
  for (size_t si = 0; si < names.size(); ++si) {
    SCOPED_TRACE("schedule " + names[si]);
    use_schedule(si, c.one_schedule);
    const Outcome got = run_on(*dut, c, init_bytes, true);
    if (c.refused_on_dut) {
      expect_refused(got, *c.refused_on_dut, init_bytes, "the device under test");
      if (c.refused_on_cpu && got.threw && on_cpu.threw) {
        EXPECT_EQ(got.error, on_cpu.error) << "the two devices refuse with different messages";
      }
      continue;
    }
    ASSERT_FALSE(got.threw) << "the device under test refused: " << got.error;
    compare_run(c, init_bytes, on_cpu.result, got.result, true, "the device's");
    if (c.path != Path::kAny && emulated()) {
      EXPECT_FALSE(got.steps.empty()) << "no step recorded its kernel path";
      for (const Ctx::Step& s : got.steps) {
        EXPECT_EQ(s.tensor_cores, c.path == Path::kTensorCores)
            << s.name << " ran the " << (s.tensor_cores ? "tensor-core" : "portable") << " path";
      }
    }
    if (c.check) c.check(init, on_cpu.result, got.result, emulated());
    if (c.repeat) {
      const Outcome again = run_on(*dut, c, init_bytes, true);
      ASSERT_FALSE(again.threw) << again.error;
      for (size_t i = 0; i < c.buffers.size(); ++i) {
        if (!c.buffers[i].output) continue;
        EXPECT_TRUE(compare_region("second run's " + c.buffers[i].name + " against the first's", c.buffers[i].repeat,
                                   c.buffers[i].region, again.result.buffers[i], got.result.buffers[i], init_bytes[i]));
      }
      for (size_t k = 0; k < again.result.scalars.size(); ++k)
        EXPECT_TRUE(compare_scalar("second run's " + c.scalars[k].first, bits(), again.result.scalars[k],
                                   got.result.scalars[k]));
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[   case   ] %-60s %zu schedule(s), %.2f s\n", c.name.c_str(), names.size(), secs);
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, ::testing::Range<size_t>(0, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) { return all_cases()[i.param].name; });

}  // namespace
}  // namespace untied::ops
