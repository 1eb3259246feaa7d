#include "core/activation_offload.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/device_staging.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {

struct ActivationOffloader::State {
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
  };
  // Device tensors whose copy to the host has been issued: freed once the
  // current stream waits for `copied`.
  struct Pending {
    DeviceEvent copied;
    std::vector<Tensor> tensors;
  };

  ~State() {
    pending.clear();
    // The side stream may still read or write the buffers.
    if (stream != nullptr) {
      absl::Status s = stream->Synchronize();
      LOG_IF(ERROR, !s.ok())
          << "activation offload on " << device.ToString() << ": " << s;
    }
    stream.reset();
    for (const Buffer& b : free) FreePinnedHost(device, b.data);
  }

  // The smallest free buffer of at least `bytes`, or a new one. Reuse needs
  // no wait: every copy that touched a freed buffer was issued earlier on
  // the same in-order side stream.
  absl::StatusOr<Buffer> Take(size_t bytes) {
    size_t best = free.size();
    for (size_t i = 0; i < free.size(); ++i) {
      if (free[i].bytes >= bytes &&
          (best == free.size() || free[i].bytes < free[best].bytes)) {
        best = i;
      }
    }
    if (best < free.size()) {
      Buffer b = free[best];
      free[best] = free.back();
      free.pop_back();
      return b;
    }
    Buffer b{AllocatePinnedHost(device, bytes), bytes};
    if (b.data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("activation offload: cannot allocate ", bytes,
                       " bytes of pinned host memory for ", device.ToString(),
                       " (", stats.pinned_bytes, " held)"));
    }
    stats.pinned_bytes += static_cast<int64_t>(bytes);
    return b;
  }
  void Give(void* data, size_t bytes) {
    if (data != nullptr) free.push_back(Buffer{data, bytes});
  }

  Device device;
  std::unique_ptr<SideStream> stream;
  std::vector<Buffer> free;
  std::vector<Pending> pending;
  OffloadStats stats;
};

ActivationOffloader::Group::~Group() {
  if (state_ == nullptr) return;
  for (Entry& e : entries_) {
    state_->Give(e.pinned, e.pinned_capacity);
    e.pinned = nullptr;
  }
}

absl::StatusOr<std::unique_ptr<ActivationOffloader>>
ActivationOffloader::Create(Device device) {
  if (device.is_cpu()) {
    return absl::InvalidArgumentError(
        "--cpu-offloading: the model is on the CPU, where activations "
        "already live in host memory; there is nothing to offload (use it "
        "with a device: --device cuda)");
  }
  auto state = std::make_shared<State>();
  state->device = device;
  MCC_ASSIGN_OR_RETURN(state->stream, SideStream::Create(device));
  auto offloader =
      std::unique_ptr<ActivationOffloader>(new ActivationOffloader);
  offloader->state_ = std::move(state);
  return offloader;
}

ActivationOffloader::~ActivationOffloader() {
  if (state_ == nullptr) return;
  absl::Status s = ReleaseOffloaded();
  LOG_IF(ERROR, !s.ok()) << "activation offload: " << s;
}

Device ActivationOffloader::device() const { return state_->device; }

bool ActivationOffloader::asynchronous() const {
  return state_->stream->asynchronous();
}

OffloadStats ActivationOffloader::stats() const { return state_->stats; }

absl::Status ActivationOffloader::ReleaseOffloaded() {
  for (State::Pending& p : state_->pending) {
    // Later work on the current stream may reuse the memory the copy reads.
    MCC_RETURN_IF_ERROR(p.copied.WaitOnCurrentStream());
  }
  state_->pending.clear();
  return absl::OkStatus();
}

namespace {

bool SameView(const Tensor& a, const Tensor& b) {
  return a.SharesStorageWith(b) && a.raw_data() == b.raw_data() &&
         a.dtype() == b.dtype() && a.shape() == b.shape();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ActivationOffloader::Group>>
ActivationOffloader::Offload(absl::Span<Tensor* const> slots) {
  MCC_RETURN_IF_ERROR(ReleaseOffloaded());
  State& st = *state_;
  auto group = std::unique_ptr<Group>(new Group);
  group->state_ = state_;
  group->num_slots_ = static_cast<int>(slots.size());
  std::vector<Tensor> held;  // Parallel to group->entries_.
  std::vector<Tensor> kept;  // Views left on the device.
  bool ordered = false;
  for (size_t i = 0; i < slots.size(); ++i) {
    Tensor& t = *slots[i];
    if (!t.defined() || t.numel() == 0) continue;
    if (t.device() != st.device) {
      return absl::InvalidArgumentError(
          absl::StrCat("activation offload: slot ", i, " holds ", t.Describe(),
                       ", not a tensor on ", st.device.ToString()));
    }
    int alias = -1;
    bool keep = false;
    for (size_t k = 0; k < held.size() && alias < 0 && !keep; ++k) {
      if (SameView(t, held[k])) {
        alias = static_cast<int>(k);
      } else if (t.SharesStorageWith(held[k])) {
        keep = true;
      }
    }
    for (const Tensor& v : kept) keep = keep || t.SharesStorageWith(v);
    if (keep) {
      kept.push_back(t);
      ++st.stats.kept_tensors;
      continue;
    }
    Group::Entry e;
    e.slot = static_cast<int>(i);
    e.shape = t.shape();
    e.dtype = t.dtype();
    e.bytes = t.nbytes();
    if (alias >= 0) {
      e.alias_of = group->entries_[alias].alias_of >= 0
                       ? group->entries_[alias].alias_of
                       : alias;
    } else {
      if (!ordered) {
        // The copies read what the current stream's work wrote.
        MCC_RETURN_IF_ERROR(st.stream->WaitForCurrentStream());
        ordered = true;
      }
      MCC_ASSIGN_OR_RETURN(State::Buffer buffer, st.Take(e.bytes));
      e.pinned = buffer.data;
      e.pinned_capacity = buffer.bytes;
      absl::Status copied =
          st.stream->CopyToHost(e.pinned, t.raw_data(), e.bytes);
      if (!copied.ok()) {
        st.Give(e.pinned, e.pinned_capacity);
        return absl::Status(copied.code(),
                            absl::StrCat("activation offload of ", t.Describe(),
                                         ": ", copied.message()));
      }
      group->bytes_ += static_cast<int64_t>(e.bytes);
      ++st.stats.tensors;
    }
    group->entries_.push_back(std::move(e));
    held.push_back(t);
  }
  for (const Group::Entry& e : group->entries_) *slots[e.slot] = Tensor();
  if (group->bytes_ > 0) {
    MCC_ASSIGN_OR_RETURN(DeviceEvent copied, st.stream->Record());
    st.pending.push_back(State::Pending{std::move(copied), std::move(held)});
  }
  st.stats.bytes += group->bytes_;
  ++st.stats.groups;
  return group;
}

absl::Status ActivationOffloader::Prefetch(Group* group) {
  if (group->stage_ != Group::Stage::kOffloaded) return absl::OkStatus();
  State& st = *state_;
  if (group->state_ != state_) {
    return absl::InvalidArgumentError(
        "activation offload: a group prefetched by another offloader");
  }
  // The new tensors may take memory the current stream's work issued so
  // far still uses (the allocator reuses freed blocks at once).
  if (group->bytes_ > 0) MCC_RETURN_IF_ERROR(st.stream->WaitForCurrentStream());
  group->back_.assign(group->entries_.size(), Tensor());
  for (size_t k = 0; k < group->entries_.size(); ++k) {
    Group::Entry& e = group->entries_[k];
    if (e.alias_of >= 0) {
      group->back_[k] = group->back_[e.alias_of];
      continue;
    }
    Tensor t = Tensor::Empty(e.shape, e.dtype, st.device);
    MCC_RETURN_IF_ERROR(
        st.stream->CopyToDevice(t.raw_data(), e.pinned, e.bytes));
    group->back_[k] = std::move(t);
    // Free for later copies on the side stream, which come after this one.
    st.Give(e.pinned, e.pinned_capacity);
    e.pinned = nullptr;
    st.stats.restored_bytes += static_cast<int64_t>(e.bytes);
  }
  if (group->bytes_ > 0) {
    MCC_ASSIGN_OR_RETURN(group->ready_, st.stream->Record());
  }
  group->stage_ = Group::Stage::kPrefetched;
  return absl::OkStatus();
}

absl::Status ActivationOffloader::Restore(Group* group,
                                          absl::Span<Tensor* const> slots) {
  if (group->stage_ == Group::Stage::kRestored) {
    return absl::FailedPreconditionError(
        "activation offload: the group was restored already");
  }
  if (static_cast<int>(slots.size()) != group->num_slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation offload: restoring ", slots.size(),
                     " slots into a group offloaded from ", group->num_slots_));
  }
  for (const Group::Entry& e : group->entries_) {
    if (slots[e.slot]->defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "activation offload: slot ", e.slot, " was refilled (",
          slots[e.slot]->Describe(), ") while its tensor was on the host"));
    }
  }
  MCC_RETURN_IF_ERROR(Prefetch(group));
  MCC_RETURN_IF_ERROR(group->ready_.WaitOnCurrentStream());
  for (size_t k = 0; k < group->entries_.size(); ++k) {
    *slots[group->entries_[k].slot] = std::move(group->back_[k]);
  }
  group->back_.clear();
  group->ready_ = DeviceEvent();
  group->stage_ = Group::Stage::kRestored;
  return absl::OkStatus();
}

}  // namespace mcc
