#ifndef OPTIM_OPTIMIZER_H_
#define OPTIM_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/side_stream.h"
#include "core/tensor.h"
#include "optim/loss_scaler.h"
#include "optim/state_precision.h"
#include "optim/update_rule.h"

namespace mcc {
namespace optim {

// Megatron's optimizer flags.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdam;  // --optimizer
  double weight_decay = 0.01;                 // --weight-decay
  double adam_beta1 = 0.9;                    // --adam-beta1
  double adam_beta2 = 0.999;                  // --adam-beta2
  double adam_eps = 1e-8;                     // --adam-eps
  double sgd_momentum = 0.9;                  // --sgd-momentum
  double clip_grad = 1.0;                     // --clip-grad (0: no clipping)
  // Loss scaling (--fp16 turns it on; dynamic unless --loss-scale is set).
  bool loss_scaling = false;
  LossScalerConfig loss_scaler;
  bool log_num_zeros_in_grad = false;  // --log-num-zeros-in-grad
  // --use-precision-aware-optimizer: the storage dtypes of Adam's moments
  // and of the main parameters the optimizer owns (see state_precision.h).
  // All fp32 by default.
  StatePrecision state_precision;
  // --optimizer-cpu-offload with --optimizer-offload-fraction: the share of
  // pieces (whole pieces in order, optim/offload_split.h) whose fp32 main
  // weights and state live in pinned host memory and are stepped by the CPU
  // kernels while the device steps the rest; their gradients come to the
  // host and their updated weights go back on a side stream. 0: none.
  // Needs a device other than the CPU.
  double cpu_offload_fraction = 0.0;
};

// The groups gradient norms and inf checks are reduced over. All may be
// null (serial).
struct OptimizerGroups {
  // Tensor-parallel group: parameters replicated over TP are counted only
  // on its rank 0.
  comm::ProcessGroup* tensor = nullptr;
  // Pipeline group: parameters marked shared_with_other_stage are counted
  // only on its rank 0.
  comm::ProcessGroup* pipeline = nullptr;
  // Model-parallel group (tensor x pipeline) the norm is summed over; null
  // means `tensor`.
  comm::ProcessGroup* model = nullptr;
  // Mixture of experts: the expert-model x expert-tensor group (one
  // pipeline stage's ranks holding different shards of the experts).
  // Parameters marked expert_parallel count on every rank; their sum is
  // completed over this group (and over the expert-data group where the
  // state is sharded), then joined to the dense sum on TP rank 0 before
  // the model-parallel sum, so each expert shard counts once.
  comm::ProcessGroup* expert_tensor_model = nullptr;
};

// What one step did, for the log.
struct StepInfo {
  double grad_norm = 0.0;   // Global, unscaled, before clipping.
  bool skipped = false;     // inf or NaN in a gradient: no update.
  double loss_scale = 1.0;  // Scale that was in effect for this step.
  double lr = 0.0;
  int64_t num_zeros = -1;  // With log_num_zeros_in_grad.
};

// The global gradient norm from the statistics Optimizer::ComputeGradStats
// wrote (the square root of stats[0] + stats[1], the sum of squares as two
// fp32 halves); inf when a gradient holds an inf or NaN. ApplyStep reports
// this value; the trainer's rerun check reads it before ApplyStep.
double GradNormOfStats(absl::Span<const float> grad_stats);

// A piece of a parameter the optimizer updates: elements [begin, end) of
// the flattened TP-local parameter of shape `param_shape`. Without `value`
// and `grad` the piece views the parameter's own value and main_grad (a
// replicated data-parallel wrapper, whose parameters stay whole); with them
// the fp32 values and gradient live outside the parameter (a sharded
// wrapper's flat shards, where the parameter itself is resident only while
// its unit computes).
struct ExternalShard {
  std::shared_ptr<Parameter> param;
  int64_t begin = 0;
  int64_t end = 0;
  Shape param_shape;
  Tensor value;  // fp32 [end - begin], updated in place: the main copy.
  Tensor grad;   // fp32 [end - begin]
};

// What a data-parallel wrapper (parallel/data_parallel/data_parallel.h)
// hands the optimizer it creates.
struct OptimizerPieces {
  // The pieces this rank updates (all of them, or its shards).
  std::vector<ExternalShard> pieces;
  // Whether the pieces are this rank's shards of state split over
  // `shard_group` (the distributed optimizer, FSDP): the gradient norm is
  // then summed over that group too, and checkpoints gather the state.
  bool sharded = false;
  comm::ProcessGroup* shard_group = nullptr;  // May be null (DP 1).
  // Where the expert_parallel parameters' state is sharded when sharded:
  // the expert-data-parallel group (may be null: one rank).
  comm::ProcessGroup* expert_shard_group = nullptr;
  // Whether the wrapper holds expert_parallel parameters (this rank may
  // have no piece of them; the norm's collectives must match).
  bool expert_params = false;
  // Where the pieces live (the optimizer's device even when there are
  // none on this rank).
  Device device = Device::CPU();
  // Runs after every applied update (may be null): where the wrapper
  // starts gathering the updated parameters.
  std::function<absl::Status()> after_update;
};

// One named piece of optimizer state, for checkpoints: `tensor` is a flat
// view, in the state's storage dtype (fp32 unless
// OptimizerConfig::state_precision lowers it), of elements [offset, offset +
// tensor.numel()) of the flattened TP-local parameter `param_name` (local shape
// `param_shape`, global shape `global_shape`). Writing into it (on load) sets
// the state.
struct StateTensor {
  std::string name;  // "<param>.exp_avg", "<param>.main_param", ...
  std::string param_name;
  // The parameter itself: two copies share a name where one stage holds
  // both (ZB-V's tied embedding), each with its own state.
  const Parameter* param = nullptr;
  std::string
      state;  // "exp_avg", "exp_avg_sq", "momentum_buffer", "main_param"
  Tensor tensor;
  int64_t offset = 0;
  Shape param_shape;
  Shape global_shape;
};

// A mixed-precision optimizer (Megatron's MixedPrecisionOptimizer and, over
// a DDP with the distributed optimizer, DistributedOptimizer): fp32 main
// parameters (copies of 16-bit weights; fp32 weights are updated in place),
// gradients read from the fp32 main_grad, unscaled by the loss scale,
// checked for inf/NaN (the step is skipped and the scaler backs off), the
// global norm computed with every parameter counted once and clipped, the
// update applied, and the 16-bit weights refreshed. Under the distributed
// optimizer each data-parallel rank updates only its shards and the DDP
// all-gathers the updated parameters.
class Optimizer {
 public:
  // Every parameter whole (no data parallelism, or the DDP's all-reduced
  // gradients of a plain optimizer).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const ParameterList& params, const OptimizerConfig& config,
      const OptimizerGroups& groups);
  // Over a data-parallel wrapper's pieces (see OptimizerPieces); the
  // wrappers' CreateOptimizer calls this.
  static absl::StatusOr<std::unique_ptr<Optimizer>> CreateForPieces(
      OptimizerPieces pieces, const OptimizerConfig& config,
      const OptimizerGroups& groups);

  // The multiplier of the loss before backward (1 without loss scaling):
  // pass loss_scale() / num_microbatches as ForwardBackward's grad_scale.
  double loss_scale() const;

  // One optimizer step at learning rate lr, after the gradients are synced
  // (DDP FinishGradSync, then the model's FinalizeGradients): the two
  // halves below with one device-to-host read of the statistics between
  // them (none on the CPU). Collective over the norm groups.
  absl::StatusOr<StepInfo> Step(double lr);

  // The first half of Step, for a caller that reads the statistics together
  // with other device values (the trainer reads them with the loss in one
  // copy). Overwrites `stats`, an fp32 [4] tensor on device() (it may view
  // part of a larger buffer), with the global gradient statistics:
  //   stats[0] + stats[1]: the sum of squares of the unscaled gradients,
  //     every parameter counted once, as a float64 split in two fp32
  //     halves; +inf (and 0) if any gradient holds an inf or NaN;
  //   stats[2] + stats[3]: the number of zero gradient elements (with
  //     log_num_zeros_in_grad; else 0).
  // One MultiTensorSumOfSquares and the all-reduces over the shard and
  // model groups (collective): no host synchronisation.
  absl::Status ComputeGradStats(Tensor* stats);
  // The second half: skips the update on inf/NaN (backing off the loss
  // scale), else clips and updates, from the host copy of the four values
  // ComputeGradStats wrote. No device-to-host copy.
  absl::StatusOr<StepInfo> ApplyStep(double lr,
                                     absl::Span<const float> grad_stats);

  // --log-params-norm: the L2 norm of the fp32 main parameters, every
  // parameter counted once (as the gradient norm counts them), summed over
  // the shard and model groups. Collective over those groups; one
  // device-to-host read (a logging path, not the step's).
  absl::StatusOr<double> ParamsNorm();
  // The unscaled gradient norm of each of `num_groups` parameter groups
  // (group_of maps a parameter to [0, num_groups), e.g. its layer), every
  // parameter counted once, summed over the shard and model groups: the
  // per-layer line of --timing-log-level 2. Call after the gradients are
  // synced and before the step. Every rank of those groups calls it with
  // the same num_groups. Collective; one device-to-host read.
  absl::StatusOr<std::vector<double>> GradNormsByGroup(
      int num_groups, const std::function<int(const Parameter&)>& group_of);

  // The device of the parameters, main weights, gradients and state (CPU
  // for an optimizer with nothing to update).
  Device device() const { return device_; }

  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  LossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const OptimizerConfig& config() const { return config_; }
  bool sharded() const { return sharded_; }
  // The group the state is sharded over when sharded() (null: one rank):
  // all of data parallelism, or an instance under HSDP. Checkpoints
  // gather the state over it.
  comm::ProcessGroup* shard_group() const { return shard_group_; }
  // Where expert_parallel parameters' state is sharded (see
  // OptimizerPieces); shard_group() for the rest.
  comm::ProcessGroup* expert_shard_group() const { return expert_shard_group_; }

  // The state, for checkpoints (see StateTensor); main_param entries view
  // the parameters themselves when those are fp32.
  std::vector<StateTensor> StateTensors();
  // Bytes this optimizer allocated (main copies and state, each in its
  // storage dtype), on the device and on the host alike.
  int64_t state_bytes() const;
  // The part of state_bytes() in host memory (--optimizer-cpu-offload), and
  // the number of elements stepped on the host.
  int64_t offloaded_state_bytes() const;
  int64_t offloaded_elements() const;
  int64_t offloaded_pieces() const;

  // For --check-for-nan-in-loss-and-grad's error: the first gradient piece
  // on this rank (in parameter order) holding an inf or NaN, as
  // "'<param>' elements [begin, end)" with the first bad element and value,
  // or empty when none does. Reads every gradient to the host: for the
  // error path only. Not collective.
  absl::StatusOr<std::string> FirstNonFiniteGradient() const;

 private:
  struct Range {
    std::shared_ptr<Parameter> param;
    int64_t begin = 0, end = 0;
    // [end - begin]: a view of the value when fp32, else the main copy in
    // the main-params dtype (fp32 unless lowered).
    Tensor master;
    Tensor grad;  // External shards only: the fp32 gradient piece.
    Shape shape;  // The TP-local parameter's shape.
    bool own_master = false;
    std::vector<Tensor> state;
    bool counted = true;  // Counts in the global norm on this rank.
    // --optimizer-cpu-offload: master and state above live in host memory;
    // the gradient comes to host_grad, the update is computed there, and
    // the result goes to device_model (the parameter's value piece, or the
    // data-parallel wrapper's fp32 shard) from host_model (the master
    // itself when device_model is fp32, else a host copy in its dtype).
    bool offloaded = false;
    Tensor host_grad;
    Tensor host_model;
    Tensor device_model;
    bool expert = false;  // An expert_parallel parameter's piece.
  };
  // Pieces without value/grad tensors view the parameter's own.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Build(
      std::vector<ExternalShard> shards, bool sharded,
      const OptimizerConfig& config, const OptimizerGroups& groups);
  absl::StatusOr<Tensor> View(const Tensor& t, const Range& r) const;
  absl::StatusOr<Tensor> GradOf(const Range& r) const;
  absl::Status ReduceSum(Tensor* t);
  // Sums of squares of the dense (`dense`) and expert (`expert`, may be
  // null when there are no expert parameters) pieces, each [4 * n], into
  // the global ones in `dense` (see OptimizerGroups::expert_tensor_model).
  absl::Status ReduceStats(Tensor* dense, Tensor* expert);
  // The counted gradients (or main values) as dense and expert lists.
  bool has_expert() const { return expert_params_; }
  // Fixes the optimizer's device at the first piece; later pieces must
  // agree.
  absl::Status CheckDevice(const Parameter& p, const Tensor& t);
  // One update of one range from `grad` (the weight decay per parameter
  // over `base`); model16, when given, receives the 16-bit weights (a main
  // copy of the optimizer's own).
  absl::Status UpdateRange(const UpdateHyper& base, const Tensor& grad,
                           Range* r, Tensor* model16);
  // The update of one range whose main copy or state is stored below fp32:
  // widened to fp32, updated, and rounded back to nearest.
  absl::Status ApplyLowered(const UpdateHyper& h, const Tensor& grad, Range* r,
                            Tensor* model16);
  // Adds the sum of squares of host tensors (offloaded main copies) to the
  // device's fp32 [4] statistics (ParamsNorm's logging path: one read).
  absl::Status AddHostSumOfSquares(const std::vector<Tensor>& host,
                                   Tensor* stats);
  // Moves a range's main copy and state to pinned host memory.
  absl::Status Offload(Range* r);
  // The offloaded ranges' gradients to the host on the side stream, after
  // the current stream's work so far; the event marks them done.
  absl::StatusOr<DeviceEvent> FetchOffloadedGrads();
  // Steps every offloaded range on the host (the weight decay per range
  // over `base`) once its gradient is there, and writes the weights back on
  // the side stream; the current stream waits for the write-back.
  absl::Status StepOffloaded(const UpdateHyper& base,
                             const DeviceEvent& grads_on_host);

  OptimizerConfig config_;
  OptimizerGroups groups_;
  comm::ProcessGroup* shard_group_ = nullptr;  // The norm sums over it.
  comm::ProcessGroup* expert_shard_group_ = nullptr;
  bool expert_params_ = false;
  std::function<absl::Status()> after_update_;
  bool sharded_ = false;
  std::unique_ptr<UpdateRule> rule_;
  std::optional<LossScaler> scaler_;
  std::vector<Range> ranges_;
  int64_t step_ = 0;
  // The copies of offloaded ranges (null without --optimizer-cpu-offload).
  std::unique_ptr<SideStream> side_;
  Device device_ = Device::CPU();
  bool device_known_ = false;
};

// Whether a parameter counts in the global gradient norm on this rank:
// TP-partitioned ones on every TP rank, replicated ones on TP rank 0; ones
// shared with another pipeline stage only on pipeline rank 0; expert ones
// (expert_parallel) on every rank (their sum is joined on TP rank 0).
bool CountsInGradNorm(const Parameter& p, int tensor_rank, int pipeline_rank);

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_OPTIMIZER_H_
