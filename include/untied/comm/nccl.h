// The NCCL communicator: one rank per GPU, collectives on the GPU over NVLink/PCIe/network.
//
// Made collectively from a bootstrap communicator of the same ranks (the MPI world under
// mpirun): rank 0 creates the NCCL unique id, the bootstrap broadcasts it, and every rank joins
// with ncclCommInitRank on its CUDA device. Collectives run on a communication stream of their
// own, ordered after the device's compute stream with an event, and the call returns when they
// are complete (the Communicator contract: blocking). Buffers are GPU memory of the bound
// device; host buffers (small agreements such as all_ranks_ok) are staged through the device.
// split() uses ncclCommSplit. abort() aborts the NCCL communicator and then the bootstrap's job;
// cancel_in_flight() (the watchdog's thread, for a stuck call) parks the rank's polling thread
// and aborts the NCCL communicator under it.
//
// Refusals (a Status every rank returns alike, before any NCCL call): a build without NCCL; a
// device that is not CUDA; more ranks on one host than GPUs visible ("N ranks share M GPUs:
// NCCL needs one GPU per rank; run fewer ranks per host, or in one process with --ranks N,
// which shares a GPU through the in-process communicator"); two ranks of one host on the same
// GPU (compared by PCI bus id, so per-rank CUDA_VISIBLE_DEVICES is fine). A failure inside
// NCCL's own initialisation, after the agreement, throws untied::Error on the ranks that see it.
//
// Errors: every NCCL call is checked (UNTIED_NCCL_CHECK: the call, NCCL's message, the rank);
// an asynchronous NCCL error seen while waiting (a failed peer, a network error) aborts the
// NCCL communicator and throws. sendrecv pairs must agree on sizes (a mismatch between two
// ranks cannot be detected; a send to self must pair with a receive from self).
#pragma once

#include <memory>
#include <string>

#include "untied/comm/communicator.h"
#include "untied/core/status.h"
#include "untied/device/device.h"

namespace untied {

// True when this build includes NCCL.
bool nccl_built();

// Collective over `bootstrap`. `dev` is this rank's CUDA device (from make_cuda_device with the
// rank's local GPU index; its GPU must be the calling thread's current CUDA device, as it is on
// the thread that made it, else a Status says so) and must outlive the communicator;
// `bootstrap` must outlive it and every communicator split from it (abort() calls its abort).
// bind_device accepts only `dev`.
StatusOr<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, Device& dev);

// A new NCCL unique id (ncclGetUniqueId; its 128 bytes), which needs no GPU. With NCCL_COMM_ID=host:port
// in the environment every process gets the same id, naming that address, where rank 0's
// ncclCommInitRank then listens; without it, a random id naming this host, which rank 0 hands the
// others (make_nccl_communicator broadcasts it over its bootstrap).
StatusOr<std::string> nccl_unique_id();

}  // namespace untied
