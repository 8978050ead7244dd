// The MPI backend of Communicator (Open MPI; one process per rank).
//
// Every MPI call goes through UNTIED_MPI_CHECK; communicators use MPI_ERRORS_RETURN so a failed
// call throws untied::Error naming the call and the rank instead of aborting the job.
//
// 64-bit sizes: MPI counts are int.
//   - Byte transfers (all_to_all, all_gather, broadcast, sendrecv) above INT_MAX bytes use a
//     contiguous datatype whose size is a power of two dividing the byte count
//     (mpi_byte_layout); a size no such unit divides fails with kUnsupported.
//   - all_reduce above INT_MAX elements runs as a loop of chunks; reduce_scatter blocks above
//     INT_MAX elements fail with kUnsupported (a chunked version would need a strided type).
//
// Thread level FUNNELED: only the thread that created the MpiSession may call MPI.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>

#include "comm/mpi/mpi_check.h"
#include "untied/comm/mpi.h"
#include "untied/core/check.h"

namespace untied {

void mpi_fail(int rc, const char* stmt, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  std::string what = len > 0 ? std::string(text, len) : "MPI error code " + std::to_string(rc);
  fail(ErrorKind::kInternal, error_prefix(file, line) + stmt + " -> " + what);
}

MpiByteLayout mpi_byte_layout(int64_t bytes) {
  UNTIED_CHECK(bytes >= 0, "negative transfer size: ", bytes, " bytes");
  constexpr int64_t kMaxCount = INT_MAX;
  constexpr int64_t kMaxUnit = int64_t{1} << 30;  // MPI_Type_contiguous takes an int count
  int64_t unit = 1;
  while (bytes / unit > kMaxCount && unit < kMaxUnit) unit *= 2;
  if (bytes / unit > kMaxCount || bytes % unit != 0) {
    fail(ErrorKind::kUnsupported,
         error_prefix(__FILE__, __LINE__) + "mpi cannot transfer " + std::to_string(bytes) +
             " bytes in one call: above INT_MAX bytes the MPI count needs a power-of-two unit "
             "dividing the size, and the smallest unit that fits (" +
             std::to_string(unit) + " bytes) does not divide it; make the size a multiple of " +
             std::to_string(unit));
  }
  return {unit, bytes / unit};
}

namespace {

// A byte transfer as (datatype, int count); owns the derived datatype when one is needed.
class ByteType {
 public:
  explicit ByteType(int64_t bytes) {
    MpiByteLayout l = mpi_byte_layout(bytes);
    count_ = static_cast<int>(l.count);
    if (l.unit_bytes == 1) return;
    UNTIED_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(l.unit_bytes), MPI_BYTE, &type_));
    owned_ = true;
    UNTIED_MPI_CHECK(MPI_Type_commit(&type_));
  }
  ~ByteType() {
    if (owned_) MPI_Type_free(&type_);
  }
  ByteType(const ByteType&) = delete;
  ByteType& operator=(const ByteType&) = delete;

  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
  bool owned_ = false;
};

// The MPI element type for a reduction; bf16 has none (MPI has no bfloat16 and no bf16 sum).
MPI_Datatype reduce_type(DType t, const char* call) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kBF16: break;
  }
  fail(ErrorKind::kUnsupported, error_prefix(__FILE__, __LINE__) +
                                    "mpi does not support reduce on " + std::string(dtype_name(t)) +
                                    " (" + call + "); reduce in f32 instead");
}

MPI_Op reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  fail(ErrorKind::kInvalidArgument, error_prefix(__FILE__, __LINE__) + "unknown ReduceOp " +
                                        std::to_string(static_cast<int>(op)));
}

class MpiCommunicator final : public Communicator {
 public:
  // Wraps `comm`; frees it on destruction when `owned` (communicators made by split).
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    UNTIED_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    UNTIED_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    UNTIED_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }

  ~MpiCommunicator() override {
    if (!owned_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // errors ignored: destructors do not throw
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void bind_device(Device& dev) override {
    UNTIED_CHECK_KIND(ErrorKind::kUnsupported, dev.kind() == DeviceKind::kCpu, "the MPI communicator moves host memory only; ",
                      dev.name(), " ranks use NCCL (make_nccl_communicator in untied/comm/nccl.h)");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    UNTIED_CHECK(color >= 0, "split: color must be >= 0, got ", color);
    MPI_Comm sub = MPI_COMM_NULL;
    UNTIED_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return std::make_unique<MpiCommunicator>(sub, /*owned=*/true);
  }

  void all_to_all(const void* send, void* recv, int64_t block_bytes) override {
    ByteType t(block_bytes);
    UNTIED_MPI_CHECK(MPI_Alltoall(send, t.count(), t.type(), recv, t.count(), t.type(), comm_));
  }

  // MPI_Alltoallv in bytes; when any rank's counts or offsets pass INT_MAX every rank takes the
  // pairwise default (64-bit sendrecv) instead: one decision for all (a max-reduction), so that no
  // rank enters the collective while another sends pairwise.
  void all_to_allv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override {
    const size_t P = static_cast<size_t>(size());
    UNTIED_CHECK(send_bytes.size() == P && recv_bytes.size() == P, "all_to_allv: ", send_bytes.size(), " send and ",
                 recv_bytes.size(), " receive sizes for a group of ", P);
    std::vector<int> sc(P), sd(P), rc(P), rd(P);
    int64_t s_at = 0, r_at = 0, wide = 0;
    for (size_t p = 0; p < P; ++p) {
      UNTIED_CHECK(send_bytes[p] >= 0 && recv_bytes[p] >= 0, "all_to_allv: a negative size for rank ", p);
      wide |= send_bytes[p] > INT_MAX || recv_bytes[p] > INT_MAX || s_at > INT_MAX || r_at > INT_MAX;
      if (!wide)
        sc[p] = static_cast<int>(send_bytes[p]), sd[p] = static_cast<int>(s_at),
        rc[p] = static_cast<int>(recv_bytes[p]), rd[p] = static_cast<int>(r_at);
      s_at += send_bytes[p], r_at += recv_bytes[p];
    }
    UNTIED_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wide, 1, MPI_INT64_T, MPI_MAX, comm_));
    if (wide != 0) {
      Communicator::all_to_allv(send, send_bytes, recv, recv_bytes);
      return;
    }
    UNTIED_MPI_CHECK(
        MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_));
  }

  // MPI_Ialltoall, completed by wait(). Open MPI moves the bytes as the call and later MPI calls
  // (wait() included) progress it; the caller computes meanwhile.
  class MpiAllToAll final : public PendingExchange {
   public:
    MpiAllToAll(MPI_Comm comm, const void* send, void* recv, int64_t block_bytes)
        : type_(std::make_unique<ByteType>(block_bytes)) {
      UNTIED_MPI_CHECK(
          MPI_Ialltoall(send, type_->count(), type_->type(), recv, type_->count(), type_->type(), comm, &req_));
    }
    ~MpiAllToAll() override {
      if (!done_) MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    void wait() override {
      if (done_) return;
      done_ = true;
      UNTIED_MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    }

   private:
    std::unique_ptr<ByteType> type_;  // the datatype lives as long as the request
    MPI_Request req_ = MPI_REQUEST_NULL;
    bool done_ = false;
  };

  std::unique_ptr<PendingExchange> all_to_all_start(const void* send, void* recv, int64_t block_bytes) override {
    return std::make_unique<MpiAllToAll>(comm_, send, recv, block_bytes);
  }

  void all_gather(const void* send, void* recv, int64_t block_bytes) override {
    ByteType t(block_bytes);
    UNTIED_MPI_CHECK(MPI_Allgather(send, t.count(), t.type(), recv, t.count(), t.type(), comm_));
  }

  void reduce_scatter(const void* send, void* recv, int64_t block_elems, DType dtype,
                      ReduceOp op) override {
    MPI_Datatype type = reduce_type(dtype, "reduce_scatter");
    MPI_Op mop = reduce_op(op);
    UNTIED_CHECK(block_elems >= 0, "reduce_scatter: negative block size ", block_elems);
    UNTIED_CHECK_KIND(ErrorKind::kUnsupported, block_elems <= INT_MAX,
                      "mpi reduce_scatter supports blocks of at most INT_MAX elements, got ",
                      block_elems, "; split the call into chunks");
    UNTIED_MPI_CHECK(
        MPI_Reduce_scatter_block(send, recv, static_cast<int>(block_elems), type, mop, comm_));
  }

  void all_reduce(const void* send, void* recv, int64_t elems, DType dtype, ReduceOp op) override {
    MPI_Datatype type = reduce_type(dtype, "all_reduce");
    MPI_Op mop = reduce_op(op);
    UNTIED_CHECK(elems >= 0, "all_reduce: negative size ", elems);
    const bool in_place = send == recv;
    const int64_t esize = dtype_size(dtype);
    constexpr int64_t kChunkElems = int64_t{1} << 30;  // <= INT_MAX
    for (int64_t off = 0; off < elems; off += kChunkElems) {
      const int count = static_cast<int>(std::min(kChunkElems, elems - off));
      char* r = static_cast<char*>(recv) + off * esize;
      const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esize;
      UNTIED_MPI_CHECK(MPI_Allreduce(s, r, count, type, mop, comm_));
    }
  }

  void broadcast(void* buf, int64_t bytes, int root) override {
    UNTIED_CHECK(root >= 0 && root < size_, "broadcast: root ", root,
                 " is not a rank of a group of ", size_);
    ByteType t(bytes);
    UNTIED_MPI_CHECK(MPI_Bcast(buf, t.count(), t.type(), root, comm_));
  }

  // Isend + Irecv, completed by wait(): the transfer progresses in MPI (and in wait()) while the
  // caller computes.
  class MpiExchange final : public PendingExchange {
   public:
    MpiExchange(MPI_Comm comm, const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src)
        : st_(send_bytes), rt_(recv_bytes), recv_bytes_(recv_bytes), src_(src) {
      constexpr int kTag = 1;  // apart from the blocking sendrecv's
      UNTIED_MPI_CHECK(MPI_Irecv(recv, rt_.count(), rt_.type(), src, kTag, comm, &req_[0]));
      UNTIED_MPI_CHECK(MPI_Isend(send, st_.count(), st_.type(), dest, kTag, comm, &req_[1]));
    }
    ~MpiExchange() override {
      if (!done_) MPI_Waitall(2, req_, MPI_STATUSES_IGNORE);
    }
    void wait() override {
      if (done_) return;
      done_ = true;
      MPI_Status status[2];
      UNTIED_MPI_CHECK(MPI_Waitall(2, req_, status));
      int got = 0;
      UNTIED_MPI_CHECK(MPI_Get_count(&status[0], rt_.type(), &got));
      UNTIED_CHECK(got == rt_.count(), "sendrecv: rank ", src_, " sent ", got, " units of ",
                   recv_bytes_ / std::max(rt_.count(), 1), " bytes, this rank expected ", recv_bytes_, " bytes");
    }

   private:
    ByteType st_, rt_;
    int64_t recv_bytes_;
    int src_;
    MPI_Request req_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    bool done_ = false;
  };

  std::unique_ptr<PendingExchange> sendrecv_start(const void* send, int64_t send_bytes, int dest, void* recv,
                                                  int64_t recv_bytes, int src) override {
    UNTIED_CHECK(dest >= 0 && dest < size_, "sendrecv: dest ", dest, " is not a rank of a group of ", size_);
    UNTIED_CHECK(src >= 0 && src < size_, "sendrecv: src ", src, " is not a rank of a group of ", size_);
    return std::make_unique<MpiExchange>(comm_, send, send_bytes, dest, recv, recv_bytes, src);
  }

  void sendrecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                int src) override {
    UNTIED_CHECK(dest >= 0 && dest < size_, "sendrecv: dest ", dest,
                 " is not a rank of a group of ", size_);
    UNTIED_CHECK(src >= 0 && src < size_, "sendrecv: src ", src, " is not a rank of a group of ",
                 size_);
    ByteType st(send_bytes);
    ByteType rt(recv_bytes);
    constexpr int kTag = 0;
    MPI_Status status;
    UNTIED_MPI_CHECK(MPI_Sendrecv(send, st.count(), st.type(), dest, kTag, recv, rt.count(),
                                  rt.type(), src, kTag, comm_, &status));
    // A shorter message is not an MPI error; the contract says exactly recv_bytes arrive.
    // (Open MPI also truncates a longer message sent to self without an error.)
    int got = 0;
    UNTIED_MPI_CHECK(MPI_Get_count(&status, rt.type(), &got));
    const int64_t unit = recv_bytes / std::max(rt.count(), 1);
    UNTIED_CHECK(got == rt.count(), "sendrecv: rank ", src, " sent ",
                 got == MPI_UNDEFINED
                     ? std::string("a partial unit of ") + std::to_string(unit) + " bytes"
                     : std::to_string(got * unit) + " bytes",
                 ", this rank expected ", recv_bytes);
  }

  void barrier() override { UNTIED_MPI_CHECK(MPI_Barrier(comm_)); }

  void abort(int code) noexcept override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::abort();  // MPI_Abort should not return; make sure this rank stops regardless
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  UNTIED_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    UNTIED_MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    UNTIED_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  }
  UNTIED_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  UNTIED_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  set_thread_rank(rank);
  if (provided < MPI_THREAD_FUNNELED) {
    if (!initialized) MPI_Finalize();  // the destructor will not run after a throw
    fail(ErrorKind::kUnsupported, error_prefix(__FILE__, __LINE__) + "MPI provides thread level " +
                                      std::to_string(provided) +
                                      ", untied needs MPI_THREAD_FUNNELED (" +
                                      std::to_string(MPI_THREAD_FUNNELED) + ")");
  }
}

MpiSession::~MpiSession() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiSession::world() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, /*owned=*/false);
}

bool MpiSession::launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace untied
