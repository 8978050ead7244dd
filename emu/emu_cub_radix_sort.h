// The emulator's stand-in for <cub/device/device_radix_sort.cuh> (rewrite_kernels.py substitutes
// it in embedding.cu): cub::DoubleBuffer and the one cub::DeviceRadixSort::SortPairs overload the
// kernels call (DoubleBuffer keys and values, bits [begin_bit, end_bit)), done on the host with
// std::stable_sort over those key bits: a stable sort, as CUB's radix sort is, that ignores the
// key bits outside the range as CUB does. Like CUB it first answers a size query
// (d_temp_storage == nullptr) and then sorts with that much temporary storage (the call fails if
// given less), and it may leave the result in either buffer of a DoubleBuffer, flipping its
// selector: here the result lands in the alternate buffers when the number of 8-bit digit passes
// of the bit range is odd (vocab <= 256: one pass) and in the current ones when it is even, so
// both outcomes are exercised and a caller that reads the sorted data anywhere but Current()
// fails. What it does not check: CUB's own kernels, and that the temporary storage is device
// memory.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2] = {nullptr, nullptr};
  int selector = 0;
  DoubleBuffer() = default;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() { return d_buffers[selector]; }
  T* Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, DoubleBuffer<KeyT>& d_keys,
                               DoubleBuffer<ValueT>& d_values, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t = nullptr) {
    static_assert(std::is_unsigned_v<KeyT>, "the stand-in sorts unsigned keys only");
    if (num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(KeyT) * 8) || begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    const size_t n = static_cast<size_t>(num_items);
    const size_t need = 256 + n;  // some storage that grows with n, as CUB's does
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need) return cudaErrorInvalidValue;
    emu::DeviceScope scope;  // a device operation: keys, values and scratch are device memory
    std::memset(d_temp_storage, 0xA5, need);  // the sort's scratch is overwritten
    const int bits = end_bit - begin_bit;
    const KeyT mask = bits == static_cast<int>(sizeof(KeyT) * 8) ? ~KeyT{0} : static_cast<KeyT>((KeyT{1} << bits) - 1);
    const KeyT* keys = d_keys.Current();
    const ValueT* values = d_values.Current();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ((keys[a] >> begin_bit) & mask) < ((keys[b] >> begin_bit) & mask);
    });
    std::vector<KeyT> sorted_keys(n);
    std::vector<ValueT> sorted_values(n);
    for (size_t i = 0; i < n; ++i) {
      sorted_keys[i] = keys[order[i]];
      sorted_values[i] = values[order[i]];
    }
    const bool flip = ((bits + 7) / 8) % 2 == 1;
    if (flip) {  // both alternates receive the result and become current; the old current is scratch
      std::memset(d_keys.Current(), 0xFF, n * sizeof(KeyT));
      std::memset(d_values.Current(), 0xFF, n * sizeof(ValueT));
      d_keys.selector ^= 1;
      d_values.selector ^= 1;
    } else {  // the alternates were used as scratch
      std::memset(d_keys.Alternate(), 0xFF, n * sizeof(KeyT));
      std::memset(d_values.Alternate(), 0xFF, n * sizeof(ValueT));
    }
    std::copy(sorted_keys.begin(), sorted_keys.end(), d_keys.Current());
    std::copy(sorted_values.begin(), sorted_values.end(), d_values.Current());
    return cudaSuccess;
  }
};

}  // namespace cub
