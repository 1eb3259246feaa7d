#ifndef PARALLEL_INIT_H_
#define PARALLEL_INIT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace parallel {

// How a parameter's full tensor is initialised.
struct InitSpec {
  enum class Kind { kZeros, kOnes, kNormal };
  Kind kind = Kind::kNormal;
  float std = 0.02f;  // For kNormal (mean zero).

  static InitSpec Zeros() { return {Kind::kZeros, 0.0f}; }
  static InitSpec Ones() { return {Kind::kOnes, 0.0f}; }
  static InitSpec Normal(float std) { return {Kind::kNormal, std}; }
};

// This rank's piece of a parameter whose FULL tensor is drawn from a
// counter-based generator keyed by (seed, name): element i of the full
// tensor is the same number whatever the layout, so every layout starts from
// the serial model's weights. Only the local piece is generated.
//
// partition_dim < 0: the whole tensor. Otherwise the tensor is split into
// `count` equal pieces along partition_dim and piece `rank` is returned.
// The numbers are drawn on the host; a piece for another device is copied
// there through the device's copy hook (once, at construction).
absl::StatusOr<Tensor> InitShard(const std::string& name, uint64_t seed,
                                 const InitSpec& spec,
                                 const Shape& global_shape, int partition_dim,
                                 int rank, int count, DType dtype,
                                 Device device = Device::CPU());

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_INIT_H_
