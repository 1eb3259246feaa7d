// Save under one layout, load under another: tensors split along dimension
// 0 or 1 into 1, 2 or 4 pieces (with data-parallel replicas and replicated
// tensors), read back with other splits, uneven ones and random boxes.
#include <random>
#include <thread>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/in_process_group.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;
using testing_util::SliceDim;

// Splits n into `pieces` nearly equal parts; returns (begin, length) pairs.
std::vector<std::pair<int64_t, int64_t>> Split(int64_t n, int pieces) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int i = 0; i < pieces; ++i) {
    const int64_t len = n / pieces + (i < n % pieces ? 1 : 0);
    out.push_back({begin, len});
    begin += len;
  }
  return out;
}

struct Layout {
  int dim;
  int pieces;
};

// The model: a 2-d fp32 weight, a 3-d bf16 weight and a replicated fp32
// vector (a layer norm's, the same on every rank).
struct Model {
  Tensor w2 = RandomTensor({12, 20}, DType::kFloat32, 1);
  Tensor w3 = RandomTensor({8, 12, 6}, DType::kBFloat16, 2);
  Tensor ln = RandomTensor({20}, DType::kFloat32, 3);
};

std::vector<ShardedTensorRef> RefsFor(const Model& m, Layout layout,
                                      int piece) {
  std::vector<ShardedTensorRef> refs;
  for (const auto& [name, full] : std::vector<std::pair<std::string, Tensor>>{
           {"w2", m.w2}, {"w3", m.w3}}) {
    // A dimension the tensor lacks splits dimension 0 instead.
    const int dim = layout.dim < full.dim() ? layout.dim : 0;
    const auto [begin, len] = Split(full.size(dim), layout.pieces)[piece];
    ShardedTensorRef ref;
    ref.name = name;
    ref.global_shape = full.shape();
    ref.global_offsets.assign(full.dim(), 0);
    ref.global_offsets[dim] = begin;
    ref.local = SliceDim(full, dim, begin, len);
    refs.push_back(ref);
  }
  refs.push_back(ShardedTensorRef::Replicated("ln", m.ln));
  return refs;
}

// Saves with layout.pieces model-parallel pieces times `dp` replicas.
void SaveWithLayout(const std::string& dir, const Model& m, Layout layout,
                    int dp) {
  const int world = layout.pieces * dp;
  InProcessGroup group(world);
  std::vector<absl::Status> status(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      status[rank] =
          SaveCheckpoint(dir, 5, RefsFor(m, layout, rank % layout.pieces), {},
                         {}, group.Context(rank));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
}

class ReshardTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {
};

TEST_P(ReshardTest, LoadsUnderEveryOtherLayout) {
  const auto [save_dim, save_pieces, dp] = GetParam();
  const std::string dir =
      FreshDir(absl::StrCat("reshard_", save_dim, "_", save_pieces, "_", dp));
  Model m;
  SaveWithLayout(dir, m, {save_dim, save_pieces}, dp);
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Written once each, whatever the replication.
  for (const auto& t : (*reader)->metadata().tensors()) {
    EXPECT_EQ(t.shards_size(), t.name() == "ln" ? 1 : save_pieces) << t.name();
  }

  for (int load_dim : {0, 1, 2}) {
    for (int load_pieces : {1, 2, 3, 4}) {
      Layout load{load_dim, load_pieces};
      for (int piece = 0; piece < load_pieces; ++piece) {
        std::vector<ShardedTensorRef> want = RefsFor(m, load, piece);
        std::vector<ShardedTensorRef> got = want;
        for (auto& ref : got) {
          ref.local =
              Tensor::Full(ref.local.shape(), 12345.0, ref.local.dtype());
        }
        ASSERT_TRUE((*reader)->Load(got).ok());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].local.ToDoubles(), want[i].local.ToDoubles())
              << got[i].name << " saved dim " << save_dim << " x" << save_pieces
              << ", loaded dim " << load_dim << " piece " << piece << "/"
              << load_pieces;
        }
      }
    }
  }

  // Random boxes of the 3-d tensor, read as fp32 (converted from bf16).
  std::mt19937 rng(save_dim * 100 + save_pieces * 10 + dp);
  const std::vector<double> full = m.w3.ToDoubles();
  for (int trial = 0; trial < 100; ++trial) {
    Shape offsets(3), shape(3);
    for (int d = 0; d < 3; ++d) {
      const int64_t n = m.w3.size(d);
      offsets[d] = rng() % n;
      shape[d] = 1 + rng() % (n - offsets[d]);
    }
    Tensor out = Tensor::Zeros(shape, DType::kFloat32);
    ASSERT_TRUE((*reader)->ReadRegion("w3", offsets, &out).ok());
    const std::vector<double> got = out.ToDoubles();
    size_t k = 0;
    for (int64_t i = 0; i < shape[0]; ++i) {
      for (int64_t j = 0; j < shape[1]; ++j) {
        for (int64_t l = 0; l < shape[2]; ++l, ++k) {
          const int64_t g =
              ((offsets[0] + i) * 12 + offsets[1] + j) * 6 + offsets[2] + l;
          ASSERT_EQ(got[k], full[g]) << "box offsets " << ShapeToString(offsets)
                                     << " shape " << ShapeToString(shape);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SaveLayouts, ReshardTest,
    ::testing::Combine(::testing::Values(0, 1),     // split dimension
                       ::testing::Values(1, 2, 4),  // pieces
                       ::testing::Values(1, 2)));   // data-parallel replicas

}  // namespace
}  // namespace mcc
