// ProcessGroup::BatchP2P over gloo, and the NCCL-like test wrapper
// (nccl_like_p2p_group.h) that the pipeline tests run under: a ring
// exchange where each rank sends to and receives from both neighbours in one
// batch (at world size 2 both neighbours are one peer), at several world
// sizes, dtypes and odd sizes; that the wrapper ignores tags (posting order
// decides); and that it deadlocks, as NCCL can, when two ranks each send
// before receiving outside a batch.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/comm/nccl_like_p2p_group.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s failed: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// What rank `from` sends as its message `kind` (distinct per rank and kind).
Tensor Message(int from, int kind, int64_t n, DType dtype) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(from * 100 + kind * 10 + i % 7);
  }
  return Tensor::FromVector(v, {n}, dtype).value();
}

bool Same(const Tensor& a, const Tensor& b) {
  return a.ToDoubles() == b.ToDoubles();
}

// Sends A to the right and B to the left, receives the left's A and the
// right's B, all in one batch.
int RingExchange(ProcessGroup& pg, const std::string& label) {
  const int n = pg.size(), r = pg.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  int failures = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    for (int64_t size : {int64_t{1}, int64_t{37}, int64_t{1001}}) {
      Tensor from_left = Tensor::Zeros({size}, dtype);
      Tensor from_right = Tensor::Zeros({size}, dtype);
      absl::Status s = pg.BatchP2PSync(
          {P2POp::Send(Message(r, 0, size, dtype), right, /*tag=*/1),
           P2POp::Send(Message(r, 1, size, dtype), left, /*tag=*/2),
           P2POp::Recv(from_left, left, /*tag=*/1),
           P2POp::Recv(from_right, right, /*tag=*/2)});
      const std::string what =
          absl::StrCat(label, " ring exchange ", DTypeName(dtype), "[", size,
                       "] on rank ", r, " of ", n);
      if (!s.ok()) return Fail(what, s);
      if (!Same(from_left, Message(left, 0, size, dtype)) ||
          !Same(from_right, Message(right, 1, size, dtype))) {
        std::fprintf(stderr, "%s: wrong values\n", what.c_str());
        ++failures;
      }
    }
  }
  return failures;
}

MCC_WORKER(batch_p2p) {
  GroupOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<World> world = InitWorldFromEnvironment(options);
  if (!world.ok()) return Fail("init", world.status());
  ProcessGroup& gloo = *world->group;
  std::unique_ptr<ProcessGroup> nccl_like_group = MakeNcclLikeP2PGroup(&gloo);
  ProcessGroup& nccl_like = *nccl_like_group;
  int failures = RingExchange(gloo, "gloo");
  failures += RingExchange(nccl_like, "nccl-like");
  // An empty batch is done at once.
  if (!gloo.BatchP2PSync({}).ok()) ++failures;

  if (gloo.size() == 2) {
    // Rank 0 sends x (tag 1) then y (tag 2); rank 1 posts tag 2 first. gloo
    // matches tags; the wrapper, as NCCL, the posting order.
    const int r = gloo.rank();
    for (ProcessGroup* pg : {static_cast<ProcessGroup*>(&gloo),
                             static_cast<ProcessGroup*>(&nccl_like)}) {
      const bool tagless = pg == &nccl_like;
      Tensor x = Message(0, 3, 5, DType::kFloat32);
      Tensor y = Message(0, 4, 5, DType::kFloat32);
      absl::Status s;
      if (r == 0) {
        s = pg->BatchP2PSync({P2POp::Send(x, 1, 1), P2POp::Send(y, 1, 2)});
      } else {
        Tensor first = Tensor::Zeros({5}, DType::kFloat32);
        Tensor second = Tensor::Zeros({5}, DType::kFloat32);
        s = pg->BatchP2PSync(
            {P2POp::Recv(first, 0, 2), P2POp::Recv(second, 0, 1)});
        if (s.ok() &&
            !(Same(first, tagless ? x : y) && Same(second, tagless ? y : x))) {
          std::fprintf(stderr, "%s: tag matching not as documented\n",
                       pg->backend().data());
          ++failures;
        }
      }
      if (!s.ok()) return Fail(absl::StrCat(pg->backend(), " tags"), s);
    }
    // Both ranks send before receiving, outside a batch: over NCCL each
    // send waits for a receive the peer posts only after its own send.
    // Rank 0's deadline is the short one: gloo closes the pair when a wait
    // times out, so whichever rank's deadline fires second would see the
    // pair closed by its peer, not a timeout (equal deadlines made the
    // check a race). Rank 1 waits longer and only must not succeed.
    CollectiveOptions timeout;
    timeout.timeout = r == 0 ? absl::Seconds(2) : absl::Seconds(30);
    Tensor out = Message(r, 5, 3, DType::kFloat32);
    Tensor in = Tensor::Zeros({3}, DType::kFloat32);
    auto send = nccl_like.Send(out, 1 - r, 0, timeout);
    auto recv = nccl_like.Recv(&in, 1 - r, 0, timeout);
    absl::Status s = send->Wait();
    const bool as_expected =
        r == 0 ? s.code() == absl::StatusCode::kDeadlineExceeded &&
                     s.message().find("Send") != absl::string_view::npos
               : !s.ok();
    if (!as_expected) {
      std::fprintf(stderr,
                   "rank %d: expected the unpaired send to %s, got %s\n", r,
                   r == 0 ? "time out" : "fail", s.ToString().c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

TEST(BatchP2PTest, RingExchangeTagsAndDeadlock) {
  for (int n : {2, 3, 4}) {
    std::vector<testing::WorkerResult> results =
        testing::RunWorkers(n, "batch_p2p", absl::Seconds(120));
    for (const testing::WorkerResult& w : results) {
      EXPECT_EQ(w.exit_code, 0) << "world size " << n << ":\n"
                                << testing::Describe(results);
    }
  }
}

}  // namespace
}  // namespace comm
}  // namespace mcc
