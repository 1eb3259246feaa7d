#ifndef CORE_KERNEL_SLOT_H_
#define CORE_KERNEL_SLOT_H_

// KernelSlot: the kernels of one op, one per device type. The contract of
// slots in general (validation, stream order, host synchronisation) is in
// core/ops/dispatch.h; this header holds only the mechanism, so that the
// tensor primitives of core/tensor.cc (fill, dtype conversion) can have
// slots too without core depending on core/ops.

#include <atomic>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/graph_capture.h"
#include "core/tensor.h"

namespace mcc {

template <typename Fn>
class KernelSlot;

// What every slot tells about itself, whatever its kernel type: for the
// listing of all slots below.
class KernelSlotInfo {
 public:
  virtual const char* op() const = 0;
  // Whether a kernel of this device type's own is registered (a host-backed
  // device falling back to the CPU kernel does not count).
  virtual bool HasKernel(DeviceType type) const = 0;

 protected:
  ~KernelSlotInfo() = default;
};

// Every slot defined with MCC_KERNEL_SLOT (below) in the linked program, in
// load order: they are listed when the program (or the shared library that
// defines them) is loaded, before main. Lets a test check, without a hand
// list, that a device library fills every slot. Thread-safe.
std::vector<const KernelSlotInfo*> AllKernelSlots();
// Adds a slot to the list (MCC_KERNEL_SLOT does; slots are never destroyed).
bool ListKernelSlot(const KernelSlotInfo* slot);

namespace kernel_slot_internal {

// How one kernel argument is passed to the CPU kernel on a host-backed
// device: tensors become host views, everything else passes through.
template <typename A>
struct HostArg {
  explicit HostArg(A a) : value(a) {}
  operator A() const { return value; }  // NOLINT: implicit by design.
  A value;
};
template <>
struct HostArg<const Tensor&> {
  explicit HostArg(const Tensor& t) : view(HostView(t)) {}
  operator const Tensor&() const { return view; }  // NOLINT
  Tensor view;
};
template <>
struct HostArg<Tensor*> {
  explicit HostArg(Tensor* t) : view(t ? HostView(*t) : Tensor()), null(!t) {}
  operator Tensor*() { return null ? nullptr : &view; }  // NOLINT
  Tensor view;
  bool null;
};
template <>
struct HostArg<const Tensor*> {
  explicit HostArg(const Tensor* t)
      : view(t ? HostView(*t) : Tensor()), null(!t) {}
  operator const Tensor*() const { return null ? nullptr : &view; }  // NOLINT
  Tensor view;
  bool null;
};
template <>
struct HostArg<absl::Span<const Tensor>> {
  explicit HostArg(absl::Span<const Tensor> ts) {
    views.reserve(ts.size());
    for (const Tensor& t : ts) views.push_back(HostView(t));
  }
  operator absl::Span<const Tensor>() const { return views; }  // NOLINT
  std::vector<Tensor> views;
};
template <>
struct HostArg<absl::Span<Tensor* const>> {
  explicit HostArg(absl::Span<Tensor* const> ts) {
    views.reserve(ts.size());
    for (Tensor* t : ts) views.push_back(t ? HostView(*t) : Tensor());
    for (size_t i = 0; i < ts.size(); ++i)
      ptrs.push_back(ts[i] ? &views[i] : nullptr);
  }
  operator absl::Span<Tensor* const>() const { return ptrs; }  // NOLINT
  std::vector<Tensor> views;
  std::vector<Tensor*> ptrs;
};
template <>
struct HostArg<absl::Span<const Tensor* const>> {
  explicit HostArg(absl::Span<const Tensor* const> ts) {
    views.reserve(ts.size());
    for (const Tensor* t : ts) views.push_back(t ? HostView(*t) : Tensor());
    for (size_t i = 0; i < ts.size(); ++i)
      ptrs.push_back(ts[i] ? &views[i] : nullptr);
  }
  operator absl::Span<const Tensor* const>() const { return ptrs; }  // NOLINT
  std::vector<Tensor> views;
  std::vector<const Tensor*> ptrs;
};

// How one kernel argument is kept by a kernel call recorded during a graph
// capture (core/graph_capture.h) until it runs at replay: tensors as
// handles (the memory stays alive and at its address, as a CUDA graph's
// does), everything else by value, so nothing the caller frees after the
// call is left dangling.
template <typename A>
struct StoredArg {
  explicit StoredArg(A a) : value(a) {}
  A get() { return value; }
  std::decay_t<A> value;
};
template <typename T>
struct StoredArg<const T&> {
  explicit StoredArg(const T& a) : value(a) {}
  const T& get() { return value; }
  T value;
};
template <>
struct StoredArg<Tensor*> {
  explicit StoredArg(Tensor* t) : value(t ? *t : Tensor()), null(!t) {}
  Tensor* get() { return null ? nullptr : &value; }
  Tensor value;
  bool null;
};
template <>
struct StoredArg<const Tensor*> {
  explicit StoredArg(const Tensor* t) : value(t ? *t : Tensor()), null(!t) {}
  const Tensor* get() { return null ? nullptr : &value; }
  Tensor value;
  bool null;
};
template <>
struct StoredArg<absl::string_view> {
  explicit StoredArg(absl::string_view s) : value(s) {}
  absl::string_view get() { return value; }
  std::string value;
};
template <typename T>
struct StoredArg<absl::Span<const T>> {
  explicit StoredArg(absl::Span<const T> s) : value(s.begin(), s.end()) {}
  absl::Span<const T> get() { return value; }
  std::vector<T> value;
};
template <typename T>
struct StoredArg<absl::Span<T* const>> {
  explicit StoredArg(absl::Span<T* const> s) {
    for (T* t : s) {
      null.push_back(t == nullptr);
      value.push_back(t ? *t : std::remove_const_t<T>());
    }
  }
  absl::Span<T* const> get() {
    ptrs.clear();
    for (size_t i = 0; i < value.size(); ++i) {
      ptrs.push_back(null[i] ? nullptr : &value[i]);
    }
    return ptrs;
  }
  std::vector<std::remove_const_t<T>> value;
  std::vector<bool> null;
  std::vector<T*> ptrs;
};

}  // namespace kernel_slot_internal

// One kernel per DeviceType for an op whose kernels have type R(*)(Args...).
//
// Thread-safety: Register is meant for static initialisation or test set-up
// but is safe at any time; lookups and calls may come from any thread.
template <typename R, typename... Args>
class KernelSlot<R (*)(Args...)> final : public KernelSlotInfo {
 public:
  using Fn = R (*)(Args...);

  // `op` names the op in errors (a string literal: it is not copied);
  // `cpu` is the op's CPU kernel (null only for ops that have none).
  explicit KernelSlot(const char* op, Fn cpu = nullptr) : op_(op) {
    if (cpu != nullptr) Register(DeviceType::kCPU, cpu);
  }

  // Sets (or, with null, removes) the kernel of one device type.
  void Register(DeviceType type, Fn fn) {
    fns_[static_cast<int>(type)].store(fn, std::memory_order_release);
  }

  // The kernel registered for the device's type, or Unimplemented naming
  // the op and the device.
  absl::StatusOr<Fn> Get(Device device) const {
    const int i = static_cast<int>(device.type);
    Fn fn = (i >= 0 && i < kNumDeviceTypes)
                ? fns_[i].load(std::memory_order_acquire)
                : nullptr;
    if (fn == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          op_, ": no kernel registered for ", device.ToString(), " tensors",
          device.is_cuda() ? " (link the CUDA kernels library)" : ""));
    }
    return fn;
  }

  // Runs the kernel for `device` (the device of the op's tensors, already
  // validated by the op): one atomic load and an indirect call. A
  // host-backed device without a kernel of its own runs the CPU kernel on
  // host views. Without any kernel, returns Get's error (R must be
  // constructible from an absl::Status: Status or StatusOr).
  //
  // Inside a graph capture (core/graph_capture.h): a kernel that returns a
  // value to the host (R is not Status) is refused; on a device type with a
  // kernel recorder (the test device), the call is recorded with its
  // arguments and runs only at replay.
  R operator()(Device device, Args... args) const {
    if (IsCapturingGraph() && !device.is_cpu()) {
      if constexpr (!std::is_same_v<R, absl::Status>) {
        return RefuseInsideGraphCapture(
            absl::StrCat(op_, " (it returns a value to the host)"));
      } else {
        graph_capture_internal::KernelRecorder* recorder =
            graph_capture_internal::CurrentKernelRecorder();
        if (recorder != nullptr && recorder->type() == device.type) {
          auto stored = std::make_shared<
              std::tuple<kernel_slot_internal::StoredArg<Args>...>>(
              std::forward<Args>(args)...);
          recorder->Record(op_, [this, device, stored]() {
            return std::apply(
                [this, device](auto&... a) { return Run(device, a.get()...); },
                *stored);
          });
          return absl::OkStatus();
        }
      }
    }
    return Run(device, std::forward<Args>(args)...);
  }

  const char* op() const override { return op_; }

  bool HasKernel(DeviceType type) const override {
    const int i = static_cast<int>(type);
    return i >= 0 && i < kNumDeviceTypes &&
           fns_[i].load(std::memory_order_acquire) != nullptr;
  }

 private:
  // The dispatch itself (operator() without capture handling).
  R Run(Device device, Args... args) const {
    const int i = static_cast<int>(device.type);
    if (i >= 0 && i < kNumDeviceTypes) {
      if (Fn fn = fns_[i].load(std::memory_order_acquire)) {
        return fn(std::forward<Args>(args)...);
      }
    }
    if (IsHostBacked(device.type)) {
      if (Fn cpu = fns_[0].load(std::memory_order_acquire)) {
        return cpu(
            kernel_slot_internal::HostArg<Args>(std::forward<Args>(args))...);
      }
    }
    return Get(device).status();
  }

  const char* op_;
  std::atomic<Fn> fns_[kNumDeviceTypes] = {};
};

}  // namespace mcc

// Defines the accessor of an op's one slot,
//   KernelSlot<Fn>& Name();  // constructed on first use, never destroyed
// and lists the slot in AllKernelSlots() at load time. Every op's slot is
// defined this way (in the namespace of its declaration), so that a slot
// added without a kernel for some device fails that device's coverage test
// (core/ops/cuda/slot_coverage_test.cc) instead of going unnoticed.
#define MCC_KERNEL_SLOT(Fn, Name, op, cpu)                    \
  ::mcc::KernelSlot<Fn>& Name() {                             \
    static auto* slot = new ::mcc::KernelSlot<Fn>(op, cpu);   \
    return *slot;                                             \
  }                                                           \
  namespace {                                                 \
  [[maybe_unused]] const bool mcc_kernel_slot_listed_##Name = \
      ::mcc::ListKernelSlot(&Name());                         \
  }                                                           \
  static_assert(true, "")

#endif  // CORE_KERNEL_SLOT_H_
