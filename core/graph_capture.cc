#include "core/graph_capture.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace {

struct HookSlot {
  std::atomic<bool> set{false};
  GraphCaptureHooks hooks;
};
HookSlot g_hooks[kNumDeviceTypes];

// This thread's capture.
struct CaptureState {
  bool active = false;
  Device device;
  GraphCaptureOptions options;
  absl::Status first_error;  // The first refused synchronisation.
  graph_capture_internal::KernelRecorder* recorder = nullptr;
};
thread_local CaptureState t_capture;

const GraphCaptureHooks* HooksFor(DeviceType type) {
  const int i = static_cast<int>(type);
  if (i < 0 || i >= kNumDeviceTypes) return nullptr;
  return g_hooks[i].set.load(std::memory_order_acquire) ? &g_hooks[i].hooks
                                                        : nullptr;
}

}  // namespace

absl::Status RegisterGraphCaptureHooks(DeviceType type,
                                       GraphCaptureHooks hooks) {
  const int i = static_cast<int>(type);
  if (type == DeviceType::kCPU || i < 0 || i >= kNumDeviceTypes) {
    return absl::InvalidArgumentError(
        "graph capture hooks are for non-CPU device types only");
  }
  const int set = (hooks.begin != nullptr) + (hooks.end != nullptr) +
                  (hooks.replay != nullptr) + (hooks.destroy != nullptr);
  if (set != 0 && set != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "graph capture hooks for device type ", i,
        ": set all four (begin, end, replay, destroy) or none; got ", set));
  }
  g_hooks[i].set.store(false, std::memory_order_release);
  g_hooks[i].hooks = hooks;
  if (set == 4) g_hooks[i].set.store(true, std::memory_order_release);
  return absl::OkStatus();
}

bool GraphCaptureSupported(DeviceType type) {
  return HooksFor(type) != nullptr;
}

DeviceGraph::DeviceGraph(DeviceGraph&& other) noexcept
    : device_(other.device_), graph_(std::exchange(other.graph_, nullptr)) {}

DeviceGraph& DeviceGraph::operator=(DeviceGraph&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = other.device_;
    graph_ = std::exchange(other.graph_, nullptr);
  }
  return *this;
}

DeviceGraph::~DeviceGraph() { Reset(); }

void DeviceGraph::Reset() {
  if (graph_ == nullptr) return;
  if (const GraphCaptureHooks* hooks = HooksFor(device_.type)) {
    hooks->destroy(device_, graph_);
  }
  graph_ = nullptr;
}

absl::Status DeviceGraph::Replay() const {
  if (graph_ == nullptr) {
    return absl::FailedPreconditionError("Replay of an empty DeviceGraph");
  }
  if (t_capture.active) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Replay of a ", device_.ToString(),
        " graph inside a graph capture (of ", t_capture.device.ToString(),
        "): replay it before BeginGraphCapture or after EndGraphCapture"));
  }
  const GraphCaptureHooks* hooks = HooksFor(device_.type);
  if (hooks == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("Replay: graph capture hooks for ", device_.ToString(),
                     " were removed"));
  }
  return hooks->replay(device_, graph_);
}

absl::Status BeginGraphCapture(Device device,
                               const GraphCaptureOptions& options) {
  if (t_capture.active) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginGraphCapture(", device.ToString(),
                     "): this thread is already capturing a graph of ",
                     t_capture.device.ToString()));
  }
  const GraphCaptureHooks* hooks = HooksFor(device.type);
  if (hooks == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "graph capture is not supported on ", device.ToString(),
        device.is_cuda() ? " (link the CUDA runtime, //core/cuda:runtime)"
                         : ""));
  }
  // Active before the hook so that the hook's own allocations and any
  // refused synchronisation already count as the capture's.
  t_capture.active = true;
  t_capture.device = device;
  t_capture.options = options;
  t_capture.first_error = absl::OkStatus();
  absl::Status began = hooks->begin(device);
  if (!began.ok()) {
    t_capture = CaptureState();
    return began;
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceGraph> EndGraphCapture() {
  if (!t_capture.active) {
    return absl::FailedPreconditionError(
        "EndGraphCapture: this thread is not capturing a graph");
  }
  const Device device = t_capture.device;
  const absl::Status first_error = t_capture.first_error;
  const GraphCaptureHooks* hooks = HooksFor(device.type);
  absl::StatusOr<void*> graph =
      hooks == nullptr ? absl::FailedPreconditionError(absl::StrCat(
                             "EndGraphCapture: graph capture hooks for ",
                             device.ToString(), " were removed"))
                       : hooks->end(device);
  t_capture = CaptureState();
  if (!first_error.ok()) {
    if (graph.ok() && *graph != nullptr) hooks->destroy(device, *graph);
    return absl::FailedPreconditionError(
        absl::StrCat("graph capture on ", device.ToString(),
                     " failed: ", first_error.message()));
  }
  if (!graph.ok()) return graph.status();
  return DeviceGraph(device, *graph);
}

bool IsCapturingGraph() { return t_capture.active; }
Device CapturingDevice() { return t_capture.device; }
const GraphCaptureOptions& CurrentGraphCaptureOptions() {
  return t_capture.options;
}

absl::Status RefuseInsideGraphCapture(absl::string_view what) {
  if (!t_capture.active) return absl::OkStatus();
  absl::Status error = absl::FailedPreconditionError(
      absl::StrCat(what,
                   " synchronises with the host, which is not allowed inside a "
                   "graph capture (of ",
                   t_capture.device.ToString(),
                   "; e.g. --cuda-graph): move it out of the captured region"));
  if (t_capture.first_error.ok()) t_capture.first_error = error;
  return error;
}

namespace graph_capture_internal {

void SetKernelRecorder(KernelRecorder* recorder) {
  t_capture.recorder = recorder;
}
KernelRecorder* CurrentKernelRecorder() { return t_capture.recorder; }

}  // namespace graph_capture_internal
}  // namespace mcc
