// Expert parallelism in real processes (gloo, 4 ranks, DP 4) against the
// serial MoeMlp: EP 2 (expert data groups of 2) and EP 4 (of 1), ETP 2
// alone (expert data groups of 2) and with EP 2 (of 1), with the alltoall
// and allgather dispatchers, dropless and with a capacity factor.
// Every rank routes its own 24 tokens; the serial reference runs each
// rank's tokens through the whole layer and averages the gradients over the
// 4 ranks, as data parallelism does.
//
// Bounds: outputs and input gradients differ from the serial layer's only
// by GEMM blocking over a different number of rows, and the gradients by
// fp32 sums in another order (an expert sums the rows of every rank at once
// instead of rank by rank): at most 2 (48 + 1) u32 of the sums of absolute
// terms, which on these unit-scale tensors stays under 1e-5 of each
// tensor's largest entry; measured figures are printed. The two
// dispatchers only move rows, so they agree bit for bit, and a rerun
// repeats every bit. One bf16 case (EP 2 x ETP 2) is held to 3e-2: the
// same sums rounded at a different place may land one bf16 step apart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "models/moe/moe_mlp.h"
#include "parallel/parallel_state.h"

namespace mcc {
namespace moe {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kTokens = 24, kSequences = 3;

MoeMlpConfig Config() {
  MoeMlpConfig c;
  c.hidden_size = 16;
  c.num_experts = 8;
  c.ffn_hidden_size = 8;
  c.shared_expert_ffn_hidden_size = 12;
  c.router.topk = 2;
  c.load_balancing = LoadBalancing::kSeqAuxLoss;
  c.aux_loss_coeff = 0.1f;
  c.z_loss_coeff = 0.01f;
  c.init_std = 0.3f;
  if (const char* f = std::getenv("MOE_CAPACITY"))
    c.capacity_factor = std::atof(f);
  if (std::getenv("MOE_BF16") != nullptr) c.dtype = DType::kBFloat16;
  if (const char* p = std::getenv("MOE_POLICY")) {
    c.drop_policy = *ParseTokenDropPolicy(p);
  }
  return c;
}

Tensor Random(int64_t t, int64_t h, uint32_t seed, DType dtype) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(t * h);
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, {t, h}, dtype);
}

// Largest |got - want| over the largest |want|; prints it.
double RelDiff(const std::vector<double>& got, const std::vector<double>& want,
               const std::string& what, int rank) {
  double scale = 0, worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  const double rel = scale > 0 ? worst / scale : worst;
  std::printf("rank %d %s: largest difference %.3g of the largest entry\n",
              rank, what.c_str(), rel);
  return got.size() == want.size() ? rel : 1e30;
}

std::vector<double> Rows(const Tensor& t, int64_t begin, int64_t end) {
  return t.Slice(begin, end)->ToDoubles();
}

struct Run {
  std::vector<double> y, dx, router, fc1, fc2, shared1, shared2;
  int64_t kept = 0;
};

absl::StatusOr<Run> RunEp(const MoeMlpConfig& c, const ExpertParallelism& ep,
                          const parallel::ParallelState& s, const Tensor& x,
                          const Tensor& dy) {
  MCC_ASSIGN_OR_RETURN(auto m, MoeMlp::Create("mlp", c, ep));
  MoeMlp::Activations act;
  MCC_ASSIGN_OR_RETURN(Tensor y, m->Forward(x, kSequences, &act));
  MCC_ASSIGN_OR_RETURN(Tensor dx, m->Backward(dy, act, 2.0f));
  MCC_RETURN_IF_ERROR(m->ReduceGradients(s.data(), s.expert_data()));
  Run r{y.ToDoubles(),
        dx.ToDoubles(),
        m->router_weight().main_grad.ToDoubles(),
        m->fc1_weight().main_grad.ToDoubles(),
        m->fc2_weight().main_grad.ToDoubles(),
        m->shared_fc1_weight()->main_grad.ToDoubles(),
        m->shared_fc2_weight()->main_grad.ToDoubles(),
        act.kept_rows};
  return r;
}

MCC_WORKER(parity) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(options);
  if (!world.ok())
    return comm::testing::ReportFailure("init", world.status(), 3);
  const int ep_size = std::atoi(std::getenv("MOE_EP"));
  const int etp_size = std::atoi(std::getenv("MOE_ETP"));
  parallel::ParallelSizes sizes;
  sizes.expert_model = ep_size;
  sizes.expert_tensor = etp_size;
  auto state = parallel::ParallelState::Create(world->group, sizes);
  if (!state.ok())
    return comm::testing::ReportFailure("state", state.status(), 4);
  const parallel::ParallelState& s = **state;
  const int rank = world->group->rank();
  const MoeMlpConfig c = Config();
  const int64_t h = c.hidden_size;

  // Serial: every rank's tokens through the whole layer, gradients averaged.
  auto serial = MoeMlp::Create("mlp", c).value();
  std::vector<double> y_ref, dx_ref;
  int64_t kept_ref = 0;
  for (int r = 0; r < kWorld; ++r) {
    MoeMlp::Activations act;
    Tensor y =
        serial->Forward(Random(kTokens, h, 100 + r, c.dtype), kSequences, &act)
            .value();
    Tensor dx =
        serial->Backward(Random(kTokens, h, 200 + r, c.dtype), act, 2.0f)
            .value();
    if (r == rank) {
      y_ref = y.ToDoubles();
      dx_ref = dx.ToDoubles();
      kept_ref = act.kept_rows;
    }
  }
  if (!serial->ReduceGradients(nullptr, nullptr).ok()) return 5;
  auto averaged = [&](const Parameter& p) {
    std::vector<double> v = p.main_grad.ToDoubles();
    for (double& d : v) d /= kWorld;
    return v;
  };
  const int64_t el = c.num_experts / ep_size,
                ep_rank = s.expert_coordinates().ep;
  // This rank's experts, and of each its ffn slice (SwiGLU: gate and up).
  const int64_t f = c.ffn_hidden_size, fl = f / etp_size;
  const int64_t q = s.expert_coordinates().etp;
  const std::vector<double> fc1_all = averaged(serial->fc1_weight());
  const std::vector<double> fc2_all = averaged(serial->fc2_weight());
  std::vector<double> fc1_ref, fc2_ref;
  for (int64_t e = ep_rank * el; e < (ep_rank + 1) * el; ++e) {
    for (int64_t half = 0; half < 2; ++half) {
      for (int64_t r = q * fl; r < (q + 1) * fl; ++r) {
        const double* row = fc1_all.data() + (e * 2 * f + half * f + r) * h;
        fc1_ref.insert(fc1_ref.end(), row, row + h);
      }
    }
    for (int64_t o = 0; o < h; ++o) {
      const double* row = fc2_all.data() + (e * h + o) * f;
      fc2_ref.insert(fc2_ref.end(), row + q * fl, row + (q + 1) * fl);
    }
  }

  const Tensor x = Random(kTokens, h, 100 + rank, c.dtype);
  const Tensor dy = Random(kTokens, h, 200 + rank, c.dtype);
  std::map<std::string, Run> runs;
  for (TokenDispatcherType type :
       {TokenDispatcherType::kAllToAll, TokenDispatcherType::kAllGather}) {
    ExpertParallelism ep{s.expert_model(), type, s.expert_tensor()};
    for (int rep = 0; rep < 2; ++rep) {
      auto run = RunEp(c, ep, s, x, dy);
      if (!run.ok()) return comm::testing::ReportFailure("ep", run.status(), 6);
      runs[absl::StrCat(TokenDispatcherTypeName(type), rep)] = *std::move(run);
    }
  }
  const Run& a = runs["alltoall0"];
  auto same = [](const Run& p, const Run& q) {
    return p.y == q.y && p.dx == q.dx && p.router == q.router &&
           p.fc1 == q.fc1 && p.fc2 == q.fc2 && p.shared1 == q.shared1 &&
           p.shared2 == q.shared2;
  };
  if (!same(a, runs["alltoall1"]) || !same(a, runs["allgather0"]) ||
      !same(a, runs["allgather1"])) {
    std::fprintf(stderr, "rank %d: runs or dispatchers differ\n", rank);
    return 7;
  }
  if (std::getenv("MOE_CAPACITY") != nullptr &&
      kept_ref >= kTokens * c.router.topk) {
    std::fprintf(stderr, "rank %d: the capacity case drops nothing\n", rank);
    return 8;
  }
  if (a.kept != kept_ref) {
    std::fprintf(stderr, "rank %d kept %ld rows, serial %ld\n", rank,
                 static_cast<long>(a.kept), static_cast<long>(kept_ref));
    return 8;
  }
  // bf16: the same sums in another order may round one bf16 step (2^-8)
  // apart at a stored tensor, and a few stored tensors lie on each path.
  const double tol = c.dtype == DType::kBFloat16 ? 3e-2 : 1e-5;
  struct Cmp {
    const char* what;
    const std::vector<double>& got;
    std::vector<double> want;
  } cmps[] = {
      {"y", a.y, y_ref},
      {"dx", a.dx, dx_ref},
      {"router", a.router, averaged(serial->router_weight())},
      {"fc1", a.fc1, fc1_ref},
      {"fc2", a.fc2, fc2_ref},
      {"shared fc1", a.shared1, averaged(*serial->shared_fc1_weight())},
      {"shared fc2", a.shared2, averaged(*serial->shared_fc2_weight())}};
  int rc = 0;
  for (const Cmp& cmp : cmps) {
    if (RelDiff(cmp.got, cmp.want, cmp.what, rank) > tol) {
      std::fprintf(stderr, "rank %d: %s beyond %g\n", rank, cmp.what, tol);
      rc = 9;
    }
  }
  return rc;
}

struct Case {
  std::string name;
  int ep;
  int etp;
  std::string capacity;  // Empty: dropless.
  std::string policy;
  bool bf16 = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ExpertParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExpertParallelTest, MatchesTheSerialLayer) {
  const Case c = GetParam();
  auto results =
      comm::testing::RunWorkers(kWorld, "parity", absl::Seconds(120), [&](int) {
        std::map<std::string, std::string> env{
            {"MOE_EP", std::to_string(c.ep)},
            {"MOE_ETP", std::to_string(c.etp)}};
        if (c.bf16) env["MOE_BF16"] = "1";
        if (!c.capacity.empty()) {
          env["MOE_CAPACITY"] = c.capacity;
          env["MOE_POLICY"] = c.policy;
        }
        return env;
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
  std::printf("%s\n", results[0].output.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExpertParallelTest,
    ::testing::Values(Case{"ep2", 2, 1, "", ""}, Case{"ep4", 4, 1, "", ""},
                      Case{"ep2_capacity_probs", 2, 1, "0.75", "probs"},
                      Case{"ep4_capacity_position", 4, 1, "0.5", "position"},
                      Case{"etp2", 1, 2, "", ""},
                      Case{"ep2_etp2", 2, 2, "", ""},
                      Case{"ep2_etp2_capacity_probs", 2, 2, "0.75", "probs"},
                      Case{"ep2_etp2_bf16", 2, 2, "", "", true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace moe
}  // namespace mcc
