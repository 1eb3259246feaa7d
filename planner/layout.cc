#include "planner/layout.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mcc {
namespace planner {

std::string Layout::Name() const {
  return absl::StrCat(
      "tp", tp, sequence_parallel && tp > 1 ? "sp" : "", ".pp", pp,
      virtual_stages > 1 ? "v" : "",
      virtual_stages > 1 ? absl::StrCat(virtual_stages) : "", ".dp", dp, ".cp",
      cp, ".z", static_cast<int>(zero), ".r", RecomputeName(recompute), ".mb",
      micro_batch, ep > 1 ? absl::StrCat(".ep", ep) : "",
      etp > 0 ? absl::StrCat(".etp", etp) : "",
      schedule == PipelineSchedule::kOneFOneB
          ? ""
          : absl::StrCat(".s", PipelineScheduleName(schedule)),
      instances > 1 ? absl::StrCat(".i", instances) : "",
      offload_percent > 0 ? absl::StrCat(".o", offload_percent) : "",
      first_stage_layers > 0 ? absl::StrCat(".first", first_stage_layers) : "",
      last_stage_layers > 0 ? absl::StrCat(".last", last_stage_layers) : "");
}

absl::string_view PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kZeroBubbleH1:
      return "zb-h1";
    case PipelineSchedule::kFile:
      return "file";
    case PipelineSchedule::kZeroBubbleV:
      return "zbv";
  }
  return "?";
}

absl::string_view ZeroStageName(ZeroStage zero) {
  switch (zero) {
    case ZeroStage::kNone:
      return "no_shard";
    case ZeroStage::kOptimizer:
      return "optim";
    case ZeroStage::kGradients:
      return "optim_grads";
    case ZeroStage::kParameters:
      return "optim_grads_params";
  }
  return "?";
}

absl::string_view RecomputeName(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kSelectiveOps:
      return "ops";
  }
  return "?";
}

namespace {

// Reads the positive integer after `prefix` in `part` into *out.
bool ReadCount(absl::string_view part, absl::string_view prefix, int64_t* out) {
  if (!absl::StartsWith(part, prefix)) return false;
  int64_t v = 0;
  if (!absl::SimpleAtoi(part.substr(prefix.size()), &v) || v < 1) return false;
  *out = v;
  return true;
}

}  // namespace

absl::StatusOr<Layout> ParseLayout(absl::string_view name) {
  Layout l;
  auto bad = [&](absl::string_view part) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout '", name, "': cannot read '", part,
        "' (expected parts like tp2sp, pp2v2, dp2, cp1, z1, rselective "
        "(rnone, rfull, rops), mb4, ep2, etp1, szb-h1 (s1f1b, szbv, sfile), "
        "i2, o50, first3, last5, joined by dots)"));
  };
  for (absl::string_view part : absl::StrSplit(name, '.', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::StartsWith(part, "tp")) {
      absl::string_view rest = part;
      if (absl::EndsWith(rest, "sp")) {
        l.sequence_parallel = true;
        rest.remove_suffix(2);
      }
      if (!ReadCount(rest, "tp", &v)) return bad(part);
      l.tp = static_cast<int>(v);
    } else if (absl::StartsWith(part, "pp")) {
      std::vector<absl::string_view> pv = absl::StrSplit(part, 'v');
      if (pv.size() > 2 || !ReadCount(pv[0], "pp", &v)) return bad(part);
      l.pp = static_cast<int>(v);
      if (pv.size() == 2) {
        if (!absl::SimpleAtoi(pv[1], &v) || v < 1) return bad(part);
        l.virtual_stages = static_cast<int>(v);
      }
    } else if (ReadCount(part, "dp", &v)) {
      l.dp = static_cast<int>(v);
    } else if (ReadCount(part, "cp", &v)) {
      l.cp = static_cast<int>(v);
    } else if (ReadCount(part, "etp", &v)) {
      l.etp = static_cast<int>(v);
    } else if (ReadCount(part, "ep", &v)) {
      l.ep = static_cast<int>(v);
    } else if (ReadCount(part, "mb", &v)) {
      l.micro_batch = v;
    } else if (part.size() == 2 && part[0] == 'z' && part[1] >= '0' &&
               part[1] <= '3') {
      l.zero = static_cast<ZeroStage>(part[1] - '0');
    } else if (ReadCount(part, "first", &v)) {
      l.first_stage_layers = static_cast<int>(v);
    } else if (ReadCount(part, "last", &v)) {
      l.last_stage_layers = static_cast<int>(v);
    } else if (ReadCount(part, "i", &v)) {
      l.instances = static_cast<int>(v);
    } else if (ReadCount(part, "o", &v) && v <= 100) {
      l.offload_percent = static_cast<int>(v);
    } else if (part == "s1f1b") {
      l.schedule = PipelineSchedule::kOneFOneB;
    } else if (part == "szb-h1") {
      l.schedule = PipelineSchedule::kZeroBubbleH1;
    } else if (part == "szbv") {
      l.schedule = PipelineSchedule::kZeroBubbleV;
    } else if (part == "sfile") {
      l.schedule = PipelineSchedule::kFile;
    } else if (part == "rnone") {
      l.recompute = Recompute::kNone;
    } else if (part == "rselective") {
      l.recompute = Recompute::kSelective;
    } else if (part == "rfull") {
      l.recompute = Recompute::kFull;
    } else if (part == "rops") {
      l.recompute = Recompute::kSelectiveOps;
    } else {
      return bad(part);
    }
  }
  if (l.tp == 1) l.sequence_parallel = false;
  return l;
}

}  // namespace planner
}  // namespace mcc
