#include "parallel/pipeline/p2p.h"

namespace mcc {
namespace pipeline {
namespace {

constexpr uint32_t kForwardTag = 0x50500000;
constexpr uint32_t kBackwardTag = 0x50510000;

}  // namespace

std::shared_ptr<comm::Work> PipelineP2P::SendForward(const Tensor& t,
                                                     int chunk) {
  return group_->Send(t, Next(), kForwardTag + chunk);
}

std::shared_ptr<comm::Work> PipelineP2P::RecvForward(Tensor* t, int chunk) {
  return group_->Recv(t, Prev(), kForwardTag + chunk);
}

std::shared_ptr<comm::Work> PipelineP2P::SendBackward(const Tensor& t,
                                                      int chunk) {
  return group_->Send(t, Prev(), kBackwardTag + chunk);
}

std::shared_ptr<comm::Work> PipelineP2P::RecvBackward(Tensor* t, int chunk) {
  return group_->Recv(t, Next(), kBackwardTag + chunk);
}

}  // namespace pipeline
}  // namespace mcc
