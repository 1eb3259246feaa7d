// Params of the flash-attention kernels for a test case, as the launchers
// (flash_attention.cu) and the registration (registrations.cc) fill them,
// for the tests that run the kernels on the host emulator. Include after
// flash_attention_kernels.cuh (and so after emulated_device.h). Test-only.
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_EMULATED_PARAMS_H_
#define CORE_OPS_CUDA_FLASH_ATTENTION_EMULATED_PARAMS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/flash_attention_options.h"
#include "core/ops/cuda/flash_attention_test_util.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace flash_testing {

inline cuda_kernels::ElemType ElemTypeOf(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kBFloat16:
      return cuda_kernels::ElemType::kBF16;
    case DType::kFloat16:
      return cuda_kernels::ElemType::kF16;
    default:
      return cuda_kernels::ElemType::kF32;
  }
}

// As registrations.cc and the launcher fill them (softmax_scale unset:
// 1/sqrt(d)).
inline cuda_kernels::flash::Params ParamsFor(const AttentionCase& c,
                                             const AttentionOptions& o) {
  cuda_kernels::flash::Params p = cuda_kernels::flash::ParamsOf(
      cuda::FlashAttentionArgsOf(c.b, c.s, c.hq, c.hkv, c.d, o));
  // The emulator reads host memory: the host first keys serve as they are.
  if (o.first_key.defined()) p.first_key = o.first_key.data<int32_t>();
  return p;
}

// The forward's inputs and outputs into p.
inline void SetForwardTensors(const HostInputs& in, Results* r,
                              cuda_kernels::flash::Params* p) {
  p->q = in.q.raw_data();
  p->k = in.k.raw_data();
  p->v = in.v.raw_data();
  p->qt = ElemTypeOf(in.q);
  p->out = r->out.raw_data();
  p->ot = ElemTypeOf(r->out);
  p->lse = r->lse.data<float>();
}

// The backward's inputs (the forward's out and lse) and gradients into p;
// row_dot (b * hq * s floats) holds D = rowsum(dO * O).
inline void SetBackwardTensors(const HostInputs& in, const Tensor& out,
                               const Tensor& lse, std::vector<float>* row_dot,
                               Results* r, cuda_kernels::flash::Params* p) {
  p->q = in.q.raw_data();
  p->k = in.k.raw_data();
  p->v = in.v.raw_data();
  p->qt = ElemTypeOf(in.q);
  p->out = out.raw_data();
  p->dout = in.dout.raw_data();
  p->ot = ElemTypeOf(out);
  p->lse = const_cast<float*>(lse.data<float>());
  p->drow = row_dot->data();
  p->dq = r->dq.raw_data();
  p->dqt = ElemTypeOf(r->dq);
  p->dk = r->dk.raw_data();
  p->dv = r->dv.raw_data();
  p->dkt = ElemTypeOf(r->dk);
}

inline cuda_emu::Dim3 DimOf(cuda_kernels::flash::Grid g) {
  return cuda_emu::Dim3{g.x, g.y, g.z};
}

// first_key per row: documents of 70, 1, 40 and 39 tokens (then 5 and 145)
// with a window of 30 keys when causal; not causal, key ranges before,
// inside and past the rows' own (rows that see no key: out 0, lse -inf).
inline AttentionOptions WithFirstKeys(const AttentionCase& c) {
  std::vector<int64_t> first;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    const std::vector<int64_t> starts =
        bi == 0 ? std::vector<int64_t>{0, 70, 71, 111}
                : std::vector<int64_t>{0, 5};
    for (int64_t i = 0; i < c.s; ++i) {
      int64_t start = 0;
      for (int64_t st : starts) start = st <= i ? st : start;
      if (!c.causal) {
        first.push_back(i < 50 ? -20 : i < 100 ? 90 : 400);
      } else {
        first.push_back(std::max<int64_t>(start, i - 29));
      }
    }
  }
  AttentionOptions o = c.Options();
  o.first_key = *Tensor::FromInts(first, {c.b, c.s}, DType::kInt32);
  return o;
}

}  // namespace flash_testing
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_EMULATED_PARAMS_H_
