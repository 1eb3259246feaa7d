// Context parallelism in real processes (gloo) against the serial run:
// CP 2 and 4, with TP 2 + SP, PP 2 (and interleaved), DP 2 with ZeRO-3,
// full recomputation, GQA with rotary positions, DP 2 with the distributed
// optimizer in bf16, and the all-to-all mode (a2a CP 2), over 10 steps;
// also packed documents with sliding windows (--reset-attention-mask,
// --window-size) under CP ring and all-to-all, TP 2 + SP, PP 2 and
// recomputation, against the serial run with the same documents.
// fp32 layouts train to the serial losses within 1e-5 relative and the
// serial gradient norms within 1e-4 (fp32 reduction order: the ring merges
// partial softmaxes and the loss sum crosses CP as fp32 halves).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"
#include "parallel/parallel_state.h"
#include "training/testing/parity_test_util.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace context_parallel {
namespace {

using optim::testing::TrainOptions;
using optim::testing::TrainResult;
using CpCommType = parallel::LayerContext::CpCommType;

struct Case {
  std::string name;
  int world = 2;
  int cp = 2;
  int tp = 1;
  int pp = 1;
  int layers_per_virtual_stage = 0;
  fsdp::ShardingStrategy sharding = fsdp::ShardingStrategy::kNoShard;
  bool recompute = false;
  bool selective = false;  // Selective recomputation (attention rebuilt).
  bool gqa_rope = false;
  // Qwen-style attention: QKV bias, QK-norm, Llama 3 rotary scaling.
  bool qwen = false;
  CpCommType comm = CpCommType::kP2P;
  // Packed documents (--reset-attention-mask, --reset-position-ids) and a
  // sliding window of window + 1 keys (-1: none).
  bool documents = false;
  int64_t window = -1;
  bool distopt = false;
  DType dtype = DType::kFloat32;
  // Relative loss bound; grad norms get 10 times it. bf16: the ring rounds
  // its fp32 result to bf16 as the serial kernel does, but from sums in
  // another order, so an element may land one bf16 step (2^-8) away, and
  // such flips move the loss by far less than one step.
  double tolerance = 1e-5;
};

std::vector<Case> Cases() {
  std::vector<Case> v;
  v.push_back({"cp2", 2, 2});
  v.push_back({"cp4", 4, 4});
  v.push_back({"cp2_tp2_sp", 4, 2, 2});
  v.push_back({"cp2_pp2", 4, 2, 1, 2});
  v.push_back({"cp2_pp2_interleaved", 4, 2, 1, 2, 1});
  v.push_back({"cp2_dp2_zero3", 4, 2, 1, 1, 0,
               fsdp::ShardingStrategy::kOptimGradsParams});
  Case recompute{"cp2_recompute_gqa_rope", 2, 2};
  recompute.recompute = true;
  recompute.gqa_rope = true;
  v.push_back(recompute);
  Case bf16{"cp2_dp2_distopt_bf16", 4, 2};
  bf16.distopt = true;
  bf16.dtype = DType::kBFloat16;
  bf16.tolerance = 2e-3;
  v.push_back(bf16);
  Case a2a{"a2a_cp2", 2, 2};
  a2a.comm = CpCommType::kAllToAll;
  v.push_back(a2a);
  Case qwen{"cp2_tp2_sp_qkv_bias_qk_norm_rope_scaling", 4, 2, 2};
  qwen.gqa_rope = true;
  qwen.qwen = true;
  v.push_back(qwen);
  // Packed documents cross the chunks (lengths 3, 7, 1, 5, 9 over 16
  // tokens: chunks of 4 at CP 2), so ring steps see partial chunks, empty
  // rows and whole chunks skipped.
  Case docs{"cp2_documents_window_gqa_rope", 2, 2};
  docs.documents = true;
  docs.window = 5;
  docs.gqa_rope = true;
  v.push_back(docs);
  Case docs_a2a{"a2a_cp2_documents_window", 2, 2};
  docs_a2a.comm = CpCommType::kAllToAll;
  docs_a2a.documents = true;
  docs_a2a.window = 5;
  v.push_back(docs_a2a);
  Case docs_tp{"cp2_tp2_sp_documents_learned_positions", 4, 2, 2};
  docs_tp.documents = true;
  v.push_back(docs_tp);
  Case docs_tp_only{"tp2_sp_documents_window_selective", 2, 1, 2};
  docs_tp_only.documents = true;
  docs_tp_only.window = 5;
  docs_tp_only.selective = true;
  v.push_back(docs_tp_only);
  Case docs_pp{"pp2_documents_window_recompute", 2, 1, 1, 2};
  docs_pp.documents = true;
  docs_pp.window = 5;
  docs_pp.recompute = true;
  v.push_back(docs_pp);
  Case docs_cp4{"cp4_documents", 4, 4};
  docs_cp4.documents = true;
  v.push_back(docs_cp4);
  return v;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

TrainOptions Options(const Case& c) {
  TrainOptions o;
  // CP changes only attention, the same in every layer: 2 layers (one per
  // stage at PP 2) cover it; interleaving needs 2 chunks of 1 on each stage.
  o.model.num_layers = c.layers_per_virtual_stage > 0 ? 4 : 2;
  // No dropout: CP draws hidden-dropout masks per chunk, not the serial
  // ones, and refuses attention dropout.
  o.model.hidden_dropout = 0.0;
  o.model.attention_dropout = 0.0;
  if (c.gqa_rope) {
    o.model.num_query_groups = 2;
    o.model.position_embedding = gpt::PositionEmbedding::kRope;
  }
  if (c.qwen) {
    o.model.add_qkv_bias = true;
    o.model.qk_layernorm = true;
    o.model.rope_scaling.enabled = true;
    o.model.rope_scaling.original_max_position_embeddings = 8;
  }
  o.packed_documents = c.documents;
  o.model.window_left = c.window;
  if (c.selective) {
    o.model.recompute_granularity = gpt::RecomputeGranularity::kSelective;
  }
  if (c.recompute) {
    o.model.recompute_granularity = gpt::RecomputeGranularity::kFull;
    o.model.recompute_num_layers = 1;
  }
  o.steps = 10;
  o.global_microbatches = 4;
  o.sequence_parallel = c.tp > 1;
  o.ddp.overlap_grad_reduce = true;
  o.sharding = c.sharding;
  o.ddp.use_distributed_optimizer = c.distopt;
  o.dtype = c.dtype;
  o.optimizer.clip_grad = 1.0;
  o.lr.lr = 2e-3;
  o.lr.min_lr = 2e-4;
  o.lr.warmup_iters = 2;
  o.lr.decay_iters = 10;
  o.pipeline.pipeline_size = c.pp;
  o.pipeline.layers_per_virtual_stage = c.layers_per_virtual_stage;
  o.schedule.schedule = c.pp > 1 ? pipeline::ScheduleKind::kOneFOneB
                                 : pipeline::ScheduleKind::kNoPipelining;
  o.cp_comm_type = c.comm;
  return o;
}

const Case& FindCase(const std::string& name) {
  static const auto* cases = new std::vector<Case>(Cases());
  return optim::testing::FindCase(*cases, name);
}

MCC_WORKER(cp_train) {
  const Case& c = FindCase(std::getenv("MCC_TEST_CASE"));
  parallel::ParallelSizes sizes;
  sizes.tensor = c.tp;
  sizes.pipeline = c.pp;
  sizes.context = c.cp;
  auto state = optim::testing::InitWorkerState(sizes);
  if (!state.ok()) {
    std::fprintf(stderr, "init: %s\n", state.status().ToString().c_str());
    return 3;
  }
  auto result = optim::testing::Train(Options(c), state->get());
  if (!result.ok()) {
    std::fprintf(stderr, "train: %s\n", result.status().ToString().c_str());
    return 4;
  }
  if ((*state)->world()->rank() == 0) {
    auto s = optim::testing::WriteResult(
        optim::testing::TmpPath(c.name + ".txt"), *result);
    if (!s.ok()) return 5;
  }
  return 0;
}

TrainResult Serial(const Case& c) {
  Case serial = c;
  serial.world = serial.cp = serial.tp = serial.pp = 1;
  serial.layers_per_virtual_stage = 0;
  serial.sharding = fsdp::ShardingStrategy::kNoShard;
  serial.distopt = false;
  TrainOptions o = Options(serial);
  o.model.num_layers = Options(c).model.num_layers;
  o.use_ddp = false;
  auto r = optim::testing::Train(o, nullptr);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult();
}

class ContextParallelParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallelParityTest, EqualsSerial) {
  const Case& c = GetParam();
  auto parallel = optim::testing::RunParityWorkers(c.world, "cp_train", c.name,
                                                   absl::Seconds(240));
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  const TrainResult serial = Serial(c);
  const double worst = optim::testing::ExpectMatchesSerial(
      *parallel, serial, 10, c.tolerance, 10 * c.tolerance);
  std::printf("%s: worst relative loss difference %.3g over 10 steps\n",
              c.name.c_str(), worst);
  EXPECT_LT(parallel->loss[9], parallel->loss[0]);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelParityTest,
                         ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace context_parallel
}  // namespace mcc
