// The NCCL backend of Communicator: one rank per GPU. See include/untied/comm/nccl.h.
//
// One collective call, step by step (class Call):
//   1. the communication stream waits, through an event, for everything already issued on the
//      device's compute stream: buffers written by kernels are complete, and device memory the
//      caching allocator hands out again is no longer in use by earlier work;
//   2. host buffers (pageable or pinned) are staged through device scratch from the device's
//      allocator (Tag::kCommunication): copied in before the NCCL call, copied out after it;
//   3. the NCCL call runs on the communication stream;
//   4. the call polls the stream until its work is done, checking ncclCommGetAsyncError on the
//      way, so a failed peer or network error throws (and aborts the NCCL communicator) instead
//      of hanging; then it returns (the Communicator contract is blocking).
//
// Sizes: NCCL counts are size_t, so 64-bit sizes pass through unchanged (bytes as ncclChar).
// Every rank passes the same sizes, so a call of zero elements returns at once on every rank.
// sendrecv: the receiver's recv_bytes must equal the sender's send_bytes (NCCL cannot report a
// mismatch between two ranks; it is checked only for a send to self).
//
// The GPU index: make_nccl_communicator takes the calling thread's current device (make_cuda_device
// selects its GPU on the thread that makes it) and checks it against the device's stream: CUDA
// refuses to record an event of one GPU on a stream of another. Every CUDA and NCCL call of the
// communicator then runs under a DeviceGuard of that index.
//
// Thread safety: like every Communicator, one rank (one thread) uses it.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backends/nccl/nccl_check.h"
#include "backends/cuda/cuda_device.h"
#include "untied/comm/nccl.h"
#include "untied/core/check.h"
#include "untied/device/cuda.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "untied needs NCCL 2.18 or newer (ncclCommSplit): point NCCL_HOME at a newer NCCL"
#endif

namespace untied {

bool nccl_built() { return true; }

namespace {

// The NCCL element type of a reduction; bf16 is refused as by every backend (the interface
// reduces f32, f64, i32 and i64 only).
ncclDataType_t reduce_type(DType t, const char* call) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kBF16: break;
  }
  fail(ErrorKind::kUnsupported, error_prefix(__FILE__, __LINE__) + "nccl does not support reduce on " +
                                    std::string(dtype_name(t)) + " (" + call + "); reduce in f32 instead");
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  fail(ErrorKind::kInvalidArgument,
       error_prefix(__FILE__, __LINE__) + "unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

// Makes GPU `index` the calling thread's current device for a scope: the staging cudaMalloc,
// stream and event creation, and NCCL's communicator calls all use the current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    int current = -1;
    UNTIED_CUDA_CHECK(cudaGetDevice(&current));
    if (current != index) {
      UNTIED_CUDA_CHECK(cudaSetDevice(index));
      restore_ = current;
    }
  }
  ~DeviceGuard() {
    if (restore_ >= 0) cudaSetDevice(restore_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int restore_ = -1;
};

// ncclGroupStart ... ncclGroupEnd. If a call inside the group throws, the destructor still ends
// the group (NCCL then discards it), so later NCCL calls are not swallowed by an open group.
class NcclGroup {
 public:
  NcclGroup() { UNTIED_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    UNTIED_NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

class NcclCommunicator final : public Communicator {
 public:
  // Creates the communication stream and its event on GPU `index`; the NCCL communicator is
  // joined afterwards (init() or split()). `bootstrap` is kept for abort().
  NcclCommunicator(CudaDevice& dev, int index, Communicator& bootstrap)
      : dev_(dev), index_(index), bootstrap_(bootstrap) {
    try {
      DeviceGuard guard(index_);
      UNTIED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      UNTIED_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    } catch (...) {
      release(/*abort_comm=*/false);
      throw;
    }
  }

  // During unwinding (a failure elsewhere on this rank) the NCCL communicator is aborted rather
  // than destroyed: destroying flushes its pending work, which may wait for peers that stopped.
  ~NcclCommunicator() override { release(/*abort_comm=*/std::uncaught_exceptions() > 0); }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // Joins the NCCL communicator of `size` ranks named by `id` as `rank` (collective).
  void init(const ncclUniqueId& id, int size, int rank) {
    DeviceGuard guard(index_);
    UNTIED_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    rank_ = rank;
    size_ = size;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void bind_device(Device& dev) override {
    UNTIED_CHECK(&dev == static_cast<Device*>(&dev_), "bind_device(", dev.name(),
                 "): this nccl communicator was made for ", dev_.name(),
                 " and moves that device's memory only; make a new communicator for another device");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    UNTIED_CHECK(color >= 0, "split: color must be >= 0, got ", color);
    check_usable("split");
    auto sub = std::make_unique<NcclCommunicator>(dev_, index_, bootstrap_);
    DeviceGuard guard(index_);
    UNTIED_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub->comm_, /*config=*/nullptr));
    UNTIED_NCCL_CHECK(ncclCommUserRank(sub->comm_, &sub->rank_));
    UNTIED_NCCL_CHECK(ncclCommCount(sub->comm_, &sub->size_));
    return sub;
  }

  void all_to_all(const void* send, void* recv, int64_t block_bytes) override {
    std::unique_ptr<Call> call = start_all_to_all(send, recv, block_bytes);
    if (call != nullptr) call->finish();
  }

  // One group of ncclSend / ncclRecv of each rank's block (zero-byte blocks skipped on both sides).
  void all_to_allv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override {
    const size_t P = static_cast<size_t>(size_);
    UNTIED_CHECK(send_bytes.size() == P && recv_bytes.size() == P, "all_to_allv: ", send_bytes.size(), " send and ",
                 recv_bytes.size(), " receive sizes for a group of ", P);
    int64_t s_total = 0, r_total = 0;
    for (size_t p = 0; p < P; ++p) {
      UNTIED_CHECK(send_bytes[p] >= 0 && recv_bytes[p] >= 0, "all_to_allv: a negative size for rank ", p);
      s_total += send_bytes[p], r_total += recv_bytes[p];
    }
    if (s_total == 0 && r_total == 0) return;
    auto call = std::make_unique<Call>(*this, "all_to_allv");
    const char* s = s_total > 0 ? static_cast<const char*>(call->in(send, s_total)) : nullptr;
    char* r = r_total > 0 ? static_cast<char*>(call->out(recv, r_total)) : nullptr;
    {
      NcclGroup group;
      int64_t s_at = 0, r_at = 0;
      for (size_t p = 0; p < P; ++p) {
        if (send_bytes[p] > 0)
          UNTIED_NCCL_CHECK(ncclSend(s + s_at, static_cast<size_t>(send_bytes[p]), ncclChar, static_cast<int>(p),
                                     comm_, stream_));
        if (recv_bytes[p] > 0)
          UNTIED_NCCL_CHECK(ncclRecv(r + r_at, static_cast<size_t>(recv_bytes[p]), ncclChar, static_cast<int>(p),
                                     comm_, stream_));
        s_at += send_bytes[p], r_at += recv_bytes[p];
      }
      group.end();
    }
    call->finish();
  }

  std::unique_ptr<PendingExchange> all_to_all_start(const void* send, void* recv, int64_t block_bytes) override {
    std::unique_ptr<Call> call = start_all_to_all(send, recv, block_bytes);
    if (call != nullptr) call->record_done();  // wait() then waits for this call, not later ones
    return std::make_unique<NcclExchange>(std::move(call));
  }

  void all_gather(const void* send, void* recv, int64_t block_bytes) override {
    UNTIED_CHECK(block_bytes >= 0, "all_gather: negative block size ", block_bytes);
    if (block_bytes == 0) return;
    Call call(*this, "all_gather");
    const void* s = call.in(send, block_bytes);
    void* r = call.out(recv, block_bytes * size_);
    UNTIED_NCCL_CHECK(ncclAllGather(s, r, static_cast<size_t>(block_bytes), ncclChar, comm_, stream_));
    call.finish();
  }

  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype,
                      ReduceOp op) override {
    const ncclDataType_t type = reduce_type(dtype, "reduce_scatter");
    const ncclRedOp_t nop = reduce_op(op);
    UNTIED_CHECK(block_elems >= 0, "reduce_scatter: negative block size ", block_elems);
    if (block_elems == 0) return;
    const int64_t block_bytes = block_elems * dtype_size(dtype);
    Call call(*this, "reduce_scatter");
    const void* s = call.in(send, block_bytes * size_);
    void* r = call.out(recv, block_bytes);
    UNTIED_NCCL_CHECK(
        ncclReduceScatter(s, r, static_cast<size_t>(block_elems), type, nop, comm_, stream_));
    call.finish();
  }

  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override {
    const ncclDataType_t type = reduce_type(dtype, "all_reduce");
    const ncclRedOp_t nop = reduce_op(op);
    UNTIED_CHECK(elems >= 0, "all_reduce: negative size ", elems);
    if (elems == 0) return;
    const int64_t bytes = elems * dtype_size(dtype);
    Call call(*this, "all_reduce");
    const void* s;
    void* r;
    if (send == recv) {  // in place: one staged buffer, copied in and back
      r = call.in_out(recv, bytes);
      s = r;
    } else {
      s = call.in(send, bytes);
      r = call.out(recv, bytes);
    }
    UNTIED_NCCL_CHECK(ncclAllReduce(s, r, static_cast<size_t>(elems), type, nop, comm_, stream_));
    call.finish();
  }

  void broadcast(void* buf, int64_t bytes, int root) override {
    UNTIED_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ",
                 size_);
    UNTIED_CHECK(bytes >= 0, "broadcast: negative size ", bytes);
    if (bytes == 0) return;
    Call call(*this, "broadcast");
    // The root's buffer is only read; the others' only written.
    void* b = call.stage(buf, bytes, /*copy_in=*/rank_ == root, /*copy_out=*/rank_ != root);
    UNTIED_NCCL_CHECK(ncclBroadcast(b, b, static_cast<size_t>(bytes), ncclChar, root, comm_, stream_));
    call.finish();
  }

  // One collective call (defined below).
 private:
  class Call;

 public:
  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src) override {
    std::unique_ptr<Call> call = start_sendrecv(send, send_bytes, dest, recv, recv_bytes, src);
    if (call != nullptr) call->finish();
  }

  // The exchange queued on the communication stream; wait() polls it to the end (and copies
  // staged host buffers back), as the blocking call does.
  class NcclExchange final : public PendingExchange {
   public:
    explicit NcclExchange(std::unique_ptr<Call> call) : call_(std::move(call)) {}
    ~NcclExchange() override {
      try {
        wait();
      } catch (...) {  // dropped: a caller that wants the error calls wait()
      }
    }
    void wait() override {
      if (call_ == nullptr) return;
      std::unique_ptr<Call> c = std::move(call_);
      c->finish();
    }

   private:
    std::unique_ptr<Call> call_;  // null: nothing in flight (zero bytes, or done)
  };

  std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest, void* recv,
                                                  int64_t recv_bytes, int src) override {
    return std::make_unique<NcclExchange>(start_sendrecv(send, send_bytes, dest, recv, recv_bytes, src));
  }

  // A one-element all_reduce: no rank's stream completes it before every rank has entered.
  void barrier() override {
    Call call(*this, "barrier");
    void* x = call.scratch(sizeof(int32_t));
    UNTIED_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(int32_t), stream_));
    UNTIED_NCCL_CHECK(ncclAllReduce(x, x, 1, ncclInt32, ncclSum, comm_, stream_));
    call.finish();
  }

  void abort(int code) noexcept override {
    if (comm_ != nullptr) {
      ncclCommAbort(comm_);  // errors ignored: the job is stopping
      comm_ = nullptr;
    }
    bootstrap_.abort(code);
  }

  // The watchdog's thread, while this rank's thread is stuck in a call: the rank's thread is
  // told to stop polling (wait() parks it), given a moment to do so, and the NCCL communicator
  // is aborted under it, which ends its kernels. comm_ is left set: the rank's thread may still
  // be inside an NCCL call, and the process ends next.
  std::string cancel_in_flight() noexcept override {
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return "";  // once per communicator
    for (int i = 0; i < 200 && !parked_.load(std::memory_order_acquire); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (comm_ == nullptr) return "";
    cudaSetDevice(index_);
    const ncclResult_t r = ncclCommAbort(comm_);
    try {
      return str_cat("rank ", rank_, " of ", size_, " (nccl): ncclCommAbort -> ", ncclGetErrorString(r),
                     parked_.load() ? "" : " (the rank's thread was inside an NCCL call)");
    } catch (...) {
      return "";
    }
  }

 private:
  // all_to_all up to its NCCL calls (one fused group of sends and receives), queued on the
  // communication stream; null for zero-byte blocks.
  std::unique_ptr<Call> start_all_to_all(const void* send, void* recv, int64_t block_bytes) {
    UNTIED_CHECK(block_bytes >= 0, "all_to_all: negative block size ", block_bytes);
    if (block_bytes == 0) return nullptr;
    const int64_t total = block_bytes * size_;
    auto call = std::make_unique<Call>(*this, "all_to_all");
    const char* s = static_cast<const char*>(call->in(send, total));
    char* r = static_cast<char*>(call->out(recv, total));
    const size_t bb = static_cast<size_t>(block_bytes);
    NcclGroup group;
    for (int p = 0; p < size_; ++p) {
      const size_t off = static_cast<size_t>(p) * bb;
      UNTIED_NCCL_CHECK(ncclSend(s + off, bb, ncclChar, p, comm_, stream_));
      UNTIED_NCCL_CHECK(ncclRecv(r + off, bb, ncclChar, p, comm_, stream_));
    }
    group.end();
    return call;
  }

  // sendrecv up to its NCCL calls, queued on the communication stream; null when there is nothing
  // to wait for (zero bytes both ways).
  std::unique_ptr<Call> start_sendrecv(const void* send, int64_t send_bytes, int dest, void* recv,
                                       int64_t recv_bytes, int src) {
    UNTIED_CHECK(dest >= 0 && dest < size_, "sendrecv: dest ", dest, " is not a rank of a group of ",
                 size_);
    UNTIED_CHECK(src >= 0 && src < size_, "sendrecv: src ", src, " is not a rank of a group of ", size_);
    UNTIED_CHECK(send_bytes >= 0 && recv_bytes >= 0, "sendrecv: negative size: send ", send_bytes,
                 " bytes, receive ", recv_bytes, " bytes");
    UNTIED_CHECK((dest == rank_) == (src == rank_), "sendrecv: rank ", rank_, " sends to ", dest,
                 " and receives from ", src,
                 ": a send to self must pair with a receive from self in the same call");
    if (dest == rank_) {  // to self: a copy on the communication stream
      UNTIED_CHECK(send_bytes == recv_bytes, "sendrecv: rank ", src, " sent ", send_bytes,
                   " bytes, this rank expected ", recv_bytes);
      if (send_bytes == 0) return nullptr;
      auto call = std::make_unique<Call>(*this, "sendrecv");
      UNTIED_CUDA_CHECK(cudaMemcpyAsync(recv, send, static_cast<size_t>(send_bytes), cudaMemcpyDefault,
                                        stream_));
      return call;
    }
    if (send_bytes == 0 && recv_bytes == 0) return nullptr;
    auto call = std::make_unique<Call>(*this, "sendrecv");
    // A side of zero bytes is skipped: the peer's matching side is zero bytes too.
    const void* s = send_bytes > 0 ? call->in(send, send_bytes) : nullptr;
    void* r = recv_bytes > 0 ? call->out(recv, recv_bytes) : nullptr;
    NcclGroup group;
    if (send_bytes > 0)
      UNTIED_NCCL_CHECK(ncclSend(s, static_cast<size_t>(send_bytes), ncclChar, dest, comm_, stream_));
    if (recv_bytes > 0)
      UNTIED_NCCL_CHECK(ncclRecv(r, static_cast<size_t>(recv_bytes), ncclChar, src, comm_, stream_));
    group.end();
    return call;
  }

  // One collective call: orders the communication stream after the compute stream, stages
  // host buffers, and (finish) copies staged results back and waits for the stream.
  class Call {
   public:
    Call(NcclCommunicator& c, const char* op) : c_(c), op_(op), guard_(c.index_) {
      c_.check_usable(op_);
      scratch_.reserve(2);
      UNTIED_CUDA_CHECK(cudaEventRecord(c_.ready_, c_.dev_.stream()));
      UNTIED_CUDA_CHECK(cudaStreamWaitEvent(c_.stream_, c_.ready_, 0));
    }
    // A call that did not finish (an error after work was queued) waits for the communication
    // stream before its scratch goes back to the caching allocator: the allocator would hand it
    // to compute-stream work that is not ordered after a copy still pending here. A failed NCCL
    // call queues nothing (NCCL discards a group with an error) and an aborted communicator's
    // kernels stop, so the wait is short. Errors are ignored: the first one is already thrown.
    ~Call() {
      if (!finished_) {
        cudaStreamSynchronize(c_.stream_);
        cudaGetLastError();
      }
      if (done_ != nullptr) cudaEventDestroy(done_);
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    // A pointer NCCL can use for the `bytes` at `p`: p itself when it is memory of this GPU;
    // otherwise device scratch, filled from p (copy_in) and copied back to p by finish()
    // (copy_out).
    void* stage(const void* p, int64_t bytes, bool copy_in, bool copy_out) {
      if (c_.on_this_gpu(p, op_)) return const_cast<void*>(p);
      void* d = scratch(bytes);
      if (copy_in)
        UNTIED_CUDA_CHECK(
            cudaMemcpyAsync(d, p, static_cast<size_t>(bytes), cudaMemcpyDefault, c_.stream_));
      if (copy_out) back_.push_back({const_cast<void*>(p), d, bytes});
      return d;
    }
    const void* in(const void* p, int64_t bytes) { return stage(p, bytes, true, false); }
    void* out(void* p, int64_t bytes) { return stage(p, bytes, false, true); }
    void* in_out(void* p, int64_t bytes) { return stage(p, bytes, true, true); }

    // Device memory for this call only (freed when the call ends, after its work is done).
    void* scratch(int64_t bytes) {
      scratch_.push_back(c_.dev_.allocator().allocate(bytes, Tag::kCommunication, "nccl staging"));
      return scratch_.back().data();
    }

    // For a call left in flight while later ones are queued behind it: an event after its work,
    // so that finish() waits for this call only (otherwise it waits for the whole stream).
    void record_done() {
      UNTIED_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      UNTIED_CUDA_CHECK(cudaEventRecord(done_, c_.stream_));
    }

    void finish() {
      // Waiting before the copies back keeps the wait a poll: a copy into pageable memory blocks
      // the host until the NCCL call before it is done.
      if (!back_.empty()) c_.wait(op_, done_);
      for (const CopyBack& b : back_)
        UNTIED_CUDA_CHECK(cudaMemcpyAsync(b.host, b.dev, static_cast<size_t>(b.bytes),
                                          cudaMemcpyDefault, c_.stream_));
      if (done_ != nullptr && !back_.empty()) UNTIED_CUDA_CHECK(cudaEventRecord(done_, c_.stream_));
      c_.wait(op_, done_);
      finished_ = true;
    }

   private:
    struct CopyBack {
      void* host;
      const void* dev;
      int64_t bytes;
    };
    NcclCommunicator& c_;
    const char* op_;
    DeviceGuard guard_;
    std::vector<Buffer> scratch_;
    std::vector<CopyBack> back_;
    cudaEvent_t done_ = nullptr;  // record_done(): the end of this call's work on the stream
    bool finished_ = false;  // finish() returned: the stream's work for this call is done
  };

  void check_usable(const char* op) const {
    UNTIED_CHECK_KIND(ErrorKind::kAborted, comm_ != nullptr, "nccl ", op,
                      ": the communicator was aborted (abort() or an earlier NCCL failure)");
  }

  // True for memory of this communicator's GPU (or managed memory), false for host memory.
  bool on_this_gpu(const void* p, const char* op) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // older runtimes report plain host memory as an error
      return false;
    }
    if (a.type == cudaMemoryTypeDevice) {
      UNTIED_CHECK(a.device == index_, "nccl ", op, ": a buffer is memory of GPU ", a.device,
                   ", this communicator moves memory of GPU ", index_, " (", dev_.name(),
                   "); allocate the buffer from that device's allocator, or pass host memory");
      return true;
    }
    return a.type == cudaMemoryTypeManaged;  // else cudaMemoryTypeHost or cudaMemoryTypeUnregistered
  }

  // Returns when the communication stream's work is done (with `until`: the work before that
  // event). Polls, so that an asynchronous NCCL error (a peer that failed, a network error)
  // throws instead of waiting forever; the NCCL communicator is then aborted, as NCCL requires
  // after such an error.
  void wait(const char* op, cudaEvent_t until = nullptr) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    for (;;) {
      if (cancelled_.load(std::memory_order_acquire)) park();
      const cudaError_t e = until != nullptr ? cudaEventQuery(until) : cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady)
        fail(ErrorKind::kInternal, error_prefix(__FILE__, __LINE__) + "nccl " + op + ": " +
                                       (until != nullptr ? "cudaEventQuery" : "cudaStreamQuery") + " -> " +
                                       cudaGetErrorString(e));
      cudaGetLastError();  // "not ready" is no error: keep it from the next launch check
      ncclResult_t async = ncclSuccess;
      UNTIED_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess) {
        std::string what = error_prefix(__FILE__, __LINE__) + "nccl " + op +
                           ": ncclCommGetAsyncError -> " + ncclGetErrorString(async);
        const char* last = ncclGetLastError(comm_);
        if (last != nullptr && last[0] != '\0') what += std::string(": ") + last;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        fail(ErrorKind::kInternal, what + "; the nccl communicator is aborted");
      }
      // Spin briefly (small collectives finish in microseconds), then poll gently.
      if (Clock::now() - start < std::chrono::milliseconds(1))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // cancel_in_flight() was called: this thread stops touching the NCCL communicator, which is
  // being aborted, and waits for the process to end (the watchdog ends it).
  [[noreturn]] void park() {
    parked_.store(true, std::memory_order_release);
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  // Frees what this object owns; never throws.
  void release(bool abort_comm) noexcept {
    int current = -1;
    const bool have_current = cudaGetDevice(&current) == cudaSuccess;
    cudaSetDevice(index_);
    if (comm_ != nullptr) {
      if (abort_comm)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
      stream_ = nullptr;
    }
    if (ready_ != nullptr) {
      cudaEventDestroy(ready_);
      ready_ = nullptr;
    }
    if (have_current && current != index_) cudaSetDevice(current);
    cudaGetLastError();  // errors ignored: destructors do not throw
  }

  CudaDevice& dev_;
  int index_;
  Communicator& bootstrap_;
  cudaStream_t stream_ = nullptr;  // the communication stream
  cudaEvent_t ready_ = nullptr;    // recorded on the compute stream before each call
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> cancelled_{false};  // cancel_in_flight() was called (the watchdog's thread)
  std::atomic<bool> parked_{false};     // this rank's thread has stopped in park()
  int rank_ = 0;
  int size_ = 0;
};

// Where a rank runs, exchanged by all_gather (fixed size, plain bytes).
struct RankPlace {
  char host[256];   // gethostname
  char bus_id[64];  // PCI bus id of the rank's GPU (stable under CUDA_VISIBLE_DEVICES)
  int32_t gpu;      // CUDA index of the rank's GPU; -1 when its device is not CUDA
  int32_t visible;  // GPUs this rank sees
};
static_assert(std::is_trivially_copyable_v<RankPlace>);

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

// The CUDA index of `dev`'s GPU: the calling thread's current device, checked against the
// device's stream.
Status find_gpu(CudaDevice& dev, int* index) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported("cannot query the current CUDA device for " + dev.name());
  }
  cudaEvent_t probe = nullptr;
  if (cudaEventCreateWithFlags(&probe, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return Status::unsupported("cannot create a CUDA event on GPU " + std::to_string(current));
  }
  const cudaError_t rec = cudaEventRecord(probe, dev.stream());
  cudaEventDestroy(probe);
  if (rec != cudaSuccess) {
    cudaGetLastError();
    return Status::invalid_argument(
        dev.name() + " is not the calling thread's current CUDA device (GPU " + std::to_string(current) +
        "): make the NCCL communicator on the thread that made the device, before it selects another GPU");
  }
  *index = current;
  return Status::ok_status();
}

// Refuses when another rank on this rank's host uses the same GPU (NCCL needs one GPU per rank).
Status check_one_gpu_per_rank(const std::vector<RankPlace>& all, int me) {
  const RankPlace& mine = all[static_cast<size_t>(me)];
  if (mine.gpu < 0) return Status::ok_status();
  int local = 0;   // ranks on this host
  int other = -1;  // the first other rank on this host with the same GPU
  for (int q = 0; q < static_cast<int>(all.size()); ++q) {
    const RankPlace& p = all[static_cast<size_t>(q)];
    if (std::strncmp(p.host, mine.host, sizeof mine.host) != 0) continue;
    ++local;
    if (q != me && other < 0 && p.gpu >= 0 && std::strncmp(p.bus_id, mine.bus_id, sizeof mine.bus_id) == 0)
      other = q;
  }
  if (other < 0) return Status::ok_status();
  if (local > mine.visible)
    return Status::unsupported(str_cat(
        local, " ranks share ", mine.visible, mine.visible == 1 ? " GPU" : " GPUs", " on host ", mine.host,
        ": NCCL needs one GPU per rank; run fewer ranks per host, or in one process with --ranks ", local,
        ", which shares a GPU through the in-process communicator"));
  return Status::unsupported(str_cat("ranks ", std::min(me, other), " and ", std::max(me, other), " on host ",
                                     mine.host, " share GPU ", mine.gpu, " (", mine.bus_id,
                                     "): NCCL needs one GPU per rank; give each rank of a host its own GPU "
                                     "index (its rank among the host's ranks)"));
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, Device& dev) {
  const int me = bootstrap.rank(), n = bootstrap.size();

  // 1. The refusals, agreed before any NCCL call: a device that is not CUDA, or a GPU that
  //    another rank of the same host uses too.
  RankPlace mine{};
  const std::string host = host_name();
  std::strncpy(mine.host, host.c_str(), sizeof mine.host - 1);
  mine.gpu = -1;
  mine.visible = cuda_device_count();
  CudaDevice* cuda = nullptr;
  Status s;
  if (dev.kind() != DeviceKind::kCuda) {
    s = Status::invalid_argument("make_nccl_communicator needs this rank's CUDA device, got " + dev.name() +
                                 ": make it with make_cuda_device (NCCL moves GPU memory only); CPU ranks "
                                 "use the MPI or in-process communicator");
  } else {
    cuda = static_cast<CudaDevice*>(&dev);
    int index = -1;
    s = find_gpu(*cuda, &index);
    if (s.ok()) {
      mine.gpu = index;
      if (cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id - 1, index) != cudaSuccess) {
        cudaGetLastError();
        std::snprintf(mine.bus_id, sizeof mine.bus_id, "cuda:%d", index);
      }
    }
  }
  std::vector<RankPlace> all(static_cast<size_t>(n));
  bootstrap.all_gather(&mine, all.data(), sizeof mine);
  if (s.ok()) s = check_one_gpu_per_rank(all, me);
  s = first_failure(bootstrap, s);
  if (!s.ok()) return s;

  // 2. This rank's stream and event, and rank 0's NCCL id; a failure on any rank is agreed too,
  //    so no rank waits in ncclCommInitRank for one that will not come.
  std::unique_ptr<NcclCommunicator> comm;
  ncclUniqueId id{};
  Status made;
  try {
    comm = std::make_unique<NcclCommunicator>(*cuda, mine.gpu, bootstrap);
    if (me == 0) UNTIED_NCCL_CHECK(ncclGetUniqueId(&id));
  } catch (const Error& e) {
    made = Status::unsupported(e.what());
  }
  made = first_failure(bootstrap, made);
  if (!made.ok()) return made;

  // 3. Every rank joins with rank 0's id, as its bootstrap rank.
  bootstrap.broadcast(&id, sizeof id, 0);
  comm->init(id, n, me);
  return std::unique_ptr<Communicator>(std::move(comm));
}

StatusOr<std::string> nccl_unique_id() {
  ncclUniqueId id{};
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    return Status::unsupported(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r) +
                               (std::getenv("NCCL_COMM_ID") != nullptr ? " (check NCCL_COMM_ID=host:port)" : ""));
  return std::string(id.internal, sizeof id.internal);
}

}  // namespace untied
