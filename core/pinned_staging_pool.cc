#include "core/pinned_staging_pool.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/device_staging.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {

PinnedStagingPool::PinnedStagingPool(Device device) : device_(device) {}

PinnedStagingPool::~PinnedStagingPool() {
  if (!in_flight_.empty()) {
    // The device may still read them.
    absl::Status s = SynchronizeStream(device_);
    LOG_IF(ERROR, !s.ok()) << "pinned staging pool for " << device_.ToString()
                           << ": " << s;
  }
  for (const Buffer& b : free_) FreePinnedHost(device_, b.data);
  for (const Buffer& b : in_flight_) FreePinnedHost(device_, b.data);
}

absl::StatusOr<PinnedStagingPool::Buffer> PinnedStagingPool::Take(
    size_t bytes) {
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].bytes >= bytes &&
        (best == free_.size() || free_[i].bytes < free_[best].bytes)) {
      best = i;
    }
  }
  if (best < free_.size()) {
    Buffer b = free_[best];
    free_[best] = free_.back();
    free_.pop_back();
    return b;
  }
  Buffer b;
  b.bytes = bytes;
  b.data = AllocatePinnedHost(device_, bytes);
  if (b.data == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned staging pool for ", device_.ToString(), ": cannot allocate ",
        bytes, " bytes of pinned memory (", pinned_bytes_, " held)"));
  }
  pinned_bytes_ += bytes;
  return b;
}

absl::StatusOr<Tensor> PinnedStagingPool::Stage(const Tensor& host) {
  if (!host.defined() || !host.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned staging to ", device_.ToString(), ": the source ",
                     host.defined() ? host.Describe() : "(undefined)",
                     " must be a CPU tensor"));
  }
  if (device_.is_cpu()) return host;
  Tensor out = Tensor::Empty(host.shape(), host.dtype(), device_);
  const size_t bytes = host.nbytes();
  if (bytes == 0) return out;
  MCC_ASSIGN_OR_RETURN(Buffer buffer, Take(bytes));
  std::memcpy(buffer.data, host.raw_data(), bytes);
  absl::Status copied =
      CopyToDeviceAsync(out.raw_data(), device_, buffer.data, bytes);
  // In flight even on failure: the device may have started reading it.
  in_flight_.push_back(buffer);
  MCC_RETURN_IF_ERROR(copied);
  return out;
}

absl::Status PinnedStagingPool::Recycle() {
  if (in_flight_.empty()) return absl::OkStatus();
  MCC_RETURN_IF_ERROR(SynchronizeStream(device_));
  free_.insert(free_.end(), in_flight_.begin(), in_flight_.end());
  in_flight_.clear();
  return absl::OkStatus();
}

}  // namespace mcc
