// A CPU emulator of the small part of CUDA that the attention and element-wise kernels use,
// force-included (g++ -include) before the rewritten kernel sources (see rewrite_kernels.py) and
// the tests.
//
// What it emulates:
//   - Every CUDA thread of a block runs as a fiber (its own stack; switch in fiber_switch_x86_64.cc)
//     on one host thread. A fiber runs until it reaches a barrier (__syncthreads, __syncwarp, a
//     shuffle, ldmatrix or mma), so threads interleave only at those points, in the order the
//     chosen Schedule gives. Blocks of a grid run one after another.
//   - threadIdx, blockIdx, blockDim, gridDim; __syncthreads and __syncwarp (full mask only), with
//     deadlock detection (a barrier some thread never reaches aborts with a message);
//     __shfl_xor_sync and the warp-collective PTX primitives of emu_ptx_primitives.h.
//   - Dynamic shared memory: filled with 0xFF (a NaN pattern) at block start; every shared access
//     of the primitives is checked for range and alignment.
//   - Static shared memory (`__shared__ T x[N];` or `__shared__ T x;` in a kernel):
//     rewrite_kernels.py makes it `static T x[N]; ::emu::shared_array(&x, sizeof(x));`, so the
//     threads of a block (fibers of one host thread) share one copy, filled with 0xFF at every
//     block start like dynamic memory.
//   - cp.async: either the bytes land at issue ("eager") or only at cp.async.wait_group with the
//     destination holding the NaN pattern until then ("deferred"), the two extremes of the
//     hardware's timing.
//   - atomicAdd on float, atomicMin on unsigned long long (trivially atomic: one host thread).
//   - cub::DeviceRadixSort::SortPairs on DoubleBuffers (emu_cub_radix_sort.h, a host sort).
//   - __shfl_xor_sync on any 4- or 8-byte type (float, double, int, ...).
//   - The IEEE round-to-nearest intrinsics __fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn,
//     __frcp_rn, __fsqrt_rn: one correctly rounded fp32 operation each, never contracted into a
//     fused multiply-add with a neighbouring operation (an empty asm hides operands and result
//     from the compiler), as nvcc guarantees; the device min/max overloads.
//
// What it does NOT emulate (a pass here says nothing about these):
//   - Timing, occupancy, register limits, shared-memory bank conflicts, performance.
//   - The memory model between barriers: a fiber's plain loads and stores are visible at once to
//     every other thread, so a race between two unsynchronised plain accesses that happen to be
//     ordered by the schedule is not seen. Races are exposed only as far as the schedules tried
//     reorder threads at barriers.
//   - Asynchronous-copy races beyond the two extremes (a copy landing in the middle of a
//     computation), concurrent blocks (they run one at a time, so inter-block races on global
//     memory are invisible; the kernels' only inter-block traffic is fp32 atomics), partial warp
//     masks, and independent thread scheduling inside a warp between barriers.
//   - Range checks of the kernels' plain shared-memory loads and stores (only the primitives'
//     accesses are checked; shared memory is a heap vector, so AddressSanitizer can see a plain
//     access past its end; static __shared__ arrays are plain static arrays, where an access
//     past one may land unseen in the next) and of global memory (each device buffer starts on a
//     page of its own, emu_device_memory.h, so an access past its end faults only beyond its last
//     page; the op test, tests/ops, checks every byte outside what an op may write instead).
//   - Floating point: host fp32 arithmetic; exp2f/log2f/expf/sincos/pow are the libm ones, not
//     the GPU's (expf within 2 ulp of it on the GPU), and g++ may contract plain expressions
//     differently from nvcc (the _rn intrinsics above are exact).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "emu_device_memory.h"

#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace emu {

// The order in which the fibers of a block are resumed.
enum class Schedule {
  kLanesForward,  // round robin over all threads, 0..n-1
  kLanesReverse,  // round robin, n-1..0
  kLanesRandom,   // round robin in a fresh random order each round
  kWarpsForward,  // one warp runs alone until all its threads wait at a block barrier, warp 0 first
  kWarpsReverse,  // the same, last warp first and lanes in reverse
  kWarpsRandom,   // the same, warps in a random order
};
inline constexpr Schedule kAllSchedules[] = {Schedule::kLanesForward, Schedule::kLanesReverse, Schedule::kLanesRandom,
                                             Schedule::kWarpsForward, Schedule::kWarpsReverse, Schedule::kWarpsRandom};

inline const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kLanesForward: return "lanes-forward";
    case Schedule::kLanesReverse: return "lanes-reverse";
    case Schedule::kLanesRandom: return "lanes-random";
    case Schedule::kWarpsForward: return "warps-forward";
    case Schedule::kWarpsReverse: return "warps-reverse";
    case Schedule::kWarpsRandom: return "warps-random";
  }
  return "?";
}

struct Options {
  Schedule schedule = Schedule::kLanesForward;
  bool eager_copies = false;  // cp.async lands at issue (true) or at wait_group (false)
  uint64_t seed = 1;          // for the random schedules
};

// The compute capability the emulated device reports (emu_cuda_api.cc).
void set_compute_capability(int major);

[[noreturn]] inline void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "emulator: %s %s\n", what, detail);
  std::fflush(stderr);
  std::abort();
}

// One cp.async: `bytes` to dst, of which the first `src_bytes` come from src and the rest are 0.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int bytes;
  int src_bytes;
};

extern "C" void emu_fiber_switch(void** save_sp, void* new_sp);

enum class Wait { kNone, kBlockBarrier, kWarpBarrier };

struct Fiber {
  void* sp = nullptr;
  uint3 tid;
  int warp = 0, lane = 0;
  bool done = false;
  Wait wait = Wait::kNone;
  uint64_t wait_gen = 0;  // the barrier generation it waits on
  std::vector<AsyncCopy> uncommitted;
  std::deque<std::vector<AsyncCopy>> groups;  // committed cp.async groups
};

// Per-lane exchange area for the warp collectives.
struct LaneSlot {
  uint32_t u[8];
  float f;
  const void* ptr;
};

struct Block {
  std::vector<Fiber> fibers;
  uint64_t block_gen = 0;
  int block_arrived = 0;
  std::vector<uint64_t> warp_gen;
  std::vector<int> warp_arrived;
  std::vector<int> warp_size;
  std::vector<LaneSlot> slots;  // warps * 32
  std::vector<unsigned char> smem;
  std::function<void()> body;
};

// Emulator state: one kernel runs at a time, on the calling thread.
inline Options g_options;
inline Fiber* g_cur = nullptr;
inline Block* g_block = nullptr;
inline void* g_scheduler_sp = nullptr;
inline uint3 g_block_idx, g_block_dim, g_grid_dim;
inline long long g_switches = 0;
inline long long g_mma_ops = 0;    // mma.sync instructions executed (per lane), for the tests
inline long long g_wgmma_ops = 0;  // wgmma instructions issued (per thread), for the tests

// Fiber stacks, mapped once and reused: 512 KiB each (enough under AddressSanitizer) with an
// inaccessible guard page below, so an overflow faults instead of corrupting a neighbour.
inline constexpr size_t kStackBytes = 512 * 1024;
inline constexpr size_t kGuardBytes = 4096;
inline char* fiber_stack(size_t i) {
  static std::vector<char*> stacks;
  while (stacks.size() <= i) {
    void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("cannot map a fiber stack");
    if (mprotect(m, kGuardBytes, PROT_NONE) != 0) die("cannot protect a fiber stack guard page");
    stacks.push_back(static_cast<char*>(m) + kGuardBytes);
  }
  return stacks[i];
}

inline void yield_to_scheduler() {
  ++g_switches;
  emu_fiber_switch(&g_cur->sp, g_scheduler_sp);
}

inline void syncthreads() {
  Block& b = *g_block;
  const uint64_t gen = b.block_gen;
  if (++b.block_arrived == static_cast<int>(b.fibers.size())) {
    b.block_arrived = 0;
    ++b.block_gen;
    return;
  }
  g_cur->wait = Wait::kBlockBarrier;
  g_cur->wait_gen = gen;
  yield_to_scheduler();
}

inline void syncwarp() {
  Block& b = *g_block;
  const int w = g_cur->warp;
  const uint64_t gen = b.warp_gen[w];
  if (++b.warp_arrived[w] == b.warp_size[w]) {
    b.warp_arrived[w] = 0;
    ++b.warp_gen[w];
    return;
  }
  g_cur->wait = Wait::kWarpBarrier;
  g_cur->wait_gen = gen;
  yield_to_scheduler();
}

inline LaneSlot& my_slot() { return g_block->slots[g_cur->warp * 32 + g_cur->lane]; }
inline LaneSlot& lane_slot(int lane) { return g_block->slots[g_cur->warp * 32 + lane]; }

inline void check_smem(const void* p, int bytes, int align) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  const unsigned char* lo = g_block->smem.data();
  const unsigned char* hi = lo + g_block->smem.size();
  if (c < lo || c + bytes > hi) die("shared memory access out of range");
  if (static_cast<size_t>(c - lo) % align != 0) die("misaligned shared memory access");
}

inline void complete(const AsyncCopy& c) {
  if (c.src_bytes > 0) std::memcpy(c.dst, c.src, c.src_bytes);
  if (c.bytes > c.src_bytes) std::memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
}

// Checks run when a thread exits: each answers what it finds outstanding (a message), or null.
// The emulated instruction sets register theirs (emu_wgmma_primitives.h).
inline std::vector<const char* (*)(const Fiber*)> g_exit_checks;

inline void fiber_main() {
  g_block->body();
  g_cur->done = true;
  bool pending = !g_cur->uncommitted.empty();
  for (auto& group : g_cur->groups) pending = pending || !group.empty();
  if (pending) die("a thread exits with cp.async copies not waited for");
  for (auto check : g_exit_checks)
    if (const char* what = check(g_cur)) die("a thread exits with", what);
  emu_fiber_switch(&g_cur->sp, g_scheduler_sp);
  die("a finished fiber was resumed");
}

// Prepares `stack` so that the first switch to the returned pointer enters fiber_main: the
// frame emu_fiber_switch pops (mxcsr and x87 control word, six callee-saved registers, then the
// return address).
// mxcsr and fpu_cw: the floating-point control state the fiber starts with (the caller's).
inline void* init_fiber_stack(char* stack, uint32_t mxcsr, uint16_t fpu_cw) {
  const uintptr_t top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  uint64_t* p = reinterpret_cast<uint64_t*>(top);
  *--p = 0;                                        // fiber_main's (never used) return address
  *--p = reinterpret_cast<uint64_t>(&fiber_main);  // popped by ret
  for (int i = 0; i < 6; ++i) *--p = 0;            // rbp rbx r12 r13 r14 r15
  --p;
  std::memcpy(reinterpret_cast<char*>(p), &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(p) + 4, &fpu_cw, 2);
  return p;
}

// The kernels' static __shared__ arrays met so far. shared_array() runs in every thread where
// the array is declared; the first thread of the first block to get there registers the array
// before any thread can have written to it, and fills it with the NaN pattern; run_block fills
// every registered array again at the start of each block.
struct SharedArray {
  void* p;
  size_t bytes;
};
inline std::vector<SharedArray> g_shared_arrays;
inline void shared_array(void* p, size_t bytes) {
  for (const SharedArray& a : g_shared_arrays)
    if (a.p == p) return;
  g_shared_arrays.push_back({p, bytes});
  std::memset(p, 0xFF, bytes);
}

inline void run_block(uint3 bidx, uint3 bdim, size_t smem_bytes, std::function<void()> body) {
  for (const SharedArray& a : g_shared_arrays) std::memset(a.p, 0xFF, a.bytes);
  // One block at a time (launch holds the device mutex), so its state is kept between blocks and
  // reset here: the allocations of a fresh Block per block cost more than small blocks run.
  static Block b;
  const int n = static_cast<int>(bdim.x * bdim.y * bdim.z);
  const int warps = (n + 31) / 32;
  b.fibers.resize(n);
  b.block_gen = 0;
  b.block_arrived = 0;
  b.warp_gen.assign(warps, 0);
  b.warp_arrived.assign(warps, 0);
  b.warp_size.assign(warps, 0);
  b.slots.resize(static_cast<size_t>(warps) * 32);
  b.smem.assign(smem_bytes, 0xFF);  // NaN pattern: a read of an unwritten byte shows as NaN
  b.body = std::move(body);
  g_block = &b;
  g_block_idx = bidx;
  g_block_dim = bdim;
  uint32_t mxcsr;
  uint16_t fpu_cw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.done = false;
    f.wait = Wait::kNone;
    f.wait_gen = 0;
    f.uncommitted.clear();
    f.groups.clear();
    f.warp = i / 32;
    f.lane = i % 32;
    f.tid = make_uint3(i % bdim.x, (i / bdim.x) % bdim.y, i / (bdim.x * bdim.y));
    ++b.warp_size[f.warp];
    f.sp = init_fiber_stack(fiber_stack(i), mxcsr, fpu_cw);
  }
  const Schedule s = g_options.schedule;
  // The random schedules' generator, seeded per block (only for them: seeding costs more than a
  // small block runs).
  std::optional<std::mt19937_64> rng;
  if (s == Schedule::kWarpsRandom || s == Schedule::kLanesRandom)
    rng.emplace(g_options.seed ^ (bidx.x * 0x9E3779B97F4A7C15ull));
  int done = 0;
  auto runnable = [&](const Fiber& f) {
    if (f.done) return false;
    if (f.wait == Wait::kBlockBarrier && b.block_gen == f.wait_gen) return false;
    if (f.wait == Wait::kWarpBarrier && b.warp_gen[f.warp] == f.wait_gen) return false;
    return true;
  };
  auto resume = [&](Fiber& f) {
    f.wait = Wait::kNone;
    g_cur = &f;
    emu_fiber_switch(&g_scheduler_sp, f.sp);
    g_cur = nullptr;
    if (f.done) ++done;
  };
  auto deadlock = [&] {
    int at_block = 0, at_warp = 0;
    for (auto& f : b.fibers) {
      at_block += !f.done && f.wait == Wait::kBlockBarrier;
      at_warp += !f.done && f.wait == Wait::kWarpBarrier;
    }
    char msg[200];
    std::snprintf(msg, sizeof msg, "block (%u,%u,%u): %d threads at a block barrier, %d at a warp barrier, %d done",
                  bidx.x, bidx.y, bidx.z, at_block, at_warp, done);
    die("deadlock:", msg);
  };

  if (s == Schedule::kWarpsForward || s == Schedule::kWarpsReverse || s == Schedule::kWarpsRandom) {
    // One warp runs alone until each of its threads waits at a block barrier (or has finished),
    // so warps drift a whole barrier interval apart: exposes missing block barriers.
    std::vector<int> worder(warps);
    while (done < n) {
      for (int w = 0; w < warps; ++w) worder[w] = w;
      if (s == Schedule::kWarpsReverse) std::reverse(worder.begin(), worder.end());
      if (s == Schedule::kWarpsRandom) std::shuffle(worder.begin(), worder.end(), *rng);
      bool progress = false;
      for (int w : worder) {
        bool ran = false;
        for (bool again = true; again;) {
          again = false;
          for (int l = 0; l < 32; ++l) {
            const int i = w * 32 + (s == Schedule::kWarpsReverse ? 31 - l : l);
            if (i >= n || !runnable(b.fibers[i])) continue;
            resume(b.fibers[i]);
            again = ran = true;
          }
        }
        if (ran) {
          progress = true;
          break;
        }
      }
      if (!progress) deadlock();
    }
  } else {
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = s == Schedule::kLanesReverse ? n - 1 - i : i;
    while (done < n) {
      if (s == Schedule::kLanesRandom) std::shuffle(order.begin(), order.end(), *rng);
      bool progress = false;
      for (int i : order) {
        if (!runnable(b.fibers[i])) continue;
        resume(b.fibers[i]);
        progress = true;
      }
      if (!progress) deadlock();
    }
  }
  g_block = nullptr;
}

// kernel<<<grid, block, smem, stream>>>(args...), run to completion before returning.
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Args&&... args) {
  DeviceScope scope;  // one thread in the emulator at a time; guarded device memory open
  // The hardware's launch limits (a launch beyond them fails on a GPU with "invalid configuration").
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      static_cast<long long>(block.x) * block.y * block.z > 1024)
    die("launch: block dimensions beyond the hardware's (at most 1024 x 1024 x 64, 1024 threads)");
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
    die("launch: grid dimensions beyond the hardware's (x < 2^31, y and z <= 65535, none 0)");
  g_grid_dim = make_uint3(grid.x, grid.y, grid.z);
  auto tup = std::make_tuple(static_cast<KArgs>(args)...);
  const long long total = static_cast<long long>(grid.x) * grid.y * grid.z;
  for (long long bi = 0; bi < total; ++bi) {
    const uint3 bidx = make_uint3(static_cast<unsigned>(bi % grid.x), static_cast<unsigned>((bi / grid.x) % grid.y),
                                  static_cast<unsigned>(bi / (static_cast<long long>(grid.x) * grid.y)));
    run_block(bidx, make_uint3(block.x, block.y, block.z), smem, [&] { std::apply(kernel, tup); });
  }
}

}  // namespace emu

// CUDA built-ins.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (::emu::g_cur->tid)
#define blockIdx (::emu::g_block_idx)
#define blockDim (::emu::g_block_dim)
#define gridDim (::emu::g_grid_dim)

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) emu::die("__syncwarp with a partial mask is not emulated");
  emu::syncwarp();
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(emu::LaneSlot::u) && std::is_trivially_copyable_v<T>);
  if (mask != 0xffffffffu) emu::die("__shfl_xor_sync with a partial mask is not emulated");
  std::memcpy(emu::my_slot().u, &v, sizeof(T));
  emu::syncwarp();
  T r;
  std::memcpy(&r, emu::lane_slot(emu::g_cur->lane ^ lane_mask).u, sizeof(T));
  emu::syncwarp();  // no lane overwrites its slot before every lane has read
  return r;
}
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = std::min(old, v);
  return old;
}

// IEEE fp32 operations rounded to nearest even, one rounding each. The empty asm statements make
// operands and result opaque, so g++ cannot fuse them with a neighbouring multiply or add (which
// -ffp-contract=fast with FMA hardware would otherwise do after inlining).
namespace emu {
inline float opaque(float x) {
  asm("" : "+x"(x));
  return x;
}
}  // namespace emu
inline float __fadd_rn(float a, float b) { return emu::opaque(emu::opaque(a) + emu::opaque(b)); }
inline float __fsub_rn(float a, float b) { return emu::opaque(emu::opaque(a) - emu::opaque(b)); }
inline float __fmul_rn(float a, float b) { return emu::opaque(emu::opaque(a) * emu::opaque(b)); }
inline float __fdiv_rn(float a, float b) { return emu::opaque(emu::opaque(a) / emu::opaque(b)); }
inline float __frcp_rn(float a) { return emu::opaque(1.0f / emu::opaque(a)); }
inline float __fsqrt_rn(float a) { return emu::opaque(std::sqrt(emu::opaque(a))); }

// The device min/max overloads the kernels call unqualified.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
