#ifndef CORE_OPS_DISPATCH_H_
#define CORE_OPS_DISPATCH_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/device.h"

namespace mcc {
namespace ops {

// Kernels for one op on devices other than the CPU. Each op validates its
// arguments (shapes, dtypes, devices) once, device-independently, and then
// runs its CPU kernel or looks up the kernel registered here for the tensors'
// device. The CUDA library registers its kernels when it is linked in, e.g.
//   GemmKernels().Register(DeviceType::kCUDA, &CudaGemm);
// Until one is registered, Get() returns an Unimplemented error naming the op.
template <typename Fn>
class KernelSlot {
 public:
  explicit KernelSlot(const char* op) : op_(op) {}

  void Register(DeviceType type, Fn fn) {
    fns_[static_cast<int>(type)].store(fn, std::memory_order_release);
  }

  absl::StatusOr<Fn> Get(Device device) const {
    const int i = static_cast<int>(device.type);
    Fn fn = (i >= 0 && i < kNumTypes) ? fns_[i].load(std::memory_order_acquire)
                                      : nullptr;
    if (fn == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(op_, ": no kernel registered for ", device.ToString(),
                       " tensors (link the CUDA kernels library)"));
    }
    return fn;
  }

  const char* op() const { return op_; }

 private:
  static constexpr int kNumTypes = 2;
  const char* op_;
  std::atomic<Fn> fns_[kNumTypes] = {};
};

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_DISPATCH_H_
