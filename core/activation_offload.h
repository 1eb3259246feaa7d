#ifndef CORE_ACTIVATION_OFFLOAD_H_
#define CORE_ACTIVATION_OFFLOAD_H_

// Activation offloading (Megatron's --cpu-offloading): the tensors a layer
// keeps for its backward leave the device for pinned host memory during the
// forward, and come back before that backward, on a side stream
// (core/side_stream.h) so the copies overlap compute where the device has
// streams.
//
// The caller names a group's tensors as a list of slots (pointers to the
// Tensor fields of its activation record) and gives the same list, in the
// same order, to Offload and to Restore:
//   forward:  layer i runs; Offload(slots of i) starts the copies to the
//             host and empties the slots; the device memory goes at the
//             next Offload (or ReleaseOffloaded), once the current stream
//             is ordered after the copies, so a copy has the next layer's
//             forward to hide behind.
//   backward: Restore(group i) puts device tensors back into the slots
//             (the current stream waits for their copy), then
//             Prefetch(group i - 1) starts the next one's copy to overlap
//             layer i's backward.
// Values come back bit for bit. Slots holding the same tensor as an earlier
// slot travel once and come back as one tensor again; a view that shares
// memory with another slot's tensor but is not the same view stays on the
// device (moving it would free nothing).
//
// Device memory is never reused while a copy may still read or write it:
// the side stream waits for the current stream before each batch of copies,
// and the current stream waits for the copies before their source is freed
// or their result is used. Pinned buffers are reused only for later copies
// on the same side stream, which runs in order.
//
// Ownership: the offloader owns the side stream and the pinned buffers; a
// Group keeps them alive (it may outlive the offloader). Errors name the
// slot's tensor and the device; after one, the group's slots are not to be
// used. Thread-safety: none; one thread drives forward and backward.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/side_stream.h"
#include "core/tensor.h"

namespace mcc {

// Totals since the offloader was made.
struct OffloadStats {
  int64_t groups = 0;          // Offload calls.
  int64_t tensors = 0;         // Tensors copied to the host.
  int64_t bytes = 0;           // Their bytes.
  int64_t restored_bytes = 0;  // Bytes brought back.
  int64_t kept_tensors = 0;    // Views left on the device (see above).
  int64_t pinned_bytes = 0;    // Pinned host memory held now.
};

class ActivationOffloader {
 public:
  struct State;  // The side stream, pinned buffers and pending releases.

  // One group's tensors while they are off the device.
  class Group {
   public:
    ~Group();
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    // Bytes copied to the host for this group.
    int64_t bytes() const { return bytes_; }

   private:
    friend class ActivationOffloader;
    Group() = default;
    struct Entry {
      int slot = 0;
      int alias_of = -1;  // The entry whose tensor this slot shared.
      Shape shape;
      DType dtype = DType::kFloat32;
      size_t bytes = 0;
      void* pinned = nullptr;
      size_t pinned_capacity = 0;
    };
    enum class Stage { kOffloaded, kPrefetched, kRestored };
    std::shared_ptr<State> state_;
    std::vector<Entry> entries_;
    int num_slots_ = 0;
    int64_t bytes_ = 0;
    Stage stage_ = Stage::kOffloaded;
    std::vector<Tensor> back_;  // Prefetched tensors, one per entry.
    DeviceEvent ready_;         // After the prefetch copies.
  };

  // An offloader for tensors on `device`. On the CPU there is nothing to
  // offload: InvalidArgument naming --cpu-offloading.
  static absl::StatusOr<std::unique_ptr<ActivationOffloader>> Create(
      Device device);
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  Device device() const;
  // Whether copies run on a real side stream (false: synchronous copies
  // through the device's copy hook, as on the test device).
  bool asynchronous() const;

  // Releases the earlier groups' device memory (ReleaseOffloaded), then
  // starts copying the defined tensors among *slots to pinned host memory
  // after the current stream's work so far, and empties their slots.
  absl::StatusOr<std::unique_ptr<Group>> Offload(
      absl::Span<Tensor* const> slots);
  // Orders the current stream after every copy started by Offload and drops
  // their device tensors (call at the end of a forward).
  absl::Status ReleaseOffloaded();
  // Starts bringing `group` back to the device after the current stream's
  // work so far (nothing if already started).
  absl::Status Prefetch(Group* group);
  // Puts the group's tensors back into `slots` (the list given to Offload),
  // prefetching first if needed; the current stream's later work sees the
  // values. FailedPrecondition if restored already.
  absl::Status Restore(Group* group, absl::Span<Tensor* const> slots);

  OffloadStats stats() const;

 private:
  ActivationOffloader() = default;
  std::shared_ptr<State> state_;
};

}  // namespace mcc

#endif  // CORE_ACTIVATION_OFFLOAD_H_
