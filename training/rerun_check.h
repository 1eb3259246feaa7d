#ifndef TRAINING_RERUN_CHECK_H_
#define TRAINING_RERUN_CHECK_H_

// Tells a transient fault from bad data, as Megatron's rerun state machine
// (--rerun-mode validate_results) does: a step whose loss or gradient norm
// is not finite, or (when asked) spikes past a factor of the recent ones,
// is run again from the same state (Trainer's rerun_step_if). A result the
// rerun reproduces bit for bit comes from the data or the model; one it
// does not came from a fault of the machine (a flipped bit, a bad core),
// and training goes on with the rerun's result.
//
// For tests and drills, errors can be injected into what the check sees
// (Megatron's --error-injection-rate and --error-injection-type): at every
// iteration that is a multiple of the rate the first result reads NaN, and
// with a persistent error the rerun's too. The training itself is never
// changed by an injection.

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/statusor.h"

namespace mcc {
namespace training {

struct RerunCheckOptions {
  enum class Injection { kTransient, kPersistent, kCorrect };
  // A loss above `spike_factor` x the largest of the last `window` accepted
  // ones is suspicious (--check-for-spiky-loss); the gradient norm likewise
  // (--check-for-large-grads). Non-finite values always are.
  bool check_spiky_loss = false;
  bool check_large_grads = false;
  double spike_factor = 10;
  int window = 50;
  // Errors injected at iterations that are multiples of this (0: none).
  int64_t injection_rate = 0;
  Injection injection = Injection::kTransient;
};

// "transient_error" and the others (Megatron's spellings) to the enum.
absl::StatusOr<RerunCheckOptions::Injection> ParseInjection(
    const std::string& name);

class RerunCheck {
 public:
  explicit RerunCheck(RerunCheckOptions options);

  // What the check sees of a run's result: the values, or NaN where an
  // error is injected (`rerun`: the second run of the iteration).
  double SeenLoss(int64_t iteration, double loss, bool rerun) const;

  // Why these values call for a rerun ("" when they do not): "the loss is
  // nan", "the gradient norm 310.2 is above 10 x the largest of the last 50
  // steps (12.1)".
  std::string Suspicion(double loss, double grad_norm) const;

  // Adds a step's applied, finite values to the window.
  void Accept(double loss, double grad_norm);

 private:
  RerunCheckOptions options_;
  std::deque<double> losses_;
  std::deque<double> grad_norms_;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_RERUN_CHECK_H_
