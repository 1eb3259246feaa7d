#include "planner/layout_search.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "planner/moe_model.h"
#include "planner/stage_balance.h"

namespace mcc {
namespace planner {
namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// The pipeline schedules, HSDP instance counts and offload shares `base`
// can run with: on a pipeline, 1F1B (interleaved with virtual stages),
// ZB-H1 on one chunk a stage, ZB-V on two, and the job's schedule file; with
// sharded state, every instance count dividing DP x CP; on a device with a host
// link (GPUs), the state offloaded by half or whole.
std::vector<Layout> Variants(const JobSpec& job, const Layout& base) {
  std::vector<PipelineSchedule> schedules = {PipelineSchedule::kOneFOneB};
  if (base.pp > 1) {
    if (base.virtual_stages == 1) {
      schedules.push_back(PipelineSchedule::kZeroBubbleH1);
    }
    if (base.virtual_stages == 2) {
      schedules.push_back(PipelineSchedule::kZeroBubbleV);
    }
    if (job.schedule_table != nullptr) {
      schedules.push_back(PipelineSchedule::kFile);
    }
  }
  std::vector<int> instances = {1};
  std::vector<int> offloads = {0};
  if (base.zero != ZeroStage::kNone) {
    for (int n : Divisors(base.dp * base.cp)) {
      if (n > 1) instances.push_back(n);
    }
    if (job.cluster.device.host_link_bandwidth > 0) offloads = {0, 50, 100};
  }
  std::vector<Layout> out;
  for (PipelineSchedule s : schedules) {
    for (int n : instances) {
      for (int o : offloads) {
        Layout l = base;
        l.schedule = s;
        l.instances = n;
        l.offload_percent = o;
        out.push_back(l);
      }
    }
  }
  return out;
}

// `even` with the first and last stages' layers that balance its stages'
// predicted times (`time`, its step), when that is not the even split;
// layouts the flags do not combine with (one stage, interleaving) have none.
std::optional<Layout> BalancedVariant(const JobSpec& job, const Layout& even,
                                      const StepTime& time) {
  if (even.pp <= 1 || (even.virtual_stages > 1 &&
                       even.schedule != PipelineSchedule::kZeroBubbleV)) {
    return std::nullopt;
  }
  const StageSplit split = BalancedStageSplit(job, even, time);
  if (split.first_stage_layers == 0 && split.last_stage_layers == 0) {
    return std::nullopt;
  }
  Layout l = even;
  l.first_stage_layers = split.first_stage_layers;
  l.last_stage_layers = split.last_stage_layers;
  return l;
}

}  // namespace

std::string UnsupportedHere(const JobSpec& job, const Layout& l) {
  if (l.cp > 1 && job.model.attention_dropout > 0) {
    return "context parallelism needs --attention-dropout 0";
  }
  if (l.schedule == PipelineSchedule::kZeroBubbleV &&
      job.cluster.device.host_link_bandwidth > 0) {
    // A device with a host link is a GPU: its pipeline runs over NCCL.
    return "zbv runs over the CPU (gloo) pipeline group only";
  }
  if (l.recompute == Recompute::kSelectiveOps) {
    return "torchtitan's op-level checkpointing is not a train mode";
  }
  if ((l.ep > 1 || l.etp > 1) && l.tp > 1 && !l.sequence_parallel) {
    return "the GPT runs expert (tensor) parallelism at TP 1 or beside TP with "
           "--sequence-parallel only "
           "(--expert-model-parallel-size, --expert-tensor-parallel-size)";
  }
  return "";
}

absl::StatusOr<Prediction> Predict(const JobSpec& job, const Layout& layout) {
  Prediction p;
  p.layout = layout;
  auto memory = EstimatePeakMemory(job, layout);
  if (!memory.ok()) return memory.status();
  p.memory = *memory;
  p.time = EstimateStepTime(job, layout);
  p.fits = p.memory.total() <= job.cluster.device.memory_bytes;
  p.unsupported = UnsupportedHere(job, layout);
  return p;
}

std::vector<Prediction> SearchLayouts(const JobSpec& job,
                                      const SearchOptions& options) {
  std::vector<int64_t> micro_batches = options.micro_batches;
  if (micro_batches.empty()) {
    for (int64_t b = 1; b <= 64; b *= 2) micro_batches.push_back(b);
  }
  const int world = job.cluster.world();
  // Each micro-batch with every EP size a mixture of experts may take ({1}
  // for a dense model; CheckMoeLayout drops those a stage cannot hold).
  std::vector<std::pair<int64_t, int>> batch_and_ep;
  for (int64_t b : micro_batches) {
    for (int ep : ExpertParallelSizes(job.model, world)) {
      batch_and_ep.emplace_back(b, ep);
    }
  }
  std::vector<Prediction> out;
  auto keep = [&](Prediction p) {
    // A variant (ZB-V on a GPU) may be what train refuses.
    if (!options.include_unsupported && !p.unsupported.empty()) return;
    if (!p.fits && !options.include_not_fitting) return;
    out.push_back(std::move(p));
  };
  for (int tp : Divisors(world)) {
    if (tp > job.cluster.devices_per_node) continue;
    for (int cp : Divisors(world / tp)) {
      for (int pp : Divisors(world / tp / cp)) {
        const int dp = world / tp / cp / pp;
        for (int vp : Divisors(job.model.num_layers)) {
          if (vp > 1 && pp == 1) break;
          for (int zero = 0; zero <= 3; ++zero) {
            if (zero > 0 && dp * cp == 1) break;
            for (Recompute r :
                 {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
              for (const auto& [b, ep] : batch_and_ep) {
                Layout l;
                l.tp = tp;
                l.sequence_parallel = tp > 1;
                l.pp = pp;
                l.virtual_stages = vp;
                l.dp = dp;
                l.cp = cp;
                l.zero = static_cast<ZeroStage>(zero);
                l.recompute = r;
                l.micro_batch = b;
                SetMoeSearchDefaults(job.model, ep, &l);
                if (!options.include_unsupported &&
                    !UnsupportedHere(job, l).empty()) {
                  continue;
                }
                for (const Layout& v : Variants(job, l)) {
                  auto p = Predict(job, v);
                  if (p.ok()) keep(*std::move(p));
                  // Beside the even split, the one that balances the
                  // stages' predicted times (also where only an uneven
                  // split divides the layers).
                  if (!p.ok() && job.model.num_layers % v.pp == 0) continue;
                  auto balanced = BalancedVariant(
                      job, v, p.ok() ? p->time : EstimateStepTime(job, v));
                  if (!balanced) continue;
                  auto b = Predict(job, *balanced);
                  if (b.ok()) keep(*std::move(b));
                }
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Prediction& a, const Prediction& b) {
                     if (a.fits != b.fits) return a.fits;
                     if (a.time.total() != b.time.total()) {
                       return a.time.total() < b.time.total();
                     }
                     return a.memory.total() < b.memory.total();
                   });
  return out;
}

}  // namespace planner
}  // namespace mcc
