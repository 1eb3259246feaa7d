#include "core/ops/adamw.h"

#include <cmath>
#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

// float64 AdamW, as torch.optim.AdamW documents it.
void RefStep(const AdamWConfig& c, const std::vector<double>& g,
             std::vector<double>* p, std::vector<double>* m,
             std::vector<double>* v) {
  const double bc1 = 1 - std::pow(c.beta1, c.step);
  const double bc2 = 1 - std::pow(c.beta2, c.step);
  for (size_t i = 0; i < p->size(); ++i) {
    const double gi = g[i] * c.grad_scale;
    (*p)[i] *= 1 - static_cast<double>(c.lr) * c.weight_decay;
    (*m)[i] = c.beta1 * (*m)[i] + (1 - c.beta1) * gi;
    (*v)[i] = c.beta2 * (*v)[i] + (1 - c.beta2) * gi * gi;
    (*p)[i] -= c.lr / bc1 * (*m)[i] / (std::sqrt((*v)[i] / bc2) + c.eps);
  }
}

TEST(AdamWTest, ThreeStepsMatchFloat64Reference) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    // The 16-bit model copy: bf16 or fp16 (--bf16 or --fp16 training).
    for (DType cd : {DType::kBFloat16, DType::kFloat16}) {
      for (int64_t n : {1, 7, 33, 129, 100003}) {
        Tensor p = RandomTensor({n}, DType::kFloat32, 1);
        Tensor m = Tensor::Zeros({n}, DType::kFloat32);
        Tensor v = Tensor::Zeros({n}, DType::kFloat32);
        Tensor p16 = Tensor::Zeros({n}, cd);
        std::vector<double> rp = p.ToDoubles(), rm(n, 0.0), rv(n, 0.0);
        AdamWConfig c;
        c.lr = 1e-2f;
        c.weight_decay = 0.1f;
        c.grad_scale = 0.5f;
        for (int64_t step = 1; step <= 3; ++step) {
          c.step = step;
          Tensor g = RandomTensor({n}, gd, 10 + step, -2.0f, 2.0f);
          ASSERT_TRUE(AdamWStep(c, g, &p, &m, &v, &p16).ok());
          RefStep(c, g.ToDoubles(), &rp, &rm, &rv);
        }
        // fp32 arithmetic, a few roundings per step on O(1) values; the
        // update itself is lr-sized, so absolute 1e-6 is ~1e-4 of an update.
        testing::ExpectAllNear(p.ToDoubles(), rp, 1e-6, 1e-6, "param");
        testing::ExpectAllNear(m.ToDoubles(), rm, 1e-6, 1e-5, "exp_avg");
        testing::ExpectAllNear(v.ToDoubles(), rv, 1e-7, 1e-5, "exp_avg_sq");
        // The 16-bit copy is the fp32 result rounded to nearest even.
        Tensor want16 = p.To(cd).value();
        EXPECT_EQ(Bytes(p16), Bytes(want16));
      }
    }
  }
}

TEST(AdamWTest, BadInputsNameShapesAndLeaveStateUntouched) {
  Tensor p = RandomTensor({4, 8}, DType::kFloat32, 1);
  Tensor g = RandomTensor({8, 4}, DType::kFloat32, 2);
  Tensor m = RandomTensor({4, 8}, DType::kFloat32, 3);
  Tensor v = RandomTensor({4, 8}, DType::kFloat32, 4);
  const auto bp = Bytes(p), bm = Bytes(m), bv = Bytes(v);
  AdamWConfig c;
  absl::Status s = AdamWStep(c, g, &p, &m, &v);
  EXPECT_NE(s.message().find("param fp32[4, 8] and grad fp32[8, 4]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(p), bp);
  EXPECT_EQ(Bytes(m), bm);
  EXPECT_EQ(Bytes(v), bv);
  Tensor g_ok = RandomTensor({4, 8}, DType::kFloat32, 5);
  c.step = 0;
  s = AdamWStep(c, g_ok, &p, &m, &v);
  EXPECT_NE(s.message().find("step 0"), std::string::npos) << s;
  EXPECT_EQ(Bytes(p), bp);
  c.step = 1;
  Tensor p16 = Tensor::Zeros({4, 7}, DType::kBFloat16);
  s = AdamWStep(c, g_ok, &p, &m, &v, &p16);
  EXPECT_NE(s.message().find("param fp32[4, 8] and param16 bf16[4, 7]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(p), bp);
  Tensor m16 = Tensor::Zeros({4, 8}, DType::kBFloat16);
  s = AdamWStep(c, g_ok, &p, &m16, &v);
  EXPECT_NE(s.message().find("exp_avg bf16[4, 8] must be fp32"),
            std::string::npos)
      << s;
}

TEST(AdamWTestDevice, MatchesCpuBitForBit) {
  for (DType gd : {DType::kFloat32, DType::kBFloat16}) {
    Tensor grad = RandomTensor({333}, gd, 1);
    Tensor param = RandomTensor({333}, DType::kFloat32, 2);
    Tensor m = RandomTensor({333}, DType::kFloat32, 3, 0.0f, 0.1f);
    Tensor v = RandomTensor({333}, DType::kFloat32, 4, 0.0f, 0.1f);
    Tensor p16 = Tensor::Zeros({333}, DType::kBFloat16);
    AdamWConfig cfg;
    cfg.lr = 0.01f;
    cfg.weight_decay = 0.1f;
    cfg.step = 3;
    cfg.grad_scale = 0.5f;
    testing::ExpectSameOnTestDevice(
        {grad, param, m, v, p16}, [&](std::vector<Tensor>& t) {
          return AdamWStep(cfg, t[0], &t[1], &t[2], &t[3], &t[4]);
        });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
