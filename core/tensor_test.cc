#include "core/tensor.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TensorTest, EmptyHasShapeAndIsAligned) {
  Tensor t = Tensor::Empty({3, 5}, DType::kFloat32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment, 0u);
  EXPECT_EQ(t.Describe(), "fp32[3, 5] on cpu");
}

TEST(TensorTest, AllocatorCountsCurrentAndPeak) {
  Allocator* cpu = GetAllocator(Device::CPU());
  const int64_t before = cpu->Stats().current_bytes;
  cpu->ResetPeak();
  {
    Tensor a = Tensor::Empty({1024}, DType::kFloat32);
    EXPECT_EQ(cpu->Stats().current_bytes, before + 4096);
    Tensor b = Tensor::Empty({256}, DType::kInt64);
    EXPECT_EQ(cpu->Stats().current_bytes, before + 4096 + 2048);
  }
  EXPECT_EQ(cpu->Stats().current_bytes, before);
  EXPECT_EQ(cpu->Stats().peak_bytes, before + 4096 + 2048);
}

TEST(TensorTest, SliceIsZeroCopyAlongFirstDimension) {
  Tensor t = *Tensor::FromVector({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor s = *t.Slice(1, 3);
  EXPECT_TRUE(s.SharesStorageWith(t));
  EXPECT_THAT(s.shape(), ElementsAre(2, 2));
  EXPECT_THAT(s.ToFloats(), ElementsAre(2, 3, 4, 5));
  s.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[2], 42);
  EXPECT_FALSE(t.Slice(2, 4).ok());
}

TEST(TensorTest, ReshapeInfersAndRejects) {
  Tensor t = Tensor::Zeros({4, 6}, DType::kFloat32);
  EXPECT_THAT(t.Reshape({2, -1, 3})->shape(), ElementsAre(2, 4, 3));
  absl::Status bad = t.Reshape({5, 5}).status();
  EXPECT_THAT(std::string(bad.message()), HasSubstr("[4, 6]"));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("[5, 5]"));
}

TEST(TensorTest, CloneIsDeep) {
  Tensor t = Tensor::Full({4}, 1.5, DType::kFloat32);
  Tensor c = t.Clone();
  c.data<float>()[0] = 0;
  EXPECT_EQ(t.data<float>()[0], 1.5f);
  EXPECT_FALSE(c.SharesStorageWith(t));
}

TEST(TensorTest, CopyFromRejectsMismatchAndWritesNothing) {
  Tensor dst = Tensor::Full({4}, 7, DType::kFloat32);
  Tensor src = Tensor::Zeros({5}, DType::kFloat32);
  absl::Status s = dst.CopyFrom(src);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("fp32[4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("fp32[5]"));
  EXPECT_THAT(dst.ToFloats(), ElementsAre(7, 7, 7, 7));
}

TEST(TensorTest, ConvertsBetweenDTypes) {
  Tensor t = *Tensor::FromVector({1.0f, -2.5f, 3.0f}, {3});
  Tensor b = *t.To(DType::kBFloat16);
  Tensor h = *t.To(DType::kFloat16);
  Tensor i = *t.To(DType::kInt32);
  EXPECT_THAT(b.ToFloats(), ElementsAre(1.0f, -2.5f, 3.0f));
  EXPECT_THAT(h.ToFloats(), ElementsAre(1.0f, -2.5f, 3.0f));
  EXPECT_THAT(i.ToDoubles(), ElementsAre(1, -2, 3));
  Tensor ids = *Tensor::FromInts({5, 1LL << 40}, {2});
  EXPECT_THAT(ids.ToDoubles(), ElementsAre(5, static_cast<double>(1LL << 40)));
}

TEST(TensorTest, FromVectorChecksCount) {
  EXPECT_FALSE(Tensor::FromVector({1, 2, 3}, {2, 2}).ok());
}

TEST(TensorTest, DTypeNamesRoundTrip) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                  DType::kInt32, DType::kInt64}) {
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
  EXPECT_FALSE(ParseDType("fp8").ok());
}

TEST(TensorDeathTest, WrongTypedAccessDies) {
  Tensor t = Tensor::Zeros({2}, DType::kInt32);
  EXPECT_DEATH(t.data<float>(), "int32\\[2\\] on cpu accessed as fp32");
}

}  // namespace
}  // namespace mcc
