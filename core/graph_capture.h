#ifndef CORE_GRAPH_CAPTURE_H_
#define CORE_GRAPH_CAPTURE_H_

// Device graphs: the work a thread issues on one device between
// BeginGraphCapture and EndGraphCapture, recorded once and replayed many
// times (CUDA graphs on GPUs), so that a training step with static shapes
// pays the host's launch cost once.
//
// Contract (CUDA's, for every device type):
//   - While capturing, the kernels (dispatch slots, core/kernel_slot.h) and
//     device-to-device copies the capturing thread issues for the device
//     are recorded, NOT run: their outputs hold nothing until a Replay.
//     Work for other devices (CPU kernels on host tensors) runs as usual.
//   - Nothing inside a capture may synchronise with the host: a copy
//     between the host and a device (CopyBytes, Tensor::To, CopyFrom), and
//     a kernel that returns a value to the host (a slot whose kernel returns
//     StatusOr, e.g. ops::Sum) fail with FailedPrecondition naming the op
//     and the capture. The first such error spoils the capture:
//     EndGraphCapture returns it even if the caller ignored it.
//   - Memory allocated on the device during the capture stays reserved for
//     the graph (CUDA: a private pool of the caching allocator) until the
//     graph is destroyed, so every replay sees the same addresses. Tensors
//     made before the capture and used inside it (static inputs, parameters,
//     gradient buffers) must be kept alive, unmoved, by the caller for as
//     long as the graph is replayed; fresh inputs are copied INTO them before
//     each Replay (a new tensor is not seen by the graph).
//   - Replay issues the recorded work, in recorded order, on the device's
//     current stream; it is ordered after the work issued before it and
//     before the work issued after it, like any kernel.
//
// A device library registers GraphCaptureHooks for its type (the CUDA
// runtime: cudaStreamBeginCapture in thread-local mode, cudaGraphLaunch;
// the test device, core/testing/test_device.h: a list of recorded kernel
// calls). A type without hooks (the CPU) cannot capture: BeginGraphCapture
// returns Unimplemented naming the device.
//
// Thread-safety: capture state is per thread, one capture at a time per
// thread. Registration is for static initialisation. A DeviceGraph is used
// from one thread at a time.

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"

namespace mcc {

struct GraphCaptureHooks {
  // Starts capturing the calling thread's work for `device`.
  absl::Status (*begin)(Device device) = nullptr;
  // Ends the thread's capture: the replayable graph (owned by the caller,
  // freed with destroy), or an error (the capture is over either way).
  absl::StatusOr<void*> (*end)(Device device) = nullptr;
  // Issues the graph's work on the device's current stream.
  absl::Status (*replay)(Device device, void* graph) = nullptr;
  // Frees the graph and the memory reserved for it.
  void (*destroy)(Device device, void* graph) = nullptr;
};

// Sets the hooks of a non-CPU device type: all four, or none ({}: no
// capture again, for tests). InvalidArgument otherwise.
absl::Status RegisterGraphCaptureHooks(DeviceType type,
                                       GraphCaptureHooks hooks);
bool GraphCaptureSupported(DeviceType type);

struct GraphCaptureOptions {
  // The caller checks the index inputs (token ids, labels) of every replay
  // itself, outside the capture (e.g. on the host before copying them in):
  // ops::CheckIndexRange, which reads the device back, then passes without
  // checking inside this capture instead of failing.
  bool index_inputs_checked_outside = false;
};

// A captured graph. Movable; destroying it releases the graph's memory
// (its replays must have been ordered before any reuse, as for any tensor
// freed on the current stream).
class DeviceGraph {
 public:
  DeviceGraph() = default;
  DeviceGraph(DeviceGraph&& other) noexcept;
  DeviceGraph& operator=(DeviceGraph&& other) noexcept;
  ~DeviceGraph();

  bool valid() const { return graph_ != nullptr; }
  Device device() const { return device_; }
  // Issues the recorded work on the device's current stream. Fails when
  // called inside a capture, on an empty graph, or when the work fails (the
  // test device reports the first failing op).
  absl::Status Replay() const;

 private:
  friend absl::StatusOr<DeviceGraph> EndGraphCapture();
  DeviceGraph(Device device, void* graph) : device_(device), graph_(graph) {}
  void Reset();

  Device device_;
  void* graph_ = nullptr;
};

// Starts capturing this thread's work for `device`. FailedPrecondition when
// this thread is capturing already; Unimplemented for a device type without
// hooks; the hook's error otherwise (nothing is capturing then).
absl::Status BeginGraphCapture(Device device,
                               const GraphCaptureOptions& options = {});
// Ends this thread's capture and returns its graph, or the first error of
// the capture (a refused host synchronisation, a failed hook). Fails when
// this thread is not capturing. The capture is over either way.
absl::StatusOr<DeviceGraph> EndGraphCapture();

// Whether this thread is capturing (for any device), and the options and
// device of its capture (meaningful only while capturing).
bool IsCapturingGraph();
Device CapturingDevice();
const GraphCaptureOptions& CurrentGraphCaptureOptions();

// For host synchronisations: OK outside a capture; inside one, a
// FailedPrecondition "<what> ... inside a graph capture" that also spoils
// the capture (see the contract above).
absl::Status RefuseInsideGraphCapture(absl::string_view what);

namespace graph_capture_internal {

// For host-backed device types (the test device), whose kernels are host
// code and would otherwise run at once: while a recorder is set on this
// thread for a device type, KernelSlot passes each call for that type to
// Record (as a closure that runs it later) instead of running it.
class KernelRecorder {
 public:
  virtual ~KernelRecorder() = default;
  virtual DeviceType type() const = 0;
  // `op` is a string literal naming the op (for errors at replay).
  virtual void Record(const char* op, std::function<absl::Status()> run) = 0;
};
// Sets (null: clears) this thread's recorder; the caller keeps ownership.
void SetKernelRecorder(KernelRecorder* recorder);
KernelRecorder* CurrentKernelRecorder();

}  // namespace graph_capture_internal
}  // namespace mcc

#endif  // CORE_GRAPH_CAPTURE_H_
