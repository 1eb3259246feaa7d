// Prefetching under optim_grads_params is real overlap: in a step whose
// unit order is known, the next unit's all-gather is issued while the
// current unit is open (before its compute ends), in forward and in
// backward (how much of the gathered data has arrived by the time the next
// unit asks for it is printed: timing, not asserted).
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "parallel/parallel_state.h"
#include "training/testing/fsdp_test_util.h"

namespace mcc {
namespace fsdp {
namespace {

// Checks one step's trace; returns a description of the first violation.
std::string CheckPrefetchOrder(const std::vector<FsdpEvent>& trace,
                               int num_units, int* checked, int* ready,
                               int* prefetched) {
  for (size_t i = 0; i < trace.size(); ++i) {
    const FsdpEvent& e = trace[i];
    if (e.kind == FsdpEvent::kGatherDone && e.ready) ++*ready;
    if (e.kind == FsdpEvent::kGatherLaunched && e.prefetch) ++*prefetched;
    const bool fwd = e.kind == FsdpEvent::kForwardBegin;
    const bool bwd = e.kind == FsdpEvent::kBackwardBegin;
    if (!fwd && !bwd) continue;
    const int next = fwd ? e.unit + 1 : e.unit - 1;
    // The last unit's forward is followed by its own backward (kept), the
    // first unit's backward by the next micro-batch's (kept).
    if (next < 0 || next >= num_units) continue;
    const auto end_kind =
        fwd ? FsdpEvent::kForwardEnd : FsdpEvent::kBackwardEnd;
    bool launched = false;
    size_t j = i + 1;
    for (; j < trace.size(); ++j) {
      const FsdpEvent& f = trace[j];
      if (f.kind == end_kind && f.unit == e.unit) break;
      if (f.kind == FsdpEvent::kGatherLaunched && f.unit == next &&
          f.prefetch) {
        launched = true;
      }
    }
    if (j == trace.size()) {
      return absl::StrCat("unit ", e.unit, " never ends");
    }
    if (!launched || trace[j].time < e.time) {
      return absl::StrCat("unit ", next, "'s gather was not issued while unit ",
                          e.unit, " computed its ",
                          fwd ? "forward" : "backward");
    }
    ++*checked;
  }
  return "";
}

MCC_WORKER(fsdp_overlap) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  static auto* world = new comm::World;
  auto w = comm::InitWorldFromEnvironment(options);
  if (!w.ok()) return 3;
  *world = *w;
  auto state = parallel::ParallelState::Create(world->group, {});
  if (!state.ok()) return 3;
  testing::FsdpTrainOptions o;
  o.base = testing::ParityOptions();
  o.base.steps = 3;
  o.base.model.num_layers = 4;
  o.base.model.seq_length = 64;
  o.base.model.untie_embeddings_and_output_weights = true;
  o.fsdp.strategy = ShardingStrategy::kOptimGradsParams;
  o.fsdp.record_trace = true;
  int failures = 0, checked = 0, ready = 0, prefetched = 0;
  o.after_step = [&](int step, data_parallel::DataParallel* dp) {
    auto* f = dynamic_cast<FullyShardedDataParallel*>(dp);
    if (f == nullptr) return absl::InternalError("not the sharded wrapper");
    // Step 0 learns the order; later steps follow it.
    if (step > 0) {
      const std::string error = CheckPrefetchOrder(
          f->trace(), f->num_units(), &checked, &ready, &prefetched);
      if (!error.empty()) {
        std::fprintf(stderr, "step %d: %s\n", step, error.c_str());
        ++failures;
      }
    }
    f->ClearTrace();
    return absl::OkStatus();
  };
  auto result = testing::TrainFsdp(o, state->get());
  if (!result.ok()) {
    std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
    return 4;
  }
  std::printf(
      "rank %d: %d unit computes checked, %d prefetched gathers, %d "
      "of the unit gathers had arrived before their unit asked\n",
      world->group->rank(), checked, prefetched, ready);
  if (checked < 2 * 2 * 10) return 5;  // 2 steps x 2 micro-batches x ...
  // How many gathers arrived before their unit asked is timing, not
  // correctness: on an idle 2-core machine 26-35 of 40 do, but under a
  // loaded CI run a rank saw 0 (the gloo thread not scheduled in time).
  // It is printed above; the launch order checked per unit is the property.
  return failures == 0 ? 0 : 7;
}

TEST(FsdpOverlapTest, NextUnitGatherStartsWhileCurrentUnitComputes) {
  auto results =
      comm::testing::RunWorkers(2, "fsdp_overlap", absl::Seconds(90));
  for (const auto& r : results) {
    ASSERT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  std::printf("%s%s", results[0].output.c_str(), results[1].output.c_str());
}

}  // namespace
}  // namespace fsdp
}  // namespace mcc
