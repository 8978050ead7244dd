// The NCCL calls of the NCCL communicator (src/backends/nccl/), answered over MPI for the emulator,
// so that the communicator itself (bootstrap, refusals, stream and event ordering, staging, split)
// runs under mpirun on emulated GPUs, one process per GPU. Links in place of libnccl.
//
// Each communicator is an MPI communicator: ncclCommInitRank splits MPI_COMM_WORLD (so, unlike
// NCCL, every rank of the world must join the communicator being made, which is how untied
// bootstraps), ncclCommSplit splits its parent. A one-rank communicator needs no MPI (as with
// NCCL, it may be made in a process that never initialised MPI): its collectives are copies. Every collective runs at once (streams have
// nothing to wait for in the emulator): the buffers, device memory, are copied to host memory
// inside a device scope (emu_device_memory.h), exchanged by the matching MPI collective and
// copied back. Sends and receives between ncclGroupStart and ncclGroupEnd are posted together at
// the end, as NCCL fuses them. Supported: the data types and reduction ops untied uses (char,
// int32, int64, float32, float64; sum, max, min); anything else answers ncclInvalidArgument.
#include <mpi.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu_device_memory.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  bool self = false;  // one rank, no MPI
};

namespace {

bool mpi_type(ncclDataType_t t, MPI_Datatype* out, size_t* size) {
  switch (t) {
    case ncclInt8: *out = MPI_INT8_T, *size = 1; return true;
    case ncclInt32: *out = MPI_INT32_T, *size = 4; return true;
    case ncclInt64: *out = MPI_INT64_T, *size = 8; return true;
    case ncclFloat32: *out = MPI_FLOAT, *size = 4; return true;
    case ncclFloat64: *out = MPI_DOUBLE, *size = 8; return true;
    default: return false;
  }
}

bool mpi_op(ncclRedOp_t op, MPI_Op* out) {
  switch (op) {
    case ncclSum: *out = MPI_SUM; return true;
    case ncclMax: *out = MPI_MAX; return true;
    case ncclMin: *out = MPI_MIN; return true;
    default: return false;
  }
}

// Host copies of device buffers.
std::vector<char> to_host(const void* p, size_t bytes) {
  std::vector<char> h(bytes);
  if (bytes > 0) std::memcpy(h.data(), p, bytes);
  return h;
}

struct PendingP2p {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
  ncclComm_t comm;
};
thread_local int g_group_depth = 0;
thread_local std::vector<PendingP2p> g_pending;

// A one-rank communicator's sends and receives (all to itself): the i-th receive gets the i-th
// send, as NCCL pairs them.
ncclResult_t run_self_p2p(std::vector<PendingP2p>& ops) {
  std::vector<PendingP2p*> sends, recvs;
  for (PendingP2p& o : ops) (o.send ? sends : recvs).push_back(&o);
  if (sends.size() != recvs.size()) return ncclInvalidUsage;
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i]->bytes != recvs[i]->bytes) return ncclInvalidUsage;
    if (sends[i]->bytes > 0) std::memmove(recvs[i]->buf, sends[i]->buf, sends[i]->bytes);
  }
  return ncclSuccess;
}

ncclResult_t run_p2p(std::vector<PendingP2p>& ops) {
  emu::DeviceScope scope;
  std::vector<PendingP2p> self_ops;
  for (const PendingP2p& o : ops)
    if (o.comm->self) self_ops.push_back(o);
  if (!self_ops.empty()) {
    if (self_ops.size() != ops.size()) return ncclInvalidUsage;  // one communicator per group here
    return run_self_p2p(self_ops);
  }
  std::vector<std::vector<char>> staged(ops.size());
  std::vector<MPI_Request> req(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    PendingP2p& o = ops[i];
    if (o.send) staged[i] = to_host(o.buf, o.bytes);
    else staged[i].resize(o.bytes);
    const int n = static_cast<int>(o.bytes);
    const int rc = o.send ? MPI_Isend(staged[i].data(), n, MPI_BYTE, o.peer, 0, o.comm->mpi, &req[i])
                          : MPI_Irecv(staged[i].data(), n, MPI_BYTE, o.peer, 0, o.comm->mpi, &req[i]);
    if (rc != MPI_SUCCESS) return ncclSystemError;
  }
  if (MPI_Waitall(static_cast<int>(req.size()), req.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS)
    return ncclSystemError;
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].send && ops[i].bytes > 0) std::memcpy(ops[i].buf, staged[i].data(), ops[i].bytes);
  return ncclSuccess;
}

ncclResult_t p2p(bool send, const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm) {
  MPI_Datatype mt;
  size_t es;
  if (comm == nullptr || !mpi_type(t, &mt, &es) || count * es > static_cast<size_t>(INT32_MAX))
    return ncclInvalidArgument;
  PendingP2p op{send, const_cast<void*>(buf), count * es, peer, comm};
  if (g_group_depth > 0) {
    g_pending.push_back(op);
    return ncclSuccess;
  }
  std::vector<PendingP2p> one{op};
  return run_p2p(one);
}

bool collective_args(ncclComm_t comm, ncclDataType_t t, size_t count, MPI_Datatype* mt, size_t* es) {
  return comm != nullptr && mpi_type(t, mt, es) && count <= static_cast<size_t>(INT32_MAX);
}

int comm_size(ncclComm_t comm) {
  int n = 1;
  if (!comm->self) MPI_Comm_size(comm->mpi, &n);
  return n;
}

// The collectives of a one-rank communicator: recv = send.
ncclResult_t self_copy(const void* send, void* recv, size_t bytes) {
  emu::DeviceScope scope;
  if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  return ncclSuccess;
}

// A collective on device buffers: send_bytes of `send` copied to the host, `mpi(host send, host
// recv)` run there, recv_bytes copied back to `recv`.
template <typename F>
ncclResult_t staged(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, F&& mpi) {
  emu::DeviceScope scope;
  std::vector<char> s = to_host(send, send_bytes), r(recv_bytes);
  if (mpi(s.data(), r.data()) != MPI_SUCCESS) return ncclSystemError;
  if (recv_bytes > 0) std::memcpy(recv, r.data(), recv_bytes);
  return ncclSuccess;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (emulated NCCL)";
    case ncclSystemError: return "system error (emulated NCCL over MPI)";
    default: return "emulated NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  std::strncpy(id->internal, "untied emulated nccl", sizeof id->internal - 1);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks == 1 && rank == 0) {
    *comm = new ncclComm{MPI_COMM_NULL, true};
    return ncclSuccess;
  }
  // A job launched without mpirun's help in untied (srun or torchrun variables, the ranks met
  // through a rendezvous directory) has not initialised MPI: the emulated NCCL's own bootstrap
  // does, as real NCCL's opens its sockets (the processes are still mpirun's, for the emulator).
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return ncclSystemError;
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world || rank < 0 || rank >= nranks) return ncclInvalidArgument;  // see the top
  auto* c = new ncclComm;
  if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->mpi) != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->self) {
    *newcomm = color == NCCL_SPLIT_NOCOLOR ? nullptr : new ncclComm{MPI_COMM_NULL, true};
    return ncclSuccess;
  }
  MPI_Comm m = MPI_COMM_NULL;
  if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m) != MPI_SUCCESS)
    return ncclSystemError;
  if (m == MPI_COMM_NULL) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  *newcomm = new ncclComm{m};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!comm->self) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete comm;  // the MPI communicator is left to MPI_Finalize or MPI_Abort
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr) return ncclInvalidArgument;
  *count = comm_size(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = 0;
  return comm->self || MPI_Comm_rank(comm->mpi, rank) == MPI_SUCCESS ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return ncclInvalidUsage;
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<PendingP2p> ops;
  ops.swap(g_pending);
  return run_p2p(ops);
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t) {
  return p2p(true, buf, count, t, peer, comm);
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t) {
  return p2p(false, buf, count, t, peer, comm);
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t) {
  MPI_Datatype mt;
  size_t es;
  if (!collective_args(comm, t, count, &mt, &es)) return ncclInvalidArgument;
  if (comm->self) return self_copy(send, recv, count * es);
  const size_t n = static_cast<size_t>(comm_size(comm));
  return staged(send, count * es, recv, count * es * n, [&](char* s, char* r) {
    return MPI_Allgather(s, static_cast<int>(count), mt, r, static_cast<int>(count), mt, comm->mpi);
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t) {
  MPI_Datatype mt;
  MPI_Op mo;
  size_t es;
  if (!collective_args(comm, t, count, &mt, &es) || !mpi_op(op, &mo)) return ncclInvalidArgument;
  if (comm->self) return self_copy(send, recv, count * es);
  const size_t n = static_cast<size_t>(comm_size(comm));
  return staged(send, count * es * n, recv, count * es, [&](char* s, char* r) {
    return MPI_Reduce_scatter_block(s, r, static_cast<int>(count), mt, mo, comm->mpi);
  });
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  MPI_Datatype mt;
  MPI_Op mo;
  size_t es;
  if (!collective_args(comm, t, count, &mt, &es) || !mpi_op(op, &mo)) return ncclInvalidArgument;
  if (comm->self) return self_copy(send, recv, count * es);
  return staged(send, count * es, recv, count * es, [&](char* s, char* r) {
    return MPI_Allreduce(s, r, static_cast<int>(count), mt, mo, comm->mpi);
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t) {
  MPI_Datatype mt;
  size_t es;
  if (!collective_args(comm, t, count, &mt, &es) || (comm->self && root != 0)) return ncclInvalidArgument;
  if (comm->self) return self_copy(send, recv, count * es);
  int me = 0;
  MPI_Comm_rank(comm->mpi, &me);
  const size_t bytes = count * es;
  return staged(send, me == root ? bytes : 0, recv, bytes, [&](char* s, char* r) {
    if (me == root && bytes > 0) std::memcpy(r, s, bytes);
    return MPI_Bcast(r, static_cast<int>(count), mt, root, comm->mpi);
  });
}

}  // extern "C"
