// CPU versions of the wgmma primitives of src/backends/cuda/wgmma.cuh (the block between its
// "wgmma primitives" markers), for the emulator in emu_runtime.h. rewrite_kernels.py includes this
// file in place of that block, inside namespace untied::cuda::attn, so the names and signatures
// must stay those of the real primitives.
//
// Emulated as the PTX ISA describes wgmma.mma_async (m64nNk16, bf16 x bf16 -> fp32):
//   - the shared-memory matrix descriptor: start address, leading and stride byte offsets, the
//     128-byte swizzle (byte address bits [4, 7) XOR bits [7, 10) of every address the
//     instruction forms; other swizzle modes and a non-zero base offset abort);
//   - K-major operands (row i of M or N at start + (i / 8) * SBO + (i % 8) * 128, k at 2k bytes
//     on) and transposed, MN-major ones (k at (k / 8) * SBO + (k % 8) * 128, index i of M or N
//     at (i / 64) * LBO + (i % 64) * 2 bytes on);
//   - A in registers: per warp of the warpgroup, the m16n8k16 A fragment of its 16 rows;
//   - the accumulator: per warp 16 rows, each 8-column block laid out as mma.sync's C fragment;
//   - asynchrony: an instruction reads its shared-memory operands and writes its accumulator when
//     its group is waited for (wgmma_wait_all), and between issue and wait the accumulator holds
//     NaN, so reading it early, or refilling an operand's shared memory before the wait, changes
//     the result. A group must be committed before it is waited for, and a thread may not exit
//     with wgmma work outstanding.
// Not exact: each instruction's 16 products are summed in fp64 and rounded once (as the mma.sync
// emulation); the descriptors' agreement across the warpgroup is checked within each warp only.
// wgmma.fence, fence.proxy.async and wgmma_hold order nothing here (the emulator's memory is
// coherent and its compiler sees plain function calls).
// (Included inside a namespace: the standard headers it uses come with emu_runtime.h.)
#pragma once

#define UNTIED_WGMMA 1

inline uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

inline void wgmma_fence() {}
inline void fence_proxy_async() {}
template <int kN>
inline void wgmma_hold(float (&)[kN]) {}
template <int kN>
inline void wgmma_hold(uint32_t (&)[kN][4]) {}

namespace wgmma_emu {

struct Desc {
  uint32_t start, lbo, sbo;
};

inline Desc decode(uint64_t d) {
  if ((d >> 62) != 1) ::emu::die("wgmma: only the 128-byte swizzle is emulated");
  if (((d >> 49) & 7) != 0) ::emu::die("wgmma: a non-zero matrix base offset is not emulated");
  return Desc{static_cast<uint32_t>(d & 0x3FFF) << 4, static_cast<uint32_t>((d >> 16) & 0x3FFF) << 4,
              static_cast<uint32_t>((d >> 32) & 0x3FFF) << 4};
}

// The bf16 at byte address `addr` of shared memory as the instruction forms it, through the swizzle.
inline double load(uint32_t addr) {
  const uint32_t phys = addr ^ (((addr >> 7) & 7u) << 4);
  const unsigned char* p = ::emu::g_block->smem.data() + phys;
  ::emu::check_smem(p, 2, 2);
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One issued instruction, as this thread sees it.
struct Op {
  float* d;
  int n;                 // N: the accumulator holds n / 2 floats per thread
  bool accumulate;       // scale-d: d = A B + d (true) or A B
  bool a_in_registers;   // A from registers (a_frag) or shared memory (desc_a)
  bool a_transposed;     // A in shared memory M-major
  bool b_transposed;     // B N-major
  uint64_t desc_a, desc_b;
  uint32_t a_frag[32][4];  // the warp's A fragments, lane by lane
  std::vector<float> d_before;  // d at issue, for the first instruction on d outstanding
};

// The outstanding instructions of each fiber: issued (not committed) and committed groups.
struct State {
  std::vector<Op> issued;
  std::vector<Op> committed;
};
inline std::map<const ::emu::Fiber*, State>& states() {
  static std::map<const ::emu::Fiber*, State> s;
  return s;
}
inline State& mine() { return states()[::emu::g_cur]; }

inline const char* outstanding(const ::emu::Fiber* f) {
  auto it = states().find(f);
  if (it == states().end() || (it->second.issued.empty() && it->second.committed.empty())) return nullptr;
  states().erase(it);
  return "wgmma instructions not waited for";
}
inline const bool registered = (::emu::g_exit_checks.push_back(&outstanding), true);

// This thread's accumulator elements of `op`, computed from shared memory and the fragments now.
inline void compute(const Op& op, std::vector<float>& d) {
  const int warp_in_group = ::emu::g_cur->warp % 4;
  const int lane = ::emu::g_cur->lane;
  const int g = lane / 4, t2 = 2 * (lane % 4);
  const Desc da = decode(op.desc_a), db = decode(op.desc_b);
  for (int nt = 0; nt < op.n / 8; ++nt) {
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1);  // row within the warp's 16
      const int row = 16 * warp_in_group + r;
      const int col = 8 * nt + t2 + (e & 1);
      double acc = 0.0;
      for (int k = 0; k < 16; ++k) {
        double a;
        if (op.a_in_registers) {
          const uint32_t reg = op.a_frag[(r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
          const uint32_t bits = (k % 2) ? (reg & 0xffff0000u) : (reg << 16);
          float f;
          std::memcpy(&f, &bits, 4);
          a = f;
        } else if (op.a_transposed) {
          a = load(da.start + (k / 8) * da.sbo + (k % 8) * 128 + (row / 64) * da.lbo + (row % 64) * 2);
        } else {
          a = load(da.start + (row / 8) * da.sbo + (row % 8) * 128 + 2 * k);
        }
        const double b = op.b_transposed
                             ? load(db.start + (k / 8) * db.sbo + (k % 8) * 128 + (col / 64) * db.lbo + (col % 64) * 2)
                             : load(db.start + (col / 8) * db.sbo + (col % 8) * 128 + 2 * k);
        acc += a * b;
      }
      float& out = d[nt * 4 + e];
      out = op.accumulate ? out + static_cast<float>(acc) : static_cast<float>(acc);
    }
  }
}

// Issues `op` for this thread: the warp's descriptors must agree; an accumulator not already
// outstanding is saved and filled with NaN.
inline void issue(Op op) {
  ++::emu::g_wgmma_ops;
  ::emu::LaneSlot& s = ::emu::my_slot();
  std::memcpy(&s.u[0], &op.desc_a, 8);
  std::memcpy(&s.u[2], &op.desc_b, 8);
  if (op.a_in_registers) std::memcpy(&s.u[4], op.a_frag[0], 16);
  ::emu::syncwarp();
  for (int l = 0; l < 32; ++l) {
    const ::emu::LaneSlot& o = ::emu::lane_slot(l);
    if (std::memcmp(&o.u[0], &s.u[0], 16) != 0) ::emu::die("wgmma: the lanes of a warp pass different descriptors");
    if (op.a_in_registers) std::memcpy(op.a_frag[l], &o.u[4], 16);
  }
  ::emu::syncwarp();  // every lane has read the slots before any lane reuses its own
  State& st = mine();
  bool outstanding = false;
  for (const Op& o : st.issued) outstanding = outstanding || o.d == op.d;
  for (const Op& o : st.committed) outstanding = outstanding || o.d == op.d;
  if (!outstanding) {
    op.d_before.assign(op.d, op.d + op.n / 2);
    std::fill(op.d, op.d + op.n / 2, std::numeric_limits<float>::quiet_NaN());
  }
  st.issued.push_back(std::move(op));
}

}  // namespace wgmma_emu

inline void wgmma_commit() {
  wgmma_emu::State& st = wgmma_emu::mine();
  for (auto& op : st.issued) st.committed.push_back(std::move(op));
  st.issued.clear();
}

// Completes every committed instruction, in issue order.
inline void wgmma_wait_all() {
  wgmma_emu::State& st = wgmma_emu::mine();
  if (!st.issued.empty()) ::emu::die("wgmma: wait_group with instructions issued but not committed");
  std::map<float*, std::vector<float>> results;
  for (const auto& op : st.committed) {
    auto it = results.find(op.d);
    if (it == results.end()) it = results.emplace(op.d, op.d_before).first;
    wgmma_emu::compute(op, it->second);
  }
  for (auto& [d, v] : results) std::copy(v.begin(), v.end(), d);
  wgmma_emu::states().erase(::emu::g_cur);
}

template <int kTransA, int kTransB, int kN>
inline void wgmma_ss_emu(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
  wgmma_emu::Op op{};
  op.d = d, op.n = kN, op.accumulate = accumulate != 0, op.desc_a = desc_a, op.desc_b = desc_b;
  op.a_transposed = kTransA != 0, op.b_transposed = kTransB != 0;
  wgmma_emu::issue(std::move(op));
}
template <int kTransA, int kTransB>
inline void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  wgmma_ss_emu<kTransA, kTransB, 128>(d, desc_a, desc_b, accumulate);
}
template <int kTransA, int kTransB>
inline void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  wgmma_ss_emu<kTransA, kTransB, 64>(d, desc_a, desc_b, accumulate);
}

template <int kN>
inline void wgmma_rs_emu(float* d, const uint32_t (&a)[4], uint64_t desc_b) {
  wgmma_emu::Op op{};
  op.d = d, op.n = kN, op.accumulate = true, op.a_in_registers = true, op.b_transposed = true, op.desc_b = desc_b;
  op.desc_a = 1ull << 62;  // unused; a valid pattern for the warp's agreement check
  std::memcpy(op.a_frag[0], a, 16);  // this lane's; issue() gathers the warp's
  wgmma_emu::issue(std::move(op));
}
inline void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) { wgmma_rs_emu<128>(d, a, desc_b); }
inline void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) { wgmma_rs_emu<64>(d, a, desc_b); }
