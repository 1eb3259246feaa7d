#include "core/testing/deferred_side_stream.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "core/side_stream.h"
#include "core/status_macros.h"
#include "core/testing/test_device.h"

namespace mcc {
namespace testing {
namespace {

struct Copy {
  void* dst = nullptr;  // Host addresses, both.
  const void* src = nullptr;
  size_t bytes = 0;
};

struct Stream {
  std::deque<Copy> queue;
  uint64_t issued = 0;
  uint64_t done = 0;
  // Runs the copies issued up to `mark`.
  void RunTo(uint64_t mark) {
    while (done < mark && !queue.empty()) {
      const Copy c = queue.front();
      queue.pop_front();
      std::memcpy(c.dst, c.src, c.bytes);
      ++done;
    }
  }
};

// An event on a side stream, or on the current stream (stream null: its
// work runs in program order, so it is always complete).
struct Event {
  Stream* stream = nullptr;
  uint64_t mark = 0;
};

int64_t g_issued = 0;
int64_t g_max_queued = 0;

void* HostAddress(const void* device_address) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_address) -
                                 kTestDeviceAddressOffset);
}

void* CreateStream(Device) { return new Stream; }

void DestroyStream(Device, void* stream) {
  auto* s = static_cast<Stream*>(stream);
  s->RunTo(s->issued);
  delete s;
}

absl::Status RecordEvent(Device, void* stream, void** event) {
  auto* s = static_cast<Stream*>(stream);
  *event = new Event{s, s == nullptr ? 0 : s->issued};
  return absl::OkStatus();
}

absl::Status WaitEvent(Device, void* event, void* stream) {
  auto* e = static_cast<Event*>(event);
  // The current stream waits for a side stream's copies: they run now,
  // before any later work. A side stream waiting for the current stream
  // (whose work is done in program order) needs nothing.
  if (stream == nullptr && e->stream != nullptr) e->stream->RunTo(e->mark);
  return absl::OkStatus();
}

absl::Status SynchronizeEvent(Device, void* event) {
  auto* e = static_cast<Event*>(event);
  if (e->stream != nullptr) e->stream->RunTo(e->mark);
  return absl::OkStatus();
}

void DestroyEvent(Device, void* event) { delete static_cast<Event*>(event); }

absl::Status CopyAsync(Device, void* stream, void* dst, const void* src,
                       size_t bytes, bool to_host) {
  auto* s = static_cast<Stream*>(stream);
  Copy c;
  c.dst = to_host ? dst : HostAddress(dst);
  c.src = to_host ? HostAddress(src) : src;
  c.bytes = bytes;
  // Until the copy runs, its destination holds NaN bytes (what a device
  // would show is undefined): a read without the wait sees them, not the
  // stale bytes a freed block may still hold.
  std::memset(c.dst, 0xFF, bytes);
  s->queue.push_back(c);
  ++s->issued;
  ++g_issued;
  g_max_queued =
      std::max<int64_t>(g_max_queued, static_cast<int64_t>(s->queue.size()));
  return absl::OkStatus();
}

}  // namespace

void InstallDeferredSideStreams() {
  SideStreamHooks h;
  h.create_stream = &CreateStream;
  h.destroy_stream = &DestroyStream;
  h.record_event = &RecordEvent;
  h.wait_event = &WaitEvent;
  h.synchronize_event = &SynchronizeEvent;
  h.destroy_event = &DestroyEvent;
  h.copy_async = &CopyAsync;
  MCC_CHECK_OK(RegisterSideStreamHooks(DeviceType::kTestDevice, h));
}

void RemoveDeferredSideStreams() {
  MCC_CHECK_OK(RegisterSideStreamHooks(DeviceType::kTestDevice, {}));
}

int64_t DeferredCopiesIssued() { return g_issued; }
int64_t DeferredCopiesMaxQueued() { return g_max_queued; }

}  // namespace testing
}  // namespace mcc
