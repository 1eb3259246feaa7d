#ifndef CORE_TENSOR_H_
#define CORE_TENSOR_H_

// Tensors: dense, contiguous arrays on one device, and the copy hook that
// moves bytes between devices.
//
// Ownership: a Tensor is a handle. Copies share one Storage (reference
// counted); the memory is returned to its device's allocator when the last
// handle goes. Views (Slice, Reshape, FromExternal) share or borrow memory
// and keep its owner alive. Nothing here is a collective call.
//
// Device memory: raw_data() is an address in the tensor's device's address
// space. Library code dereferences it on the host only for CPU tensors;
// every other access goes through a kernel (core/ops, the one kernel path:
// core/ops/dispatch.h) or the device's copy hook (CopyBytes, CopyFrom,
// To(Device)). The test device (core/testing/test_device.h) makes any other
// host access fail loudly, so CI proves the rule.
//
// Ordering: kernels and copies are issued on the device's current stream in
// program order. A copy to the host (To(Device::CPU()), CopyFrom into a CPU
// tensor) returns with the bytes in place: it synchronises with the device,
// which is why the training step does exactly one per step.
//
// Thread-safety: a Tensor handle, like a shared_ptr, may be copied and
// destroyed from any thread; reads of the same elements may overlap, but a
// write must not overlap any other access to those elements (the caller
// orders them). Registration functions (RegisterDeviceCopy,
// RegisterHostBackedDevice) run before any tensor of that device type
// exists, normally from a static initialiser.
//
// Errors: calls that can fail for reasons outside the program (shapes from
// a file, a device copy that fails) return Status naming the tensors and
// devices; nothing is written on error unless the call says otherwise.
// Misuse that is a programming error (a wrong dtype in data<T>(), host
// access to test-device memory, an allocation that cannot be had) dies with
// a message naming the tensor.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/half.h"

namespace mcc {

using Shape = std::vector<int64_t>;

std::string ShapeToString(absl::Span<const int64_t> shape);  // "[4, 64]"
int64_t NumElements(absl::Span<const int64_t> shape);

// The DType of a C++ element type.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};

// A block of device memory shared by a tensor and its views.
class Storage {
 public:
  // Memory from the device's allocator, freed with the storage.
  Storage(size_t bytes, Device device);
  // Memory owned elsewhere (a view of another device's storage, a pinned
  // staging buffer): `owner` is held while the storage lives.
  Storage(void* data, size_t bytes, Device device,
          std::shared_ptr<const void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;     // Null for memory owned elsewhere.
  std::shared_ptr<const void> owner_;  // Keeps that memory alive.
};

// A dense, contiguous, row-major N-d array on one device.
//
// Copying a Tensor shares its storage (as PyTorch's tensors do); Clone() makes
// a deep copy. Views are zero-copy along the first dimension only (Slice) or
// reinterpret the same elements under another shape (Reshape), so every
// tensor stays contiguous and kernels need no stride logic.
class Tensor {
 public:
  Tensor() = default;  // An undefined tensor: defined() is false.

  // Uninitialised memory from the device's allocator. Dies with a message that
  // names the size and the device when the memory cannot be had.
  static Tensor Empty(Shape shape, DType dtype, Device device = Device::CPU());
  static Tensor Zeros(Shape shape, DType dtype, Device device = Device::CPU());
  // value converted to dtype (rounded to nearest even for 16-bit types).
  static Tensor Full(Shape shape, double value, DType dtype,
                     Device device = Device::CPU());
  // A CPU tensor holding values converted to dtype; values.size() must equal
  // the shape's element count.
  static absl::StatusOr<Tensor> FromVector(absl::Span<const float> values,
                                           Shape shape,
                                           DType dtype = DType::kFloat32);
  static absl::StatusOr<Tensor> FromInts(absl::Span<const int64_t> values,
                                         Shape shape,
                                         DType dtype = DType::kInt64);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int d) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const {
    return static_cast<size_t>(numel_) * DTypeSize(dtype_);
  }
  std::string ShapeString() const { return ShapeToString(shape_); }
  // "fp32[4, 64] on cpu", for error messages.
  std::string Describe() const;

  // The address of the first element in the device's address space: a host
  // pointer for CPU tensors, a device pointer otherwise (never dereference
  // it on the host unless device().is_cpu()).
  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + offset_bytes_;
  }
  // Typed access for kernels; dies if T does not match dtype() (a
  // programming error) or if the tensor lives on the test device, whose
  // memory only kernels and the copy hook may touch.
  template <typename T>
  T* data() const {
    CheckDType(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }

  // Rows [begin, end) of the first dimension, sharing storage.
  absl::StatusOr<Tensor> Slice(int64_t begin, int64_t end) const;
  // The same elements under another shape (one -1 is inferred), sharing
  // storage.
  absl::StatusOr<Tensor> Reshape(Shape shape) const;

  // A deep copy on the same device.
  Tensor Clone() const;
  // Copies src's elements here. Shapes (element counts) and dtypes must
  // match; devices may differ where a copier for them is registered.
  absl::Status CopyFrom(const Tensor& src);
  // A new tensor on the same device with the values converted to dtype,
  // through the Convert slot (core/tensor_kernels.h): no host staging;
  // Unimplemented if the device has no Convert kernel.
  absl::StatusOr<Tensor> To(DType dtype) const;
  // A copy on another device.
  absl::StatusOr<Tensor> To(Device device) const;

  // Sets every element to value (converted to dtype) on the tensor's own
  // device, through the Fill slot (core/tensor_kernels.h): no host staging.
  // Dies, naming the device, if the device has no Fill kernel (a build that
  // does not link its device library).
  void Fill(double value);
  void Zero();

  // Values as float64 (CPU tensors of any dtype), for tests and logging.
  std::vector<double> ToDoubles() const;
  // Values as float, converted from any floating dtype (CPU).
  std::vector<float> ToFloats() const;

  // Whether both tensors view the same memory.
  bool SharesStorageWith(const Tensor& other) const {
    return storage_ == other.storage_;
  }

  // A tensor over memory that something else owns: `data` on `device`,
  // kept alive by `owner`. Used for host views of host-backed devices and
  // for staging buffers.
  static Tensor FromExternal(void* data, Shape shape, DType dtype,
                             Device device, std::shared_ptr<const void> owner);

 private:
  void CheckDType(DType expected) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
  Device device_;
};

// Copies bytes between devices: the device's copy hook. CPU to CPU is
// memmove; a device library registers the copier for transfers that involve
// its device type (the CUDA library for GPUs, //core/testing:test_device for
// the test device). A copy between two non-CPU types goes through the host.
// The copier runs on the device's current stream and returns an error
// naming both devices and the size; it never aborts.
using DeviceCopyFn = absl::Status (*)(void* dst, Device dst_device,
                                      const void* src, Device src_device,
                                      size_t bytes);
void RegisterDeviceCopy(DeviceType type, DeviceCopyFn fn);
absl::Status CopyBytes(void* dst, Device dst_device, const void* src,
                       Device src_device, size_t bytes);

// Host-backed devices (the test device) keep their memory in host RAM at
// addresses the host must not use directly; kernels run the CPU code on a
// host view. to_host maps a device address to the host address.
using HostAddressFn = void* (*)(const void* device_address);
void RegisterHostBackedDevice(DeviceType type, HostAddressFn to_host);
bool IsHostBacked(DeviceType type);
// The same elements as a CPU tensor sharing the memory: t itself for CPU
// tensors, a host view for host-backed devices. Only kernel adaptors and
// communication backends of host-backed devices call this; it dies for
// other devices (a programming error).
Tensor HostView(const Tensor& t);

// Converts n elements between any two dtypes on the CPU (16-bit floats round
// to nearest even; floats to integers truncate toward zero).
void ConvertElements(const void* src, DType src_dtype, void* dst,
                     DType dst_dtype, int64_t n);

// Checks used by kernels; the message names both tensors.
absl::Status CheckSameShape(const Tensor& a, const Tensor& b,
                            absl::string_view what);
absl::Status CheckDTypeIs(const Tensor& t, DType dtype, absl::string_view what);

}  // namespace mcc

#endif  // CORE_TENSOR_H_
