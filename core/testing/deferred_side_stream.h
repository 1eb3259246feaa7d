#ifndef CORE_TESTING_DEFERRED_SIDE_STREAM_H_
#define CORE_TESTING_DEFERRED_SIDE_STREAM_H_

// Side streams on the test device (core/side_stream.h) that run their
// copies as late as the ordering contract allows: a copy issued on a side
// stream happens only when the host or the current stream waits for an
// event recorded after it (or the stream is synchronised or destroyed).
// Until then the destination holds NaN bytes, so code that uses a copy's
// result without the wait the contract asks for reads garbage and fails its
// test, where the synchronous stand-in would hide the mistake. (Code that
// frees a copy's source too early may still read the stale bytes.)
// Test-only; not thread-safe.

#include <cstdint>

namespace mcc {
namespace testing {

// Registers the deferred hooks for DeviceType::kTestDevice (side streams
// made before keep the hooks they were made with).
void InstallDeferredSideStreams();
// Back to the synchronous stand-in.
void RemoveDeferredSideStreams();

// Copies issued on deferred side streams so far, and the most that were
// waiting at once (more than 0: they really ran late).
int64_t DeferredCopiesIssued();
int64_t DeferredCopiesMaxQueued();

}  // namespace testing
}  // namespace mcc

#endif  // CORE_TESTING_DEFERRED_SIDE_STREAM_H_
