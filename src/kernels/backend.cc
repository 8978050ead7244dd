// The table of a device's backend, and the allocation of a call's scratch (backend.h).
#include "kernels/backend.h"

namespace untied {

const KernelTable& kernel_table(const Device& dev) {
  const KernelTable* own = dev.kernels();
  return own != nullptr ? *own : cpu::kernel_table();
}

Scratch allocate_scratch(Device& dev, const ScratchRequest& request) {
  Scratch s;
  for (size_t i = 0; i < request.items.size(); ++i) {
    const ScratchRequest::Item& item = request.items[i];
    if (item.set) s.buffers[i] = dev.allocator().allocate(item.bytes, item.tag, item.what);
  }
  return s;
}

}  // namespace untied
