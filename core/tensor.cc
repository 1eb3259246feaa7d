#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/graph_capture.h"
#include "core/status_macros.h"
#include "core/tensor_kernels.h"
#include "glog/logging.h"

namespace mcc {

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), allocator_(GetAllocator(device)) {
  data_ = allocator_->Allocate(bytes);
  if (data_ == nullptr) {
    const MemoryStats stats = allocator_->Stats();
    LOG(FATAL) << "out of memory on " << device.ToString()
               << ": could not allocate " << FormatBytes(bytes) << " (" << bytes
               << " bytes) with " << FormatBytes(stats.current_bytes)
               << " in use, peak " << FormatBytes(stats.peak_bytes);
  }
}

Storage::Storage(void* data, size_t bytes, Device device,
                 std::shared_ptr<const void> owner)
    : data_(data), bytes_(bytes), device_(device), owner_(std::move(owner)) {}

Storage::~Storage() {
  if (allocator_ != nullptr) allocator_->Free(data_, bytes_);
}

Tensor Tensor::FromExternal(void* data, Shape shape, DType dtype, Device device,
                            std::shared_ptr<const void> owner) {
  Tensor t;
  t.numel_ = NumElements(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ =
      std::make_shared<Storage>(data, t.nbytes(), device, std::move(owner));
  return t;
}

Tensor Tensor::Empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    CHECK_GE(d, 0) << "negative dimension in shape " << ShapeToString(shape);
  }
  Tensor t;
  t.numel_ = NumElements(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::Zeros(Shape shape, DType dtype, Device device) {
  Tensor t = Empty(std::move(shape), dtype, device);
  t.Zero();
  return t;
}

Tensor Tensor::Full(Shape shape, double value, DType dtype, Device device) {
  Tensor t = Empty(std::move(shape), dtype, device);
  t.Fill(value);
  return t;
}

absl::StatusOr<Tensor> Tensor::FromVector(absl::Span<const float> values,
                                          Shape shape, DType dtype) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FromVector: ", values.size(), " values for shape ",
        ShapeToString(shape), " (", NumElements(shape), " elements)"));
  }
  Tensor t = Empty(std::move(shape), dtype);
  ConvertElements(values.data(), DType::kFloat32, t.raw_data(), dtype,
                  t.numel());
  return t;
}

absl::StatusOr<Tensor> Tensor::FromInts(absl::Span<const int64_t> values,
                                        Shape shape, DType dtype) {
  if (static_cast<int64_t>(values.size()) != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FromInts: ", values.size(), " values for shape ", ShapeToString(shape),
        " (", NumElements(shape), " elements)"));
  }
  Tensor t = Empty(std::move(shape), dtype);
  ConvertElements(values.data(), DType::kInt64, t.raw_data(), dtype, t.numel());
  return t;
}

int64_t Tensor::size(int d) const {
  const int n = dim();
  const int idx = d < 0 ? d + n : d;
  CHECK(idx >= 0 && idx < n)
      << "dimension " << d << " out of range for " << Describe();
  return shape_[idx];
}

std::string Tensor::Describe() const {
  if (!defined()) return "undefined tensor";
  return absl::StrCat(DTypeName(dtype_), ShapeString(), " on ",
                      device_.ToString());
}

void Tensor::CheckDType(DType expected) const {
  CHECK(defined()) << "access to an undefined tensor";
  CHECK(device_.type != DeviceType::kTestDevice)
      << "host code dereferenced " << Describe()
      << ": device memory may be touched only by a kernel (ops::) or the copy "
         "hook (Tensor::CopyFrom)";
  CHECK(dtype_ == expected)
      << "tensor " << Describe() << " accessed as " << DTypeName(expected);
}

absl::StatusOr<Tensor> Tensor::Slice(int64_t begin, int64_t end) const {
  if (!defined() || dim() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Slice needs a tensor with at least one dimension, got ", Describe()));
  }
  if (begin < 0 || end < begin || end > shape_[0]) {
    return absl::OutOfRangeError(absl::StrCat(
        "Slice [", begin, ", ", end, ") out of range for ", Describe()));
  }
  Tensor t = *this;
  const int64_t row = numel_ / (shape_[0] == 0 ? 1 : shape_[0]);
  t.offset_bytes_ += static_cast<size_t>(begin * row) * DTypeSize(dtype_);
  t.shape_[0] = end - begin;
  t.numel_ = NumElements(t.shape_);
  return t;
}

absl::StatusOr<Tensor> Tensor::Reshape(Shape shape) const {
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Reshape to ", ShapeToString(shape), ": more than one -1"));
      }
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Reshape to ", ShapeToString(shape), ": negative size"));
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0 && known > 0 && numel_ % known == 0)
    shape[infer] = numel_ / known;
  if (NumElements(shape) != numel_ || (infer >= 0 && known == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot reshape ", Describe(), " to ", ShapeToString(shape)));
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Clone() const {
  Tensor t = Empty(shape_, dtype_, device_);
  MCC_CHECK_OK(t.CopyFrom(*this));
  return t;
}

absl::Status Tensor::CopyFrom(const Tensor& src) {
  if (!defined() || !src.defined()) {
    return absl::InvalidArgumentError("CopyFrom with an undefined tensor");
  }
  if (src.numel() != numel_ || src.dtype() != dtype_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyFrom: destination ", Describe(), " and source ",
                     src.Describe(), " differ in element count or dtype"));
  }
  return CopyBytes(raw_data(), device_, src.raw_data(), src.device(), nbytes());
}

absl::StatusOr<Tensor> Tensor::To(DType dtype) const {
  if (!defined()) {
    return absl::InvalidArgumentError("To(DType) of an undefined tensor");
  }
  Tensor t = Empty(shape_, dtype, device_);
  MCC_RETURN_IF_ERROR(ConvertKernels()(device_, *this, &t));
  return t;
}

absl::StatusOr<Tensor> Tensor::To(Device device) const {
  Tensor t = Empty(shape_, dtype_, device);
  absl::Status status = t.CopyFrom(*this);
  if (!status.ok()) return status;
  return t;
}

namespace {

template <typename T>
void FillTyped(void* dst, int64_t n, T value) {
  T* p = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

absl::Status FillCpu(double value, Tensor* x) {
  void* p = x->raw_data();
  const int64_t n = x->numel();
  if (value == 0.0 && !std::signbit(value)) {
    std::memset(p, 0, x->nbytes());  // +0 is all zero bits in every dtype.
    return absl::OkStatus();
  }
  switch (x->dtype()) {
    case DType::kFloat32:
      FillTyped(p, n, static_cast<float>(value));
      break;
    case DType::kBFloat16:
      FillTyped(p, n, FloatToBFloat16(static_cast<float>(value)));
      break;
    case DType::kFloat16:
      FillTyped(p, n, FloatToFloat16(static_cast<float>(value)));
      break;
    case DType::kInt32:
      FillTyped(p, n, static_cast<int32_t>(value));
      break;
    case DType::kInt64:
      FillTyped(p, n, static_cast<int64_t>(value));
      break;
    case DType::kInt8:
      FillTyped(p, n, static_cast<int8_t>(value));
      break;
  }
  return absl::OkStatus();
}

absl::Status ConvertCpu(const Tensor& src, Tensor* dst) {
  ConvertElements(src.raw_data(), src.dtype(), dst->raw_data(), dst->dtype(),
                  src.numel());
  return absl::OkStatus();
}

DeviceCopyFn g_device_copy[kNumDeviceTypes] = {};
HostAddressFn g_to_host[kNumDeviceTypes] = {};

}  // namespace

MCC_KERNEL_SLOT(FillKernel, FillKernels, "Fill", &FillCpu);

MCC_KERNEL_SLOT(ConvertKernel, ConvertKernels, "Convert", &ConvertCpu);

void Tensor::Fill(double value) {
  CHECK(defined()) << "Fill of an undefined tensor";
  MCC_CHECK_OK(FillKernels()(device_, value, this));
}

void Tensor::Zero() { Fill(0.0); }

std::vector<double> Tensor::ToDoubles() const {
  CHECK(defined());
  Tensor host = device_.is_cpu() ? *this : *To(Device::CPU());
  std::vector<double> out(numel_);
  const void* p = host.raw_data();
  for (int64_t i = 0; i < numel_; ++i) {
    switch (dtype_) {
      case DType::kFloat32:
        out[i] = static_cast<const float*>(p)[i];
        break;
      case DType::kBFloat16:
        out[i] = BFloat16ToFloat(static_cast<const BFloat16*>(p)[i]);
        break;
      case DType::kFloat16:
        out[i] = Float16ToFloat(static_cast<const Float16*>(p)[i]);
        break;
      case DType::kInt32:
        out[i] = static_cast<const int32_t*>(p)[i];
        break;
      case DType::kInt64:
        out[i] = static_cast<double>(static_cast<const int64_t*>(p)[i]);
        break;
      case DType::kInt8:
        out[i] = static_cast<const int8_t*>(p)[i];
        break;
    }
  }
  return out;
}

std::vector<float> Tensor::ToFloats() const {
  CHECK(defined());
  Tensor host = device_.is_cpu() ? *this : *To(Device::CPU());
  std::vector<float> out(numel_);
  ConvertElements(host.raw_data(), dtype_, out.data(), DType::kFloat32, numel_);
  return out;
}

void RegisterDeviceCopy(DeviceType type, DeviceCopyFn fn) {
  CHECK(type != DeviceType::kCPU) << "CPU copies are built in";
  g_device_copy[static_cast<int>(type)] = fn;
}

void RegisterHostBackedDevice(DeviceType type, HostAddressFn to_host) {
  CHECK(type != DeviceType::kCPU) << "the CPU is the host";
  g_to_host[static_cast<int>(type)] = to_host;
}

bool IsHostBacked(DeviceType type) {
  return type != DeviceType::kCPU &&
         g_to_host[static_cast<int>(type)] != nullptr;
}

Tensor HostView(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  const HostAddressFn to_host = g_to_host[static_cast<int>(t.device().type)];
  CHECK(to_host != nullptr)
      << "HostView of " << t.Describe() << ": its device is not host-backed";
  return Tensor::FromExternal(to_host(t.raw_data()), t.shape(), t.dtype(),
                              Device::CPU(), std::make_shared<Tensor>(t));
}

absl::Status CopyBytes(void* dst, Device dst_device, const void* src,
                       Device src_device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }
  if (dst_device.is_cpu() || src_device.is_cpu() ||
      dst_device.type != src_device.type) {
    MCC_RETURN_IF_ERROR(RefuseInsideGraphCapture(
        absl::StrCat("a copy of ", bytes, " bytes from ", src_device.ToString(),
                     " to ", dst_device.ToString())));
  }
  // One copier handles transfers between its type and the host (and within
  // its type); two different non-CPU types meet on the host.
  if (!dst_device.is_cpu() && !src_device.is_cpu() &&
      dst_device.type != src_device.type) {
    std::unique_ptr<char[]> host(new char[bytes]);
    MCC_RETURN_IF_ERROR(
        CopyBytes(host.get(), Device::CPU(), src, src_device, bytes));
    return CopyBytes(dst, dst_device, host.get(), Device::CPU(), bytes);
  }
  const Device device = dst_device.is_cpu() ? src_device : dst_device;
  const DeviceCopyFn copy = g_device_copy[static_cast<int>(device.type)];
  if (copy == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "copy from ", src_device.ToString(), " to ", dst_device.ToString(),
        ": no copier for ", device.ToString(), " (link ",
        device.is_cuda() ? "//core/cuda:runtime" : "//core/testing:test_device",
        ")"));
  }
  return copy(dst, dst_device, src, src_device, bytes);
}

namespace {

template <typename T>
float LoadAsFloat(const void* p, int64_t i) {
  return static_cast<float>(static_cast<const T*>(p)[i]);
}

float LoadFloat(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const BFloat16*>(p)[i]);
    case DType::kFloat16:
      return Float16ToFloat(static_cast<const Float16*>(p)[i]);
    case DType::kInt32:
      return LoadAsFloat<int32_t>(p, i);
    case DType::kInt64:
      return LoadAsFloat<int64_t>(p, i);
    case DType::kInt8:
      return LoadAsFloat<int8_t>(p, i);
  }
  return 0.0f;
}

}  // namespace

void ConvertElements(const void* src, DType src_dtype, void* dst,
                     DType dst_dtype, int64_t n) {
  if (n <= 0) return;  // Empty tensors may carry null pointers.
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype));
    return;
  }
  // Integer to integer keeps full precision.
  if (!IsFloatingPoint(src_dtype) && !IsFloatingPoint(dst_dtype)) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v =
          src_dtype == DType::kInt32  ? static_cast<const int32_t*>(src)[i]
          : src_dtype == DType::kInt8 ? static_cast<const int8_t*>(src)[i]
                                      : static_cast<const int64_t*>(src)[i];
      if (dst_dtype == DType::kInt32) {
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
      } else if (dst_dtype == DType::kInt8) {
        static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(v);
      } else {
        static_cast<int64_t*>(dst)[i] = v;
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = LoadFloat(src, src_dtype, i);
    switch (dst_dtype) {
      case DType::kFloat32:
        static_cast<float*>(dst)[i] = v;
        break;
      case DType::kBFloat16:
        static_cast<BFloat16*>(dst)[i] = FloatToBFloat16(v);
        break;
      case DType::kFloat16:
        static_cast<Float16*>(dst)[i] = FloatToFloat16(v);
        break;
      case DType::kInt32:
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
        break;
      case DType::kInt64:
        static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
        break;
      case DType::kInt8:
        static_cast<int8_t*>(dst)[i] = static_cast<int8_t>(v);
        break;
    }
  }
}

absl::Status CheckSameShape(const Tensor& a, const Tensor& b,
                            absl::string_view what) {
  if (a.shape() != b.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shapes differ: ", a.Describe(), " vs ", b.Describe()));
  }
  return absl::OkStatus();
}

absl::Status CheckDTypeIs(const Tensor& t, DType dtype,
                          absl::string_view what) {
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", DTypeName(dtype), ", got ", t.Describe()));
  }
  return absl::OkStatus();
}

}  // namespace mcc
