#include "core/ops/paged_attention.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/cached_attention.h"
#include "core/ops/rotary.h"
#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectAllNear;
using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

constexpr int64_t kBlocks = 12, kBlockSize = 4, kGroups = 2, kHeads = 4,
                  kDim = 8;

// Three sequences of lengths 7, 1 and 10 in shuffled blocks of the pool,
// their keys and values also laid out contiguously for CachedAttention.
struct Fixture {
  std::vector<int64_t> lengths = {7, 1, 10};
  std::vector<std::vector<int32_t>> tables;
  Tensor k_pool, v_pool;
  std::vector<Tensor> k_seq, v_seq;  // [1, length, groups, d] each

  Fixture() {
    std::vector<int32_t> order(kBlocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
    k_pool =
        Tensor::Zeros({kBlocks, kBlockSize, kGroups, kDim}, DType::kFloat32);
    v_pool = Tensor::Zeros(k_pool.shape(), DType::kFloat32);
    size_t next = 0;
    uint32_t seed = 11;
    const int64_t row = kGroups * kDim;
    for (int64_t len : lengths) {
      std::vector<int32_t>& t = tables.emplace_back();
      for (int64_t b = 0; b < (len + kBlockSize - 1) / kBlockSize; ++b) {
        t.push_back(order[next++]);
      }
      k_seq.push_back(
          RandomTensor({1, len, kGroups, kDim}, DType::kFloat32, seed++));
      v_seq.push_back(
          RandomTensor({1, len, kGroups, kDim}, DType::kFloat32, seed++));
      for (int64_t p = 0; p < len; ++p) {
        const int64_t slot = t[p / kBlockSize] * kBlockSize + p % kBlockSize;
        std::memcpy(k_pool.data<float>() + slot * row,
                    k_seq.back().data<float>() + p * row, row * sizeof(float));
        std::memcpy(v_pool.data<float>() + slot * row,
                    v_seq.back().data<float>() + p * row, row * sizeof(float));
      }
    }
  }

  // Rows: sequence s at position p, for the given (s, p) pairs.
  Tensor Tables(const std::vector<std::pair<int, int64_t>>& rows) const {
    const int64_t max_blocks = kBlocks;
    std::vector<int64_t> v(rows.size() * max_blocks, 0);
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<int32_t>& t = tables[rows[r].first];
      std::copy(t.begin(), t.end(), v.begin() + r * max_blocks);
    }
    return *Tensor::FromInts(v, {static_cast<int64_t>(rows.size()), max_blocks},
                             DType::kInt32);
  }
  static Tensor Positions(const std::vector<std::pair<int, int64_t>>& rows) {
    std::vector<int64_t> v;
    for (const auto& r : rows) v.push_back(r.second);
    return *Tensor::FromInts(v, {static_cast<int64_t>(rows.size())});
  }
};

TEST(PagedAttentionTest, MatchesCachedAttentionOverEachSequence) {
  Fixture f;
  const std::vector<std::pair<int, int64_t>> rows = {
      {0, 6}, {2, 3}, {1, 0}, {2, 9}, {0, 0}};
  const int64_t n = static_cast<int64_t>(rows.size());
  const Tensor q = RandomTensor({n, kHeads, kDim}, DType::kFloat32, 3);
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32);
  ASSERT_TRUE(PagedAttention(q, f.k_pool, f.v_pool, f.Tables(rows),
                             Fixture::Positions(rows), &out)
                  .ok());
  for (int64_t r = 0; r < n; ++r) {
    const auto [s, p] = rows[r];
    Tensor qr = *q.Slice(r, r + 1)->Reshape({1, 1, kHeads, kDim});
    Tensor want = Tensor::Empty(qr.shape(), DType::kFloat32);
    ASSERT_TRUE(CachedAttention(qr, f.k_seq[s], f.v_seq[s], p, &want).ok());
    ExpectAllNear(out.Slice(r, r + 1)->ToDoubles(), want.ToDoubles(), 1e-6,
                  1e-5, "row " + std::to_string(r));
  }
}

// A sliding window: row (s, p) attends to positions p - window .. p only,
// as CachedAttention over those keys alone; table entries of blocks wholly
// before the window (freed by the engine) are never read (here -1).
TEST(PagedAttentionTest, SlidingWindowReadsOnlyTheWindow) {
  Fixture f;
  const int64_t window = 5;
  const std::vector<std::pair<int, int64_t>> rows = {
      {0, 6}, {2, 3}, {1, 0}, {2, 9}, {2, 5}};
  const int64_t n = static_cast<int64_t>(rows.size());
  const Tensor q = RandomTensor({n, kHeads, kDim}, DType::kFloat32, 7);
  Tensor tables = f.Tables(rows);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t first = std::max<int64_t>(0, rows[r].second - window);
    for (int64_t b = 0; b < first / kBlockSize; ++b) {
      tables.data<int32_t>()[r * tables.size(1) + b] = -1;
    }
  }
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32);
  ASSERT_TRUE(PagedAttention(q, f.k_pool, f.v_pool, tables,
                             Fixture::Positions(rows), &out, window)
                  .ok());
  const int64_t row = kGroups * kDim;
  for (int64_t r = 0; r < n; ++r) {
    const auto [s, p] = rows[r];
    const int64_t first = std::max<int64_t>(0, p - window);
    const int64_t keys = p - first + 1;
    Tensor k = Tensor::Empty({1, keys, kGroups, kDim}, DType::kFloat32);
    Tensor v = Tensor::Empty(k.shape(), DType::kFloat32);
    std::memcpy(k.data<float>(), f.k_seq[s].data<float>() + first * row,
                keys * row * sizeof(float));
    std::memcpy(v.data<float>(), f.v_seq[s].data<float>() + first * row,
                keys * row * sizeof(float));
    Tensor qr = *q.Slice(r, r + 1)->Reshape({1, 1, kHeads, kDim});
    Tensor want = Tensor::Empty(qr.shape(), DType::kFloat32);
    ASSERT_TRUE(CachedAttention(qr, k, v, keys - 1, &want).ok());
    ExpectAllNear(out.Slice(r, r + 1)->ToDoubles(), want.ToDoubles(), 1e-6,
                  1e-5, "row " + std::to_string(r));
  }
  // Without the window the freed entries are read, and refused by name.
  const absl::Status s = PagedAttention(q, f.k_pool, f.v_pool, tables,
                                        Fixture::Positions(rows), &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block -1"), std::string::npos) << s;
}

TEST(PagedAttentionTest, ARowIsTheSameBitsAloneOrBatched) {
  Fixture f;
  const std::vector<std::pair<int, int64_t>> rows = {{2, 9}, {0, 4}, {1, 0}};
  const Tensor q = RandomTensor({3, kHeads, kDim}, DType::kFloat32, 4);
  Tensor batched = Tensor::Empty(q.shape(), DType::kFloat32);
  ASSERT_TRUE(PagedAttention(q, f.k_pool, f.v_pool, f.Tables(rows),
                             Fixture::Positions(rows), &batched)
                  .ok());
  for (int64_t r = 0; r < 3; ++r) {
    Tensor alone = Tensor::Empty({1, kHeads, kDim}, DType::kFloat32);
    ASSERT_TRUE(PagedAttention(*q.Slice(r, r + 1), f.k_pool, f.v_pool,
                               f.Tables({rows[r]}),
                               Fixture::Positions({rows[r]}), &alone)
                    .ok());
    EXPECT_EQ(std::memcmp(alone.raw_data(), batched.Slice(r, r + 1)->raw_data(),
                          alone.nbytes()),
              0)
        << "row " << r;
  }
}

TEST(PagedAttentionTest, SameOnTheTestDevice) {
  Fixture f;
  const std::vector<std::pair<int, int64_t>> rows = {{0, 5}, {2, 8}};
  ExpectSameOnTestDevice(
      {RandomTensor({2, kHeads, kDim}, DType::kFloat32, 6), f.k_pool, f.v_pool,
       f.Tables(rows), Fixture::Positions(rows),
       Tensor::Zeros({2, kHeads, kDim}, DType::kFloat32)},
      [](std::vector<Tensor>& t) {
        return PagedAttention(t[0], t[1], t[2], t[3], t[4], &t[5]);
      });
}

TEST(PagedAttentionTest, ABlockOutsideThePoolIsAnError) {
  Fixture f;
  Tensor tables = f.Tables({{0, 6}});
  tables.data<int32_t>()[1] = kBlocks;  // The second block of position 6.
  Tensor out = Tensor::Zeros({1, kHeads, kDim}, DType::kFloat32);
  const absl::Status s = PagedAttention(
      RandomTensor({1, kHeads, kDim}, DType::kFloat32, 1), f.k_pool, f.v_pool,
      tables, Fixture::Positions({{0, 6}}), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("block 12 of row 0"), std::string::npos) << s;
}

TEST(PagedKvWriteTest, WritesEachRowAtItsSlot) {
  Tensor k_pool = Tensor::Zeros({3, 2, kGroups, kDim}, DType::kFloat32);
  Tensor v_pool = Tensor::Zeros(k_pool.shape(), DType::kFloat32);
  const Tensor k = RandomTensor({2, kGroups, kDim}, DType::kFloat32, 7);
  const Tensor v = RandomTensor({2, kGroups, kDim}, DType::kFloat32, 8);
  const Tensor slots = *Tensor::FromInts({5, 0}, {2});
  const std::vector<Tensor> cpu = ExpectSameOnTestDevice(
      {k, v, slots, k_pool, v_pool}, [](std::vector<Tensor>& t) {
        return PagedKvWrite(t[0], t[1], t[2], &t[3], &t[4]);
      });
  const int64_t row = kGroups * kDim;
  EXPECT_EQ(std::memcmp(cpu[3].data<float>() + 5 * row, k.data<float>(),
                        row * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(cpu[4].data<float>(), v.data<float>() + row,
                        row * sizeof(float)),
            0);
  EXPECT_EQ(cpu[3].data<float>()[row], 0.0f);  // Slot 1 untouched.
  Tensor bad = *Tensor::FromInts({6, 0}, {2});
  EXPECT_EQ(PagedKvWrite(k, v, bad, &k_pool, &v_pool).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RotaryAtPositionsTest, EachRowAsRotaryForwardAtItsPosition) {
  RotaryOptions options;
  options.base = 500000;
  options.llama3.enabled = true;
  options.llama3.original_max_position_embeddings = 16;
  const std::vector<int64_t> pos = {3, 0, 41};
  const Tensor x = RandomTensor({3, kHeads, kDim}, DType::kFloat32, 9);
  const std::vector<Tensor> cpu = ExpectSameOnTestDevice(
      {x, *Tensor::FromInts(pos, {3}),
       Tensor::Zeros(x.shape(), DType::kFloat32)},
      [&](std::vector<Tensor>& t) {
        return RotaryAtPositions(t[0], t[1], options, &t[2]);
      });
  for (int64_t r = 0; r < 3; ++r) {
    RotaryOptions at = options;
    at.position_offset = pos[r];
    Tensor xr = *x.Slice(r, r + 1)->Reshape({1, 1, kHeads, kDim});
    Tensor want = Tensor::Empty(xr.shape(), DType::kFloat32);
    ASSERT_TRUE(RotaryForward(xr, at, &want).ok());
    ExpectAllNear(cpu[2].Slice(r, r + 1)->ToDoubles(), want.ToDoubles(), 1e-6,
                  1e-6, "row " + std::to_string(r));
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
