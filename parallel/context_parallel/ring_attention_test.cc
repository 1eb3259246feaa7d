// Ring attention (and the all-to-all mode, ulysses_attention.h) against the
// serial flash attention (core/ops/attention.*): alone (C = 1: the two-chunk
// split and the softmax merge) and in real processes over gloo at C = 2 and
// 4, forward and backward, with GQA and causal masking across the 2C-chunk
// layout, in fp32 and bf16. Every rank computes the serial result of the
// whole sequence and checks its chunks.
#include "parallel/context_parallel/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "parallel/context_parallel/chunk_layout.h"
#include "parallel/context_parallel/ulysses_attention.h"

namespace mcc {
namespace context_parallel {
namespace {

struct Case {
  std::string name;
  int world = 1;
  int64_t b = 2, s = 32, heads = 4, kv_heads = 4, d = 16;
  DType dtype = DType::kFloat32;
  bool a2a = false;  // Ulysses all-to-all instead of the ring.
  // Packed documents (lengths 3, 9, 1, 7, then the rest, rotated per batch
  // entry) and a sliding window of `window` keys (0: none).
  bool documents = false;
  int64_t window = 0;
};

// QkvChunks::first_key of the case's documents and window; undefined for
// plain causal attention.
Tensor FirstKeys(const Case& c) {
  if (!c.documents && c.window == 0) return Tensor();
  std::vector<int64_t> first;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    const int64_t pattern[] = {3, 9, 1, 7};
    int64_t start = 0, next = c.documents ? pattern[bi % 4] : c.s, n = 0;
    for (int64_t t = 0; t < c.s; ++t) {
      if (t == next) {
        start = t;
        next = t + (c.documents ? pattern[(bi + ++n) % 4] : c.s);
      }
      int64_t f = start;
      if (c.window > 0) f = std::max(f, t - c.window + 1);
      first.push_back(f);
    }
  }
  return Tensor::FromInts(first, {c.b, c.s}, DType::kInt32).value();
}

std::vector<Case> Cases() {
  return {
      {"cp2_fp32", 2},
      {"cp2_gqa_fp32", 2, 2, 32, 4, 2, 16},
      {"cp2_gqa_bf16", 2, 2, 32, 4, 1, 16, DType::kBFloat16},
      {"cp4_gqa_fp32", 4, 1, 32, 4, 2, 8},
      {"a2a_cp2_gqa_fp32", 2, 2, 32, 4, 2, 16, DType::kFloat32, true},
      {"a2a_cp2_bf16", 2, 2, 32, 4, 4, 16, DType::kBFloat16, true},
      {"a2a_cp4_fp32", 4, 1, 32, 8, 4, 8, DType::kFloat32, true},
      {"cp2_documents_fp32", 2, 2, 32, 4, 2, 16, DType::kFloat32, false, true},
      {"cp4_documents_window_fp32", 4, 2, 32, 4, 2, 8, DType::kFloat32, false,
       true, 6},
      {"cp4_window_bf16", 4, 1, 32, 4, 2, 8, DType::kBFloat16, false, false, 5},
      {"a2a_cp2_documents_window_fp32", 2, 2, 32, 4, 2, 16, DType::kFloat32,
       true, true, 6},
  };
}

// Error bounds. fp32: the serial kernel and the ring sum the same terms in
// other orders and merge per block, a few hundred fp32 roundings of values
// of order 1 (relative 6e-8 each). bf16: both results are rounded to bf16
// (relative 2^-8) from fp32 values that differ in the last fp32 bits, so
// they may differ by one bf16 step; gradients sum such terms over the
// sequence, so they get twice that.
double Tolerance(DType dtype, bool grad) {
  if (dtype == DType::kFloat32) return grad ? 1e-4 : 2e-5;
  return grad ? 4e-2 : 1.6e-2;
}

// Chunk g (of 2C) of a [b, s, h, d] host tensor, as doubles.
std::vector<double> ChunkOf(const Tensor& full, int g, int64_t chunk_len) {
  const std::vector<double> v = full.ToDoubles();
  const int64_t b = full.size(0), s = full.size(1);
  const int64_t row = full.size(2) * full.size(3);
  std::vector<double> out;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = g * chunk_len; t < (g + 1) * chunk_len; ++t) {
      const double* p = v.data() + (bi * s + t) * row;
      out.insert(out.end(), p, p + row);
    }
  }
  return out;
}

// The same numbers as a [b, chunk_len, h, d] tensor in `dtype`.
Tensor ChunkTensor(const Tensor& full, int g, int64_t chunk_len) {
  const std::vector<double> v = ChunkOf(full, g, chunk_len);
  std::vector<float> f(v.begin(), v.end());
  return Tensor::FromVector(
             f, {full.size(0), chunk_len, full.size(2), full.size(3)},
             full.dtype())
      .value();
}

// Worst |got - want| - tol * (1 + |want|) over elements (> 0: a miss).
double WorstExcess(const std::vector<double>& got,
                   const std::vector<double>& want, double tol) {
  double worst = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e =
        std::fabs(got[i] - want[i]) - tol * (1.0 + std::fabs(want[i]));
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return got.size() == want.size() ? worst : INFINITY;
}

// Runs ring attention for one case on `group` (null: alone) and compares
// with the serial kernel; returns "" or what went wrong.
std::string CheckCase(const Case& c, comm::ProcessGroup* group) {
  const int size = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  auto layout = ChunkLayout::Create(size, rank, c.s);
  if (!layout.ok()) return layout.status().ToString();
  const int64_t l = layout->chunk_length();
  using ops::testing::RandomTensor;
  const Tensor q = RandomTensor({c.b, c.s, c.heads, c.d}, c.dtype, 11);
  const Tensor k = RandomTensor({c.b, c.s, c.kv_heads, c.d}, c.dtype, 12);
  const Tensor v = RandomTensor({c.b, c.s, c.kv_heads, c.d}, c.dtype, 13);
  const Tensor dout = RandomTensor({c.b, c.s, c.heads, c.d}, c.dtype, 14);

  ops::AttentionOptions options;
  options.first_key = FirstKeys(c);
  Tensor out = Tensor::Empty(q.shape(), c.dtype);
  Tensor lse = Tensor::Empty({c.b, c.heads, c.s}, DType::kFloat32);
  absl::Status s = ops::FlashAttentionForward(q, k, v, options, &out, &lse);
  Tensor dq = Tensor::Empty(q.shape(), c.dtype);
  Tensor dk = Tensor::Empty(k.shape(), c.dtype);
  Tensor dv = Tensor::Empty(v.shape(), c.dtype);
  s.Update(ops::FlashAttentionBackward(q, k, v, out, dout, lse, options, &dq,
                                       &dk, &dv));
  if (!s.ok()) return s.ToString();

  QkvChunks in;
  in.first_key = options.first_key;
  ChunkPair local_dout;
  for (int a = 0; a < 2; ++a) {
    const int g = layout->GlobalChunk(a);
    in.q[a] = ChunkTensor(q, g, l);
    in.k[a] = ChunkTensor(k, g, l);
    in.v[a] = ChunkTensor(v, g, l);
    local_dout[a] = ChunkTensor(dout, g, l);
  }
  ChunkPair ring_out, ring_lse;
  QkvChunks grads;
  if (c.a2a) {
    UlyssesRecord record;
    s = UlyssesAttentionForward(group, in, 0.0f, &ring_out, &record);
    if (s.ok()) {
      s = UlyssesAttentionBackward(group, record, local_dout, 0.0f, &grads);
    }
  } else {
    s = RingAttentionForward(group, in, 0.0f, &ring_out, &ring_lse);
    if (s.ok()) {
      s = RingAttentionBackward(group, in, ring_out, local_dout, ring_lse, 0.0f,
                                &grads);
    }
  }
  if (!s.ok()) return s.ToString();
  std::string errors;
  auto expect = [&](const char* what, const Tensor& got, const Tensor& full,
                    int a, bool grad) {
    const double worst =
        WorstExcess(got.ToDoubles(), ChunkOf(full, layout->GlobalChunk(a), l),
                    Tolerance(c.dtype, grad));
    if (worst > 0) {
      absl::StrAppend(&errors, c.name, " rank ", rank, ": ", what, " chunk ", a,
                      " exceeds its bound by ", worst, "\n");
    }
  };
  for (int a = 0; a < 2; ++a) {
    expect("out", ring_out[a], out, a, false);
    expect("dq", grads.q[a], dq, a, true);
    expect("dk", grads.k[a], dk, a, true);
    expect("dv", grads.v[a], dv, a, true);
  }
  return errors;
}

const Case& FindCase(const std::string& name) {
  static const auto* cases = new std::vector<Case>(Cases());
  for (const Case& c : *cases) {
    if (c.name == name) return c;
  }
  std::fprintf(stderr, "unknown case %s\n", name.c_str());
  std::abort();
}

MCC_WORKER(ring_attention) {
  const Case& c = FindCase(std::getenv("MCC_TEST_CASE"));
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().ToString().c_str());
    return 3;
  }
  const std::string errors = CheckCase(c, world->group.get());
  if (!errors.empty()) {
    std::fprintf(stderr, "%s", errors.c_str());
    return 4;
  }
  return 0;
}

TEST(RingAttentionTest, OneRankSplitIntoTwoChunksEqualsSerial) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (bool a2a : {false, true}) {
      Case c{"alone", 1, 2, 24, 4, 2, 8, dtype, a2a};
      EXPECT_EQ(CheckCase(c, nullptr), "") << DTypeName(dtype) << a2a;
      c.documents = true;
      c.window = 5;
      EXPECT_EQ(CheckCase(c, nullptr), "") << DTypeName(dtype) << a2a;
    }
  }
}

TEST(RingAttentionTest, TestDeviceRunsTheSameBitsWithoutHostCopies) {
  // Ring and all-to-all attention reach memory only through ops: alone on
  // the test device they give the CPU's bits and copy nothing to the host.
  using ops::testing::RandomTensor;
  for (bool a2a : {false, true}) {
    std::vector<Tensor> args;
    for (uint32_t seed = 1; seed <= 8; ++seed) {  // q, k, v, dout x 2.
      args.push_back(RandomTensor({1, 4, 2, 8}, DType::kFloat32, seed));
    }
    for (int i = 0; i < 8; ++i) {  // out, dq, dk, dv x 2.
      args.push_back(Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32));
    }
    ops::testing::ExpectSameOnTestDevice(
        args,
        [a2a](std::vector<Tensor>& t) -> absl::Status {
          QkvChunks in;
          ChunkPair dout, out, lse;
          for (int a = 0; a < 2; ++a) {
            in.q[a] = t[a];
            in.k[a] = t[2 + a];
            in.v[a] = t[4 + a];
            dout[a] = t[6 + a];
          }
          QkvChunks grads;
          if (a2a) {
            UlyssesRecord record;
            MCC_RETURN_IF_ERROR(
                UlyssesAttentionForward(nullptr, in, 0.0f, &out, &record));
            MCC_RETURN_IF_ERROR(
                UlyssesAttentionBackward(nullptr, record, dout, 0.0f, &grads));
          } else {
            MCC_RETURN_IF_ERROR(
                RingAttentionForward(nullptr, in, 0.0f, &out, &lse));
            MCC_RETURN_IF_ERROR(RingAttentionBackward(nullptr, in, out, dout,
                                                      lse, 0.0f, &grads));
          }
          for (int a = 0; a < 2; ++a) {
            MCC_RETURN_IF_ERROR(ops::Convert(out[a], &t[8 + a]));
            MCC_RETURN_IF_ERROR(ops::Convert(grads.q[a], &t[10 + a]));
            MCC_RETURN_IF_ERROR(ops::Convert(grads.k[a], &t[12 + a]));
            MCC_RETURN_IF_ERROR(ops::Convert(grads.v[a], &t[14 + a]));
          }
          return absl::OkStatus();
        },
        a2a ? "a2a" : "ring");
  }
}

TEST(RingAttentionTest, CatchesAWrongMerge) {
  // The check can fail: a ring result missing the keys of the other rank's
  // chunks (here: one rank attending only to its own chunks, which is what
  // a skipped ring step would give) is off by far more than the bound.
  Case c{"own_only", 1, 1, 16, 2, 2, 8};
  auto layout = ChunkLayout::Create(2, 1, c.s).value();
  const int64_t l = layout.chunk_length();
  using ops::testing::RandomTensor;
  const Tensor q = RandomTensor({1, 16, 2, 8}, DType::kFloat32, 1);
  const Tensor k = RandomTensor({1, 16, 2, 8}, DType::kFloat32, 2);
  const Tensor v = RandomTensor({1, 16, 2, 8}, DType::kFloat32, 3);
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32);
  Tensor lse = Tensor::Empty({1, 2, 16}, DType::kFloat32);
  ASSERT_TRUE(ops::FlashAttentionForward(q, k, v, {}, &out, &lse).ok());
  QkvChunks in;
  for (int a = 0; a < 2; ++a) {
    in.q[a] = ChunkTensor(q, layout.GlobalChunk(a), l);
    in.k[a] = ChunkTensor(k, layout.GlobalChunk(a), l);
    in.v[a] = ChunkTensor(v, layout.GlobalChunk(a), l);
  }
  ChunkPair ring_out, ring_lse;
  ASSERT_TRUE(
      RingAttentionForward(nullptr, in, 0.0f, &ring_out, &ring_lse).ok());
  // Chunk 2 of 4 attends to chunks 0..2 in the serial run; alone it saw
  // chunks 1 and 2 only.
  EXPECT_GT(WorstExcess(ring_out[1].ToDoubles(),
                        ChunkOf(out, layout.GlobalChunk(1), l),
                        Tolerance(DType::kFloat32, false)),
            0.0);
}

TEST(UlyssesAttentionTest, RejectsHeadsThatDoNotDivide) {
  // Alone C = 1 divides everything; the check itself is shared, so make a
  // chunk whose shape disagrees with q instead.
  QkvChunks in;
  for (int a = 0; a < 2; ++a) {
    in.q[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
    in.k[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
    in.v[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
  }
  in.v[0] = Tensor::Zeros({1, 4, 2, 4}, DType::kFloat32);
  ChunkPair out;
  UlyssesRecord record;
  const absl::Status s =
      UlyssesAttentionForward(nullptr, in, 0.0f, &out, &record);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a2a"), std::string::npos) << s;
}

TEST(RingAttentionTest, RejectsMismatchedChunks) {
  QkvChunks in;
  for (int a = 0; a < 2; ++a) {
    in.q[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
    in.k[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
    in.v[a] = Tensor::Zeros({1, 4, 2, 8}, DType::kFloat32);
  }
  in.k[1] = Tensor::Zeros({1, 5, 2, 8}, DType::kFloat32);
  ChunkPair out, lse;
  const absl::Status s = RingAttentionForward(nullptr, in, 0.0f, &out, &lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("RingAttentionForward"), std::string::npos) << s;
}

class RingAttentionProcessTest : public ::testing::TestWithParam<Case> {};

TEST_P(RingAttentionProcessTest, EqualsSerial) {
  const Case& c = GetParam();
  auto results = comm::testing::RunWorkers(
      c.world, "ring_attention", absl::Seconds(120), [&](int) {
        return std::map<std::string, std::string>{{"MCC_TEST_CASE", c.name}};
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << "\n"
                              << comm::testing::Describe(results);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttentionProcessTest,
                         ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace context_parallel
}  // namespace mcc
