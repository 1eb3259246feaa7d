#include "parallel/mlp_block.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/ops/activation.h"
#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

constexpr int64_t kRows = 3, kHidden = 4, kFfn = 6;

MlpBlock MakeBlock(std::map<std::string, std::shared_ptr<Parameter>>* by_name) {
  LinearOptions options;
  options.weight_init = InitSpec::Normal(0.2f);
  absl::StatusOr<MlpBlock> block =
      MlpBlock::Create("blocks.0", kHidden, kFfn, options, LayerContext());
  EXPECT_TRUE(block.ok()) << block.status();
  ParameterList params;
  block->AppendParameters(&params);
  for (const auto& p : params) (*by_name)[p->name] = p;
  return std::move(*block);
}

std::vector<float> Inputs() {
  std::vector<float> x(kRows * kHidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * i) + 0.1f;
  return x;
}

TEST(MlpBlockTest, ForwardIsFc2OfGeluOfFc1) {
  std::map<std::string, std::shared_ptr<Parameter>> p;
  MlpBlock block = MakeBlock(&p);
  ASSERT_EQ(p.size(), 4u);
  const std::vector<float> w1 = p.at("blocks.0.fc1.weight")->value.ToFloats();
  const std::vector<float> b1 = p.at("blocks.0.fc1.bias")->value.ToFloats();
  const std::vector<float> w2 = p.at("blocks.0.fc2.weight")->value.ToFloats();
  const std::vector<float> b2 = p.at("blocks.0.fc2.bias")->value.ToFloats();
  ASSERT_EQ(p.at("blocks.0.fc1.weight")->value.shape(), (Shape{kFfn, kHidden}));
  const std::vector<float> x = Inputs();
  // fc1 by hand, GELU by the kernel, fc2 by hand.
  std::vector<float> h(kRows * kFfn);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t f = 0; f < kFfn; ++f) {
      double s = b1[f];
      for (int64_t k = 0; k < kHidden; ++k) {
        s += double{w1[f * kHidden + k]} * x[r * kHidden + k];
      }
      h[r * kFfn + f] = static_cast<float>(s);
    }
  }
  Tensor g = Tensor::Empty({kRows, kFfn}, DType::kFloat32);
  ASSERT_TRUE(ops::Gelu(*Tensor::FromVector(h, {kRows, kFfn}), &g).ok());
  const std::vector<float> gv = g.ToFloats();
  MlpBlock::Activations act;
  absl::StatusOr<Tensor> y =
      block.Forward(*Tensor::FromVector(x, {kRows, kHidden}), &act);
  ASSERT_TRUE(y.ok()) << y.status();
  const std::vector<float> yv = y->ToFloats();
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t o = 0; o < kHidden; ++o) {
      double s = b2[o];
      for (int64_t f = 0; f < kFfn; ++f) {
        s += double{w2[o * kFfn + f]} * gv[r * kFfn + f];
      }
      EXPECT_NEAR(yv[r * kHidden + o], s, 1e-5) << r << ", " << o;
    }
  }
}

// Backward's input gradient against central differences of sum(y * dy),
// and the weights' gradients accumulated.
TEST(MlpBlockTest, BackwardIsTheGradientOfForward) {
  std::map<std::string, std::shared_ptr<Parameter>> p;
  MlpBlock block = MakeBlock(&p);
  for (auto& [name, param] : p) param->main_grad.Zero();
  std::vector<float> dy(kRows * kHidden);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.3f * i);
  auto objective = [&](const std::vector<float>& x) {
    MlpBlock::Activations act;
    const std::vector<float> y =
        block.Forward(*Tensor::FromVector(x, {kRows, kHidden}), &act)
            ->ToFloats();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += double{y[i]} * dy[i];
    return s;
  };
  const std::vector<float> x = Inputs();
  MlpBlock::Activations act;
  ASSERT_TRUE(
      block.Forward(*Tensor::FromVector(x, {kRows, kHidden}), &act).ok());
  absl::StatusOr<Tensor> dx =
      block.Backward(*Tensor::FromVector(dy, {kRows, kHidden}), &act);
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ(act.pre_gelu.numel(), 0) << "Backward keeps its activations";
  const std::vector<float> dxv = dx->ToFloats();
  constexpr float kEps = 1e-2f;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<float> up = x, down = x;
    up[i] += kEps;
    down[i] -= kEps;
    const double numeric = (objective(up) - objective(down)) / (2 * kEps);
    EXPECT_NEAR(dxv[i], numeric, 1e-3) << "x[" << i << "]";
  }
  for (const auto& [name, param] : p) {
    double norm = 0;
    for (float v : param->main_grad.ToFloats()) norm += double{v} * v;
    EXPECT_GT(norm, 0) << name << " took no gradient";
  }
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
