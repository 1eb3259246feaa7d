#include "parallel/fsdp/unit_layout.h"

#include <memory>

#include "gtest/gtest.h"

namespace mcc {
namespace fsdp {
namespace {

std::shared_ptr<Parameter> Param(const std::string& name, Shape shape) {
  auto p = std::make_shared<Parameter>();
  p->name = name;
  p->value = Tensor::Zeros(shape, DType::kFloat32);
  p->global_shape = shape;
  return p;
}

TEST(UnitLayoutTest, AlignedOffsetsEqualShardsAndPiecesCoverEveryElement) {
  ParameterList params = {Param("a", {3, 7}), Param("b", {5}),
                          Param("c", {40})};
  for (int dp : {1, 2, 3, 4}) {
    auto layout = UnitLayout::Create(params, dp);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->offsets, (std::vector<int64_t>{0, 32, 48}));
    EXPECT_EQ(layout->numel, 96);
    EXPECT_EQ(layout->padded_numel % (16 * dp), 0);
    EXPECT_GE(layout->padded_numel, layout->numel);
    // Every element of every parameter is in exactly one rank's piece, and
    // the ranks' pieces of one parameter follow each other in rank order.
    std::vector<int64_t> next(params.size(), 0);
    for (int r = 0; r < dp; ++r) {
      for (const auto& piece : layout->Pieces(r)) {
        EXPECT_EQ(piece.begin, next[piece.param]);
        next[piece.param] = piece.end;
        EXPECT_EQ(r * layout->shard_numel() + piece.shard_offset,
                  layout->offsets[piece.param] + piece.begin);
        EXPECT_LE(piece.shard_offset + piece.end - piece.begin,
                  layout->shard_numel());
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(next[i], params[i]->value.numel());
    }
  }
}

TEST(UnitLayoutTest, RejectsMissingValues) {
  auto p = std::make_shared<Parameter>();
  p->name = "empty";
  EXPECT_FALSE(UnitLayout::Create({p}, 2).ok());
  EXPECT_FALSE(UnitLayout::Create({Param("a", {4})}, 0).ok());
}

}  // namespace
}  // namespace fsdp
}  // namespace mcc
