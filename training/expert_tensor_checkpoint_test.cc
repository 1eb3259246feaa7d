// Expert weights split over expert model (EP) and expert tensor (ETP)
// parallelism are saved as the full [E, ...] tensors, SwiGLU's fc1 with its
// gate and up blocks stacked, so a checkpoint written at any EP x ETP reads
// back whole and loads at any other. The slices here are written from
// models/moe's definition (fc1 [E, 2f, h]: rows [q f/ETP, (q+1) f/ETP) of
// each block of f rows; fc2 [E, h, f]: those columns), independently of
// MoeMlp.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "gtest/gtest.h"
#include "training/checkpointing.h"

namespace mcc {
namespace training {
namespace {

constexpr int64_t kExperts = 4, kFfn = 4, kHidden = 3;

std::string Dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

// A weight whose every element is distinct: value = flat index + 1.
std::vector<float> Full(const Shape& shape) {
  std::vector<float> v(NumElements(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
  return v;
}

// The local piece of one expert weight at EP rank `e` of `ep`, ETP rank `q`
// of `etp`: fc1 [E, blocks f, h] or fc2 [E, h, f].
std::shared_ptr<Parameter> Piece(bool fc1, int blocks, int e, int ep, int q,
                                 int etp, const std::vector<float>& full) {
  const Shape global = fc1 ? Shape{kExperts, blocks * kFfn, kHidden}
                           : Shape{kExperts, kHidden, kFfn};
  const int64_t el = kExperts / ep, fl = kFfn / etp;
  const Shape local =
      fc1 ? Shape{el, blocks * fl, kHidden} : Shape{el, kHidden, fl};
  std::vector<float> v;
  for (int64_t x = e * el; x < (e + 1) * el; ++x) {
    for (int64_t r = 0; r < local[1]; ++r) {
      for (int64_t c = 0; c < local[2]; ++c) {
        const int64_t gr = fc1 ? (r / fl) * kFfn + q * fl + r % fl : r;
        const int64_t gc = fc1 ? c : q * fl + c;
        v.push_back(full[(x * global[1] + gr) * global[2] + gc]);
      }
    }
  }
  auto p = std::make_shared<Parameter>();
  p->name = fc1 ? "experts.linear_fc1.weight" : "experts.linear_fc2.weight";
  p->value = *Tensor::FromVector(v, local);
  p->global_shape = global;
  if (ep > 1) {
    p->partition_dim = 0;
    p->partition_rank = e;
    p->partition_count = ep;
  }
  p->expert_parallel = true;
  p->expert_tensor_dim = fc1 ? 1 : 2;
  p->expert_tensor_rank = q;
  p->expert_tensor_count = etp;
  p->expert_tensor_blocks = fc1 ? blocks : 1;
  return p;
}

struct Layout {
  int ep, etp;
};

const Layout kLayouts[] = {{1, 1}, {2, 1}, {4, 1}, {1, 2},
                           {2, 2}, {1, 4}, {4, 4}, {2, 4}};

class ExpertTensorCheckpointTest
    : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(ExpertTensorCheckpointTest, SavedWholeAndLoadedAtAnyLayout) {
  const auto [fc1, blocks] = GetParam();
  const Shape global = fc1 ? Shape{kExperts, blocks * kFfn, kHidden}
                           : Shape{kExperts, kHidden, kFfn};
  const std::vector<float> full = Full(global);
  for (const Layout& save : kLayouts) {
    // Every rank's boxes in one list: one process writes them all.
    std::vector<ShardedTensorRef> refs;
    std::vector<std::shared_ptr<Parameter>> held;
    for (int e = 0; e < save.ep; ++e) {
      for (int q = 0; q < save.etp; ++q) {
        held.push_back(Piece(fc1, blocks, e, save.ep, q, save.etp, full));
        auto mine =
            ParameterRefs(held.back()->name, *held.back(), held.back()->value);
        ASSERT_TRUE(mine.ok()) << mine.status();
        // SwiGLU's fc1 under ETP: one box per local expert and block.
        const size_t boxes = fc1 && blocks > 1 && save.etp > 1
                                 ? (kExperts / save.ep) * blocks
                                 : 1;
        EXPECT_EQ(mine->size(), boxes);
        refs.insert(refs.end(), mine->begin(), mine->end());
      }
    }
    const std::string dir =
        Dir(absl::StrCat("experts_", fc1, blocks, "_", save.ep, save.etp));
    ASSERT_TRUE(SaveCheckpoint(dir, 1, refs, checkpoint::CommonState(), {},
                               DistContext::Single())
                    .ok());
    auto reader = *CheckpointReader::Open(dir);
    auto whole = reader->ReadTensor(held[0]->name);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ASSERT_EQ(whole->shape(), global);
    EXPECT_EQ(whole->ToFloats(), full)
        << "saved at EP " << save.ep << " ETP " << save.etp;
    for (const Layout& load : kLayouts) {
      for (int e = 0; e < load.ep; ++e) {
        for (int q = 0; q < load.etp; ++q) {
          auto want = Piece(fc1, blocks, e, load.ep, q, load.etp, full);
          auto got = Piece(fc1, blocks, e, load.ep, q, load.etp, full);
          got->value.Zero();
          ASSERT_TRUE(LoadParameters(*reader, {got}).ok());
          EXPECT_EQ(got->value.ToFloats(), want->value.ToFloats())
              << "saved at EP " << save.ep << " ETP " << save.etp
              << ", loaded at EP rank " << e << " of " << load.ep
              << ", ETP rank " << q << " of " << load.etp;
        }
      }
    }
  }
}

// fc1 SwiGLU (2 blocks), fc1 GELU (1 block), fc2.
INSTANTIATE_TEST_SUITE_P(Weights, ExpertTensorCheckpointTest,
                         ::testing::Values(std::make_tuple(true, 2),
                                           std::make_tuple(true, 1),
                                           std::make_tuple(false, 1)));

TEST(ExpertTensorRefsTest, SliceThatDoesNotFitIsRefusedByName) {
  auto p = Piece(true, 2, 0, 1, 0, 2, Full({kExperts, 2 * kFfn, kHidden}));
  p->expert_tensor_count = 3;  // 8 rows do not split into 2 x 3 pieces.
  auto refs = ParameterRefs(p->name, *p, p->value);
  ASSERT_FALSE(refs.ok());
  EXPECT_NE(refs.status().message().find("experts.linear_fc1.weight"),
            std::string::npos)
      << refs.status();
}

}  // namespace
}  // namespace training
}  // namespace mcc
