#include "untied/core/allocator.h"

#include <malloc.h>

#include <algorithm>
#include <map>
#include <utility>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace untied {

std::string_view tag_name(Tag t) {
  switch (t) {
    case Tag::kParameters: return "parameters";
    case Tag::kGradients: return "gradients";
    case Tag::kOptimizer: return "optimizer";
    case Tag::kActivations: return "activations";
    case Tag::kAttnWorkspace: return "attn_workspace";
    case Tag::kCommunication: return "communication";
    case Tag::kOther: return "other";
  }
  return "?";
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::kSetup: return "setup";
    case Phase::kForward: return "forward";
    case Phase::kBackward: return "backward";
    case Phase::kOptimizer: return "optimizer";
  }
  return "?";
}

namespace {

// Keep large blocks in the heap and freed memory in the process, so that buffers freed and
// allocated again each stage are reused instead of being mapped and faulted in anew. One arena:
// glibc gives each thread (each in-process rank) an arena of its own, whose heaps are at most
// 64 MiB, so that those threads' larger blocks were mapped anew on every allocation and their
// pages cleared by the kernel on first touch (about 10% of an 8-rank attention block's time).
// The process allocates rarely next to its compute (kernels take their scratch from the
// allocator, per call), so one lock costs nothing measurable. Set at load, before any thread has
// taken an arena.
[[maybe_unused]] const bool kMallocTuned = [] {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

class HostMemory final : public MemorySource {
 public:
  std::string_view name() const override { return "host"; }
  void* allocate(int64_t bytes) override {
    size_t rounded = (static_cast<size_t>(bytes) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, rounded);
    UNTIED_CHECK_KIND(ErrorKind::kOutOfBudget, p != nullptr, "host memory exhausted: malloc of ",
                      format_bytes(bytes), " failed");
    return p;
  }
  void release(void* ptr, int64_t) noexcept override { std::free(ptr); }
  bool backed() const override { return true; }
};

class CountingMemory final : public MemorySource {
 public:
  std::string_view name() const override { return "counting"; }
  void* allocate(int64_t) override { return nullptr; }
  void release(void*, int64_t) noexcept override {}
  bool backed() const override { return false; }
};

}  // namespace

std::unique_ptr<MemorySource> make_host_memory() { return std::make_unique<HostMemory>(); }
std::unique_ptr<MemorySource> make_counting_memory() { return std::make_unique<CountingMemory>(); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    id_ = o.id_;
    tag_ = o.tag_;
    o.owner_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.id_ = -1;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (owner_ != nullptr) owner_->release(data_, bytes_, tag_, id_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  id_ = -1;
}

Allocator::Allocator(std::unique_ptr<MemorySource> source, Options opts)
    : source_(std::move(source)), opts_(std::move(opts)) {
  UNTIED_CHECK(opts_.budget_bytes >= 0, "memory budget must be >= 0, got ", opts_.budget_bytes);
}

Allocator::~Allocator() {
  if (s_.live_total != 0) {
    std::fprintf(stderr, "untied: allocator '%s' destroyed with %s still live (%s)\n",
                 opts_.name.c_str(), format_bytes(s_.live_total).c_str(),
                 describe_live_locked().c_str());
  }
}

Buffer Allocator::allocate(int64_t bytes, Tag tag, std::string_view what) {
  UNTIED_CHECK(bytes >= 0, "allocation of a negative size (", bytes, " bytes) for '", what, "'");
  std::lock_guard<std::mutex> lock(mu_);
  if (opts_.budget_bytes > 0 && bytes > opts_.budget_bytes - s_.live_total) {
    fail(ErrorKind::kOutOfBudget,
         error_prefix(__FILE__, __LINE__) + "memory budget exceeded: request of " +
             format_bytes(bytes) + " for '" + std::string(what) + "' (" +
             std::string(tag_name(tag)) + ") would bring the live total to " +
             format_bytes(bytes > INT64_MAX - s_.live_total ? INT64_MAX : s_.live_total + bytes) +
             ", over the budget of " +
             format_bytes(opts_.budget_bytes) + "; " + describe_live_locked() +
             ". Raise --mem-budget or choose a configuration that needs less memory.");
  }
  void* p = bytes > 0 ? source_->allocate(bytes) : nullptr;
  int t = static_cast<int>(tag);
  int ph = static_cast<int>(phase_);
  s_.live[t] += bytes;
  s_.live_total += bytes;
  s_.num_allocations += 1;
  if (s_.live[t] > s_.peak[t]) s_.peak[t] = s_.live[t];
  if (s_.live[t] > s_.phase_peak[ph][t]) s_.phase_peak[ph][t] = s_.live[t];
  if (s_.live_total > s_.phase_peak_total[ph]) s_.phase_peak_total[ph] = s_.live_total;
  Buffer b;
  if (opts_.track_buffers) {
    b.id_ = next_id_++;
    live_buffers_.emplace(b.id_, LiveBuffers{.what = std::string(what), .tag = tag, .bytes = bytes, .count = 1});
    LiveBuffers& seen = seen_[{std::string(what), tag}];
    seen.what = what;
    seen.tag = tag;
    seen.bytes = std::max(seen.bytes, bytes);
    seen.count += 1;
  }
  if (s_.live_total > s_.peak_total) {
    s_.peak_total = s_.live_total;
    s_.at_total_peak = s_.live;
    if (opts_.track_buffers) snapshot_buffers_locked();
  }
  if (watched_[t]) update_watch_locked();
  b.owner_ = this;
  b.data_ = p;
  b.bytes_ = bytes;
  b.tag_ = tag;
  return b;
}

void Allocator::snapshot_buffers_locked() {
  std::map<std::pair<std::string, Tag>, LiveBuffers> groups;
  for (const auto& [id, lb] : live_buffers_) {
    LiveBuffers& g = groups[{lb.what, lb.tag}];
    g.what = lb.what;
    g.tag = lb.tag;
    g.bytes += lb.bytes;
    g.count += 1;
  }
  at_peak_.clear();
  for (auto& [key, g] : groups) at_peak_.push_back(std::move(g));
  std::sort(at_peak_.begin(), at_peak_.end(), [](const LiveBuffers& a, const LiveBuffers& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.what < b.what;
  });
}

std::vector<LiveBuffers> Allocator::live_at_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return at_peak_;
}

std::vector<LiveBuffers> Allocator::buffers_seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LiveBuffers> out;
  for (const auto& [key, b] : seen_) out.push_back(b);
  return out;
}

void Allocator::release(void* ptr, int64_t bytes, Tag tag, int64_t id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= 0) live_buffers_.erase(id);
  if (ptr != nullptr) source_->release(ptr, bytes);
  s_.live[static_cast<int>(tag)] -= bytes;
  s_.live_total -= bytes;
  if (watched_[static_cast<int>(tag)]) update_watch_locked();
}

void Allocator::update_watch_locked() {
  int64_t sum = 0;
  for (int t = 0; t < kNumTags; ++t)
    if (watched_[t]) sum += s_.live[t];
  s_.watch_live = sum;
  if (sum > s_.watch_peak) s_.watch_peak = sum;
  int64_t& ph = s_.phase_watch_peak[static_cast<int>(phase_)];
  if (sum > ph) ph = sum;
}

void Allocator::set_watch(std::initializer_list<Tag> tags) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_ = {};
  for (Tag t : tags) watched_[static_cast<int>(t)] = true;
  s_.watch_peak = 0;
  s_.phase_watch_peak = {};
  update_watch_locked();
}

void Allocator::set_phase(Phase p) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = p;
  int ph = static_cast<int>(p);
  // What is live on entering a phase counts toward that phase's peak.
  for (int t = 0; t < kNumTags; ++t)
    if (s_.live[t] > s_.phase_peak[ph][t]) s_.phase_peak[ph][t] = s_.live[t];
  if (s_.live_total > s_.phase_peak_total[ph]) s_.phase_peak_total[ph] = s_.live_total;
  update_watch_locked();
}

Phase Allocator::phase() const {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.live;
  s_.at_total_peak = s_.live;
  s_.peak_total = s_.live_total;
  if (opts_.track_buffers) snapshot_buffers_locked();
  for (int ph = 0; ph < kNumPhases; ++ph) {
    s_.phase_peak[ph] = {};
    s_.phase_peak_total[ph] = 0;
  }
  int ph = static_cast<int>(phase_);
  s_.phase_peak[ph] = s_.live;
  s_.phase_peak_total[ph] = s_.live_total;
  s_.watch_peak = 0;
  s_.phase_watch_peak = {};
  update_watch_locked();
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

std::string Allocator::describe_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_live_locked();
}

std::string Allocator::describe_live_locked() const {
  std::string out = "live " + format_bytes(s_.live_total);
  if (opts_.budget_bytes > 0) out += " of budget " + format_bytes(opts_.budget_bytes);
  std::string parts;
  for (int t = 0; t < kNumTags; ++t) {
    if (s_.live[t] == 0) continue;
    if (!parts.empty()) parts += ", ";
    parts += std::string(tag_name(static_cast<Tag>(t))) + " " + format_bytes(s_.live[t]);
  }
  return out + (parts.empty() ? "" : ": " + parts);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024 && bytes > -1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = -1;
  while (std::fabs(v) >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

StatusOr<int64_t> parse_bytes(std::string_view s) {
  std::string str(s);
  auto bad = [&] {
    return Status::invalid_argument("cannot read '" + str +
                                    "' as a byte count: use a number with an optional unit, "
                                    "e.g. 4096, 512M, 8G, 1.5G");
  };
  if (str.empty()) return bad();
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(str, &pos);
  } catch (...) {
    return bad();
  }
  std::string unit = str.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "IB") unit.resize(unit.size() - 2);
  else if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  double mult = 1;
  if (unit.empty()) mult = 1;
  else if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024;
  else if (unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else return bad();
  const double bytes = v * mult;
  if (!(bytes >= 1.0) || bytes > 9.0e18)
    return Status::invalid_argument("byte count '" + str +
                                    "' must be positive (at least 1 byte, below 8 EiB), e.g. 512M or 8G");
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace untied
