// CPU versions of the PTX primitives of src/backends/cuda/attention_tiles.cuh (the block between
// its "PTX primitives" markers), for the emulator in emu_runtime.h. rewrite_kernels.py includes
// this file in place of that block, inside namespace untied::cuda::attn, so the names and
// signatures must stay those of the real primitives.
//
// Emulated exactly (per the PTX ISA): the fragment layouts of ldmatrix.x4 (plain and .trans) and
// mma.m16n8k16 bf16 x bf16 -> fp32; cp.async zero-fill of invalid copies and its commit / wait
// groups (timing: see Options::eager_copies); shared-memory range and alignment of every access.
// Not exact: mma sums its 16 products in fp64 and rounds once (the tensor core's internal order
// and rounding are unspecified, so no emulation could match it bit for bit); exp2_ftz uses libm
// exp2 and flushes subnormal results, not ex2.approx.
#pragma once

inline unsigned char* dynamic_smem() { return ::emu::g_block->smem.data(); }

// The shared-window address of p: its offset in the block's shared memory (which starts at 0, as
// a kernel's dynamic shared memory without static shared arrays does on a GPU).
inline uint32_t smem_addr(const void* p) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  const unsigned char* lo = ::emu::g_block->smem.data();
  if (c < lo || c > lo + ::emu::g_block->smem.size()) ::emu::die("smem_addr of a pointer outside shared memory");
  return static_cast<uint32_t>(c - lo);
}

inline void cp_async(void* dst, const void* src, bool valid, int bytes) {
  ::emu::check_smem(dst, bytes, bytes);
  if (valid && reinterpret_cast<uintptr_t>(src) % bytes != 0) ::emu::die("misaligned cp.async source");
  const ::emu::AsyncCopy c{static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes,
                           valid ? bytes : 0};
  if (::emu::g_options.eager_copies) {
    ::emu::complete(c);
  } else {
    // Deferred: the bytes land at wait time; until then the destination holds the NaN pattern.
    std::memset(c.dst, 0xFF, bytes);
    ::emu::g_cur->uncommitted.push_back(c);
  }
}
inline void cp_async_16(void* dst, const void* src, bool valid) { cp_async(dst, src, valid, 16); }
inline void cp_async_4(void* dst, const void* src, bool valid) { cp_async(dst, src, valid, 4); }
inline void cp_async_commit() {
  ::emu::g_cur->groups.push_back(std::move(::emu::g_cur->uncommitted));
  ::emu::g_cur->uncommitted.clear();
}
inline void cp_async_wait_all() {
  for (auto& group : ::emu::g_cur->groups)
    for (auto& c : group) ::emu::complete(c);
  ::emu::g_cur->groups.clear();
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l supplies the address of row l % 8 of matrix
// l / 8; register m of lane l receives elements 2(l % 4), 2(l % 4) + 1 of row l / 4 of matrix m
// (transposed: of column l / 4, rows 2(l % 4) and 2(l % 4) + 1).
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p, bool trans) {
  ::emu::check_smem(p, 16, 16);
  ::emu::my_slot().ptr = p;
  ::emu::syncwarp();
  const int l = ::emu::g_cur->lane;
  for (int m = 0; m < 4; ++m) {
    uint16_t lo, hi;
    if (!trans) {
      const uint16_t* row = static_cast<const uint16_t*>(::emu::lane_slot(8 * m + l / 4).ptr);
      lo = row[2 * (l % 4)];
      hi = row[2 * (l % 4) + 1];
    } else {
      const uint16_t* r0 = static_cast<const uint16_t*>(::emu::lane_slot(8 * m + 2 * (l % 4)).ptr);
      const uint16_t* r1 = static_cast<const uint16_t*>(::emu::lane_slot(8 * m + 2 * (l % 4) + 1).ptr);
      lo = r0[l / 4];
      hi = r1[l / 4];
    }
    r[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  ::emu::syncwarp();
}
inline void ldsm_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4(r, p, false); }
inline void ldsm_x4_t(uint32_t (&r)[4], const void* p) { ldmatrix_x4(r, p, true); }

// The bf16 in the low (half 0) or high (half 1) 16 bits of a register, as float.
inline float bf16_half_to_float(uint32_t reg, int half) {
  const uint32_t bits = half ? (reg & 0xffff0000u) : (reg << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = C + A B with the fragment layouts of
// the PTX ISA (A 16x16 row-major in 4 registers, B 16x8 column-major in 2, C/D 16x8 in 4 floats).
inline void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ++::emu::g_mma_ops;
  ::emu::LaneSlot& s = ::emu::my_slot();
  for (int i = 0; i < 4; ++i) s.u[i] = a[i];
  s.u[4] = b0;
  s.u[5] = b1;
  ::emu::syncwarp();
  auto A = [](int row, int k) {
    const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    const int lane = (row % 8) * 4 + (k % 8) / 2;
    return bf16_half_to_float(::emu::lane_slot(lane).u[reg], k % 2);
  };
  auto B = [](int k, int col) {
    const int reg = k >= 8 ? 1 : 0;
    const int lane = col * 4 + (k % 8) / 2;
    return bf16_half_to_float(::emu::lane_slot(lane).u[4 + reg], k % 2);
  };
  const int l = ::emu::g_cur->lane;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = l / 4 + (e >= 2 ? 8 : 0);
    const int col = 2 * (l % 4) + (e & 1);
    double acc = 0.0;
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A(row, k)) * B(k, col);
    out[e] = c[e] + static_cast<float>(acc);
  }
  ::emu::syncwarp();  // every lane has read the fragments before any lane reuses its slot
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

inline void st_shared_u32(void* p, uint32_t v) {
  ::emu::check_smem(p, 4, 4);
  std::memcpy(p, &v, 4);
}

inline void atomic_add_f32x2(float* p, float x, float y) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) ::emu::die("misaligned float2 atomic");
  p[0] += x;
  p[1] += y;
}

inline float exp2_ftz(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}
