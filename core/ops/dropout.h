#ifndef CORE_OPS_DROPOUT_H_
#define CORE_OPS_DROPOUT_H_

// Dropout with a counter-based generator (Philox4x32-10, as cuRAND and
// PyTorch use), so a mask is a pure function of (seed, offset, element):
// the backward regenerates the forward's mask instead of storing it, and
// runs, thread counts and devices agree.
//
// The random stream of a seed is the sequence of 32-bit words
//   W[4 j + r] = Philox4x32_10(counter = {lo32(j), hi32(j), 0, 0},
//                              key = {lo32(seed), hi32(seed)})[r].
// Element e of a tensor dropped at `offset` uses W[offset + e] and is kept
// when (W >> 8) >= round(p * 2^24); kept elements are scaled by 1 / (1 - p).
// Callers advance the offset by numel() per call,
// and a slice [b, e) of a tensor dropped at offset + b gets the same mask as
// those elements of the whole tensor.

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// One Philox4x32-10 block.
std::array<uint32_t, 4> Philox4x32_10(std::array<uint32_t, 4> counter,
                                      std::array<uint32_t, 2> key);

// Words W[first, first + n) of seed's stream (see above) into out.
void PhiloxStream(uint64_t seed, uint64_t first, int64_t n, uint32_t* out);

// y = x * mask / (1 - p). p in [0, 1); p == 0 copies. x, y fp32 or bf16,
// same shape; y may be x.
absl::Status Dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset,
                     Tensor* y);
// dx = dy * mask / (1 - p), with the forward's (seed, offset).
absl::Status DropoutBackward(const Tensor& dy, float p, uint64_t seed,
                             uint64_t offset, Tensor* dx);

// The kernel of both ops (core/ops/dispatch.h; the backward is the same
// masking): y overwritten (y may be x), the device's current stream, no
// host synchronisation.
using DropoutKernel = absl::Status (*)(const Tensor& x, float p, uint64_t seed,
                                       uint64_t offset, Tensor* y);
KernelSlot<DropoutKernel>& DropoutKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_DROPOUT_H_
