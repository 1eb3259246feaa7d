// Every collective at several world sizes, every dtype, odd element counts,
// checked against a float64 reference computed from the same inputs.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/comm/all_reduce_coalesced.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                         DType::kInt32, DType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                         ReduceOp::kMin};

double RoundTo(DType dt, double x);

// Element i of rank `rank`'s deterministic input (Input below); floats are
// not integers so 16-bit rounding matters.
double InputAt(DType dt, int64_t i, int rank, int salt) {
  const int64_t k = ((i * 7 + rank * 13 + salt * 5) % 17) - 8;
  if (!IsFloatingPoint(dt)) return static_cast<double>(k * 1000003);
  return RoundTo(dt, static_cast<float>(k) * 0.37f);
}

Tensor Input(DType dt, const Shape& shape, int rank, int salt) {
  const int64_t n = NumElements(shape);
  if (IsFloatingPoint(dt)) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(InputAt(dt, i, rank, salt));
    }
    return Tensor::FromVector(v, shape, dt).value();
  }
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = static_cast<int64_t>(InputAt(dt, i, rank, salt));
  }
  return Tensor::FromInts(v, shape, dt).value();
}

// x rounded to dtype, as a double.
double RoundTo(DType dt, double x) {
  switch (dt) {
    case DType::kFloat32:
      return static_cast<float>(x);
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(x)));
    case DType::kFloat16:
      return Float16ToFloat(FloatToFloat16(static_cast<float>(x)));
    default:
      return x;
  }
}

std::vector<double> ReduceRef(DType dt, const Shape& shape, int world, int salt,
                              ReduceOp op) {
  const int64_t n = NumElements(shape);
  std::vector<std::vector<double>> inputs;
  for (int q = 0; q < world; ++q) {
    inputs.push_back(Input(dt, shape, q, salt).ToDoubles());
  }
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int q = 0; q < world; ++q) {
      const double v = inputs[q][i];
      if (q == 0) {
        acc = v;
      } else if (op == ReduceOp::kMax) {
        acc = std::max(acc, v);
      } else if (op == ReduceOp::kMin) {
        acc = std::min(acc, v);
      } else {
        acc += v;
      }
    }
    if (op == ReduceOp::kAvg) {
      acc = IsFloatingPoint(dt) ? acc / world : std::trunc(acc / world);
    }
    out[i] = RoundTo(dt, acc);
  }
  return out;
}

// Compares got with want: exact for integers and for 16-bit sum/max/min
// (the fp32 sums of these inputs are exact, so one rounding gives exactly
// want); relative tolerances for fp32 sums and averages.
int Compare(const std::string& what, const Tensor& got,
            const std::vector<double>& want, bool exact_16bit = true) {
  std::vector<double> g = got.ToDoubles();
  if (g.size() != want.size()) {
    fprintf(stderr, "%s: %zu elements, want %zu\n", what.c_str(), g.size(),
            want.size());
    return 1;
  }
  double tol = 0;
  switch (got.dtype()) {
    case DType::kFloat32:
      tol = 1e-5;
      break;
    case DType::kBFloat16:
      tol = exact_16bit ? 0 : 1.0 / 128;
      break;
    case DType::kFloat16:
      tol = exact_16bit ? 0 : 1.0 / 1024;
      break;
    default:
      tol = 0;
  }
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - want[i]) > tol * (1 + std::abs(want[i]))) {
      fprintf(stderr, "%s: element %zu is %.9g, want %.9g\n", what.c_str(), i,
              g[i], want[i]);
      return 1;
    }
  }
  return 0;
}

int Fail(const std::string& what, const absl::Status& s) {
  fprintf(stderr, "%s failed: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

MCC_WORKER(collectives) {
  GroupOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<World> world = InitWorldFromEnvironment(options);
  if (!world.ok()) return Fail("init", world.status());
  ProcessGroup& pg = *world->group;
  const int n = pg.size();
  const int r = pg.rank();
  int failures = 0;
  int salt = 0;
  for (DType dt : kDTypes) {
    const std::string d(DTypeName(dt));
    // All-reduce, every op, two odd shapes.
    for (const Shape& shape : {Shape{7}, Shape{3, 5}}) {
      for (ReduceOp op : kOps) {
        ++salt;
        const std::string what = absl::StrCat(
            "AllReduce ", d, " ", ReduceOpName(op), " ", ShapeToString(shape));
        Tensor t = Input(dt, shape, r, salt);
        absl::Status s = pg.AllReduceSync(&t, op);
        if (!s.ok()) return Fail(what, s);
        failures += Compare(what, t, ReduceRef(dt, shape, n, salt, op),
                            op != ReduceOp::kAvg);
      }
    }
    // All-gather: out = n x in along dim 0.
    {
      ++salt;
      Tensor in = Input(dt, {3, 2}, r, salt);
      Tensor out = Tensor::Empty({3 * n, 2}, dt);
      absl::Status s = pg.AllGatherSync(in, &out);
      if (!s.ok()) return Fail("AllGather " + d, s);
      std::vector<double> want;
      for (int q = 0; q < n; ++q) {
        for (double v : Input(dt, {3, 2}, q, salt).ToDoubles()) {
          want.push_back(v);
        }
      }
      failures += Compare("AllGather " + d, out, want);
    }
    // Uneven all-gather: rank q gives q % 3 rows of 3 (rank 0 gives none).
    {
      ++salt;
      std::vector<int64_t> rows;
      int64_t total = 0;
      for (int q = 0; q < n; ++q) {
        rows.push_back(q % 3);
        total += q % 3;
      }
      Tensor in = Input(dt, {r % 3, 3}, r, salt);
      Tensor out = Tensor::Empty({total, 3}, dt);
      absl::Status s = pg.AllGatherVSync(in, &out, rows);
      if (!s.ok()) return Fail("AllGatherV " + d, s);
      std::vector<double> want;
      for (int q = 0; q < n; ++q) {
        for (double v : Input(dt, {q % 3, 3}, q, salt).ToDoubles()) {
          want.push_back(v);
        }
      }
      failures += Compare("AllGatherV " + d, out, want);
    }
    // Reduce-scatter: out is block r of the reduction of n x 5 elements.
    for (ReduceOp op : kOps) {
      ++salt;
      const std::string what =
          absl::StrCat("ReduceScatter ", d, " ", ReduceOpName(op));
      Tensor in = Input(dt, {5 * n}, r, salt);
      Tensor out = Tensor::Empty({5}, dt);
      absl::Status s = pg.ReduceScatterSync(in, &out, op);
      if (!s.ok()) return Fail(what, s);
      std::vector<double> full = ReduceRef(dt, {5 * n}, n, salt, op);
      std::vector<double> want(full.begin() + 5 * r, full.begin() + 5 * r + 5);
      failures += Compare(what, out, want, op != ReduceOp::kAvg);
    }
    // A block the ring sends in several pieces (4 MiB each) and a partial
    // one: 2.5 pieces of fp32 (or of int64, whose pieces hold half as many).
    // The reference is built for this rank's block alone: every rank's
    // whole input in float64 took gigabytes at 8 ranks.
    if (dt == DType::kFloat32 || dt == DType::kInt64) {
      ++salt;
      const int64_t block = (int64_t{5} << 20) / 2 + 3;
      const std::string what =
          absl::StrCat("ReduceScatter ", d, " of ", block, " elements a rank");
      Tensor in = Input(dt, {block * n}, r, salt);
      Tensor out = Tensor::Empty({block}, dt);
      absl::Status s = pg.ReduceScatterSync(in, &out, ReduceOp::kSum);
      if (!s.ok()) return Fail(what, s);
      std::vector<double> want(block);
      for (int64_t i = 0; i < block; ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += InputAt(dt, block * r + i, q, salt);
        want[i] = RoundTo(dt, sum);
      }
      failures += Compare(what, out, want);
    }
    // In place, as the distributed optimizer calls it: the output is this
    // rank's own block of the input, whose other blocks are only read.
    {
      ++salt;
      const std::string what = absl::StrCat("ReduceScatter ", d, " in place");
      Tensor in = Input(dt, {7 * n}, r, salt);
      Tensor out = in.Slice(7 * r, 7 * (r + 1)).value();
      absl::Status s = pg.ReduceScatterSync(in, &out, ReduceOp::kSum);
      if (!s.ok()) return Fail(what, s);
      std::vector<double> want = Input(dt, {7 * n}, r, salt).ToDoubles();
      const std::vector<double> full =
          ReduceRef(dt, {7 * n}, n, salt, ReduceOp::kSum);
      std::copy(full.begin() + 7 * r, full.begin() + 7 * (r + 1),
                want.begin() + 7 * r);
      failures += Compare(what, in, want);
    }
    // Broadcast from the first and the last rank.
    for (int root : {0, n - 1}) {
      ++salt;
      Tensor t = Input(dt, {9}, r, salt);
      absl::Status s = pg.BroadcastSync(&t, root);
      if (!s.ok()) return Fail("Broadcast " + d, s);
      failures += Compare(absl::StrCat("Broadcast ", d, " root ", root), t,
                          Input(dt, {9}, root, salt).ToDoubles());
    }
    // All-to-all: block j of rank i's input lands in block i of rank j's.
    {
      ++salt;
      Tensor in = Input(dt, {3 * n}, r, salt);
      Tensor out = Tensor::Empty({3 * n}, dt);
      absl::Status s = pg.AllToAllSync(in, &out);
      if (!s.ok()) return Fail("AllToAll " + d, s);
      std::vector<double> want;
      for (int q = 0; q < n; ++q) {
        std::vector<double> theirs = Input(dt, {3 * n}, q, salt).ToDoubles();
        want.insert(want.end(), theirs.begin() + 3 * r,
                    theirs.begin() + 3 * r + 3);
      }
      failures += Compare("AllToAll " + d, out, want);
    }
    // Tagged send/receive around the ring; two tags received out of order.
    if (n > 1) {
      ++salt;
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      Tensor a = Input(dt, {11}, r, salt);
      Tensor b = Input(dt, {4}, r, salt + 1000);
      auto send_a = pg.Send(a, right, /*tag=*/1);
      auto send_b = pg.Send(b, right, /*tag=*/2);
      Tensor got_b = Tensor::Empty({4}, dt);
      Tensor got_a = Tensor::Empty({11}, dt);
      absl::Status s = pg.RecvSync(&got_b, left, /*tag=*/2);
      if (s.ok()) s = pg.RecvSync(&got_a, left, /*tag=*/1);
      if (s.ok()) s = send_a->Wait();
      if (s.ok()) s = send_b->Wait();
      if (!s.ok()) return Fail("Send/Recv " + d, s);
      failures += Compare("Recv tag 1 " + d, got_a,
                          Input(dt, {11}, left, salt).ToDoubles());
      failures += Compare("Recv tag 2 " + d, got_b,
                          Input(dt, {4}, left, salt + 1000).ToDoubles());
    }
  }
  // Several asynchronous all-reduces in flight, waited for in reverse.
  {
    std::vector<Tensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {
      ts.push_back(Input(DType::kFloat32, {13}, r, 500 + k));
    }
    for (int k = 0; k < 4; ++k) {
      works.push_back(pg.AllReduce(&ts[k], ReduceOp::kSum));
    }
    for (int k = 3; k >= 0; --k) {
      absl::Status s = works[k]->Wait(absl::Seconds(30));
      if (!s.ok()) return Fail("async AllReduce", s);
      if (!works[k]->IsCompleted()) return Fail("IsCompleted", s);
      failures +=
          Compare(absl::StrCat("async AllReduce ", k), ts[k],
                  ReduceRef(DType::kFloat32, {13}, n, 500 + k, ReduceOp::kSum));
    }
  }
  // Coalesced: three tensors of odd shapes in one collective, each reduced
  // as by itself; mixed dtypes are refused, naming the tensor.
  {
    const std::vector<Shape> shapes = {{7}, {3, 5}, {1}};
    std::vector<Tensor> ts;
    for (size_t k = 0; k < shapes.size(); ++k) {
      ts.push_back(Input(DType::kFloat32, shapes[k], r, 600 + k));
    }
    std::vector<Tensor*> ptrs = {&ts[0], &ts[1], &ts[2]};
    absl::Status s = AllReduceCoalescedSync(&pg, ptrs, ReduceOp::kSum);
    if (!s.ok()) return Fail("AllReduceCoalesced", s);
    for (size_t k = 0; k < shapes.size(); ++k) {
      failures += Compare(
          absl::StrCat("AllReduceCoalesced ", k), ts[k],
          ReduceRef(DType::kFloat32, shapes[k], n, 600 + k, ReduceOp::kSum));
    }
    Tensor half = Input(DType::kBFloat16, {2}, r, 700);
    s = AllReduceCoalescedSync(&pg, {&ts[0], &half}, ReduceOp::kSum);
    if (s.ok() || s.message().find("tensor 1 is bf16") == std::string::npos) {
      fprintf(stderr, "AllReduceCoalesced of mixed dtypes: %s\n",
              s.ToString().c_str());
      ++failures;
    }
  }
  absl::Status s = pg.BarrierSync();
  if (!s.ok()) return Fail("Barrier", s);
  printf("rank %d: %d checks failed\n", r, failures);
  return failures == 0 ? 0 : 1;
}

std::vector<int> WorldSizes() {
  std::vector<int> sizes;
  const char* env = std::getenv("MCC_TEST_WORLD_SIZES");
  for (absl::string_view p :
       absl::StrSplit(env != nullptr ? env : "1,2,3,4", ',')) {
    int v = 0;
    if (absl::SimpleAtoi(p, &v)) sizes.push_back(v);
  }
  return sizes;
}

TEST(CollectivesTest, EveryCollectiveEveryDtype) {
  for (int n : WorldSizes()) {
    std::vector<testing::WorkerResult> results =
        testing::RunWorkers(n, "collectives", absl::Seconds(90));
    for (const testing::WorkerResult& w : results) {
      EXPECT_EQ(w.exit_code, 0) << "world size " << n << ":\n"
                                << testing::Describe(results);
    }
  }
}

}  // namespace
}  // namespace comm
}  // namespace mcc
