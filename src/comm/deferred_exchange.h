// DeferredExchange: a PendingExchange whose remaining work is one call, run by the first wait().
//
// Used where an exchange in flight has nothing to poll: the default sendrecv_start and
// all_to_all_start (the blocking call itself, run then) and the in-process sendrecv_start (its
// message already posted; the peer's taken from the mailbox then). wait() runs the call once; a
// second wait() returns at once, also after the first threw. Destroying it without wait() waits,
// and drops the error (a caller that wants it calls wait()), as PendingExchange promises.
//
// Thread safety: as its communicator's, one rank's thread.
#pragma once

#include <functional>
#include <utility>

#include "untied/comm/communicator.h"

namespace untied {

class DeferredExchange final : public PendingExchange {
 public:
  // REQUIRES: finish is callable; everything it refers to outlives this exchange's wait.
  explicit DeferredExchange(std::function<void()> finish) : finish_(std::move(finish)) {}
  ~DeferredExchange() override;
  void wait() override;

 private:
  std::function<void()> finish_;
  bool done_ = false;
};

}  // namespace untied
