// The emulator's device operations and its guarded "GPU memory".
//
// DeviceScope: every emulated device operation (a kernel launch, a runtime copy or memset, the
// stand-ins for CUB and cuBLAS, the emulated CudaDevice's copies) runs inside one. It holds one
// process-wide recursive mutex, so in-process ranks (threads) take turns in the emulator, whose
// state is global; and while the outermost scope is open, guarded memory is readable and
// writable.
//
// Guarded memory (guarded_alloc): device buffers in one reserved range of address space that
// has no access at all outside a DeviceScope, so host code that reads or writes "GPU memory"
// directly, which on a real GPU reads garbage or crashes, faults here at the very access
// (SIGSEGV). Such a fault prints "emulator: host access to guarded GPU memory at <address>" and a
// stack trace (symbol names where the program is linked with -rdynamic) before the process dies
// of it. Where the CPU has memory protection keys (pkeys), the range carries a key of its own
// and a scope opens it for its own thread only, by a register write: other threads (other ranks)
// stay locked out even then, at no cost per operation. Elsewhere a scope opens and closes the
// whole range with one mprotect each, for every thread.
// Each buffer starts on a page of its own; freed pages go back to the system and their addresses
// are not reused (the range is large), so a stale pointer faults outside a scope too. Inside a
// scope the whole range is open: this finds host accesses, not overruns (the op test, tests/ops,
// compares every byte of its buffers outside what an op may write for those). New buffers hold
// 0xFF bytes (a NaN pattern), so reads of what no kernel wrote show up as NaN.
//
// Without guarded buffers a scope only takes the mutex.
#pragma once

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace emu {

inline constexpr size_t kGuardedReserve = size_t{1} << 38;  // address space, not memory

inline std::recursive_mutex g_device_mu;
inline int g_device_depth = 0;       // open scopes (of the thread holding the mutex)
inline char* g_guarded = nullptr;    // the reserved range (null until the first guarded buffer)
inline size_t g_guarded_used = 0;    // bytes of it handed out so far (page multiples)

inline int g_pkey = -1;              // the range's protection key, or -1: mprotect instead

inline void set_guarded_access(int prot) {
  if (g_pkey >= 0) {
    pkey_set(g_pkey, prot == PROT_NONE ? PKEY_DISABLE_ACCESS : 0);  // this thread's rights only
    return;
  }
  if (g_guarded_used > 0 && mprotect(g_guarded, g_guarded_used, prot) != 0) {
    std::perror("emulator: mprotect of guarded device memory");
    std::abort();
  }
}

class DeviceScope {
 public:
  DeviceScope() : lock_(g_device_mu) {
    if (g_device_depth++ == 0) set_guarded_access(PROT_READ | PROT_WRITE);
  }
  ~DeviceScope() {
    if (--g_device_depth == 0) set_guarded_access(PROT_NONE);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  std::lock_guard<std::recursive_mutex> lock_;
};

// SIGSEGV in guarded memory: says so, with a stack trace, then dies of the signal as it would have.
inline void on_guarded_fault(int sig, siginfo_t* info, void*) {
  const char* a = static_cast<const char*>(info->si_addr);
  if (g_guarded != nullptr && a >= g_guarded && a < g_guarded + kGuardedReserve) {
    char msg[128];
    const int n = std::snprintf(msg, sizeof msg, "emulator: host access to guarded GPU memory at %p; stack:\n",
                                static_cast<const void*>(a));
    if (n > 0) (void)!::write(2, msg, static_cast<size_t>(n));
    void* frames[48];
    backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

inline void install_fault_handler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_guarded_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

inline size_t page_size() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

inline size_t pages_for(size_t bytes) {
  const size_t page = page_size();
  return (bytes + page - 1) / page * page;
}

// `bytes` (> 0) of guarded device memory, page-aligned, filled with 0xFF.
inline void* guarded_alloc(size_t bytes) {
  install_fault_handler();
  DeviceScope scope;  // the range is open until the scope ends
  if (g_guarded == nullptr) {
    void* r = mmap(nullptr, kGuardedReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return nullptr;
    g_guarded = static_cast<char*>(r);
    // Threads deny access to a new key by default (Linux's initial rights); this one is open
    // while its scope lasts.
    const int key = pkey_alloc(0, 0);
    if (key >= 0 && pkey_mprotect(r, kGuardedReserve, PROT_READ | PROT_WRITE, key) == 0) g_pkey = key;
    else if (key >= 0) pkey_free(key);
  }
  const size_t span = pages_for(bytes);
  if (g_guarded_used + span > kGuardedReserve) {
    std::fprintf(stderr, "emulator: the guarded device memory range (%zu bytes) is used up\n", kGuardedReserve);
    std::abort();
  }
  char* p = g_guarded + g_guarded_used;
  g_guarded_used += span;
  // Open, as the rest of the range is (with a key it is mapped read-write throughout).
  if (g_pkey < 0 && mprotect(p, span, PROT_READ | PROT_WRITE) != 0) return nullptr;
  std::memset(p, 0xFF, bytes);
  return p;
}

// Gives the pages back (they read as zeros if touched inside a later scope); the addresses stay
// reserved and are never handed out again.
inline void guarded_free(void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(g_device_mu);
  char* c = static_cast<char*>(p);
  if (g_guarded == nullptr || c < g_guarded || c + bytes > g_guarded + g_guarded_used) {
    std::fprintf(stderr, "emulator: free of %p, which is no guarded device buffer\n", p);
    std::abort();
  }
  madvise(c, pages_for(bytes), MADV_DONTNEED);
}

}  // namespace emu
