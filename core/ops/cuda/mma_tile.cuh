// One warp-level tensor-core product, mma.sync.aligned.m16n8k16.row.col
// with 16-bit inputs (bf16 or fp16) and fp32 accumulators, behind one
// function with two implementations:
//   on the device (__CUDA_ARCH__ >= 800): the PTX instruction;
//   on the host emulator (cuda_emulator.h): the same per-lane fragment
//     layouts computed in fp32, so CI runs a kernel's fragment indexing.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16" with
// .bf16/.f16), lane = 4 g + t (g = lane / 4, t = lane % 4); a 32-bit
// register holds two 16-bit elements, the lower column (A) or row (B) in
// its low half:
//   A [16 x 16] row-major: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//     a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9].
//   B [16 x 8] (k x n): b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g].
//   C, D [16 x 8] fp32: c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] =
//     C[g+8][2t, 2t+1].
// A kernel includes this after what the kernels' .cuh files expect (see
// flash_attention_kernels.cuh); the emulator's version needs cuda_emulator.h
// and core/half.h (emulated_device.h includes both).
#ifndef CORE_OPS_CUDA_MMA_TILE_CUH_
#define CORE_OPS_CUDA_MMA_TILE_CUH_

#include <cstdint>
#include <cstring>

namespace mcc {
namespace cuda_kernels {
namespace mma {

// The 16-bit input type of a product.
enum class Input { kBF16, kF16 };

#if defined(CORE_OPS_CUDA_CUDA_EMULATOR_H_) && !defined(__CUDA_ARCH__)

// Test-only faults in the emulation's reading of the fragments, so a test
// can show that it sees a layout error: 0 none; 1 a[1] and a[2] swapped (A's
// row and column halves confused); 2 B's g and t roles swapped (b[0] read as
// B[2g..][t]); 3 C's rows g and g+8 swapped.
inline int emulated_layout_fault = 0;

// Warp-level products run so far (tests count a kernel's work with it).
inline int64_t emulated_products = 0;

inline float HalfBitsToFloat(Input in, uint16_t bits) {
  if (in == Input::kBF16) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  Float16 h;
  std::memcpy(&h, &bits, sizeof bits);
  return Float16ToFloat(h);
}

// Element `half` (0 low, 1 high) of a register.
inline uint16_t HalfOf(uint32_t reg, int half) {
  return static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu);
}

// Each lane publishes its A and B registers into the warp's exchange words,
// a warp barrier, each lane computes its C elements from the others'
// registers in fp32 (products exact, sums in k order), a warp barrier
// (before the words are reused).
template <Input kIn>
inline void MmaM16N8K16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  cuda_emu::Emulator& e = cuda_emu::Emulator::Current();
  const unsigned int tid = threadIdx.x, lane = tid % 32, warp0 = tid - lane;
  uint32_t* mine = e.Exchange(tid);
  for (int r = 0; r < 4; ++r) mine[r] = a[r];
  mine[4] = b[0];
  mine[5] = b[1];
  if (lane == 0) ++emulated_products;
  __syncwarp();
  const int fault = emulated_layout_fault;
  // A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >=
  // 8), half k % 2.
  auto a_at = [&](int row, int k) {
    int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    if (fault == 1 && (reg == 1 || reg == 2)) reg = 3 - reg;
    const uint32_t* w = e.Exchange(warp0 + 4 * (row % 8) + (k % 8) / 2);
    return HalfBitsToFloat(kIn, HalfOf(w[reg], k % 2));
  };
  // B[k][n]: lane 4 n + (k % 8) / 2, register 4 + (k >= 8), half k % 2.
  auto b_at = [&](int k, int n) {
    const unsigned int src =
        fault == 2 ? 4 * ((k % 8) / 2) + n : 4 * n + (k % 8) / 2;
    const uint32_t* w = e.Exchange(warp0 + src);
    return HalfBitsToFloat(kIn, HalfOf(w[4 + (k >= 8 ? 1 : 0)], k % 2));
  };
  const int g = lane / 4, t = lane % 4;
  float d[4];
  for (int i = 0; i < 4; ++i) {
    int row = g + (i >= 2 ? 8 : 0);
    if (fault == 3) row = (row + 8) % 16;
    const int col = 2 * t + i % 2;
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += a_at(row, k) * b_at(k, col);
    d[i] = acc;
  }
  __syncwarp();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

#else

template <Input kIn>
__device__ __forceinline__ void MmaM16N8K16(float c[4], const uint32_t a[4],
                                            const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kIn == Input::kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#elif defined(__CUDA_ARCH__)
  // Launchers run the tensor-core kernels on sm_80+ only.
  __trap();
#endif
}

#endif

// Two 16-bit elements in one register, `lo` in the low half.
__host__ __device__ __forceinline__ uint32_t Pack(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

}  // namespace mma
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MMA_TILE_CUH_
