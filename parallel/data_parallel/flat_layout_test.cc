#include "parallel/data_parallel/flat_layout.h"

#include <memory>

#include "gtest/gtest.h"

namespace mcc {
namespace data_parallel {
namespace {

std::shared_ptr<Parameter> Param(const std::string& name, Shape shape) {
  auto p = std::make_shared<Parameter>();
  p->name = name;
  p->value = Tensor::Zeros(shape, DType::kFloat32);
  p->global_shape = shape;
  return p;
}

TEST(FlatLayoutTest, AlignedOffsetsEqualShardsAndPiecesCoverEveryElement) {
  ParameterList params = {Param("a", {3, 7}), Param("b", {5}),
                          Param("c", {40})};
  for (int dp : {1, 2, 3, 4}) {
    auto layout = FlatLayout::Create(params, dp, "test");
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
    // A replica's pieces: every parameter whole, at its buffer offset.
    const std::vector<FlatPiece> whole = layout->WholePieces();
    ASSERT_EQ(whole.size(), params.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(whole[i].param, static_cast<int>(i));
      EXPECT_EQ(whole[i].begin, 0);
      EXPECT_EQ(whole[i].end, params[i]->value.numel());
      EXPECT_EQ(whole[i].shard_offset, layout->offsets[i]);
    }
  }
}

TEST(FlatLayoutTest, AppendMatchesCreate) {
  int64_t used = 0;
  for (int64_t n : {21, 5, 40}) used = FlatLayout::Append(used, n);
  EXPECT_EQ(used, 96);
  EXPECT_EQ(FlatLayout::Append(0, 16), 16);
  EXPECT_EQ(FlatLayout::Append(0, 17), 32);
}

TEST(FlatLayoutTest, RejectsMissingValues) {
  auto p = std::make_shared<Parameter>();
  p->name = "empty";
  EXPECT_FALSE(FlatLayout::Create({p}, 2, "test").ok());
  EXPECT_FALSE(FlatLayout::Create({Param("a", {4})}, 0, "test").ok());
}

}  // namespace
}  // namespace data_parallel
}  // namespace mcc
