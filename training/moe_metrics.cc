#include "training/moe_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace mcc {
namespace training {
namespace {

double MaxOverMean(const std::vector<int64_t>& tokens) {
  if (tokens.empty()) return 0;
  int64_t total = 0, most = 0;
  for (int64_t t : tokens) {
    total += t;
    most = std::max(most, t);
  }
  if (total == 0) return 0;
  return static_cast<double>(most) * static_cast<double>(tokens.size()) /
         static_cast<double>(total);
}

double PerMicroBatch(double sum, int64_t micro_batches) {
  return micro_batches > 0 ? sum / static_cast<double>(micro_batches) : 0;
}

}  // namespace

absl::StatusOr<std::vector<gpt::MoeLayerStats>> TakeMoeStatsOverDp(
    gpt::StageModel* model, comm::ProcessGroup* dp, Device device) {
  MCC_ASSIGN_OR_RETURN(std::vector<gpt::MoeLayerStats> stats,
                       model->TakeMoeStats());
  if (dp == nullptr || dp->size() == 1) return stats;
  for (gpt::MoeLayerStats& s : stats) {
    // Counts exactly (int64), losses in fp32 as the model sums them.
    std::vector<int64_t> counts = s.tokens_per_expert;
    counts.push_back(s.micro_batches);
    MCC_ASSIGN_OR_RETURN(
        Tensor c,
        Tensor::FromInts(counts, {static_cast<int64_t>(counts.size())}));
    MCC_ASSIGN_OR_RETURN(c, c.To(device));
    MCC_RETURN_IF_ERROR(dp->AllReduceSync(&c, comm::ReduceOp::kSum));
    MCC_ASSIGN_OR_RETURN(c, c.To(Device::CPU()));
    MCC_ASSIGN_OR_RETURN(
        Tensor l, Tensor::FromVector(
                      std::vector<float>{static_cast<float>(s.aux_loss_sum),
                                         static_cast<float>(s.z_loss_sum)},
                      {2}, DType::kFloat32));
    MCC_ASSIGN_OR_RETURN(l, l.To(device));
    MCC_RETURN_IF_ERROR(dp->AllReduceSync(&l, comm::ReduceOp::kSum));
    MCC_ASSIGN_OR_RETURN(l, l.To(Device::CPU()));
    const int64_t* summed = c.data<int64_t>();
    s.tokens_per_expert.assign(summed, summed + s.tokens_per_expert.size());
    s.micro_batches = summed[s.tokens_per_expert.size()];
    s.aux_loss_sum = l.data<float>()[0];
    s.z_loss_sum = l.data<float>()[1];
  }
  return stats;
}

std::string MoeStatsLine(const gpt::MoeLayerStats& s) {
  return absl::StrFormat(
      "moe layer %d: tokens per expert [%s] (max/mean %.2f) | balance loss "
      "%.4E | z-loss %.4E",
      s.layer, absl::StrJoin(s.tokens_per_expert, " "),
      MaxOverMean(s.tokens_per_expert),
      PerMicroBatch(s.aux_loss_sum, s.micro_batches),
      PerMicroBatch(s.z_loss_sum, s.micro_batches));
}

std::vector<std::pair<std::string, double>> MoeScalars(
    const std::vector<gpt::MoeLayerStats>& stats) {
  std::vector<std::pair<std::string, double>> out;
  if (stats.empty()) return out;
  double aux = 0, z = 0;
  for (const gpt::MoeLayerStats& s : stats) {
    const double layer_aux = PerMicroBatch(s.aux_loss_sum, s.micro_batches);
    const double layer_z = PerMicroBatch(s.z_loss_sum, s.micro_batches);
    aux += layer_aux;
    z += layer_z;
    out.emplace_back(absl::StrCat("moe/load_balancing_loss_layer_", s.layer),
                     layer_aux);
    out.emplace_back(absl::StrCat("moe/z_loss_layer_", s.layer), layer_z);
    out.emplace_back(absl::StrCat("moe/max_over_mean_load_layer_", s.layer),
                     MaxOverMean(s.tokens_per_expert));
    for (size_t e = 0; e < s.tokens_per_expert.size(); ++e) {
      out.emplace_back(
          absl::StrCat("moe/tokens_layer_", s.layer, "_expert_", e),
          static_cast<double>(s.tokens_per_expert[e]));
    }
  }
  const double n = static_cast<double>(stats.size());
  out.emplace_back("load_balancing_loss", aux / n);
  out.emplace_back("z_loss", z / n);
  return out;
}

}  // namespace training
}  // namespace mcc
