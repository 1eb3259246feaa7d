#include "core/ops/cuda/ops.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/norm_loss.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

namespace k = ::mcc::cuda_kernels;

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// t is defined, on a CUDA device that exists, and (if device is given) on
// that device.
absl::Status CheckOnCuda(absl::string_view op, absl::string_view name,
                         const Tensor& t) {
  if (!t.defined()) return Invalid(op, absl::StrCat(name, " is undefined"));
  if (!t.device().is_cuda()) {
    return Invalid(
        op, absl::StrCat(name, " must be a CUDA tensor, got ", t.Describe()));
  }
  MCC_RETURN_IF_ERROR(::mcc::cuda::CheckDeviceIndex(t.device().index));
  return absl::OkStatus();
}

absl::Status CheckFloat(absl::string_view op, absl::string_view name,
                        const Tensor& t) {
  MCC_RETURN_IF_ERROR(CheckOnCuda(op, name, t));
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kBFloat16) {
    return Invalid(
        op, absl::StrCat(name, " must be fp32 or bf16, got ", t.Describe()));
  }
  return absl::OkStatus();
}

// t is on x's device with the given dtype and shape.
absl::Status CheckLike(absl::string_view op, absl::string_view name,
                       const Tensor& t, const Tensor& x, DType dtype,
                       const Shape& shape) {
  MCC_RETURN_IF_ERROR(CheckOnCuda(op, name, t));
  if (t.device() != x.device() || t.dtype() != dtype || t.shape() != shape) {
    return Invalid(
        op,
        absl::StrCat(name, " must be ", DTypeName(dtype), ShapeToString(shape),
                     " on ", x.device().ToString(), ", got ", t.Describe()));
  }
  return absl::OkStatus();
}

// Rows and columns of x viewed as [rows, last dimension].
absl::Status RowsCols(absl::string_view op, const Tensor& x, int64_t* rows,
                      int64_t* cols) {
  if (x.dim() < 1) {
    return Invalid(
        op, absl::StrCat("needs at least one dimension, got ", x.Describe()));
  }
  *cols = x.size(-1);
  *rows = *cols == 0 ? 0 : x.numel() / *cols;
  return absl::OkStatus();
}

Shape LeadingShape(const Tensor& x) {
  return Shape(x.shape().begin(), x.shape().end() - 1);
}

absl::Status Launch(absl::string_view op, int device, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      op, " on cuda:", device, ": kernel launch failed: ",
      cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

bool IsBF16(const Tensor& t) { return t.dtype() == DType::kBFloat16; }

template <typename T>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

uint16_t* Bits(const Tensor& t) { return static_cast<uint16_t*>(t.raw_data()); }

}  // namespace

absl::StatusOr<Tensor> GeluForward(const Tensor& x) {
  constexpr absl::string_view kOp = "GeluForward";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(x)
          ? k::GeluForwardBF16(Bits(x), Bits(y), x.numel(), s)
          : k::GeluForwardF32(Ptr<float>(x), Ptr<float>(y), x.numel(), s)));
  return y;
}

absl::StatusOr<Tensor> GeluBackward(const Tensor& dy, const Tensor& x) {
  constexpr absl::string_view kOp = "GeluBackward";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  MCC_RETURN_IF_ERROR(CheckLike(kOp, "dy", dy, x, x.dtype(), x.shape()));
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(x) ? k::GeluBackwardBF16(Bits(dy), Bits(x), Bits(dx), x.numel(), s)
                : k::GeluBackwardF32(Ptr<float>(dy), Ptr<float>(x),
                                     Ptr<float>(dx), x.numel(), s)));
  return dx;
}

absl::StatusOr<Tensor> BiasAdd(const Tensor& x, const Tensor& bias) {
  constexpr absl::string_view kOp = "BiasAdd";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  int64_t rows = 0, cols = 0;
  MCC_RETURN_IF_ERROR(RowsCols(kOp, x, &rows, &cols));
  MCC_RETURN_IF_ERROR(CheckLike(kOp, "bias", bias, x, x.dtype(), {cols}));
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(x) ? k::BiasAddBF16(Bits(x), Bits(bias), Bits(y), rows, cols, s)
                : k::BiasAddF32(Ptr<float>(x), Ptr<float>(bias), Ptr<float>(y),
                                rows, cols, s)));
  return y;
}

absl::StatusOr<Tensor> BiasGrad(const Tensor& dy) {
  constexpr absl::string_view kOp = "BiasGrad";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "dy", dy));
  int64_t rows = 0, cols = 0;
  MCC_RETURN_IF_ERROR(RowsCols(kOp, dy, &rows, &cols));
  const int dev = dy.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor db = Tensor::Empty({cols}, DType::kFloat32, dy.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(dy)
          ? k::BiasGradBF16(Bits(dy), Ptr<float>(db), rows, cols, s)
          : k::BiasGradF32(Ptr<float>(dy), Ptr<float>(db), rows, cols, s)));
  return db;
}

absl::Status AdamWStep(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                       const AdamWConfig& config, int64_t step,
                       Tensor* model_param) {
  constexpr absl::string_view kOp = "AdamWStep";
  MCC_RETURN_IF_ERROR(CheckOnCuda(kOp, "param", param));
  if (param.dtype() != DType::kFloat32) {
    return Invalid(kOp,
                   absl::StrCat("param must be fp32, got ", param.Describe()));
  }
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "grad", grad, param, DType::kFloat32, param.shape()));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "m", m, param, DType::kFloat32, param.shape()));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "v", v, param, DType::kFloat32, param.shape()));
  if (model_param != nullptr) {
    MCC_RETURN_IF_ERROR(CheckLike(kOp, "model_param", *model_param, param,
                                  DType::kBFloat16, param.shape()));
  }
  if (step < 1)
    return Invalid(kOp, absl::StrCat("step must be >= 1, got ", step));
  const double bc1 = config.bias_correction
                         ? 1.0 - std::pow(double{config.beta1}, double(step))
                         : 1.0;
  const double bc2 = config.bias_correction
                         ? 1.0 - std::pow(double{config.beta2}, double(step))
                         : 1.0;
  const int dev = param.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  return Launch(kOp, dev,
                k::AdamWStepF32(
                    Ptr<float>(param), Ptr<float>(grad), Ptr<float>(m),
                    Ptr<float>(v), model_param ? Bits(*model_param) : nullptr,
                    param.numel(), config.lr, config.beta1, config.beta2,
                    config.eps, config.weight_decay, static_cast<float>(bc1),
                    static_cast<float>(bc2), ::mcc::cuda::CurrentStream(dev)));
}

absl::StatusOr<Tensor> Convert(const Tensor& x, DType dtype) {
  constexpr absl::string_view kOp = "Convert";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    return Invalid(kOp, absl::StrCat("target dtype must be fp32 or bf16, got ",
                                     DTypeName(dtype), " for ", x.Describe()));
  }
  if (dtype == x.dtype()) return x.Clone();
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor y = Tensor::Empty(x.shape(), dtype, x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(
      Launch(kOp, dev,
             IsBF16(x) ? k::BF16ToF32(Bits(x), Ptr<float>(y), x.numel(), s)
                       : k::F32ToBF16(Ptr<float>(x), Bits(y), x.numel(), s)));
  return y;
}

absl::StatusOr<LayerNormOutput> LayerNormForward(const Tensor& x,
                                                 const Tensor& gamma,
                                                 const Tensor& beta,
                                                 float eps) {
  constexpr absl::string_view kOp = "LayerNormForward";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  int64_t rows = 0, cols = 0;
  MCC_RETURN_IF_ERROR(RowsCols(kOp, x, &rows, &cols));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "gamma", gamma, x, DType::kFloat32, {cols}));
  MCC_RETURN_IF_ERROR(CheckLike(kOp, "beta", beta, x, DType::kFloat32, {cols}));
  if (!(eps > 0.0f))
    return Invalid(kOp, absl::StrCat("eps must be > 0, got ", eps));
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  LayerNormOutput out;
  out.y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  out.mean = Tensor::Empty(LeadingShape(x), DType::kFloat32, x.device());
  out.rstd = Tensor::Empty(LeadingShape(x), DType::kFloat32, x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(x)
          ? k::LayerNormForwardBF16(
                Bits(x), Ptr<float>(gamma), Ptr<float>(beta), Bits(out.y),
                Ptr<float>(out.mean), Ptr<float>(out.rstd), rows, cols, eps, s)
          : k::LayerNormForwardF32(Ptr<float>(x), Ptr<float>(gamma),
                                   Ptr<float>(beta), Ptr<float>(out.y),
                                   Ptr<float>(out.mean), Ptr<float>(out.rstd),
                                   rows, cols, eps, s)));
  return out;
}

absl::StatusOr<LayerNormGrads> LayerNormBackward(const Tensor& dy,
                                                 const Tensor& x,
                                                 const Tensor& gamma,
                                                 const Tensor& mean,
                                                 const Tensor& rstd) {
  constexpr absl::string_view kOp = "LayerNormBackward";
  MCC_RETURN_IF_ERROR(CheckFloat(kOp, "x", x));
  int64_t rows = 0, cols = 0;
  MCC_RETURN_IF_ERROR(RowsCols(kOp, x, &rows, &cols));
  MCC_RETURN_IF_ERROR(CheckLike(kOp, "dy", dy, x, x.dtype(), x.shape()));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "gamma", gamma, x, DType::kFloat32, {cols}));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "mean", mean, x, DType::kFloat32, LeadingShape(x)));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "rstd", rstd, x, DType::kFloat32, LeadingShape(x)));
  const int dev = x.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  LayerNormGrads g;
  g.dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
  g.dgamma = Tensor::Empty({cols}, DType::kFloat32, x.device());
  g.dbeta = Tensor::Empty({cols}, DType::kFloat32, x.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(x)
          ? k::LayerNormBackwardBF16(Bits(dy), Bits(x), Ptr<float>(gamma),
                                     Ptr<float>(mean), Ptr<float>(rstd),
                                     Bits(g.dx), Ptr<float>(g.dgamma),
                                     Ptr<float>(g.dbeta), rows, cols, s)
          : k::LayerNormBackwardF32(
                Ptr<float>(dy), Ptr<float>(x), Ptr<float>(gamma),
                Ptr<float>(mean), Ptr<float>(rstd), Ptr<float>(g.dx),
                Ptr<float>(g.dgamma), Ptr<float>(g.dbeta), rows, cols, s)));
  return g;
}

namespace {

absl::Status CheckLabels(absl::string_view op, const Tensor& logits,
                         const Tensor& labels, int64_t* rows, int64_t* vocab) {
  MCC_RETURN_IF_ERROR(CheckFloat(op, "logits", logits));
  MCC_RETURN_IF_ERROR(RowsCols(op, logits, rows, vocab));
  MCC_RETURN_IF_ERROR(CheckLike(op, "labels", labels, logits, DType::kInt64,
                                LeadingShape(logits)));
  if (*vocab == 0) {
    return Invalid(
        op, absl::StrCat("empty vocabulary in logits ", logits.Describe()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CrossEntropyOutput> SoftmaxCrossEntropyForward(
    const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  constexpr absl::string_view kOp = "SoftmaxCrossEntropyForward";
  int64_t rows = 0, vocab = 0;
  MCC_RETURN_IF_ERROR(CheckLabels(kOp, logits, labels, &rows, &vocab));
  const int dev = logits.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  CrossEntropyOutput out;
  out.loss = Tensor::Empty(labels.shape(), DType::kFloat32, logits.device());
  out.lse = Tensor::Empty(labels.shape(), DType::kFloat32, logits.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(logits)
          ? k::CrossEntropyForwardBF16(
                Bits(logits), Ptr<int64_t>(labels), Ptr<float>(out.loss),
                Ptr<float>(out.lse), rows, vocab, ignore_index, s)
          : k::CrossEntropyForwardF32(Ptr<float>(logits), Ptr<int64_t>(labels),
                                      Ptr<float>(out.loss), Ptr<float>(out.lse),
                                      rows, vocab, ignore_index, s)));
  return out;
}

absl::StatusOr<Tensor> SoftmaxCrossEntropyBackward(const Tensor& dloss,
                                                   const Tensor& logits,
                                                   const Tensor& labels,
                                                   const Tensor& lse,
                                                   int64_t ignore_index) {
  constexpr absl::string_view kOp = "SoftmaxCrossEntropyBackward";
  int64_t rows = 0, vocab = 0;
  MCC_RETURN_IF_ERROR(CheckLabels(kOp, logits, labels, &rows, &vocab));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "dloss", dloss, logits, DType::kFloat32, labels.shape()));
  MCC_RETURN_IF_ERROR(
      CheckLike(kOp, "lse", lse, logits, DType::kFloat32, labels.shape()));
  const int dev = logits.device().index;
  ::mcc::cuda::DeviceGuard guard(dev);
  Tensor dlogits =
      Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  const cudaStream_t s = ::mcc::cuda::CurrentStream(dev);
  MCC_RETURN_IF_ERROR(Launch(
      kOp, dev,
      IsBF16(logits)
          ? k::CrossEntropyBackwardBF16(
                Ptr<float>(dloss), Bits(logits), Ptr<int64_t>(labels),
                Ptr<float>(lse), Bits(dlogits), rows, vocab, ignore_index, s)
          : k::CrossEntropyBackwardF32(Ptr<float>(dloss), Ptr<float>(logits),
                                       Ptr<int64_t>(labels), Ptr<float>(lse),
                                       Ptr<float>(dlogits), rows, vocab,
                                       ignore_index, s)));
  return dlogits;
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
