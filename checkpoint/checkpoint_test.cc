#include <thread>

#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/in_process_group.h"
#include "checkpoint/save_plan.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;

checkpoint::CommonState MakeCommon() {
  checkpoint::CommonState c;
  c.set_consumed_train_samples(12800);
  c.mutable_lr_scheduler()->set_decay_style("cosine");
  c.mutable_lr_scheduler()->set_max_lr(3e-4);
  c.mutable_lr_scheduler()->set_num_steps(100);
  c.mutable_loss_scaler()->set_scale(65536.0);
  auto* m = c.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(64);
  m->set_num_attention_heads(4);
  m->set_num_query_groups(4);
  m->set_ffn_hidden_size(256);
  m->set_padded_vocab_size(128);
  m->set_seq_length(32);
  c.mutable_parallel()->set_tensor_model_parallel_size(1);
  c.mutable_parallel()->set_data_parallel_size(1);
  return c;
}

checkpoint::RankState MakeRankState(int rank) {
  checkpoint::RankState s;
  (*s.mutable_rng_states())["cpu"] = absl::StrCat("cpu-rng-of-rank-", rank);
  (*s.mutable_rng_states())["cuda"] = std::string("\0\1\2", 3);
  return s;
}

void ExpectSameValues(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.ToDoubles(), b.ToDoubles());
}

TEST(CheckpointTest, SingleRankRoundTrip) {
  const std::string dir = FreshDir("roundtrip");
  Tensor w = RandomTensor({16, 8}, DType::kFloat32, 1);
  Tensor b = RandomTensor({8}, DType::kBFloat16, 2);
  Tensor steps = RandomTensor({3}, DType::kInt64, 3);
  std::vector<ShardedTensorRef> refs = {
      ShardedTensorRef::Replicated("w", w),
      ShardedTensorRef::Replicated("b", b),
      ShardedTensorRef::Replicated("steps", steps)};
  ASSERT_TRUE(SaveCheckpoint(dir, 100, refs, MakeCommon(), MakeRankState(0),
                             DistContext::Single())
                  .ok());
  EXPECT_TRUE(file_util::Exists(dir + "/iter_0000100/metadata.pb"));
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000100.tmp"));
  auto latest = LatestIteration(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 100);

  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->iteration(), 100);
  EXPECT_EQ((*reader)->common_state().iteration(), 100);
  EXPECT_EQ((*reader)->common_state().consumed_train_samples(), 12800);
  EXPECT_EQ((*reader)->common_state().lr_scheduler().decay_style(), "cosine");
  EXPECT_EQ((*reader)->common_state().model().hidden_size(), 64);
  auto rs = (*reader)->RankStateOf(0);
  ASSERT_TRUE(rs.ok());
  EXPECT_EQ(rs->rng_states().at("cpu"), "cpu-rng-of-rank-0");
  EXPECT_EQ(rs->rng_states().at("cuda"), std::string("\0\1\2", 3));
  EXPECT_FALSE((*reader)->RankStateOf(1).ok());

  for (const auto& ref : refs) {
    auto t = (*reader)->ReadTensor(ref.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype(), ref.local.dtype());
    ExpectSameValues(*t, ref.local);
  }
  // Converting on read: the bf16 tensor into fp32.
  Tensor b32 = Tensor::Zeros({8}, DType::kFloat32);
  ASSERT_TRUE((*reader)->ReadRegion("b", {0}, &b32).ok());
  ExpectSameValues(b32, b);
  // Unknown tensor and out-of-range regions are errors that say so.
  Tensor x = Tensor::Zeros({4}, DType::kFloat32);
  absl::Status s = (*reader)->ReadRegion("nope", {0}, &x);
  EXPECT_TRUE(absl::IsNotFound(s));
  EXPECT_NE(s.message().find("nope"), std::string::npos);
  s = (*reader)->ReadRegion("b", {6}, &x);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("[8]"), std::string::npos) << s;
}

TEST(CheckpointTest, LatestKeepLastAndResave) {
  const std::string dir = FreshDir("keep_last");
  EXPECT_TRUE(absl::IsNotFound(LatestIteration(dir).status()));
  EXPECT_FALSE(CheckpointReader::Open(dir).ok());
  SaveOptions opts;
  opts.keep_last = 2;
  for (int it : {10, 20, 30, 40}) {
    Tensor w = Tensor::Full({4, 4}, it, DType::kFloat32);
    ASSERT_TRUE(SaveCheckpoint(dir, it, {ShardedTensorRef::Replicated("w", w)},
                               MakeCommon(), {}, DistContext::Single(), opts)
                    .ok());
  }
  EXPECT_EQ(ListCheckpoints(dir), (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(*LatestIteration(dir), 40);
  // An older iteration opens explicitly.
  auto r30 = CheckpointReader::Open(dir, 30);
  ASSERT_TRUE(r30.ok()) << r30.status();
  EXPECT_EQ((*r30)->ReadTensor("w")->ToDoubles()[0], 30.0);
  EXPECT_FALSE(CheckpointReader::Open(dir, 10).ok());
  // Saving the same iteration again replaces it.
  Tensor w = Tensor::Full({4, 4}, 41, DType::kFloat32);
  ASSERT_TRUE(SaveCheckpoint(dir, 40, {ShardedTensorRef::Replicated("w", w)},
                             MakeCommon(), {}, DistContext::Single(), opts)
                  .ok());
  auto r40 = CheckpointReader::Open(dir);
  ASSERT_TRUE(r40.ok());
  EXPECT_EQ((*r40)->ReadTensor("w")->ToDoubles()[0], 41.0);
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000040.old"));
}

TEST(CheckpointTest, RotaryModelsLoadAtAnyPositionRange) {
  const std::string dir = FreshDir("config_rope");
  checkpoint::CommonState common = MakeCommon();
  common.mutable_model()->set_position_embedding_type(
      checkpoint::POSITION_EMBEDDING_ROPE);
  common.mutable_model()->set_max_position_embeddings(8192);
  common.mutable_model()->set_seq_length(8192);
  Tensor w = RandomTensor({4, 4}, DType::kFloat32, 6);
  ASSERT_TRUE(SaveCheckpoint(dir, 1, {ShardedTensorRef::Replicated("w", w)},
                             common, {}, DistContext::Single())
                  .ok());
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  checkpoint::ModelConfig run = common.model();
  run.set_max_position_embeddings(64);
  run.set_seq_length(64);
  EXPECT_TRUE((*reader)->CheckModelConfig(run).ok());
  // A learned table of the other size is another model.
  run.set_position_embedding_type(
      checkpoint::POSITION_EMBEDDING_LEARNED_ABSOLUTE);
  const absl::Status s = (*reader)->CheckModelConfig(run);
  EXPECT_NE(
      s.message().find("max_position_embeddings: checkpoint 8192, run 64"),
      std::string::npos)
      << s;
}

TEST(CheckpointTest, ModelConfigMismatchNamesTheField) {
  const std::string dir = FreshDir("config");
  Tensor w = RandomTensor({64, 64}, DType::kFloat32, 5);
  ASSERT_TRUE(SaveCheckpoint(dir, 1, {ShardedTensorRef::Replicated("w", w)},
                             MakeCommon(), {}, DistContext::Single())
                  .ok());
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  checkpoint::ModelConfig run = MakeCommon().model();
  EXPECT_TRUE((*reader)->CheckModelConfig(run).ok());
  // The vocabulary padding is the writing layout's, not the model's (an
  // unset vocab_size, as older writers left it, is the padded one).
  run.set_vocab_size(128);
  run.set_padded_vocab_size(256);
  EXPECT_TRUE((*reader)->CheckModelConfig(run).ok());
  // The sequence length is the run's; so is the position range of rotary
  // models (no table), but not of learned positions.
  run.set_seq_length(run.seq_length() + 7);
  EXPECT_TRUE((*reader)->CheckModelConfig(run).ok());
  run.set_max_position_embeddings(run.max_position_embeddings() + 5);
  EXPECT_NE((*reader)->CheckModelConfig(run).message().find(
                "max_position_embeddings: checkpoint"),
            std::string::npos);
  run.set_max_position_embeddings(run.max_position_embeddings() - 5);
  run.set_vocab_size(100);
  EXPECT_NE((*reader)->CheckModelConfig(run).message().find(
                "vocab_size: checkpoint 128, run 100"),
            std::string::npos);
  run.set_vocab_size(0);
  run.set_hidden_size(128);
  absl::Status s = (*reader)->CheckModelConfig(run);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_NE(s.message().find("hidden_size: checkpoint 64, run 128"),
            std::string::npos)
      << s;
  // Loading into a tensor of the other hidden size fails with both shapes.
  Tensor big = Tensor::Zeros({128, 128}, DType::kFloat32);
  s = (*reader)->Load({ShardedTensorRef::Replicated("w", big)});
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("[64, 64]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[128, 128]"), std::string::npos) << s;
}

// Runs fn(rank) on world threads.
void RunRanks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

TEST(CheckpointTest, DataParallelReplicasWriteEachShardOnceSpreadOverRanks) {
  // 4 ranks: tp = 2, dp = 2. Rank r holds TP piece r % 2 of 8 equal-sized
  // weights, and a replicated bias.
  const std::string dir = FreshDir("dp_spread");
  const int world = 4, tp = 2, num_weights = 8;
  std::vector<Tensor> full;
  for (int i = 0; i < num_weights; ++i) {
    full.push_back(RandomTensor({8, 6}, DType::kFloat32, 100 + i));
  }
  Tensor bias = RandomTensor({6}, DType::kFloat32, 99);
  InProcessGroup group(world);
  std::vector<absl::Status> status(world);
  RunRanks(world, [&](int rank) {
    std::vector<ShardedTensorRef> refs;
    for (int i = 0; i < num_weights; ++i) {
      refs.push_back(ShardedTensorRef::SplitAlong(
          absl::StrCat("w", i),
          testing_util::SliceDim(full[i], 0, 4 * (rank % tp), 4), 0, rank % tp,
          tp));
    }
    refs.push_back(ShardedTensorRef::Replicated("bias", bias));
    status[rank] = SaveCheckpoint(dir, 7, refs, MakeCommon(),
                                  MakeRankState(rank), group.Context(rank));
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];

  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::map<int, int64_t> bytes_by_writer;
  for (const auto& t : (*reader)->metadata().tensors()) {
    // Exactly one record per distinct shard.
    EXPECT_EQ(t.shards_size(), t.name() == "bias" ? 1 : tp) << t.name();
    for (const auto& s : t.shards())
      bytes_by_writer[s.writer_rank()] += s.byte_length();
  }
  // Every rank writes, and no rank writes more than its fair share plus one
  // shard.
  EXPECT_EQ(bytes_by_writer.size(), 4u);
  for (const auto& [rank, bytes] : bytes_by_writer) {
    EXPECT_LE(bytes, (8 * 8 * 6 * 4 + 6 * 4) / 4 + 4 * 6 * 4)
        << "rank " << rank;
  }
  for (int r = 0; r < world; ++r) {
    auto rs = (*reader)->RankStateOf(r);
    ASSERT_TRUE(rs.ok());
    EXPECT_EQ(rs->rng_states().at("cpu"), absl::StrCat("cpu-rng-of-rank-", r));
  }
  for (int i = 0; i < num_weights; ++i) {
    ExpectSameValues(*(*reader)->ReadTensor(absl::StrCat("w", i)), full[i]);
  }
}

TEST(CheckpointTest, InconsistentRanksFailEverywhere) {
  const std::string dir = FreshDir("inconsistent");
  InProcessGroup group(2);
  std::vector<absl::Status> status(2);
  RunRanks(2, [&](int rank) {
    // Rank 1 claims another global shape for the same tensor.
    Tensor t = Tensor::Zeros({4, rank == 0 ? 4 : 5}, DType::kFloat32);
    status[rank] =
        SaveCheckpoint(dir, 1, {ShardedTensorRef::Replicated("w", t)},
                       MakeCommon(), {}, group.Context(rank));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsInvalidArgument(status[r])) << status[r];
    EXPECT_NE(status[r].message().find("tensor w"), std::string::npos);
  }
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000001"));
  EXPECT_FALSE(file_util::Exists(dir + "/iter_0000001.tmp"));
  EXPECT_TRUE(absl::IsNotFound(LatestIteration(dir).status()));

  // Shards that leave a hole are refused too.
  RunRanks(2, [&](int rank) {
    Tensor t = Tensor::Zeros({2, 4}, DType::kFloat32);
    ShardedTensorRef ref{"w", {8, 4}, {rank * 2, 0}, t};
    status[rank] =
        SaveCheckpoint(dir, 1, {ref}, MakeCommon(), {}, group.Context(rank));
  });
  EXPECT_NE(status[0].message().find("cover 16 of 32"), std::string::npos)
      << status[0];
}

TEST(CheckpointTest, AsyncSaveSnapshotsTensorsAtStart) {
  const std::string dir = FreshDir("async");
  Tensor w = RandomTensor({256, 64}, DType::kFloat32, 8);
  const std::vector<double> before = w.ToDoubles();
  AsyncCheckpointSaver saver;
  for (int it = 1; it <= 3; ++it) {
    std::vector<ShardedTensorRef> refs = {ShardedTensorRef::Replicated("w", w)};
    ASSERT_TRUE(saver
                    .Start(dir, it, refs, MakeCommon(), MakeRankState(0),
                           DistContext::Single())
                    .ok());
    EXPECT_EQ(saver.iteration(), it);
    // Training goes on and changes the weights while the save runs.
    w.Fill(-1.0 * it);
  }
  ASSERT_TRUE(saver.Wait().ok());
  EXPECT_FALSE(saver.in_flight());
  EXPECT_EQ(*LatestIteration(dir), 3);
  auto r1 = CheckpointReader::Open(dir, 1);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ((*r1)->ReadTensor("w")->ToDoubles(), before);
  auto r3 = CheckpointReader::Open(dir, 3);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ((*r3)->ReadTensor("w")->ToDoubles()[0], -2.0);
}

TEST(CheckpointTest, AsyncSaveAcrossRanks) {
  // Each rank's saver runs the collectives from its background thread.
  const std::string dir = FreshDir("async_ranks");
  Tensor full = RandomTensor({8, 6}, DType::kFloat32, 21);
  InProcessGroup group(2);
  std::vector<absl::Status> status(2);
  RunRanks(2, [&](int rank) {
    AsyncCheckpointSaver saver;
    Tensor mine = testing_util::SliceDim(full, 1, 3 * rank, 3);
    for (int it = 1; it <= 2; ++it) {
      absl::Status s = saver.Start(
          dir, it, {ShardedTensorRef::SplitAlong("w", mine, 1, rank, 2)},
          MakeCommon(), MakeRankState(rank), group.Context(rank));
      if (!s.ok()) status[rank] = s;
      mine.Fill(0.0);  // Changed after the snapshot: not saved.
      mine.CopyFrom(testing_util::SliceDim(full, 1, 3 * rank, 3)).IgnoreError();
    }
    absl::Status s = saver.Wait();
    if (!s.ok()) status[rank] = s;
  });
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(*LatestIteration(dir), 2);
  auto reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok());
  ExpectSameValues(*(*reader)->ReadTensor("w"), full);
}

TEST(SavePlanTest, WritersBalanceBytes) {
  // 8 replicas of 16 equal shards: each rank should write 2.
  std::vector<checkpoint::RankManifest> manifests(8);
  for (int r = 0; r < 8; ++r) {
    for (int i = 0; i < 16; ++i) {
      auto* t = manifests[r].add_tensors();
      t->set_name(absl::StrCat("t", i));
      t->add_global_shape(10);
      auto* s = t->add_shards();
      s->add_global_offsets(0);
      s->add_local_shape(10);
    }
  }
  auto plan = PlanSave(manifests);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 16u);
  std::map<int, int> count;
  for (const auto& p : *plan) ++count[p.writer];
  EXPECT_EQ(count.size(), 8u);
  for (const auto& [r, n] : count) EXPECT_EQ(n, 2) << "rank " << r;
}

}  // namespace
}  // namespace mcc
