#include "core/ops/sgd.h"

#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

// float64 torch.optim.SGD (dampening 0).
void RefStep(const SgdConfig& c, const std::vector<double>& g,
             std::vector<double>* p, std::vector<double>* buf) {
  for (size_t i = 0; i < p->size(); ++i) {
    double d = g[i] * c.grad_scale + c.weight_decay * (*p)[i];
    if (c.momentum != 0.0f) {
      (*buf)[i] = c.first_step ? d : c.momentum * (*buf)[i] + d;
      d = c.nesterov ? d + c.momentum * (*buf)[i] : (*buf)[i];
    }
    (*p)[i] -= c.lr * d;
  }
}

TEST(SgdTest, ThreeStepsMatchFloat64Reference) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (float momentum : {0.0f, 0.9f}) {
      for (bool nesterov : {false, true}) {
        for (int64_t n : {1, 33, 100003}) {
          Tensor p = RandomTensor({n}, DType::kFloat32, 1);
          Tensor buf = Tensor::Zeros({n}, DType::kFloat32);
          std::vector<double> rp = p.ToDoubles(), rb(n, 0.0);
          for (int step = 1; step <= 3; ++step) {
            Tensor g = RandomTensor({n}, gd, 10 + step);
            SgdConfig c;
            c.lr = 0.1f;
            c.momentum = momentum;
            c.nesterov = nesterov;
            c.weight_decay = 0.01f;
            c.grad_scale = 0.5f;
            c.first_step = step == 1;
            ASSERT_TRUE(
                SgdStep(c, g, &p, momentum != 0.0f ? &buf : nullptr).ok());
            RefStep(c, g.ToDoubles(), &rp, &rb);
          }
          testing::ExpectAllNear(p.ToDoubles(), rp, 1e-6, 1e-5, "param");
        }
      }
    }
  }
}

TEST(SgdTest, SameOnTestDevice) {
  for (DType gd : {DType::kFloat32, DType::kFloat16}) {
    SgdConfig c;
    c.lr = 0.05f;
    c.momentum = 0.9f;
    c.weight_decay = 0.1f;
    c.first_step = false;
    ExpectSameOnTestDevice(
        {RandomTensor({4099}, gd, 3), RandomTensor({4099}, DType::kFloat32, 4),
         RandomTensor({4099}, DType::kFloat32, 5)},
        [&](std::vector<Tensor>& t) { return SgdStep(c, t[0], &t[1], &t[2]); },
        "SgdStep");
  }
}

TEST(SgdTest, RefusesBadArguments) {
  Tensor p = Tensor::Zeros({4}, DType::kFloat32);
  Tensor g = Tensor::Zeros({5}, DType::kFloat32);
  SgdConfig c;
  EXPECT_FALSE(SgdStep(c, g, &p, nullptr).ok());  // Element counts differ.
  Tensor g4 = Tensor::Zeros({4}, DType::kFloat32);
  c.momentum = 0.9f;
  EXPECT_FALSE(SgdStep(c, g4, &p, nullptr).ok());  // Buffer missing.
  Tensor p16 = Tensor::Zeros({4}, DType::kBFloat16);
  c.momentum = 0.0f;
  EXPECT_FALSE(SgdStep(c, g4, &p16, nullptr).ok());  // param not fp32.
  EXPECT_TRUE(SgdStep(c, g4, &p, nullptr).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
