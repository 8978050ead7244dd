// The token embedding (include/untied/kernels/embedding.h) on the GPU.
//
//   id check:  one thread per token (grid-stride); a bad id atomicMin's its position into one
//              u64 in scratch. The host reads the first bad position back (and the id there),
//              which synchronizes the stream, and throws the CPU's message before anything is
//              written.
//   forward:   blockIdx.x walks tokens (grid-stride), blockIdx.y and the threads cover the E
//              columns, 4 per thread (a 16-byte f32 / 8-byte bf16 vector where E and the
//              pointers allow, else one column per thread); the table row is copied bit for bit
//              when the dtypes agree (as on the CPU), else converted on the way (bf16 out rounds
//              to nearest even, as store_f32 does).
//   backward:  deterministic without atomics on dtable. The (id, position) pairs are sorted by
//              id with cub::DeviceRadixSort (stable: equal ids keep their positions in token
//              order), so every id's tokens form one run of the sorted array. A block meets
//              each run at its first element (blocks stride over the sorted array and skip
//              non-first elements), finds the run's end (a galloping then binary search over
//              the sorted ids), and, with its threads over the columns as in the forward, adds
//              the run's dout rows in position order into the dtable row:
//                dtable[id] = (((dtable[id] + dout[p0]) + dout[p1]) + ...),  p0 < p1 < ...
//              which is exactly the CPU's order and operations, so the result is bit-identical
//              to the CPU kernel for any launch shape. Each (id, column) is owned by one thread.
//
// Workspace (dev.allocator(), Tag::kOther, live during the call; the CPU kernels take none):
// both directions 8 bytes (the first bad position); the backward also the sort's
// buffers, 16 * tokens bytes (ids and positions, two copies each) plus CUB's temporary storage
// (what cub::DeviceRadixSort::SortPairs asks for with DoubleBuffer: a few KiB to a few MiB).
#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_util.cuh"

namespace untied::cuda {
namespace {

constexpr int kThreads = 128;                     // threads per block of the row kernels
constexpr int kVec = 4;                           // columns per thread
constexpr int kUnroll = 8;                        // dout rows loaded ahead in the backward walk
constexpr int64_t kMaxRowBlocks = int64_t{1} << 16;  // blockIdx.x; grid-stride loops cover the rest

// Scratch slots: the id check's flag, and the backward's sort.
enum EmbeddingScratch { kIdCheck, kKeysA, kKeysB, kPosA, kPosB, kSortTemp };

// Throws Error(kInvalidArgument) naming the first id outside [0, vocab), as the CPU does.
// Synchronizes the stream. flag: 8 bytes of device scratch.
void check_ids(Device& dev, const EmbeddingShape& s, const int32_t* ids, void* flag) {
  int32_t id = 0;
  const int64_t t = first_out_of_range(stream_of(dev), ids, s.tokens, s.vocab, kNoException, flag, &id);
  if (t < 0) return;
  UNTIED_CHECK(id >= 0 && id < s.vocab, "embedding: ids[", t, "] = ", id, " is outside [0, vocab = ", s.vocab, ")");
  UNTIED_ASSERT(false, "embedding: the GPU flagged ids[", t, "] = ", id, " as outside [0, vocab = ", s.vocab, ")");
}

// Launch shape of the row kernels: x over rows (grid-stride), y over column blocks.
dim3 row_grid(int64_t rows, int64_t dim, int vec) {
  const int64_t col_blocks = (dim + int64_t{kThreads} * vec - 1) / (int64_t{kThreads} * vec);
  UNTIED_CHECK(col_blocks <= kMaxGridYZ, "cuda embedding: dim (E = ", dim, ") too large for one grid");
  return dim3(blocks_for(rows, 1, kMaxRowBlocks), static_cast<unsigned>(col_blocks));
}

// ---- forward -------------------------------------------------------------------------------

// out[t, c] = table[ids[t], c] for the VEC columns this thread owns. VEC == kVec requires E % 4
// == 0 and both pointers aligned to 4 elements; VEC == 1 has no requirement.
template <typename TIn, typename TOut, int VEC>
__global__ void __launch_bounds__(kThreads) embedding_forward_kernel(int64_t tokens, int64_t dim, TOut* out,
                                                                     const int32_t* ids, const TIn* table) {
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * VEC;
  if (c >= dim) return;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const TIn* src = table + static_cast<int64_t>(ids[t]) * dim + c;
    TOut* dst = out + t * dim + c;
    const Pack<TIn, VEC> x = load<TIn, VEC>(src);
    if constexpr (std::is_same_v<TIn, TOut>) {
      store<TOut, VEC>(dst, x);  // a copy of the bits, as the CPU's (NaN payloads included)
    } else {
      Pack<TOut, VEC> y;
#pragma unroll
      for (int k = 0; k < VEC; ++k) y.v[k] = from_f32<TOut>(to_f32(x.v[k]));
      store<TOut, VEC>(dst, y);
    }
  }
}

template <typename TIn, typename TOut>
void launch_forward(cudaStream_t st, const EmbeddingShape& s, void* out, const int32_t* ids, const void* table) {
  auto* o = static_cast<TOut*>(out);
  auto* tab = static_cast<const TIn*>(table);
  if (multiples_of(kVec, {s.dim}) && aligned(o, kVec * sizeof(TOut)) && aligned(tab, kVec * sizeof(TIn))) {
    embedding_forward_kernel<TIn, TOut, kVec><<<row_grid(s.tokens, s.dim, kVec), kThreads, 0, st>>>(
        s.tokens, s.dim, o, ids, tab);
  } else {
    embedding_forward_kernel<TIn, TOut, 1><<<row_grid(s.tokens, s.dim, 1), kThreads, 0, st>>>(
        s.tokens, s.dim, o, ids, tab);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// ---- backward ------------------------------------------------------------------------------

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    v[i] = static_cast<int32_t>(i);
}

// The end of the run of `key` that starts at `begin` in the sorted keys[0, n): the first index
// > begin whose key differs, or n. Galloping (1, 2, 4, ... ahead) then binary search, so a run
// of length r costs O(log r) loads. Every thread of a block computes it from the same loads.
__device__ __forceinline__ int64_t run_end(const uint32_t* keys, int64_t n, int64_t begin, uint32_t key) {
  int64_t lo = begin;  // keys[lo] == key
  int64_t step = 1;
  int64_t hi;          // keys[hi] != key, or hi == n
  for (;;) {
    const int64_t probe = begin + step;
    if (probe >= n) {
      hi = n;
      break;
    }
    if (keys[probe] != key) {
      hi = probe;
      break;
    }
    lo = probe;
    step *= 2;
  }
  while (hi - lo > 1) {  // keys[lo] == key, keys[hi] != key (or hi == n)
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] == key)
      lo = mid;
    else
      hi = mid;
  }
  return hi;
}

// dtable[key, c] += dout[p, c] over the run of every key in the sorted (keys, pos), p in order.
// VEC as in the forward (dtable and dout aligned to 4 elements, E % 4 == 0).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) embedding_backward_kernel(int64_t tokens, int64_t dim, float* dtable,
                                                                      const uint32_t* keys, const int32_t* pos,
                                                                      const T* dout) {
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * VEC;
  if (c >= dim) return;
  for (int64_t i = blockIdx.x; i < tokens; i += gridDim.x) {
    const uint32_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;  // not the first token of its id
    const int64_t end = run_end(keys, tokens, i, key);
    float* dst = dtable + static_cast<int64_t>(key) * dim + c;
    Pack<float, VEC> acc = load<float, VEC>(dst);
    const T* src = dout + c;
    int64_t j = i;
    for (; j + kUnroll <= end; j += kUnroll) {  // kUnroll rows loaded ahead, then added in order
      Pack<T, VEC> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        x[u] = load<T, VEC>(src + static_cast<int64_t>(pos[j + u]) * dim);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc.v[k] += to_f32(x[u].v[k]);
    }
    for (; j < end; ++j) {
      const Pack<T, VEC> x = load<T, VEC>(src + static_cast<int64_t>(pos[j]) * dim);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc.v[k] += to_f32(x.v[k]);
    }
    store<float, VEC>(dst, acc);
  }
}

template <typename T>
void launch_backward(cudaStream_t st, const EmbeddingShape& s, float* dtable, const uint32_t* keys,
                     const int32_t* pos, const void* dout) {
  auto* g = static_cast<const T*>(dout);
  if (multiples_of(kVec, {s.dim}) && aligned(dtable, kVec * sizeof(float)) && aligned(g, kVec * sizeof(T))) {
    embedding_backward_kernel<T, kVec><<<row_grid(s.tokens, s.dim, kVec), kThreads, 0, st>>>(s.tokens, s.dim, dtable,
                                                                                          keys, pos, g);
  } else {
    embedding_backward_kernel<T, 1><<<row_grid(s.tokens, s.dim, 1), kThreads, 0, st>>>(s.tokens, s.dim, dtable,
                                                                                     keys, pos, g);
  }
  UNTIED_CUDA_CHECK(cudaGetLastError());
}

// Radix-sort bits for ids in [0, vocab): enough for vocab - 1 (at least 1).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

}  // namespace

ScratchRequest embedding_forward_scratch(const Device&, const EmbeddingForwardCall& c) {
  ScratchRequest r;
  if (c.s.tokens > 0) r.set(kIdCheck, 8, Tag::kOther, "embedding id check");
  return r;
}

void embedding_forward(Device& dev, const EmbeddingForwardCall& c, const Scratch& scratch) {
  const auto& [s, out, ids, table] = c;
  if (s.tokens == 0) return;
  check_ids(dev, s, ids, scratch.data(kIdCheck));
  const cudaStream_t st = stream_of(dev);
  const bool in_bf16 = s.table_dtype == DType::kBF16, out_bf16 = s.dtype == DType::kBF16;
  if (in_bf16 && out_bf16) return launch_forward<bf16_t, bf16_t>(st, s, out, ids, table);
  if (in_bf16) return launch_forward<bf16_t, float>(st, s, out, ids, table);
  if (out_bf16) return launch_forward<float, bf16_t>(st, s, out, ids, table);
  launch_forward<float, float>(st, s, out, ids, table);
}

Status embedding_backward_supports(const EmbeddingBackwardCall& c) {
  if (c.s.tokens <= INT32_MAX) return Status::ok_status();
  return Status::unsupported(str_cat("tokens = ", c.s.tokens, " (at most 2^31 - 1 per call)"));
}

namespace {
// The sort's temporary storage for n keys of key_bits(vocab) bits, as CUB asks (a size query:
// nothing runs).
size_t sort_temp_bytes(int64_t n, int64_t vocab) {
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> pos(nullptr, nullptr);
  size_t temp_bytes = 0;
  UNTIED_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, pos, static_cast<int>(n), 0,
                                                    key_bits(vocab), cudaStream_t{}));
  return std::max<size_t>(temp_bytes, 1);
}
}  // namespace

ScratchRequest embedding_backward_scratch(const Device&, const EmbeddingBackwardCall& c) {
  ScratchRequest r;
  const int64_t n = c.s.tokens;
  if (n == 0) return r;
  r.set(kIdCheck, 8, Tag::kOther, "embedding id check");
  r.set(kKeysA, n * 4, Tag::kOther, "embedding sort ids");
  r.set(kKeysB, n * 4, Tag::kOther, "embedding sort ids (alternate)");
  r.set(kPosA, n * 4, Tag::kOther, "embedding sort positions");
  r.set(kPosB, n * 4, Tag::kOther, "embedding sort positions (alternate)");
  r.set(kSortTemp, static_cast<int64_t>(sort_temp_bytes(n, c.s.vocab)), Tag::kOther, "embedding sort temporary storage");
  return r;
}

void embedding_backward(Device& dev, const EmbeddingBackwardCall& c, const Scratch& scratch) {
  const auto& [s, dtable, ids, dout] = c;
  if (s.tokens == 0) return;
  check_ids(dev, s, ids, scratch.data(kIdCheck));
  const cudaStream_t st = stream_of(dev);
  const int64_t n = s.tokens;
  const int n32 = static_cast<int>(n);

  // Stable sort of (id, position) by id. The ids are in [0, vocab) (checked), so as unsigned
  // keys they sort like the ints, and only the low key_bits(vocab) bits need sorting.
  UNTIED_CUDA_CHECK(cudaMemcpyAsync(scratch.data(kKeysA), ids, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, st));
  iota_kernel<<<blocks_for(n, 256, 4096), 256, 0, st>>>(scratch.as<int32_t>(kPosA), n);
  UNTIED_CUDA_CHECK(cudaGetLastError());
  cub::DoubleBuffer<uint32_t> keys(scratch.as<uint32_t>(kKeysA), scratch.as<uint32_t>(kKeysB));
  cub::DoubleBuffer<int32_t> pos(scratch.as<int32_t>(kPosA), scratch.as<int32_t>(kPosB));
  const int end_bit = key_bits(s.vocab);
  size_t temp_bytes = static_cast<size_t>(scratch.buffers[kSortTemp].bytes());
  UNTIED_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch.data(kSortTemp), temp_bytes, keys, pos, n32, 0, end_bit, st));

  if (s.dtype == DType::kBF16)
    launch_backward<bf16_t>(st, s, dtable, keys.Current(), pos.Current(), dout);
  else
    launch_backward<float>(st, s, dtable, keys.Current(), pos.Current(), dout);
  // The scratch buffers return to the allocator when this function returns, while the kernels
  // may still run: the caching allocator hands memory out again only to work issued later on
  // this same stream, which runs after them.
}

}  // namespace untied::cuda
