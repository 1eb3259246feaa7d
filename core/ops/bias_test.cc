#include "core/ops/bias.h"

#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

std::vector<double> RefBiasAdd(const std::vector<double>& x,
                               const std::vector<double>& b) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] + b[i % b.size()];
  return y;
}

TEST(BiasTest, ForwardMatchesReferenceAllDTypes) {
  for (const Shape& shape :
       {Shape{1, 1}, Shape{7, 33}, Shape{3, 5, 129}, Shape{300, 1030}}) {
    for (DType xd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (DType bd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        for (DType yd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          Tensor x = RandomTensor(shape, xd, 1);
          Tensor b = RandomTensor({shape.back()}, bd, 2);
          Tensor y = Tensor::Zeros(shape, yd);
          ASSERT_TRUE(BiasAdd(x, b, &y).ok());
          // fp32: exact up to one fp32 rounding; bf16 output: one bf16
          // rounding, at most 2^-8 relative (unit roundoff of 8 significant
          // bits); fp16 output: 2^-11 (11 significant bits).
          const double rtol = yd == DType::kFloat32    ? 1e-7
                              : yd == DType::kBFloat16 ? 1.0 / 256
                                                       : 1.0 / 2048;
          testing::ExpectAllNear(y.ToDoubles(),
                                 RefBiasAdd(x.ToDoubles(), b.ToDoubles()),
                                 1e-30, rtol, y.Describe());
        }
      }
    }
  }
}

TEST(BiasTest, InPlace) {
  Tensor x = RandomTensor({5, 17}, DType::kFloat32, 3);
  Tensor b = RandomTensor({17}, DType::kFloat32, 4);
  const auto want = RefBiasAdd(x.ToDoubles(), b.ToDoubles());
  ASSERT_TRUE(BiasAdd(x, b, &x).ok());
  testing::ExpectAllNear(x.ToDoubles(), want, 0, 1e-7, "in place");
}

TEST(BiasTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  for (DType dd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Shape shape{9, 33};
    Tensor x = RandomTensor(shape, DType::kFloat32, 5);
    Tensor dy = RandomTensor(shape, dd, 6);
    Tensor db = RandomTensor({33}, DType::kFloat32, 7);  // Accumulated into.
    const std::vector<double> db0 = db.ToDoubles(), dyv = dy.ToDoubles(),
                              xv = x.ToDoubles();
    ASSERT_TRUE(BiasAddBackward(dy, &db).ok());
    // L(b) = sum dy * (x + b), in float64.
    auto loss = [&](const std::vector<double>& b) {
      return testing::Dot(dyv, RefBiasAdd(xv, b));
    };
    std::vector<double> want =
        testing::NumericGrad(loss, std::vector<double>(33, 0.1));
    for (size_t i = 0; i < want.size(); ++i) want[i] += db0[i];
    testing::ExpectAllNear(db.ToDoubles(), want, 1e-6, 1e-6, "dbias");
  }
}

TEST(BiasTest, BackwardIsIndependentOfThreadCount) {
  Tensor dy = RandomTensor({1000, 67}, DType::kFloat32, 8);
  Tensor a = Tensor::Zeros({67}, DType::kFloat32);
  Tensor b = Tensor::Zeros({67}, DType::kFloat32);
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  ASSERT_TRUE(BiasAddBackward(dy, &a).ok());
  ThreadPool::SetGlobalThreads(std::max(2, threads));
  ASSERT_TRUE(BiasAddBackward(dy, &b).ok());
  ThreadPool::SetGlobalThreads(threads);
  EXPECT_EQ(Bytes(a), Bytes(b));
}

TEST(BiasTest, BadInputsNameShapesAndLeaveOutputUntouched) {
  Tensor x = RandomTensor({4, 8}, DType::kFloat32, 1);
  Tensor b = RandomTensor({7}, DType::kFloat32, 2);
  Tensor y = RandomTensor({4, 8}, DType::kFloat32, 3);
  const auto before = Bytes(y);
  absl::Status s = BiasAdd(x, b, &y);
  EXPECT_NE(s.message().find("x fp32[4, 8] and bias fp32[7]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y), before);
  Tensor b8 = RandomTensor({8}, DType::kFloat32, 4);
  Tensor y_bad = RandomTensor({4, 9}, DType::kBFloat16, 5);
  const auto before_bad = Bytes(y_bad);
  s = BiasAdd(x, b8, &y_bad);
  EXPECT_NE(s.message().find("x fp32[4, 8] and y bf16[4, 9]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y_bad), before_bad);
  Tensor db16 = Tensor::Zeros({8}, DType::kBFloat16);
  s = BiasAddBackward(x, &db16);
  EXPECT_NE(s.message().find("dbias bf16[8] must be fp32"), std::string::npos)
      << s;
  Tensor cx = testing::FakeCudaTensor({4, 8}, DType::kFloat32);
  Tensor cb = testing::FakeCudaTensor({8}, DType::kFloat32);
  s = BiasAdd(cx, cb, &cx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("BiasAdd"), std::string::npos) << s;
}

TEST(BiasTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = RandomTensor({7, 33}, dt, 1);
    Tensor bias = RandomTensor({33}, dt, 2);
    Tensor y = Tensor::Zeros({7, 33}, dt);
    Tensor dbias = RandomTensor({33}, DType::kFloat32, 3);
    testing::ExpectSameOnTestDevice({x, bias, y}, [](std::vector<Tensor>& t) {
      return BiasAdd(t[0], t[1], &t[2]);
    });
    testing::ExpectSameOnTestDevice({x, bias}, [](std::vector<Tensor>& t) {
      return BiasAdd(t[0], t[1], &t[0]);  // In place.
    });
    testing::ExpectSameOnTestDevice({x, dbias}, [](std::vector<Tensor>& t) {
      return BiasAddBackward(t[0], &t[1]);
    });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
