#include "core/testing/test_device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/allocator.h"
#include "core/graph_capture.h"

namespace mcc {
namespace testing {
namespace {

std::atomic<int64_t> g_to_host{0};
std::atomic<int64_t> g_from_host{0};

void* ToDeviceAddress(void* host) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(host) +
                                 kTestDeviceAddressOffset);
}

void* ToHostAddress(const void* device) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device) -
                                 kTestDeviceAddressOffset);
}

// Memory allocated while a graph is captured stays reserved for the graph
// (as a CUDA graph's private pool): freed before the graph is destroyed, it
// is released only when the graph is. By address; guarded by g_reserved_mu.
struct Reservation {
  bool freed = false;
};
std::mutex g_reserved_mu;
std::map<void*, std::map<void*, Reservation>*>* g_reserved =
    new std::map<void*, std::map<void*, Reservation>*>();
// This thread's capture's reservations (null when not capturing).
thread_local std::map<void*, Reservation>* t_reserving = nullptr;

class TestDeviceAllocator : public Allocator {
 public:
  explicit TestDeviceAllocator(int index) : index_(index) {}
  Device device() const override { return Device::TestDevice(index_); }

 protected:
  void* RawAllocate(size_t bytes) override {
    size_t rounded =
        (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* host = std::aligned_alloc(kCpuAlignment, rounded);
    if (host != nullptr && t_reserving != nullptr) {
      std::lock_guard<std::mutex> lock(g_reserved_mu);
      (*t_reserving)[host] = Reservation();
      (*g_reserved)[host] = t_reserving;
    }
    return host == nullptr ? nullptr : ToDeviceAddress(host);
  }
  void RawFree(void* ptr, size_t) override {
    if (ptr == nullptr) return;
    void* host = ToHostAddress(ptr);
    {
      std::lock_guard<std::mutex> lock(g_reserved_mu);
      auto it = g_reserved->find(host);
      if (it != g_reserved->end()) {
        (*it->second)[host].freed = true;  // Released with its graph.
        return;
      }
    }
    std::free(host);
  }

 private:
  int index_;
};

absl::Status Copy(void* dst, Device dst_device, const void* src,
                  Device src_device, size_t bytes) {
  for (const Device& d : {dst_device, src_device}) {
    if (!d.is_cpu() && d.type != DeviceType::kTestDevice) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test-device copier asked to copy ", bytes, " bytes from ",
          src_device.ToString(), " to ", dst_device.ToString()));
    }
  }
  void* host_dst = dst_device.is_cpu() ? dst : ToHostAddress(dst);
  const void* host_src = src_device.is_cpu() ? src : ToHostAddress(src);
  graph_capture_internal::KernelRecorder* recorder =
      graph_capture_internal::CurrentKernelRecorder();
  if (recorder != nullptr && !dst_device.is_cpu() && !src_device.is_cpu()) {
    // A device-to-device copy inside a capture is part of the graph (CopyBytes
    // has refused host copies already).
    recorder->Record("device-to-device copy", [host_dst, host_src, bytes] {
      std::memmove(host_dst, host_src, bytes);
      return absl::OkStatus();
    });
    return absl::OkStatus();
  }
  if (dst_device.is_cpu()) g_to_host.fetch_add(1);
  if (src_device.is_cpu()) g_from_host.fetch_add(1);
  std::memmove(host_dst, host_src, bytes);
  return absl::OkStatus();
}

// A captured graph: the kernel calls and device copies recorded during the
// capture, run in order at replay (CUDA runs nothing while capturing either).
struct TestDeviceGraph {
  std::vector<std::pair<const char*, std::function<absl::Status()>>> calls;
  std::map<void*, Reservation> reserved;  // Memory allocated in the capture.
  ~TestDeviceGraph() {
    std::lock_guard<std::mutex> lock(g_reserved_mu);
    for (const auto& [host, r] : reserved) {
      g_reserved->erase(host);
      if (r.freed) std::free(host);
    }
  }
};

class Recorder : public graph_capture_internal::KernelRecorder {
 public:
  DeviceType type() const override { return DeviceType::kTestDevice; }
  void Record(const char* op, std::function<absl::Status()> run) override {
    graph->calls.emplace_back(op, std::move(run));
  }
  std::unique_ptr<TestDeviceGraph> graph = std::make_unique<TestDeviceGraph>();
};

thread_local std::unique_ptr<Recorder> t_recorder;
std::atomic<int64_t> g_replayed_calls{0};

absl::Status BeginCapture(Device) {
  t_recorder = std::make_unique<Recorder>();
  t_reserving = &t_recorder->graph->reserved;
  graph_capture_internal::SetKernelRecorder(t_recorder.get());
  return absl::OkStatus();
}

absl::StatusOr<void*> EndCapture(Device device) {
  graph_capture_internal::SetKernelRecorder(nullptr);
  t_reserving = nullptr;
  if (t_recorder == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "EndGraphCapture on ", device.ToString(), ": no capture begun"));
  }
  std::unique_ptr<TestDeviceGraph> graph = std::move(t_recorder->graph);
  t_recorder.reset();
  return graph.release();
}

absl::Status Replay(Device device, void* graph) {
  auto* g = static_cast<TestDeviceGraph*>(graph);
  for (size_t i = 0; i < g->calls.size(); ++i) {
    absl::Status status = g->calls[i].second();
    g_replayed_calls.fetch_add(1);
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat("replay of a ", device.ToString(), " graph: call ", i,
                       " (", g->calls[i].first,
                       ") failed: ", status.message()));
    }
  }
  return absl::OkStatus();
}

void Destroy(Device, void* graph) {
  delete static_cast<TestDeviceGraph*>(graph);
}

}  // namespace

bool RegisterTestDevice() {
  static const bool registered = [] {
    RegisterAllocator(DeviceType::kTestDevice, [](int index) -> Allocator* {
      return new TestDeviceAllocator(index);
    });
    RegisterDeviceCopy(DeviceType::kTestDevice, &Copy);
    RegisterHostBackedDevice(DeviceType::kTestDevice, &ToHostAddress);
    GraphCaptureHooks hooks;
    hooks.begin = &BeginCapture;
    hooks.end = &EndCapture;
    hooks.replay = &Replay;
    hooks.destroy = &Destroy;
    (void)RegisterGraphCaptureHooks(DeviceType::kTestDevice, hooks);
    return true;
  }();
  return registered;
}

int64_t TestDeviceCopiesToHost() { return g_to_host.load(); }
int64_t TestDeviceCopiesFromHost() { return g_from_host.load(); }
int64_t TestDeviceReplayedCalls() { return g_replayed_calls.load(); }

namespace {
const bool kRegistered = RegisterTestDevice();
}  // namespace

}  // namespace testing
}  // namespace mcc
