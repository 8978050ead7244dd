#include "untied/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "untied/core/check.h"
#include "untied/core/checked_math.h"
#include "untied/core/file_io.h"
#include "untied/train/fault.h"

namespace untied {
namespace {

constexpr char kMagic[8] = {'U', 'N', 'T', 'I', 'E', 'D', 'C', 'K'};
constexpr uint32_t kVersion = 1;

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

// Flushes a file's (or a directory's) data to stable storage, so that a rename made after it
// survives an OS crash with the contents it names.
bool sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

// What a checkpoint's identity says of the layout it was written with (rank count, attention
// strategy, ring degree), which a resume may change: left out where identities are compared.
std::string without_layout(const std::string& identity) {
  std::istringstream in(identity);
  std::string word, out;
  while (in >> word)
    if (!word.starts_with("ranks=") && !word.starts_with("strategy=") && !word.starts_with("ring="))
      out += (out.empty() ? "" : " ") + word;
  return out;
}

// A step directory's name as `latest` must hold it: "step_" and 8 digits, nothing else (no path:
// `latest` never leads out of the checkpoint directory).
bool is_step_name(const std::string& s) {
  if (s.size() != 13 || !s.starts_with("step_")) return false;
  return std::all_of(s.begin() + 5, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The step directory `latest` names ("" and a Status saying why where it names none).
StatusOr<std::string> read_latest(const std::string& dir) {
  auto text = read_regular_file(dir + "/latest", 4096, "the checkpoint's latest");
  if (!text.ok() && text.status().code() == Status::Code::kNotFound)
    return Status::not_found(dir + "/latest is missing: no checkpoint to resume from in " + dir);
  if (!text.ok()) return text.status();
  std::string name = text.value();
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  if (!is_step_name(name))
    return Status::corrupt(dir + "/latest holds '" + name.substr(0, 64) +
                           "', not the name of a step directory (step_NNNNNNNN) inside " + dir);
  return name;
}

// The step directories of dir, newest first.
std::vector<std::string> step_dirs(const std::string& dir) {
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_directory() && is_step_name(e.path().filename().string())) steps.push_back(e.path().filename());
  std::sort(steps.rbegin(), steps.rend());  // step_%08lld: newest first
  return steps;
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}
std::string rank_file(const std::string& dir, const std::string& step, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.bin", rank);
  return dir + "/" + step + "/" + buf;
}

// Writes and checksums in one pass.
class Writer {
 public:
  explicit Writer(const std::string& path) : f_(path, std::ios::binary | std::ios::trunc) {}
  bool ok() const { return static_cast<bool>(f_); }
  void put(const void* p, size_t n) {
    fnv_.add(p, n);
    f_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  }
  template <typename T>
  void put(T v) { put(&v, sizeof v); }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    put(s.data(), s.size());
  }
  void finish() {
    const uint64_t sum = fnv_.h;
    f_.write(reinterpret_cast<const char*>(&sum), sizeof sum);
    f_.flush();
  }

 private:
  std::ofstream f_;
  Fnv fnv_;
};

// The typed fields of a file, read through the reader's own get(void*, size_t): a fixed-size value,
// or a string stored as its uint64_t length (at most `max`, else false) then its bytes. Shared by
// the stream Reader and the pread Cursor, which differ only in how bytes arrive.
template <typename Source>
class FieldReads {
 public:
  template <typename T>
  bool get(T* v) { return source().get(static_cast<void*>(v), sizeof *v); }
  bool get_str(std::string* s, uint64_t max) {
    uint64_t n;
    if (!get(&n) || n > max) return false;
    s->resize(n);
    return source().get(static_cast<void*>(s->data()), n);
  }

 private:
  Source& source() { return static_cast<Source&>(*this); }
};

class Reader : public FieldReads<Reader> {
 public:
  explicit Reader(const std::string& path) : f_(path, std::ios::binary) {}
  bool open() const { return f_.is_open(); }
  using FieldReads<Reader>::get;
  bool get(void* p, size_t n) {
    f_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    if (!f_) return false;
    fnv_.add(p, n);
    return true;
  }
  // Skips n bytes (not added to the checksum: for a file whose checksum is already verified).
  bool skip(int64_t n) {
    f_.seekg(n, std::ios::cur);
    return static_cast<bool>(f_);
  }
  bool checksum_ok() {
    uint64_t sum;
    const uint64_t want = fnv_.h;
    f_.read(reinterpret_cast<char*>(&sum), sizeof sum);
    return f_ && sum == want;
  }

 private:
  std::ifstream f_;
  Fnv fnv_;
};

// True when the file's trailing FNV-1a 64 matches everything before it: checked before any
// field is interpreted, so that damage anywhere reads as damage, not as a different model.
bool checksum_matches(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return false;
  const std::streamoff size = f.tellg();
  if (size < 8) return false;
  f.seekg(0);
  Fnv fnv;
  std::vector<char> buf(1 << 20);
  for (std::streamoff left = size - 8; left > 0;) {
    const std::streamoff n = std::min<std::streamoff>(left, static_cast<std::streamoff>(buf.size()));
    if (!f.read(buf.data(), n)) return false;
    fnv.add(buf.data(), static_cast<size_t>(n));
    left -= n;
  }
  uint64_t sum = 0;
  f.read(reinterpret_cast<char*>(&sum), sizeof sum);
  return f && sum == fnv.h;
}

// Checks this rank's file (load == nullptr: the checksum first, then every header field, the data
// skipped), or reads it into *load one parameter at a time (so that no more than one parameter's
// state is staged in host memory), checking it again as it goes.
Status read_rank(const std::string& path, int world, int rank, const std::string& identity,
                 const ShardedParams& params, int64_t* step, ShardedParams* load) {
  Reader r(path);
  if (!r.open()) return Status::not_found(path + " is missing: the checkpoint is incomplete");
  auto corrupt = [&](const std::string& what) {
    return Status::corrupt(path + ": " + what + "; the file is damaged or not an untied checkpoint");
  };
  if (load == nullptr && !checksum_matches(path)) return corrupt("checksum mismatch (or truncated)");
  char magic[8];
  uint32_t version, w, rk;
  if (!r.get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return corrupt("bad magic");
  if (!r.get(&version)) return corrupt("truncated header");
  if (version != kVersion)
    return Status::corrupt(path + ": format version " + std::to_string(version) + ", this untied reads " +
                           std::to_string(kVersion));
  if (!r.get(&w) || !r.get(&rk) || !r.get(step)) return corrupt("truncated header");
  if (static_cast<int>(w) != world)
    return Status::corrupt(path + " says it was written by " + std::to_string(w) + " ranks, the step's files by " +
                           std::to_string(world));
  if (static_cast<int>(rk) != rank) return corrupt("rank field " + std::to_string(rk) + " in rank " + std::to_string(rank) + "'s file");
  std::string id;
  if (!r.get_str(&id, 1 << 20)) return corrupt("truncated identity");
  if (without_layout(id) != without_layout(identity))
    return Status::invalid_argument("checkpoint " + path + " is from another configuration:\n  checkpoint: " +
                                    without_layout(id) + "\n  this run:   " + without_layout(identity) +
                                    "\nresume with the same model, data, sequence, batch and dtype (the ranks, the "
                                    "strategy, --ring, --upipe-heads, --steps and the learning-rate schedule may change), "
                                    "or use a new --checkpoint-dir");
  uint64_t count;
  if (!r.get(&count) || count != static_cast<uint64_t>(params.num_params()))
    return Status::invalid_argument(path + ": parameter count differs from this model");
  std::vector<float> state;  // one parameter's master, m and v
  for (int i = 0; i < params.num_params(); ++i) {
    std::string name;
    int64_t n;
    if (!r.get_str(&name, 4096) || !r.get(&n)) return corrupt("truncated parameter header");
    if (name != params.desc(i).name || n != params.shard_elems(i))
      return Status::invalid_argument(path + ": parameter " + std::to_string(i) + " is '" + name + "' (" +
                                      std::to_string(n) + " elements), this model has '" + params.desc(i).name + "' (" +
                                      std::to_string(params.shard_elems(i)) + ")");
    if (load == nullptr) {
      if (!r.skip(3 * n * 4)) return corrupt("truncated data of " + name);
      continue;
    }
    state.resize(static_cast<size_t>(3 * n));
    if (!r.get(state.data(), state.size() * 4)) return corrupt("truncated data of " + name);
    if (const int64_t bad = first_nonfinite(state.data(), 3 * n); bad >= 0)
      return Status::corrupt(path + ": " + name + " holds a non-finite value (" + (bad < n ? "weight" : "AdamW moment") +
                             " element " + std::to_string(bad % n) + "): the checkpoint cannot be resumed");
    load->write_state(i, state.data());
  }
  if (load != nullptr && !r.checksum_ok()) return corrupt("checksum mismatch");
  return Status::ok_status();
}

// A parameter table of a rank file: each parameter's name and shard length.
using ParamTable = std::vector<std::pair<std::string, int64_t>>;

// A rank file of a step written by `world` ranks (not necessarily this run's count), checked whole
// (its checksum first, then its header and identity), and its parameter table.
StatusOr<ParamTable> check_rank_file(const std::string& path, int world, int rank, const std::string& identity,
                                     int64_t* step) {
  Reader r(path);
  if (!r.open()) return Status::not_found(path + " is missing: the checkpoint is incomplete");
  auto corrupt = [&](const std::string& what) {
    return Status::corrupt(path + ": " + what + "; the file is damaged or not an untied checkpoint");
  };
  if (!checksum_matches(path)) return corrupt("checksum mismatch (or truncated)");
  char magic[8];
  uint32_t version, w, rk;
  std::string id;
  uint64_t count;
  if (!r.get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return corrupt("bad magic");
  if (!r.get(&version) || version != kVersion) return corrupt("format version is not " + std::to_string(kVersion));
  if (!r.get(&w) || !r.get(&rk) || !r.get(step) || !r.get_str(&id, 1 << 20) || !r.get(&count) || count > (1u << 24))
    return corrupt("truncated header");
  if (static_cast<int>(w) != world || static_cast<int>(rk) != rank)
    return corrupt("its world size and rank (" + std::to_string(w) + ", " + std::to_string(rk) + ") are not " +
                   std::to_string(world) + " and " + std::to_string(rank));
  if (without_layout(id) != without_layout(identity))
    return Status::invalid_argument("checkpoint " + path + " is from another configuration:\n  checkpoint: " +
                                    without_layout(id) + "\n  this run:   " + without_layout(identity) +
                                    "\nresume with the same model, data, sequence, batch and dtype (the ranks, the "
                                    "strategy, --ring, --upipe-heads, --steps and the learning-rate schedule may "
                                    "change), or use a new --checkpoint-dir");
  ParamTable table;
  for (uint64_t i = 0; i < count; ++i) {
    std::string name;
    int64_t n;
    if (!r.get_str(&name, 4096) || !r.get(&n) || n < 0 || n > (int64_t{1} << 40) || !r.skip(3 * n * 4))
      return corrupt("truncated parameter table");
    table.emplace_back(std::move(name), n);
  }
  return table;
}

// A table of a file written at `world` ranks is this model's: its parameters in order, each shard
// ceil(numel / world) long.
Status check_table(const ParamTable& t, const ShardedParams& params, int world, const std::string& path) {
  if (static_cast<int>(t.size()) != params.num_params())
    return Status::invalid_argument(path + ": " + std::to_string(t.size()) + " parameters, this model has " +
                                    std::to_string(params.num_params()));
  for (int i = 0; i < params.num_params(); ++i) {
    const int64_t want = (params.desc(i).shape.numel() + world - 1) / world;
    if (t[static_cast<size_t>(i)].first != params.desc(i).name || t[static_cast<size_t>(i)].second != want)
      return Status::invalid_argument(path + ": parameter " + std::to_string(i) + " is '" + t[static_cast<size_t>(i)].first +
                                      "' (" + std::to_string(t[static_cast<size_t>(i)].second) + " elements per rank), "
                                      "this model has '" + params.desc(i).name + "' (" + std::to_string(want) + ")");
  }
  return Status::ok_status();
}

// This rank's shard of every parameter's master weights and AdamW moments, read from the files of
// a checkpoint written at another rank count (its elements lie in one or two of them).
Status load_resharded(const CheckpointWeights& w, ShardedParams& params) {
  std::vector<float> state;  // one parameter's master, m and v
  for (int i = 0; i < params.num_params(); ++i) {
    const int64_t s = params.shard_elems(i), n = params.owned_elems(i), numel = params.desc(i).shape.numel();
    state.assign(static_cast<size_t>(3 * s), 0.0f);  // (the padding past numel stays 0)
    for (int part = 0; part < 3 && n > 0; ++part)
      if (Status st = w.read_part(i, part, numel, params.first_elem(i), n, state.data() + part * s); !st.ok()) return st;
    if (const int64_t bad = first_nonfinite(state.data(), 3 * s); bad >= 0)
      return Status::corrupt("checkpoint: " + params.desc(i).name + " holds a non-finite value: it cannot be resumed");
    params.write_state(i, state.data());
  }
  return Status::ok_status();
}

}  // namespace

namespace {
std::string moe_identity(const ModelConfig& m) {
  if (m.experts == 0) return "";
  std::string dense;
  for (int64_t l : m.dense_layers) dense += (dense.empty() ? "" : ",") + std::to_string(l);
  // (router_aux_coef is the loss's, not the model's: a resume may change it)
  return str_cat(" experts=", m.experts, " k=", m.experts_per_token, " Fe=", m.expert_ffn,
                 " norm_topk=", m.norm_topk_prob, " every=", m.moe_every, dense.empty() ? "" : " dense=" + dense);
}
}  // namespace

std::string model_identity(const ModelConfig& m) {
  const RopeScaling& r = m.rope_scaling;
  const std::string rope = r.type == RopeScalingType::kNone ? ""
                           : r.type == RopeScalingType::kLinear
                               ? str_cat(" rope=linear(", r.factor, ")")
                               : str_cat(" rope=llama3(", r.factor, ",", r.low_freq_factor, ",", r.high_freq_factor, ",",
                                         r.original_max_position, ")");
  return str_cat("V=", m.vocab, " E=", m.hidden, " N=", m.layers, " H=", m.heads, " G=", m.kv_heads, " D=", m.head_dim,
                 " F=", m.ffn, " theta=", m.rope_theta, " eps=", m.norm_eps, " qk_norm=", m.qk_norm, " qkv_bias=", m.qkv_bias,
                 m.tied_embeddings ? " tied" : "", rope, moe_identity(m));
}

Status remove_old_checkpoints(const std::string& dir, int64_t keep) {
  const StatusOr<std::string> named = read_latest(dir);
  const std::string latest = named.ok() ? named.value() : "";
  std::vector<std::string> steps = step_dirs(dir);
  std::reverse(steps.begin(), steps.end());  // oldest first
  std::error_code ec;
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i) {
    if (steps[i] == latest) continue;
    std::filesystem::remove_all(dir + "/" + steps[i], ec);
    if (ec) return Status::io_error("cannot remove " + dir + "/" + steps[i] + ": " + ec.message());
  }
  return Status::ok_status();
}

bool checkpoint_exists(const std::string& dir) {
  struct stat st;
  return ::stat((dir + "/latest").c_str(), &st) == 0;
}

StatusOr<CheckpointLock> CheckpointLock::acquire(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = dir + "/lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::io_error("cannot create " + path + ": " + std::strerror(errno) +
                            "; check that --checkpoint-dir is writable");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder(512, '\0');
    const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!holder.empty() && holder.back() == '\n') holder.pop_back();
    ::close(fd);
    return Status::invalid_argument("--checkpoint-dir " + dir + " is in use by another job (" +
                                    (holder.empty() ? std::string("its lock holds no name") : holder) +
                                    "): wait for it to end, stop it, or choose another directory");
  }
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const std::string me = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + ", run " +
                         std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(now).count() ^ ::getpid()) +
                         ", started at unix time " +
                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    ::close(fd);
    return Status::io_error("cannot write " + path + ": " + std::strerror(errno));
  }
  CheckpointLock lock;
  lock.fd_ = fd;
  return lock;
}

CheckpointLock& CheckpointLock::operator=(CheckpointLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // (closing the file releases the flock)
}

Status save_checkpoint(Communicator& comm, const std::string& dir, int64_t step, const std::string& identity,
                       const ShardedParams& params) {
  const std::string sname = step_name(step);
  Status st;
  fault_point("save-begin", step, comm.rank());
  if (comm.rank() == 0) {
    ::mkdir(dir.c_str(), 0755);
    ::mkdir((dir + "/" + sname).c_str(), 0755);
  }
  comm.barrier();
  const std::string path = rank_file(dir, sname, comm.rank()), tmp = path + ".tmp";
  {
    Writer w(tmp);
    if (!w.ok()) {
      st = Status::io_error("cannot write " + tmp + ": check that --checkpoint-dir is writable");
    } else {
      w.put(kMagic, 8);
      w.put<uint32_t>(kVersion);
      w.put<uint32_t>(static_cast<uint32_t>(comm.size()));
      w.put<uint32_t>(static_cast<uint32_t>(comm.rank()));
      w.put<int64_t>(step);
      w.put_str(identity);
      w.put<uint64_t>(static_cast<uint64_t>(params.num_params()));
      std::vector<float> state;  // master, m, v of one parameter, staged on the host
      for (int i = 0; i < params.num_params(); ++i) {
        w.put_str(params.desc(i).name);
        w.put<int64_t>(params.shard_elems(i));
        state.resize(static_cast<size_t>(3 * params.shard_elems(i)));
        params.read_state(i, state.data());
        if (const int64_t bad = first_nonfinite(state.data(), static_cast<int64_t>(state.size())); bad >= 0 && st.ok())
          st = Status::invalid_argument(
              "step " + std::to_string(step) + ": " + params.desc(i).name + " holds a non-finite " +
              (bad < params.shard_elems(i) ? "weight" : "AdamW moment") + " (NaN or Inf), so the step was not saved: "
              "resume from the checkpoint before it (with a lower --lr where training made it)");
        w.put(state.data(), state.size() * 4);
      }
      w.finish();
      if (!w.ok() && st.ok()) st = Status::io_error("short write to " + tmp + " (disk full?)");
    }
  }
  if (st.ok() && !sync_path(tmp, false)) st = Status::io_error("cannot flush " + tmp + " to disk");
  fault_point("save-rank-file", step, comm.rank());
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = Status::io_error("cannot rename " + tmp);
  if (st.ok() && !sync_path(dir + "/" + sname, true)) st = Status::io_error("cannot flush " + dir + "/" + sname);
  if (!st.ok()) std::remove(tmp.c_str());  // a partial file is of no use (and may fill a disk)
  st = first_failure(comm, st);
  if (!st.ok()) {  // `latest` still names the previous checkpoint
    return Status::io_error(st.message() + "; the checkpoint of step " + std::to_string(step) +
                            " was not saved, the previous one (" + dir + "/latest) is intact");
  }
  fault_point("save-before-latest", step, comm.rank());
  if (comm.rank() == 0) {
    const std::string latest = dir + "/latest", ltmp = latest + ".tmp";
    std::ofstream f(ltmp, std::ios::trunc);
    f << sname << "\n";
    f.close();
    if (f && sync_path(ltmp, false)) fault_point("save-latest-tmp", step, comm.rank());
    if (!f || !sync_path(ltmp, false) || std::rename(ltmp.c_str(), latest.c_str()) != 0 || !sync_path(dir, true))
      st = Status::io_error("cannot update " + latest);
  }
  return first_failure(comm, st);
}

namespace {

// The rank count that wrote step `sname` of dir: rank 0's file's header says (0 and a Status where
// it cannot be read).
StatusOr<int> world_of(const std::string& dir, const std::string& sname) {
  const std::string path = rank_file(dir, sname, 0);
  Reader r(path);
  if (!r.open()) return Status::not_found(path + " is missing: the checkpoint is incomplete");
  char magic[8];
  uint32_t version, w;
  if (!r.get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !r.get(&version) || !r.get(&w) || w < 1 ||
      w > (1u << 20))
    return Status::corrupt(path + ": bad header; the file is damaged or not an untied checkpoint");
  return static_cast<int>(w);
}

}  // namespace

StatusOr<int64_t> load_checkpoint(Communicator& comm, const std::string& dir, const std::string& identity,
                                  ShardedParams& params, int64_t step_wanted, std::string* notes) {
  // The steps to try, in order: the one asked for; else the one `latest` names, then the others,
  // newest first (where the newest is damaged, the newest intact one).
  std::vector<std::string> candidates;
  Status first_problem;
  if (step_wanted > 0) {
    candidates.push_back(step_name(step_wanted));
  } else {
    const StatusOr<std::string> latest = read_latest(dir);
    if (latest.ok()) candidates.push_back(latest.value());
    else first_problem = latest.status();
    if (!latest.ok() && latest.status().code() != Status::Code::kNotFound && notes != nullptr)
      *notes += latest.status().message() + "; trying the step directories, newest first\n";
    for (const std::string& s : step_dirs(dir))
      if (!latest.ok() || s != latest.value()) candidates.push_back(s);
    if (candidates.empty()) return first_problem;  // (the same on every rank: every rank reads the same dir)
  }
  for (const std::string& sname : candidates) {
    // Every rank checks its part of the step's files: its own file when the rank counts agree, else
    // every P-th of them (checksum, header, identity, parameter table), before anything changes.
    StatusOr<int> written = world_of(dir, sname);
    Status st = written.ok() ? Status::ok_status() : written.status();
    const int W = written.ok() ? written.value() : 0, P = comm.size();
    int64_t step = -1;
    if (st.ok() && W == P) {
      st = read_rank(rank_file(dir, sname, comm.rank()), P, comm.rank(), identity, params, &step, nullptr);
    } else if (st.ok()) {
      for (int f = comm.rank(); f < W && st.ok(); f += P) {
        StatusOr<ParamTable> table = check_rank_file(rank_file(dir, sname, f), W, f, identity, &step);
        st = table.ok() ? check_table(table.value(), params, W, rank_file(dir, sname, f)) : table.status();
      }
    }
    st = first_failure(comm, st);
    if (st.ok()) {
      int64_t lo = step < 0 ? INT64_MAX : step, hi = step;
      comm.all_reduce(&lo, &lo, 1, DType::kI64, ReduceOp::kMin);
      comm.all_reduce(&hi, &hi, 1, DType::kI64, ReduceOp::kMax);
      if (lo != hi) st = Status::corrupt("checkpoint " + dir + "/" + sname + ": the ranks' files are of different steps");
      step = hi;
    }
    if (!st.ok()) {
      // Damage (a missing, truncated or corrupt file) falls back to the next step; a checkpoint of
      // another configuration, or the step asked for, does not.
      const bool damage = st.code() == Status::Code::kCorrupt || st.code() == Status::Code::kNotFound;
      if (first_problem.ok()) first_problem = st;
      if (!damage || step_wanted > 0) return st;
      if (notes != nullptr) *notes += sname + " skipped: " + st.message() + "\n";
      continue;
    }
    // Then each rank reads its shard: from its own file when the rank counts agree (a parameter at
    // a time), else from the files that hold its elements of each parameter (resharded).
    if (W == P) {
      int64_t again = -1;
      st = first_failure(comm, read_rank(rank_file(dir, sname, comm.rank()), P, comm.rank(), identity, params, &again,
                                         &params));
      if (!st.ok()) return Status::corrupt(st.message() + " (it changed while being loaded)");
    } else {
      auto w = CheckpointWeights::open(dir, /*verify=*/false, step);
      st = w.ok() ? load_resharded(w.value(), params) : w.status();
      st = first_failure(comm, st);
      if (!st.ok()) return st;
      if (notes != nullptr)
        *notes += "resharded from " + std::to_string(W) + " ranks onto " + std::to_string(P) + "\n";
    }
    return step;
  }
  return first_problem;
}

struct CheckpointWeights::Impl {
  struct File {
    std::string path;
    int fd = -1;
    std::vector<int64_t> offset;  // per parameter: the byte offset of its master shard
  };
  std::string dir, identity;
  int64_t step = 0;
  int world = 0;
  std::vector<std::string> names;
  std::vector<int64_t> shard;  // per parameter: elements per rank
  std::vector<File> files;
  ~Impl() {
    for (File& f : files)
      if (f.fd >= 0) ::close(f.fd);
  }
};

CheckpointWeights::CheckpointWeights() : impl_(std::make_unique<Impl>()) {}
CheckpointWeights::CheckpointWeights(CheckpointWeights&&) noexcept = default;
CheckpointWeights& CheckpointWeights::operator=(CheckpointWeights&&) noexcept = default;
CheckpointWeights::~CheckpointWeights() = default;
int64_t CheckpointWeights::step() const { return impl_->step; }
int CheckpointWeights::world() const { return impl_->world; }
const std::string& CheckpointWeights::identity() const { return impl_->identity; }

// Reads fields of a file at increasing offsets with pread.
struct Cursor : FieldReads<Cursor> {
  explicit Cursor(int file) : fd(file) {}
  int fd;
  int64_t at = 0;
  using FieldReads<Cursor>::get;
  bool get(void* p, size_t n) {
    if (pread_all(fd, p, n, at) != 0) return false;
    at += static_cast<int64_t>(n);
    return true;
  }
};

StatusOr<CheckpointWeights> CheckpointWeights::open(const std::string& dir, bool verify, int64_t step_wanted) {
  std::string sname = step_name(step_wanted);
  if (step_wanted <= 0) {
    const StatusOr<std::string> latest = read_latest(dir);
    if (!latest.ok() && latest.status().code() == Status::Code::kNotFound)
      return Status::not_found(dir + "/latest is missing: " + dir + " holds no untied checkpoint");
    if (!latest.ok()) return latest.status();
    sname = latest.value();
  } else {
    struct stat st;
    if (::stat((dir + "/" + sname).c_str(), &st) != 0)
      return Status::not_found(dir + " holds no step " + std::to_string(step_wanted) + " (" + sname + ")");
  }
  CheckpointWeights w;
  Impl& x = *w.impl_;
  x.dir = dir;
  for (int rank = 0; rank == 0 || rank < x.world; ++rank) {
    const std::string path = rank_file(dir, sname, rank);
    auto corrupt = [&](const std::string& what) {
      return Status::corrupt(path + ": " + what + "; the file is damaged or not an untied checkpoint");
    };
    Impl::File& file = x.files.emplace_back();
    file.path = path;
    StatusOr<int> fd = open_regular_file(path, "checkpoint file");
    if (!fd.ok() && fd.status().code() == Status::Code::kNotFound)
      return Status::not_found(path + " is missing: the checkpoint is incomplete");
    if (!fd.ok()) return fd.status();
    file.fd = fd.value();
    if (verify && !checksum_matches(path)) return corrupt("checksum mismatch (or truncated)");
    Cursor c{file.fd};
    char magic[8];
    uint32_t version, world, rk;
    int64_t step;
    std::string id;
    uint64_t count;
    if (!c.get(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return corrupt("bad magic");
    if (!c.get(&version) || version != kVersion) return corrupt("format version is not " + std::to_string(kVersion));
    if (!c.get(&world) || !c.get(&rk) || !c.get(&step) || !c.get_str(&id, 1 << 20) || !c.get(&count) ||
        count > (1u << 24))
      return corrupt("truncated header");
    if (rank == 0) {
      if (world < 1 || world > (1u << 20)) return corrupt("world size " + std::to_string(world));
      x.world = static_cast<int>(world), x.step = step, x.identity = id;
    } else if (static_cast<int>(world) != x.world || step != x.step || id != x.identity) {
      return corrupt("its header (world size, step or identity) differs from rank 0's");
    }
    if (static_cast<int>(rk) != rank) return corrupt("rank field " + std::to_string(rk));
    for (uint64_t i = 0; i < count; ++i) {
      std::string name;
      int64_t n;
      if (!c.get_str(&name, 4096) || !c.get(&n) || n < 0 || n > (int64_t{1} << 40))
        return corrupt("truncated parameter table");
      if (rank == 0) {
        x.names.push_back(name);
        x.shard.push_back(n);
      } else if (i >= x.names.size() || name != x.names[i] || n != x.shard[i]) {
        return corrupt("its parameter table differs from rank 0's at " + name);
      }
      file.offset.push_back(c.at);
      c.at += 3 * n * 4;  // master, m, v
    }
    if (count != x.names.size()) return corrupt("its parameter count differs from rank 0's");
    struct stat st;
    if (::fstat(file.fd, &st) != 0 || st.st_size != c.at + 8) return corrupt("wrong size (truncated?)");
  }
  return w;
}

Status CheckpointWeights::check(const ModelConfig& m) const {
  const Impl& x = *impl_;
  const std::vector<ParamDesc> descs = parameter_descriptors(m);
  if (x.identity.find(" " + model_identity(m) + " ") == std::string::npos)
    return Status::invalid_argument(x.dir + " holds a checkpoint of another model than its config.json says:\n  checkpoint: " +
                                    x.identity + "\n  config:     " + model_identity(m));
  if (descs.size() != x.names.size())
    return Status::invalid_argument(x.dir + " holds " + std::to_string(x.names.size()) + " parameters, this model has " +
                                    std::to_string(descs.size()) + ": the checkpoint is of another model");
  for (size_t i = 0; i < descs.size(); ++i) {
    const int64_t want = (descs[i].shape.numel() + x.world - 1) / x.world;
    if (descs[i].name != x.names[i] || want != x.shard[i])
      return Status::invalid_argument(x.dir + ": parameter " + std::to_string(i) + " is '" + x.names[i] + "' (" +
                                      std::to_string(x.shard[i]) + " elements per rank), this model has '" +
                                      descs[i].name + "' (" + std::to_string(want) + ")");
  }
  return Status::ok_status();
}

Status CheckpointWeights::read(int i, int64_t numel, int64_t first, int64_t count, float* out) const {
  return read_part(i, 0, numel, first, count, out);
}

Status CheckpointWeights::read_part(int i, int part, int64_t numel, int64_t first, int64_t count, float* out) const {
  const Impl& x = *impl_;
  const int64_t s = x.shard[static_cast<size_t>(i)];
  UNTIED_ASSERT(part >= 0 && part < 3 && first >= 0 && count >= 0 && first + count <= numel && numel <= s * x.world,
                "CheckpointWeights::read_part: part ", part, ", elements [", first, ", ", first + count, ") of ", numel);
  while (count > 0) {
    const int r = static_cast<int>(first / s);
    const int64_t off = first - r * s, n = std::min(count, s - off);
    const Impl::File& f = x.files[static_cast<size_t>(r)];
    if (pread_all(f.fd, out, static_cast<size_t>(n) * 4, f.offset[static_cast<size_t>(i)] + (part * s + off) * 4) != 0)
      return Status::io_error("cannot read " + x.files[static_cast<size_t>(r)].path + " (" +
                              x.names[static_cast<size_t>(i)] + ")");
    first += n, count -= n, out += n;
  }
  return Status::ok_status();
}

Status load_checkpoint_weights(const CheckpointWeights& w, ShardedParams& params) {
  Status st;
  params.init([&](int i, int64_t first, std::span<float> out) {
    if (!st.ok()) return;
    const int64_t numel = params.desc(i).shape.numel();
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(static_cast<int64_t>(out.size()), numel - first));
    if (n > 0) st = w.read(i, numel, first, n, out.data());
    if (const int64_t bad = st.ok() ? first_nonfinite(out.data(), n) : -1; bad >= 0)
      st = Status::corrupt("the checkpoint's " + params.desc(i).name + " holds a non-finite value (element " +
                           std::to_string(first + bad) + "): it is not a usable model");
  });
  return st;
}

}  // namespace untied
