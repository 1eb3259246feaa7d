#include "training/step_flops.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "models/gpt/model_flops.h"

namespace mcc {
namespace training {

StepFlopsCounter::StepFlopsCounter(const gpt::GPTConfig& config, bool documents,
                                   comm::ProcessGroup* dp_host)
    : config_(config), documents_(documents), dp_host_(dp_host) {}

void StepFlopsCounter::Add(const data::MicroBatch& micro_batch) {
  if (!documents_) return;
  const int64_t s = config_.seq_length;
  const Tensor& starts = micro_batch.document_start;
  const bool has_starts = starts.defined() && starts.dtype() == DType::kInt32 &&
                          starts.device().is_cpu() && starts.dim() == 2 &&
                          starts.size(1) == s;
  const int64_t b = has_starts                     ? starts.size(0)
                    : micro_batch.tokens.defined() ? micro_batch.tokens.size(0)
                                                   : 0;
  pairs_ += gpt::CausalAttentionPairs(
      has_starts ? starts.data<int32_t>() : nullptr, b, s, config_.window_left);
  sequences_ += b;
}

absl::StatusOr<double> StepFlopsCounter::TakeStepFlops(int64_t global_batch) {
  const int64_t s = config_.seq_length;
  const double samples = static_cast<double>(global_batch);
  if (!documents_ && !config_.sliding_window()) {
    // As the count always was: every query over the whole sequence.
    return samples * (gpt::TrainingFlopsPerToken(config_) * s);
  }
  double fraction = 1.0;
  if (documents_) {
    int64_t pairs = pairs_, sequences = sequences_;
    pairs_ = sequences_ = 0;
    if (dp_host_ != nullptr && dp_host_->size() > 1) {
      MCC_ASSIGN_OR_RETURN(Tensor t, Tensor::FromInts({pairs, sequences}, {2}));
      MCC_RETURN_IF_ERROR(dp_host_->AllReduceSync(&t, comm::ReduceOp::kSum));
      pairs = t.data<int64_t>()[0];
      sequences = t.data<int64_t>()[1];
    }
    const int64_t full = gpt::FullCausalAttentionPairs(sequences, s);
    if (full > 0) fraction = static_cast<double>(pairs) / full;
  } else {
    // The window alone: the same pairs in every sequence.
    fraction = static_cast<double>(gpt::CausalAttentionPairs(
                   nullptr, 1, s, config_.window_left)) /
               gpt::FullCausalAttentionPairs(1, s);
  }
  return gpt::TrainingFlops(config_, samples * s, fraction);
}

std::string StepFlopsCounter::Describe() const {
  const std::string scale =
      "Megatron's count, whose attention term takes every query over the "
      "whole sequence, scaled by the share of causal (query, key) pairs ";
  if (documents_) {
    return absl::StrCat(
        "TFLOP/s and MFU: ", scale, "each step's packed documents",
        config_.sliding_window() ? " and the sliding window" : "",
        " leave (counted from every data-parallel rank's micro-batches)");
  }
  if (config_.sliding_window()) {
    return absl::StrCat("TFLOP/s and MFU: ", scale, "the sliding window of ",
                        config_.window_left, " keys back leaves");
  }
  return "TFLOP/s and MFU: Megatron's count (every query over the whole "
         "sequence)";
}

}  // namespace training
}  // namespace mcc
