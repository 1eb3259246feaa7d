#ifndef PARALLEL_MODEL_H_
#define PARALLEL_MODEL_H_

// The model contract: what data parallelism (replicated or sharded), the
// pipeline executor and the training loop need from a model, so that any
// model (the GPT, a user's own, the test MLP in parallel/testing) gets them
// without those libraries knowing its type. It depends only on //core.
//
// A model here is one model chunk: the whole model, one pipeline stage, or
// one virtual stage of an interleaved pipeline. Its parameters are grouped
// into units (an embedding, a layer, a head) in forward order; a sharded
// data-parallel wrapper gathers a unit's parameters just before the unit
// computes, and data parallelism reduces a unit's gradients as soon as they
// are ready. Both learn about the compute through hooks the model calls.
//
// Threads: nothing here is thread-safe. A model, its hooks and the
// executor that drives it are used from one thread at a time; hooks run on
// the thread that called the model. Install and remove hooks only between
// steps, never from inside a hook.
//
// Errors: every call returns a Status naming what failed. After an error in
// a step (a forward, a backward or a hook) the step is abandoned: the
// parameters' gradients and any open activation records are unspecified
// until the next ZeroGradients, and collective calls must not be retried
// (other ranks may be waiting in a different collective), so the job should
// report the error and exit.

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace mcc {
namespace parallel {

// The summed loss of a micro-batch and how many loss terms (tokens,
// samples) it covers; training minimises sum / tokens.
struct LossSum {
  double sum = 0.0;
  double tokens = 0.0;
  double mean() const { return tokens > 0 ? sum / tokens : 0.0; }
};

// The host value of a loss sum kept on a device as ops::LossSum's fp32 [4]
// tensor (core/ops/loss_sum.h: sum and token count, each as fp32 hi + lo).
// One device-to-host copy unless the tensor is on the CPU; InvalidArgument
// for another shape or dtype.
absl::StatusOr<LossSum> ReadLossSum(const Tensor& loss_sum);

// Called around each unit's compute. Units are numbered in forward order
// as Model::units() lists them. Calls nest (a tied output layer may open
// the embedding unit inside the head's), but each Before* has its After*
// on the same unit before the step ends. Every method has a no-op default,
// so a hook overrides only what it needs.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // The unit's forward is about to read its parameters' values.
  virtual absl::Status BeforeForward(int unit);
  virtual absl::Status AfterForward(int unit);
  // Before anything of the unit runs in the backward pass, including a
  // recomputed forward.
  virtual absl::Status BeforeBackward(int unit);
  // The unit's parameter gradients for this micro-batch are complete.
  virtual absl::Status AfterBackward(int unit);
  // Whether the hooks allow a split backward (PipelineStage::
  // BackwardInputStep): the steps of other micro-batches between a unit's
  // BeforeBackward and its AfterBackward, which then runs in W. False by
  // default; a model does not split while a hook says false.
  virtual bool AllowsSplitBackward() const { return false; }
};

// Called during backward with the parameters whose `main_grad` for this
// micro-batch is complete, so data parallelism can start reducing them
// while the backward goes on. A parameter shared with another stage is
// reported only by SyncSharedGradients, once summed with the other copy.
using GradReadyHook =
    std::function<absl::Status(const std::vector<Parameter*>& ready)>;

// A model chunk's parameters, units, hooks and gradient finalisation.
//
// The model owns its parameters (shared with whoever keeps a ParameterList)
// and does not own installed hooks. Unit and grad-ready hooks compose:
// several may be installed at once (e.g. a sharded data-parallel wrapper and
// the distributed optimizer's parameter-gather waits) and each event calls
// them in install order, stopping at the first error, which the model's
// call returns.
class Model {
 public:
  Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  virtual ~Model() = default;

  // Every parameter of this chunk, each once, in forward order. The list
  // does not change after construction.
  virtual const ParameterList& parameters() const = 0;
  // The same parameters grouped per unit, in forward order; a parameter is
  // in exactly one unit.
  virtual const std::vector<ParameterList>& units() const = 0;
  // The tensor-parallel group whose ranks hold the other pieces of this
  // chunk's tensor-parallel parameters (null: no tensor parallelism).
  virtual comm::ProcessGroup* tensor_group() const = 0;

  // Hooks. `hooks` must outlive its installation; installing the same
  // object twice is an error (InvalidArgument). Not during a step.
  absl::Status AddUnitHooks(UnitHooks* hooks);
  // Removes `hooks` if installed (else nothing).
  void RemoveUnitHooks(UnitHooks* hooks);
  // Returns an id for RemoveGradReadyHook; a null hook is ignored (id -1).
  int AddGradReadyHook(GradReadyHook hook);
  void RemoveGradReadyHook(int id);

  // Gradient finalisation, called by the training loop around the
  // data-parallel gradient sync, in this order:
  //   ZeroGradients                      before the step's micro-batches;
  //   SyncSharedGradients(embedding)     after the last backward, before the
  //                                      data-parallel reduction;
  //   FinalizeGradients                  after the data-parallel reduction.
  // Sharded data parallelism replaces ZeroGradients and FinalizeGradients
  // with its own (the gradients live in its shards).
  //
  // Zeroes every parameter's main_grad. Local.
  virtual void ZeroGradients();
  // Sums over `embedding_group` the gradients of the parameters held also
  // by another stage (Parameter::shared_with_other_stage, e.g. a tied word
  // embedding on the first and last pipeline stages), then reports them to
  // the grad-ready hooks. Collective over `embedding_group` when it has
  // more than one rank and this chunk holds such parameters; null: no sum.
  virtual absl::Status SyncSharedGradients(comm::ProcessGroup* embedding_group);
  // Sums over tensor_group() the gradients sequence parallelism leaves
  // partial (Parameter::sequence_parallel: norm weights, row-parallel
  // biases). Collective over tensor_group() when it has more than one rank.
  virtual absl::Status FinalizeGradients();

 protected:
  // For implementations that split the backward: whether every installed
  // unit hook allows it (UnitHooks::AllowsSplitBackward).
  bool UnitHooksAllowSplitBackward() const;
  // For implementations: run the installed hooks. A negative unit (the
  // chunk has no such unit) calls nothing.
  absl::Status CallBeforeForward(int unit) const;
  absl::Status CallAfterForward(int unit) const;
  absl::Status CallBeforeBackward(int unit) const;
  absl::Status CallAfterBackward(int unit) const;
  // Reports `params` ready, leaving out those shared with another stage
  // (SyncSharedGradients reports them).
  absl::Status CallGradsReady(const ParameterList& params) const;

 private:
  absl::Status CallUnitHooks(absl::Status (UnitHooks::*fn)(int),
                             int unit) const;

  std::vector<UnitHooks*> unit_hooks_;
  std::vector<std::pair<int, GradReadyHook>> grad_ready_hooks_;
  int next_grad_ready_id_ = 0;
};

// The shape, dtype and device of a tensor passed between pipeline stages;
// the executor allocates its receive buffers from it.
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kFloat32;
  Device device = Device::CPU();
};

// What a forward step leaves for its backward: a model subclasses it with
// its activations. Owned by whoever ran the forward until handed back to
// BackwardStep, which consumes it.
class ActivationRecord {
 public:
  virtual ~ActivationRecord() = default;
};

// What one pipeline forward step produced.
struct StageOutput {
  // To the next stage (shaped as OutputSpec); undefined on the last stage.
  Tensor output;
  // The micro-batch's loss on the chunk that computes it (computes_loss()),
  // on the model's device as ops::LossSum's fp32 [4] tensor (the sum and
  // the token count as hi/lo pairs); undefined elsewhere. It stays on the
  // device: the pipeline executor totals a step's losses there and the
  // trainer reads them once per step (ReadLossSum reads one, for tests).
  Tensor loss_sum;
  // For BackwardStep; null when the forward ran without backward_after.
  std::unique_ptr<ActivationRecord> record;
};

// A model chunk as one step of a pipeline schedule sees it. Micro-batches
// are addressed by their index in the step (0 ... the step's count - 1):
// the chunk (or the batch source it was given) supplies micro-batch i's
// data, so the executor never sees tokens or labels. Every stage of a step
// must agree on which data an index means.
//
// Steps on one chunk are not collective in themselves, but a chunk's
// tensor-parallel layers communicate inside them over tensor_group(), so
// every TP rank must run the same steps in the same order.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;

  // Whether this chunk reads its input from the micro-batch (the model's
  // first chunk) rather than from the previous stage's output.
  virtual bool takes_batch_input() const = 0;
  // Whether this chunk computes the loss (the model's last chunk).
  virtual bool computes_loss() const = 0;
  // The tensor this chunk receives from the previous chunk in forward for
  // micro-batch i (and returns the gradient of in backward), and the one it
  // sends to the next (whose gradient it receives). Error: no such
  // micro-batch.
  virtual absl::StatusOr<TensorSpec> InputSpec(int microbatch) const = 0;
  virtual absl::StatusOr<TensorSpec> OutputSpec(int microbatch) const = 0;

  // The forward of micro-batch `microbatch`. input: the previous chunk's
  // output (ignored when takes_batch_input()). With backward_after false
  // (evaluation) no dropout runs and no record is returned. Calls the unit
  // hooks of its units.
  virtual absl::StatusOr<StageOutput> ForwardStep(int microbatch,
                                                  const Tensor& input,
                                                  bool backward_after) = 0;
  // The backward of the forward that returned `record` (consumed):
  // accumulates grad_scale * d(loss.mean())/d(param) into the parameters'
  // main_grad, reporting them to the grad-ready hooks as they complete.
  // output_grad: d(loss)/d(output) from the next chunk (ignored when
  // computes_loss(), which starts from its loss). Returns d(loss)/d(input),
  // or an undefined tensor when takes_batch_input().
  virtual absl::StatusOr<Tensor> BackwardStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<ActivationRecord> record) = 0;

  // The split backward, for schedules that run a micro-batch's weight
  // gradient later than its input gradient (zero-bubble: ZB-H1, a schedule
  // file's W rows).
  //
  // BackwardInputStep (B) takes BackwardStep's arguments, with the record
  // passed by pointer, and returns what BackwardStep returns: the input
  // gradient the previous chunk waits for. It leaves in *record only what
  // the weight gradients still need (the weight GEMMs' inputs and output
  // gradients), freeing the rest. BackwardWeightStep (W) takes that record
  // back (consumed), accumulates the parameter gradients into main_grad and
  // frees it. The steps of other micro-batches may run between the two.
  //
  // Hooks follow the gradients: a unit's AfterBackward and the grad-ready
  // hooks run in W, once its gradients are complete; BeforeBackward runs in
  // B. A model that splits keeps each parameter's contributions in the same
  // order, so B followed at once by W leaves every gradient bit for bit as
  // BackwardStep does.
  //
  // The defaults do not split: B runs BackwardStep (the weight gradients
  // included) and sets *record to null, and W of a null record does
  // nothing. Every model thus runs the split schedules correctly, only
  // without their gain.
  virtual absl::StatusOr<Tensor> BackwardInputStep(
      const Tensor& output_grad, float grad_scale,
      std::unique_ptr<ActivationRecord>* record);
  virtual absl::Status BackwardWeightStep(
      std::unique_ptr<ActivationRecord> record);
};

// Where one stage holds both copies of a shared parameter (a tied word
// embedding under ZB-V, whose V puts the embeddings and the output layer on
// stage 0, in two chunks): sums the copies' `main_grad` (same name, in
// chunk order) into each, as the embedding group's all-reduce does between
// stages. Call before the chunks' SyncSharedGradients (with a null
// embedding group then). Copies of one name must match in shape.
absl::Status SumSharedGradientsWithinStage(const std::vector<Model*>& models);

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_MODEL_H_
