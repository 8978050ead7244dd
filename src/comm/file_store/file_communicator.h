// The file-store Communicator (the contract: untied/comm/file_store.h). join.cc builds the world
// one; split builds the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "comm/file_store/store_files.h"
#include "untied/comm/communicator.h"

namespace untied::file_store {

// What every communicator of one job shares. Immutable after join.
struct Job {
  std::string dir;                 // the directory every rank shares
  std::string job_dir;             // dir/<token>: this job's communicators and its abort file
  double timeout_s = 300;
  int world_rank = 0;
  std::vector<std::string> notes;  // by world rank
};

class FileCommunicator final : public Communicator {
 public:
  // Rank `rank` of the communicator `id` (its folder: job_dir/id, created here if missing), whose
  // ranks are world ranks `world_ranks`. `registration`: the world's rank_<r> file, removed on
  // destruction ("" for a split).
  FileCommunicator(std::shared_ptr<const Job> job, std::string id, int rank, std::vector<int> world_ranks,
                   std::string registration = "");
  ~FileCommunicator() override;
  FileCommunicator(const FileCommunicator&) = delete;
  FileCommunicator& operator=(const FileCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_ranks_.size()); }
  std::string backend() const override { return "file"; }
  void bind_device(Device& dev) override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void all_to_all(const void* send, void* recv, int64_t block_bytes) override;
  void all_gather(const void* send, void* recv, int64_t block_bytes) override;
  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype, ReduceOp op) override;
  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src) override;
  void barrier() override;
  // Writes job_dir/abort (this rank and `code`), then ends the process with `code`.
  void abort(int code) noexcept override;

  // The join's last step, collective: returns once every rank has read every registration.
  void confirm_join();

 private:
  // One collective: writes this rank's file for the next collective number, waits for every
  // rank's, and checks that all are in `call` with the same size and arg. Returns the files,
  // by rank.
  std::vector<StoreFile> exchange(Call call, int64_t size, int64_t arg, std::initializer_list<Piece> payload);
  // op over ranks 0..n-1 of `elems` elements at byte `offset` of each rank's payload (this
  // rank's own from `mine`) into `out`.
  void reduce_files(const std::vector<StoreFile>& files, int64_t offset, const void* mine, void* out,
                    int64_t elems, DType dtype, ReduceOp op);
  // Reads `bytes` at `offset` of rank q's payload into dst; kIo on failure.
  void read_from(const std::vector<StoreFile>& files, int q, int64_t offset, void* dst, int64_t bytes);

  // Waits until ready() is true; throws kAborted when the job's abort file appears, and kIo
  // with "<what>: <missing()> within T s" past the timeout.
  template <typename Ready, typename Missing>
  void wait_for(const std::string& what, Ready&& ready, Missing&& missing);
  void throw_if_aborted(const std::string& what);
  // Deletes this rank's files of collectives before seen_: every rank wrote its file of seen_
  // after it had finished reading them.
  void delete_read_files() noexcept;

  std::string round_path(int64_t n, int q) const;
  std::string message_path(int from, int to, int64_t k) const;
  // "file store all_reduce #17 on w (rank 0 of 4)".
  std::string label(Call call, int64_t n) const;
  // "2 (host n2, pid 7)", with the world rank when it differs.
  std::string describe(int q) const;

  std::shared_ptr<const Job> job_;
  std::string id_, path_, registration_;
  int rank_;
  std::vector<int> world_ranks_;   // by rank of this communicator
  int64_t next_ = 0;               // the next collective's number
  int64_t seen_ = -1;              // the last collective whose every file this rank has seen
  int64_t kept_from_ = 0;          // this rank's files of collectives >= kept_from_ may exist
  int64_t splits_ = 0;             // split calls so far (names the new groups)
  std::vector<int64_t> sent_, received_;  // sendrecv messages so far, by peer
  std::chrono::steady_clock::time_point next_abort_check_{};
};

}  // namespace untied::file_store
