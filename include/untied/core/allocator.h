// The tagged allocator: one per rank, and every byte untied allocates goes through it.
//
// Each allocation carries a Tag saying what the bytes are for. The allocator records live and
// peak bytes per tag and in total, the peak per phase (forward, backward, optimizer; set with
// set_phase), and the live bytes per tag at the moment of the total peak. Peaks can be reset.
//
// A budget (0 = none) makes a rank behave like a device of that size: a request that would
// take the live total past it throws untied::Error(kOutOfBudget) whose message names the
// request, the budget and the live bytes per tag. Nothing is allocated in that case.
//
// Backing: where the bytes come from is a MemorySource. HostMemory gives 64-byte aligned host
// memory; CountingMemory backs nothing and returns nullptr, so that a rehearsal can run the
// real schedule of a step with every allocation counted and kernels skipped. A device backend
// (CUDA) supplies its own source.
//
// Thread safety: every method may be called from any thread (a mutex guards the counters).
// Buffers must not outlive their allocator.
#pragma once

#include <array>
#include <initializer_list>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "untied/core/status.h"

namespace untied {

enum class Tag : uint8_t {
  kParameters,
  kGradients,
  kOptimizer,
  kActivations,    // saved for backward (block inputs, attention outputs, LSE)
  kAttnWorkspace,  // attention intermediates: projections, per-stage buffers, kernel scratch
  kCommunication,  // all-to-all and ring receive buffers (send buffers are kAttnWorkspace)
  kOther,
};
inline constexpr int kNumTags = 7;
std::string_view tag_name(Tag t);  // "parameters", "attn_workspace", ...

enum class Phase : uint8_t { kSetup, kForward, kBackward, kOptimizer };
inline constexpr int kNumPhases = 4;
std::string_view phase_name(Phase p);

// Where an allocator's bytes come from.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual std::string_view name() const = 0;
  // Returns memory for `bytes` (> 0) bytes, or nullptr when the source backs nothing.
  // Throws untied::Error when the memory cannot be had.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* ptr, int64_t bytes) noexcept = 0;
  // True when allocate() returns real memory that kernels may touch.
  virtual bool backed() const = 0;
  // The most bytes this source has held from the system at once, blocks it keeps for reuse
  // included (the real footprint, against the allocator's live peak); 0 where not tracked.
  virtual int64_t reserved_peak_bytes() const { return 0; }
};

std::unique_ptr<MemorySource> make_host_memory();      // 64-byte aligned, zero-initialised: no
std::unique_ptr<MemorySource> make_counting_memory();  // backs nothing (rehearsal)

class Allocator;

// An owned allocation. Move-only; returns its bytes to the allocator when destroyed or reset.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() noexcept;  // frees now
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }
  Tag tag() const { return tag_; }
  bool empty() const { return owner_ == nullptr; }

 private:
  friend class Allocator;
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int64_t id_ = -1;  // the allocator's tracking key (-1: not tracked)
  Tag tag_ = Tag::kOther;
};

// Buffers of one purpose live together (Allocator::live_at_peak): their name, tag, bytes in all
// and how many.
struct LiveBuffers {
  std::string what;
  Tag tag = Tag::kOther;
  int64_t bytes = 0;
  int64_t count = 0;
};

// A copy of the allocator's counters.
struct MemoryStats {
  std::array<int64_t, kNumTags> live{};            // bytes live now, per tag
  std::array<int64_t, kNumTags> peak{};            // highest live bytes per tag since reset
  std::array<int64_t, kNumTags> at_total_peak{};   // live bytes per tag when the total peaked
  int64_t live_total = 0;
  int64_t peak_total = 0;
  std::array<int64_t, kNumPhases> phase_peak_total{};                         // since reset
  std::array<std::array<int64_t, kNumTags>, kNumPhases> phase_peak{};         // [phase][tag]
  int64_t num_allocations = 0;  // allocations made since construction
  // The watched tag set (Allocator::set_watch): live bytes of those tags together, and the
  // peak of that sum since reset, overall and per phase. Lets a caller measure, e.g., attention
  // intermediates (workspace + communication) as they coexist, not as a sum of separate peaks.
  int64_t watch_live = 0;
  int64_t watch_peak = 0;
  std::array<int64_t, kNumPhases> phase_watch_peak{};
};

class Allocator {
 public:
  struct Options {
    int64_t budget_bytes = 0;  // 0 = unlimited
    std::string name = "host";
    // Keep every live buffer's name, and at each new total peak what was live (live_at_peak):
    // a map update per allocation, for rehearsals and diagnostics.
    bool track_buffers = false;
  };
  Allocator(std::unique_ptr<MemorySource> source, Options opts);
  Allocator() : Allocator(make_host_memory(), Options{}) {}
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Allocates `bytes` (>= 0; 0 gives an empty-but-owned buffer) for the named purpose.
  // Throws Error(kOutOfBudget) when the budget would be exceeded.
  Buffer allocate(int64_t bytes, Tag tag, std::string_view what);

  void set_phase(Phase p);
  // Chooses the tags whose combined live bytes are tracked as watch_live / watch_peak
  // (restarts the watch peaks). Default: none.
  void set_watch(std::initializer_list<Tag> tags);
  Phase phase() const;
  // Peaks (per tag, total, per phase) restart from the bytes live now.
  void reset_peaks();
  MemoryStats stats() const;
  int64_t budget_bytes() const { return opts_.budget_bytes; }
  bool backed() const { return source_->backed(); }
  // The source's reserved_peak_bytes(): 0 unless it caches (the CUDA device's does).
  int64_t reserved_peak_bytes() const { return source_->reserved_peak_bytes(); }
  const std::string& name() const { return opts_.name; }

  // "live 1.50 GiB of budget 2.00 GiB: parameters 1.00 GiB, activations 512.00 MiB"
  std::string describe_live() const;

  // With Options::track_buffers, what was live when the total last peaked (since construction
  // or reset_peaks), grouped by (name, tag), largest first; empty without.
  std::vector<LiveBuffers> live_at_peak() const;
  // With Options::track_buffers, every (name, tag) allocated since construction, its bytes the
  // largest of one buffer of it and count the allocations, by name; empty without.
  std::vector<LiveBuffers> buffers_seen() const;

 private:
  friend class Buffer;
  void release(void* ptr, int64_t bytes, Tag tag, int64_t id) noexcept;
  std::string describe_live_locked() const;

  std::unique_ptr<MemorySource> source_;
  Options opts_;
  mutable std::mutex mu_;
  void update_watch_locked();

  void snapshot_buffers_locked();

  MemoryStats s_;
  Phase phase_ = Phase::kSetup;
  int64_t next_id_ = 0;
  std::unordered_map<int64_t, LiveBuffers> live_buffers_;  // by Buffer id, while tracking
  std::vector<LiveBuffers> at_peak_;                        // grouped, when the total peaked
  std::map<std::pair<std::string, Tag>, LiveBuffers> seen_; // every (name, tag), while tracking
  std::array<bool, kNumTags> watched_{};
};

// "1.50 GiB", "12.00 MiB", "512 B".
std::string format_bytes(int64_t bytes);
// Parses "4096", "512K", "512M", "8G", "1.5G", "2T", also with "B"/"iB" suffixes ("8GiB").
// K/M/G/T are binary (1024-based).
StatusOr<int64_t> parse_bytes(std::string_view s);

}  // namespace untied
