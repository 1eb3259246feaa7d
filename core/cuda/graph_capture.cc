// GraphCaptureHooks for CUDA devices (core/graph_capture.h): CUDA graphs.
//
// Begin: the capture runs on the thread's current stream; when that is the
// legacy default stream (which cannot be captured), on a stream of its own,
// made current for the capture's length. Capture mode is thread-local, so
// other threads (a data loader, a checkpoint writer) may keep calling
// cudaMalloc and synchronising. The allocator's private pool for the
// capture (CudaAllocator::BeginCapturePool) keeps the graph's memory
// reserved until the graph is destroyed; its cudaMalloc, which thread-local
// mode forbids on this thread, runs in relaxed mode for that one call.
// End: cudaStreamEndCapture and cudaGraphInstantiate; an illegal call inside
// the capture (a host synchronisation that slipped past the generic checks)
// comes back here as cudaErrorStreamCaptureInvalidated.
// Replay: cudaGraphLaunch on the current stream. Destroy: frees the graph,
// then the pool (cudaFree waits for the replays).
#include "core/graph_capture.h"

#include <cuda_runtime.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {
namespace {

struct CudaGraph {
  int device = 0;
  int pool = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

// This thread's capture in progress.
struct Capture {
  int device = -1;
  int pool = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Stream> own_stream;  // When the current one was legacy.
  std::unique_ptr<StreamGuard> guard;  // Makes own_stream current.
};
thread_local std::unique_ptr<Capture> t_capture;

void EndCaptureState() {
  if (t_capture == nullptr) return;
  GetCudaAllocator(t_capture->device)->EndCapturePool();
  t_capture->guard.reset();
  t_capture.reset();
}

absl::Status Begin(Device device) {
  if (t_capture != nullptr) {
    return absl::FailedPreconditionError(
        "CUDA graph capture: this thread is capturing already");
  }
  MCC_RETURN_IF_ERROR(CheckDeviceIndex(device.index));
  auto capture = std::make_unique<Capture>();
  capture->device = device.index;
  capture->stream = CurrentStream(device.index);
  if (capture->stream == nullptr) {
    absl::StatusOr<Stream> stream = Stream::Create(device.index);
    if (!stream.ok()) return stream.status();
    capture->own_stream = std::make_unique<Stream>(*std::move(stream));
    capture->stream = capture->own_stream->get();
    capture->guard =
        std::make_unique<StreamGuard>(device.index, capture->stream);
  }
  DeviceGuard device_guard(device.index);
  CudaAllocator* allocator = GetCudaAllocator(device.index);
  capture->pool = allocator->BeginCapturePool();
  const cudaError_t error =
      cudaStreamBeginCapture(capture->stream, cudaStreamCaptureModeThreadLocal);
  if (error != cudaSuccess) {
    allocator->EndCapturePool();
    allocator->ReleasePool(capture->pool);
    return CudaErrorToStatus(error, "cudaStreamBeginCapture", __FILE__,
                             __LINE__);
  }
  t_capture = std::move(capture);
  return absl::OkStatus();
}

absl::StatusOr<void*> End(Device device) {
  if (t_capture == nullptr || t_capture->device != device.index) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graph capture: no capture of ", device.ToString(),
                     " in progress on this thread"));
  }
  DeviceGuard device_guard(device.index);
  auto graph = std::make_unique<CudaGraph>();
  graph->device = device.index;
  graph->pool = t_capture->pool;
  const cudaError_t ended =
      cudaStreamEndCapture(t_capture->stream, &graph->graph);
  EndCaptureState();  // The pool stays reserved; the stream can go.
  CudaAllocator* allocator = GetCudaAllocator(device.index);
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph->graph != nullptr) cudaGraphDestroy(graph->graph);
    allocator->ReleasePool(graph->pool);
    return absl::Status(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat(
            CudaErrorToStatus(ended, "cudaStreamEndCapture", __FILE__, __LINE__)
                .message(),
            " (something inside the capture synchronised with the "
            "host or used another stream without an event)"));
  }
  const cudaError_t made =
      cudaGraphInstantiate(&graph->exec, graph->graph, /*flags=*/0);
  if (made != cudaSuccess) {
    (void)cudaGetLastError();
    cudaGraphDestroy(graph->graph);
    allocator->ReleasePool(graph->pool);
    return CudaErrorToStatus(made, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return graph.release();
}

absl::Status Replay(Device device, void* graph) {
  auto* g = static_cast<CudaGraph*>(graph);
  DeviceGuard device_guard(g->device);
  MCC_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g->exec, CurrentStream(g->device)));
  return absl::OkStatus();
}

void Destroy(Device device, void* graph) {
  auto* g = static_cast<CudaGraph*>(graph);
  {
    DeviceGuard device_guard(g->device);
    if (g->exec != nullptr) cudaGraphExecDestroy(g->exec);
    if (g->graph != nullptr) cudaGraphDestroy(g->graph);
  }
  GetCudaAllocator(g->device)->ReleasePool(g->pool);
  delete g;
}

const bool registered = [] {
  GraphCaptureHooks hooks;
  hooks.begin = &Begin;
  hooks.end = &End;
  hooks.replay = &Replay;
  hooks.destroy = &Destroy;
  const absl::Status s = RegisterGraphCaptureHooks(DeviceType::kCUDA, hooks);
  CHECK(s.ok()) << s;
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace mcc
