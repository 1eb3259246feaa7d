#include "core/ops/index_check.h"

#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;

TEST(CheckIndexRangeTest, NamesTheFirstIdOutsideOnEveryDevice) {
  for (DType dtype : {DType::kInt32, DType::kInt64}) {
    Tensor good = *Tensor::FromInts({0, 9, -100, 3}, {2, 2}, dtype);
    Tensor bad = *Tensor::FromInts({0, 9, 10, -1}, {4}, dtype);
    ExpectSameOnTestDevice({good}, [](std::vector<Tensor>& t) {
      return CheckIndexRange(t[0], 10, -100, "target");
    });
    ExpectSameOnTestDevice({bad}, [](std::vector<Tensor>& t) {
      return CheckIndexRange(t[0], 10, -100, "target");
    });
    EXPECT_TRUE(CheckIndexRange(good, 10, -100, "target").ok());
    const absl::Status s = CheckIndexRange(bad, 10, -100, "target");
    EXPECT_EQ(s.message(),
              "target 10 at token 2 is outside the vocabulary of 10");
    // -100 is an id like any other when it is not the ignore index.
    EXPECT_FALSE(CheckIndexRange(good, 10, -1, "id").ok());
  }
}

TEST(CheckIndexRangeTest, RefusesFloatIds) {
  Tensor f = Tensor::Zeros({3}, DType::kFloat32);
  EXPECT_EQ(CheckIndexRange(f, 10, -100, "id").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ops
}  // namespace mcc
