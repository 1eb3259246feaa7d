#ifndef CORE_COMM_BACKEND_H_
#define CORE_COMM_BACKEND_H_

// What a transport implements so that a ProcessGroup (process_group.h) can
// run on it, as c10d keeps Backend apart from ProcessGroup. Users never call
// a backend: they hold the ProcessGroup that owns it. The implementations
// are gloo (gloo_process_group.cc), NCCL (nccl_process_group.cc) and the
// test wrapper with NCCL's point-to-point rules (nccl_like_p2p_group.cc).
//
// Who does what:
//  - ProcessGroup checks every argument (tensors defined and on device(),
//    dtypes and shapes, ranks in range), refuses calls once the group is
//    broken, numbers collectives, compares fingerprints across ranks under
//    debug collectives, and records every call in the flight recorder and
//    for the CallObserver. Only then does it call one Do* method, passing a
//    Call that describes the operation.
//  - The backend starts the operation and returns its Work (work.h) without
//    waiting for the peers; the Work finishes exactly once, with OK or an
//    error. Collectives reach the backend in the order the user issued them
//    and must run in that order. A transport failure or a timeout (after
//    call.timeout) goes through Fail(), which names the call and any lost
//    ranks and breaks the group.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/comm/process_group.h"
#include "core/comm/store.h"
#include "core/comm/work.h"
#include "core/tensor.h"

namespace mcc {
namespace comm {

// One operation as ProcessGroup hands it to the backend: what it is, for
// errors and fingerprints, its place in the group's order and its timeout.
struct Call {
  std::string op;           // "AllReduce"
  std::string signature;    // "AllReduce(sum, fp32[3, 5])"
  std::string fingerprint;  // what must agree across ranks
  int64_t seq = -1;         // sequence number in this group (-1: p2p)
  int64_t p2p_index = -1;   // index among this group's p2p calls
  absl::Duration timeout;
  // "AllReduce(sum, fp32[3, 5]) (sequence number 7) in group 'world' on
  // rank 1 of 4"
  std::string what;
};

class Backend {
 public:
  // The group this backend moves data for: this rank's place in it, its
  // name, the world ranks of its members (in group order) and the store,
  // already prefixed for it.
  Backend(int rank, int size, std::string name, std::vector<int> global_ranks,
          std::shared_ptr<Store> store, GroupOptions options);
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // ---- What a transport implements.

  // Its name in errors and logs: "gloo", "nccl".
  virtual absl::string_view type() const = 0;
  // The device whose tensors it moves.
  virtual Device device() const = 0;

  // ProcessGroup's operations of the same name (less "Do"), with arguments
  // already checked. Tensors are handles on the caller's storage; the
  // backend keeps them referenced until its Work has finished.
  virtual std::shared_ptr<Work> DoAllReduce(const Call& call, Tensor t,
                                            ReduceOp op) = 0;
  virtual std::shared_ptr<Work> DoAllGather(const Call& call, Tensor in,
                                            Tensor out) = 0;
  // Counts are elements (rows times the row's elements) per rank.
  virtual std::shared_ptr<Work> DoAllGatherV(
      const Call& call, Tensor in, Tensor out,
      std::vector<int64_t> elements_per_rank) = 0;
  virtual std::shared_ptr<Work> DoReduceScatter(const Call& call, Tensor in,
                                                Tensor out, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> DoBroadcast(const Call& call, Tensor t,
                                            int root) = 0;
  virtual std::shared_ptr<Work> DoAllToAll(const Call& call, Tensor in,
                                           Tensor out) = 0;
  virtual std::shared_ptr<Work> DoBarrier(const Call& call) = 0;
  virtual std::shared_ptr<Work> DoSend(const Call& call, Tensor t, int dst,
                                       uint32_t tag) = 0;
  virtual std::shared_ptr<Work> DoRecv(const Call& call, Tensor t, int src,
                                       uint32_t tag) = 0;
  // Posts every op (checked, at least one) and returns a work that finishes
  // with all of them. The default posts each through DoSend / DoRecv, which
  // suits backends whose transfers progress independently (gloo).
  virtual std::shared_ptr<Work> DoBatchP2P(const Call& call,
                                           std::vector<P2POp> ops);
  // A backend of the same kind for a subgroup (ProcessGroup::NewSubgroup has
  // agreed on its members), over `store`, already prefixed for it.
  virtual absl::StatusOr<std::unique_ptr<Backend>> CreateSubgroup(
      int rank, int size, std::string name, std::vector<int> global_ranks,
      std::shared_ptr<Store> store, GroupOptions options) = 0;

  // ---- The group.

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const GroupOptions& options() const { return options_; }
  const std::shared_ptr<Store>& store() const { return store_; }

  // ---- Failure: shared by the backend and its ProcessGroup.

  // Turns a failure into the error every caller sees: names the call, and
  // the lost ranks when the liveness store knows of any; breaks the group
  // and, on its first failure, dumps the flight recorder.
  absl::Status Fail(const Call& call, absl::StatusCode code,
                    absl::string_view detail);
  // Breaks the group with `status` unless it is already broken; true when
  // this was the first error.
  bool Break(const absl::Status& status);
  // The first error that broke the group (OK while healthy).
  absl::Status broken_status();

 private:
  // Global ranks the liveness store reports lost, within this group.
  std::vector<int> LostGroupMembers(absl::Duration wait);

  const int rank_;
  const int size_;
  const std::string name_;
  const std::vector<int> global_ranks_;
  const std::shared_ptr<Store> store_;
  const GroupOptions options_;
  std::mutex broken_mu_;
  absl::Status broken_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_BACKEND_H_
