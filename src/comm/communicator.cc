// Backend-neutral helpers over the Communicator interface.
#include "untied/comm/communicator.h"

#include <climits>
#include <cstdint>
#include <string>

#include "comm/deferred_exchange.h"

namespace untied {

DeferredExchange::~DeferredExchange() {
  try {
    wait();
  } catch (...) {  // dropped: a caller that wants the error calls wait()
  }
}

void DeferredExchange::wait() {
  if (done_) return;
  done_ = true;
  finish_();
}

// The defaults in flight: the blocking call, run when the exchange is waited for.
std::unique_ptr<PendingExchange> Communicator::sendrecv_start(const void* send, int64_t send_bytes, int dest,
                                                              void* recv, int64_t recv_bytes, int src) {
  return std::make_unique<DeferredExchange>(
      [=, this] { sendrecv(send, send_bytes, dest, recv, recv_bytes, src); });
}

std::unique_ptr<PendingExchange> Communicator::all_to_all_start(const void* send, void* recv, int64_t block_bytes) {
  return std::make_unique<DeferredExchange>([=, this] { all_to_all(send, recv, block_bytes); });
}

void Communicator::all_to_allv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                               const std::vector<int64_t>& recv_bytes) {
  const int P = size(), r = rank();
  UNTIED_CHECK(static_cast<int>(send_bytes.size()) == P && static_cast<int>(recv_bytes.size()) == P,
               "all_to_allv: rank ", r, " gave ", send_bytes.size(), " send and ", recv_bytes.size(),
               " receive sizes for a group of ", P);
  std::vector<int64_t> send_at(static_cast<size_t>(P) + 1, 0), recv_at(static_cast<size_t>(P) + 1, 0);
  for (int p = 0; p < P; ++p) {
    UNTIED_CHECK(send_bytes[static_cast<size_t>(p)] >= 0 && recv_bytes[static_cast<size_t>(p)] >= 0,
                 "all_to_allv: rank ", r, " gave a negative size for rank ", p);
    send_at[static_cast<size_t>(p) + 1] = send_at[static_cast<size_t>(p)] + send_bytes[static_cast<size_t>(p)];
    recv_at[static_cast<size_t>(p) + 1] = recv_at[static_cast<size_t>(p)] + recv_bytes[static_cast<size_t>(p)];
  }
  for (int s = 0; s < P; ++s) {
    const int dest = (r + s) % P, src = (r - s + P) % P;
    sendrecv(static_cast<const char*>(send) + send_at[static_cast<size_t>(dest)], send_bytes[static_cast<size_t>(dest)],
             dest, static_cast<char*>(recv) + recv_at[static_cast<size_t>(src)], recv_bytes[static_cast<size_t>(src)],
             src);
  }
}

// One int64 min-reduction: 1 survives only if every rank passed 1.
bool all_ranks_ok(Communicator& comm, bool ok) {
  int64_t v = ok ? 1 : 0;
  comm.all_reduce(&v, &v, 1, DType::kI64, ReduceOp::kMin);
  return v == 1;
}

Status first_failure(Communicator& comm, const Status& s) {
  int64_t first = s.ok() ? INT64_MAX : comm.rank();
  comm.all_reduce(&first, &first, 1, DType::kI64, ReduceOp::kMin);
  if (first == INT64_MAX) return Status::ok_status();
  const int root = static_cast<int>(first);
  // The failing rank's code and message, broadcast to everyone.
  int64_t head[2] = {static_cast<int64_t>(s.code()), static_cast<int64_t>(s.message().size())};
  comm.broadcast(head, sizeof head, root);
  std::string msg = comm.rank() == root ? s.message() : std::string(static_cast<size_t>(head[1]), '\0');
  comm.broadcast(msg.data(), head[1], root);
  // Name the failing rank once (a Status that already went through an agreement has it).
  const std::string prefix = "rank " + std::to_string(root) + ": ";
  if (comm.size() > 1 && msg.rfind(prefix, 0) != 0) msg = prefix + msg;
  switch (static_cast<Status::Code>(head[0])) {
    case Status::Code::kNotFound: return Status::not_found(msg);
    case Status::Code::kCorrupt: return Status::corrupt(msg);
    case Status::Code::kIoError: return Status::io_error(msg);
    case Status::Code::kUnsupported: return Status::unsupported(msg);
    default: return Status::invalid_argument(msg);
  }
}

}  // namespace untied
