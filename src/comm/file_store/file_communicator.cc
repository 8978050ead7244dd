// The file-store communicator's collectives (the contract and the folder's layout:
// untied/comm/file_store.h).
//
// A collective, numbered n in its communicator (every rank counts alike):
//   1. delete this rank's file of collective n - 2: having seen every rank's file of n - 1, each
//      written after its writer had finished reading n - 2, no rank reads it any more (after a
//      collective that failed, only the files before the last one fully seen);
//   2. write this rank's file c<n>.r<rank>: a header (the call, its sizes) and its contribution
//      (the whole send buffer for all_to_all, reduce_scatter and all_reduce, the block for
//      all_gather, the buffer on broadcast's root, nothing otherwise);
//   3. wait until every rank's file of n exists (so every collective is also a barrier), check the
//      headers agree, and read from each file what this rank needs. Reductions run over ranks
//      0..n-1 in that order, from a copy, so in-place calls need nothing more.
// sendrecv writes the k-th message from s to d as m<s>-<d>.<k>; the receiver waits for it, opens
// it, deletes its name and reads it. Destruction: see ~FileCommunicator.
#include "comm/file_store/file_communicator.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "untied/core/check.h"

namespace untied::file_store {
namespace {

void check_reducible(DType t, const char* call) {
  UNTIED_CHECK_KIND(ErrorKind::kUnsupported, t != DType::kBF16, "file store does not support reduce on bf16 (",
                    call, "); reduce in f32 instead");
}

int64_t reduce_arg(DType t, ReduceOp op) { return static_cast<int64_t>(t) * 16 + static_cast<int>(op); }

// acc[i] = acc[i] op src[i].
template <typename T>
void combine_typed(void* acc_v, const void* src_v, int64_t n, ReduceOp op) {
  T* acc = static_cast<T*>(acc_v);
  const T* s = static_cast<const T*>(src_v);
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + s[i];
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] < s[i] ? s[i] : acc[i];
      break;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) acc[i] = s[i] < acc[i] ? s[i] : acc[i];
      break;
  }
}

void combine(void* acc, const void* src, int64_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::kF32: return combine_typed<float>(acc, src, n, op);
    case DType::kF64: return combine_typed<double>(acc, src, n, op);
    case DType::kI32: return combine_typed<int32_t>(acc, src, n, op);
    case DType::kI64: return combine_typed<int64_t>(acc, src, n, op);
    case DType::kBF16: break;
  }
  check_reducible(t, "reduce");
}

}  // namespace

FileCommunicator::FileCommunicator(std::shared_ptr<const Job> job, std::string id, int rank,
                                   std::vector<int> world_ranks, std::string registration)
    : job_(std::move(job)),
      id_(std::move(id)),
      path_(job_->job_dir + "/" + id_),
      registration_(std::move(registration)),
      rank_(rank),
      world_ranks_(std::move(world_ranks)),
      sent_(world_ranks_.size(), 0),
      received_(world_ranks_.size(), 0) {
  std::error_code ec;
  std::filesystem::create_directories(path_, ec);
  UNTIED_CHECK_KIND(ErrorKind::kIo, !ec, "file store: cannot create ", path_, ": ", ec.message(),
                    "; every rank must be able to write in ", job_->dir);
}

// Every rank writes bye.r<rank>; the one that then finds all of them removes the folder (every
// rank has finished with it), then the job's folder and the directory if nothing else is left.
// Until then this rank's last contribution stays: others may still be reading it.
FileCommunicator::~FileCommunicator() {
  delete_read_files();
  if (!registration_.empty()) ::unlink(registration_.c_str());  // every rank read it in confirm_join
  auto bye = [&](int q) { return path_ + "/bye.r" + std::to_string(q); };
  const int fd = ::open(bye(rank_).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  for (int q = 0; q < size(); ++q) {
    struct stat st {};
    if (::stat(bye(q).c_str(), &st) != 0) return;
  }
  remove_folder(path_);
  ::rmdir(job_->job_dir.c_str());
  ::rmdir(job_->dir.c_str());
}

void FileCommunicator::bind_device(Device& dev) {
  UNTIED_CHECK_KIND(ErrorKind::kUnsupported, dev.kind() == DeviceKind::kCpu,
                    "the file-store communicator moves host memory only; ", dev.name(),
                    " ranks use NCCL (make_nccl_communicator in untied/comm/nccl.h), bootstrapped through it");
}

void FileCommunicator::delete_read_files() noexcept {
  for (; kept_from_ < seen_; ++kept_from_) ::unlink(round_path(kept_from_, rank_).c_str());
}

std::string FileCommunicator::round_path(int64_t n, int q) const {
  return path_ + "/c" + std::to_string(n) + ".r" + std::to_string(q);
}

std::string FileCommunicator::message_path(int from, int to, int64_t k) const {
  return path_ + "/m" + std::to_string(from) + "-" + std::to_string(to) + "." + std::to_string(k);
}

std::string FileCommunicator::label(Call call, int64_t n) const {
  return str_cat("file store ", call_name(call), " #", n, " on ", id_, " (rank ", rank_, " of ", size(), ")");
}

std::string FileCommunicator::describe(int q) const {
  const int w = world_ranks_[static_cast<size_t>(q)];
  std::string s = std::to_string(q) + " (";
  if (w != q) s += "world rank " + std::to_string(w) + ", ";
  return s + job_->notes[static_cast<size_t>(w)] + ")";
}

void FileCommunicator::throw_if_aborted(const std::string& what) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_abort_check_) return;
  next_abort_check_ = now + std::chrono::milliseconds(10);
  std::string text;
  if (read_small_file(job_->job_dir + "/abort", &text) != 0) return;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  fail(ErrorKind::kAborted, error_prefix(__FILE__, __LINE__) + what + ": " +
                                (text.empty() ? std::string("a rank called abort()") : text) + "; this rank stops");
}

template <typename Ready, typename Missing>
void FileCommunicator::wait_for(const std::string& what, Ready&& ready, Missing&& missing) {
  if (poll_until(deadline_after(job_->timeout_s), ready, [&] { throw_if_aborted(what); })) return;
  next_abort_check_ = {};  // an abort explains the wait better than the timeout does
  throw_if_aborted(what);
  fail(ErrorKind::kIo, error_prefix(__FILE__, __LINE__) + what + ": " + missing());
}

std::vector<StoreFile> FileCommunicator::exchange(Call call, int64_t size_arg, int64_t arg,
                                                  std::initializer_list<Piece> payload) {
  const int64_t n = next_++;
  const std::string what = label(call, n);
  delete_read_files();
  int64_t bytes = 0;
  for (const Piece& p : payload) bytes += p.bytes;
  const std::string err = write_store_file(round_path(n, rank_), make_header(call, n, rank_, size_arg, arg, bytes), payload);
  if (!err.empty())
    fail(ErrorKind::kIo, error_prefix(__FILE__, __LINE__) + what + ": " + err + " (is " + job_->dir +
                             " writable by every rank, with room left?)");

  std::vector<StoreFile> files(static_cast<size_t>(size()));
  int arrived = 0;
  auto ready = [&] {
    for (int q = 0; q < size(); ++q) {
      StoreFile& f = files[static_cast<size_t>(q)];
      if (f.is_open()) continue;
      std::string why;
      const StoreFile::Opened o = f.open(round_path(n, q), &why);
      if (o == StoreFile::Opened::kOk) ++arrived;
      if (o == StoreFile::Opened::kBad) fail(ErrorKind::kIo, error_prefix(__FILE__, __LINE__) + what + ": " + why);
    }
    return arrived == size();
  };
  auto missing = [&] {
    std::string ranks;
    for (int q = 0; q < size(); ++q)
      if (!files[static_cast<size_t>(q)].is_open()) ranks += (ranks.empty() ? "" : ", ") + describe(q);
    return "no file from rank(s) " + ranks + " within " + seconds_text(job_->timeout_s) + " in " + path_ +
           " (did they stop or fail, or call fewer collectives on this communicator?)";
  };
  wait_for(what, ready, missing);
  seen_ = n;

  for (int q = 0; q < size(); ++q) {
    const FileHeader& h = files[static_cast<size_t>(q)].header();
    UNTIED_CHECK_KIND(ErrorKind::kIo, h.seq == n && h.rank == q, what, ": ", round_path(n, q),
                      " says it is collective #", h.seq, " of rank ", h.rank,
                      ": another job writes in this folder? give each job a directory of its own");
    UNTIED_CHECK(h.call == static_cast<uint32_t>(call), "file store: rank ", q, " called ",
                 call_name(static_cast<Call>(h.call)), " while rank ", rank_, " called ", call_name(call), " (#", n,
                 " on ", id_, "); every rank must call the same collectives in the same order");
    UNTIED_CHECK(h.size == size_arg && h.arg == arg, what, ": rank ", q, " passed size ", h.size, " (arg ", h.arg,
                 "), rank ", rank_, " passed size ", size_arg, " (arg ", arg,
                 "); every rank must pass the same sizes, types and root");
  }
  return files;
}

void FileCommunicator::read_from(const std::vector<StoreFile>& files, int q, int64_t offset, void* dst,
                                 int64_t bytes) {
  const StoreFile& f = files[static_cast<size_t>(q)];
  const std::string err = f.read(offset, dst, bytes);
  UNTIED_CHECK_KIND(ErrorKind::kIo, err.empty(), label(static_cast<Call>(f.header().call), f.header().seq),
                    ": reading rank ", q, "'s file: ", err);
}

void FileCommunicator::reduce_files(const std::vector<StoreFile>& files, int64_t offset, const void* mine,
                                    void* out, int64_t elems, DType dtype, ReduceOp op) {
  const int64_t bytes = elems * dtype_size(dtype);
  if (bytes == 0) return;
  std::vector<std::byte> acc(static_cast<size_t>(bytes)), theirs(static_cast<size_t>(bytes));
  for (int q = 0; q < size(); ++q) {
    const void* src = mine;
    if (q != rank_) {
      read_from(files, q, offset, theirs.data(), bytes);
      src = theirs.data();
    }
    if (q == 0) std::memcpy(acc.data(), src, static_cast<size_t>(bytes));
    else combine(acc.data(), src, elems, dtype, op);
  }
  std::memcpy(out, acc.data(), static_cast<size_t>(bytes));
}

void FileCommunicator::confirm_join() { exchange(Call::kJoin, 0, 0, {}); }

std::unique_ptr<Communicator> FileCommunicator::split(int color, int key) {
  UNTIED_CHECK(color >= 0, "split: color must be >= 0, got ", color);
  const int32_t mine[2] = {color, key};
  std::vector<StoreFile> files = exchange(Call::kSplit, 0, 0, {Piece{mine, sizeof mine}});
  std::vector<int32_t> all(2 * static_cast<size_t>(size()));
  for (int q = 0; q < size(); ++q) {
    if (q == rank_) std::memcpy(&all[2 * static_cast<size_t>(q)], mine, sizeof mine);
    else read_from(files, q, 0, &all[2 * static_cast<size_t>(q)], sizeof mine);
  }
  // Members of this colour ordered by (key, rank): a stable sort of ascending ranks by key.
  std::vector<int> members;
  for (int q = 0; q < size(); ++q)
    if (all[2 * static_cast<size_t>(q)] == color) members.push_back(q);
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  std::vector<int> world;
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    world.push_back(world_ranks_[static_cast<size_t>(members[i])]);
    if (members[i] == rank_) new_rank = static_cast<int>(i);
  }
  const std::string id = id_ + ".s" + std::to_string(splits_++) + "c" + std::to_string(color);
  return std::make_unique<FileCommunicator>(job_, id, new_rank, std::move(world));
}

void FileCommunicator::all_to_all(const void* send, void* recv, int64_t block_bytes) {
  UNTIED_CHECK(block_bytes >= 0, "all_to_all: negative block size ", block_bytes);
  const int n = size();
  std::vector<StoreFile> files = exchange(Call::kAllToAll, block_bytes, 0, {Piece{send, n * block_bytes}});
  for (int q = 0; q < n; ++q) {
    char* dst = static_cast<char*>(recv) + q * block_bytes;
    if (q == rank_) {
      if (block_bytes > 0)
        std::memcpy(dst, static_cast<const char*>(send) + rank_ * block_bytes, static_cast<size_t>(block_bytes));
    } else {
      read_from(files, q, rank_ * block_bytes, dst, block_bytes);
    }
  }
}

void FileCommunicator::all_gather(const void* send, void* recv, int64_t block_bytes) {
  UNTIED_CHECK(block_bytes >= 0, "all_gather: negative block size ", block_bytes);
  std::vector<StoreFile> files = exchange(Call::kAllGather, block_bytes, 0, {Piece{send, block_bytes}});
  for (int q = 0; q < size(); ++q) {
    char* dst = static_cast<char*>(recv) + q * block_bytes;
    if (q != rank_) read_from(files, q, 0, dst, block_bytes);
    else if (block_bytes > 0) std::memcpy(dst, send, static_cast<size_t>(block_bytes));
  }
}

void FileCommunicator::reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype,
                                      ReduceOp op) {
  check_reducible(dtype, "reduce_scatter");
  UNTIED_CHECK(block_elems >= 0, "reduce_scatter: negative block size ", block_elems);
  const int64_t block_bytes = block_elems * dtype_size(dtype);
  std::vector<StoreFile> files = exchange(Call::kReduceScatter, block_elems, reduce_arg(dtype, op),
                                          {Piece{send, size() * block_bytes}});
  reduce_files(files, rank_ * block_bytes, static_cast<const char*>(send) + rank_ * block_bytes, recv,
               block_elems, dtype, op);
}

void FileCommunicator::all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) {
  check_reducible(dtype, "all_reduce");
  UNTIED_CHECK(elems >= 0, "all_reduce: negative size ", elems);
  std::vector<StoreFile> files =
      exchange(Call::kAllReduce, elems, reduce_arg(dtype, op), {Piece{send, elems * dtype_size(dtype)}});
  reduce_files(files, 0, send, recv, elems, dtype, op);
}

void FileCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  UNTIED_CHECK(bytes >= 0, "broadcast: negative size ", bytes);
  UNTIED_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of a group of ", size());
  std::vector<StoreFile> files =
      exchange(Call::kBroadcast, bytes, root, {Piece{buf, rank_ == root ? bytes : 0}});
  if (rank_ != root) read_from(files, root, 0, buf, bytes);
}

void FileCommunicator::barrier() { exchange(Call::kBarrier, 0, 0, {}); }

void FileCommunicator::sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                                int src) {
  UNTIED_CHECK(send_bytes >= 0 && recv_bytes >= 0, "sendrecv: negative size (send ", send_bytes, ", recv ",
               recv_bytes, ")");
  UNTIED_CHECK(dest >= 0 && dest < size(), "sendrecv: dest ", dest, " is not a rank of a group of ", size());
  UNTIED_CHECK(src >= 0 && src < size(), "sendrecv: src ", src, " is not a rank of a group of ", size());
  // Post: the message is a file, so the send completes before the peer receives.
  const int64_t k_out = sent_[static_cast<size_t>(dest)]++;
  const std::string err = write_store_file(message_path(rank_, dest, k_out),
                                           make_header(Call::kSendrecv, k_out, rank_, send_bytes, 0, send_bytes),
                                           {Piece{send, send_bytes}});
  const std::string what = str_cat("file store sendrecv on ", id_, " (rank ", rank_, " of ", size(), ")");
  UNTIED_CHECK_KIND(ErrorKind::kIo, err.empty(), what, ": message #", k_out, " to rank ", dest, ": ", err);
  // Receive: wait for the peer's message, take its name out of the folder, read it.
  const int64_t k_in = received_[static_cast<size_t>(src)]++;
  const std::string path = message_path(src, rank_, k_in);
  StoreFile f;
  auto ready = [&] {
    std::string why;
    const StoreFile::Opened o = f.open(path, &why);
    if (o == StoreFile::Opened::kBad) fail(ErrorKind::kIo, error_prefix(__FILE__, __LINE__) + what + ": " + why);
    return o == StoreFile::Opened::kOk;
  };
  auto missing = [&] {
    return str_cat("message #", k_in, " from rank ", describe(src), " did not come within ",
                   seconds_text(job_->timeout_s), " (", path, "; did rank ", src,
                   " stop or fail, or call sendrecv towards this rank fewer times?)");
  };
  wait_for(what, ready, missing);
  ::unlink(path.c_str());
  const FileHeader& h = f.header();
  UNTIED_CHECK_KIND(ErrorKind::kIo, h.call == static_cast<uint32_t>(Call::kSendrecv) && h.seq == k_in && h.rank == src,
                    what, ": ", path, " is not message #", k_in, " from rank ", src,
                    ": another job writes in this folder? give each job a directory of its own");
  UNTIED_CHECK(h.payload_bytes == recv_bytes, "sendrecv: rank ", src, " sent ", h.payload_bytes,
               " bytes, this rank expected ", recv_bytes);
  const std::string rerr = f.read(0, recv, recv_bytes);
  UNTIED_CHECK_KIND(ErrorKind::kIo, rerr.empty(), what, ": reading ", path, ": ", rerr);
}

void FileCommunicator::abort(int code) noexcept {
  std::string text;
  try {
    text = str_cat("rank ", world_ranks_[static_cast<size_t>(rank_)], " (", job_->notes[static_cast<size_t>(job_->world_rank)],
                   ") called abort(", code, ")");
    replace_file(job_->job_dir + "/abort", text + "\n");
  } catch (...) {  // out of memory: the process still ends
  }
  std::fprintf(stderr, "untied: file store: %s; the other ranks stop at their next collective\n", text.c_str());
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace untied::file_store
