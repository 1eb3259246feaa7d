// The FP8 matmul's plan key (fp8_lt_gemm.h): every field that decides what
// cuBLASLt is asked gives a distinct key (so no call can take another's
// descriptors or algorithm), equal keys hit the cached plan, and a call's
// arguments reach the key. Needs no GPU.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "core/fp8.h"
#include "core/ops/cuda/fp8_lt_gemm.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/lt_plan_cache.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using internal::Fp8LtArgs;
using internal::Fp8LtPlanKey;
using internal::Fp8LtPlanKeyOf;

// A key with every field away from its default, so that setting a field
// back to the default also changes it.
Fp8LtPlanKey Base() {
  Fp8LtPlanKey key;
  key.device = 1;
  key.m = 4096;
  key.n = 512;
  key.k = 1024;
  key.ld_first = 1024;
  key.ld_second = 1024;
  key.ldc = 4096;
  key.first_type = CUDA_R_8F_E4M3;
  key.second_type = CUDA_R_8F_E5M2;
  key.c_type = CUDA_R_16BF;
  key.max_workspace = uint64_t{32} << 20;
  key.c_alignment = 256;
  return key;
}

struct FieldChange {
  std::string field;
  std::function<void(Fp8LtPlanKey*)> change;
};

// One change per field of Fp8LtPlanKey. A new field needs a row here (the
// size check below fails until the struct's size is updated beside it).
std::vector<FieldChange> EveryField() {
  return {
      {"device", [](Fp8LtPlanKey* k) { k->device = 0; }},
      {"m", [](Fp8LtPlanKey* k) { k->m = 4080; }},
      {"n", [](Fp8LtPlanKey* k) { k->n = 513; }},
      {"k", [](Fp8LtPlanKey* k) { k->k = 1040; }},
      {"ld_first", [](Fp8LtPlanKey* k) { k->ld_first = 1040; }},
      {"ld_second", [](Fp8LtPlanKey* k) { k->ld_second = 1040; }},
      {"ldc", [](Fp8LtPlanKey* k) { k->ldc = 4112; }},
      {"first_type", [](Fp8LtPlanKey* k) { k->first_type = CUDA_R_8F_E5M2; }},
      {"second_type", [](Fp8LtPlanKey* k) { k->second_type = CUDA_R_8F_E4M3; }},
      {"c_type", [](Fp8LtPlanKey* k) { k->c_type = CUDA_R_32F; }},
      {"scale_type", [](Fp8LtPlanKey* k) { k->scale_type = CUDA_R_16BF; }},
      {"compute",
       [](Fp8LtPlanKey* k) { k->compute = CUBLAS_COMPUTE_32F_FAST_TF32; }},
      {"op_first", [](Fp8LtPlanKey* k) { k->op_first = CUBLAS_OP_N; }},
      {"op_second", [](Fp8LtPlanKey* k) { k->op_second = CUBLAS_OP_T; }},
      {"first_scale_mode",
       [](Fp8LtPlanKey* k) {
         k->first_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
       }},
      {"second_scale_mode",
       [](Fp8LtPlanKey* k) {
         k->second_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
       }},
      {"epilogue",
       [](Fp8LtPlanKey* k) { k->epilogue = CUBLASLT_EPILOGUE_BIAS; }},
      {"max_workspace",
       [](Fp8LtPlanKey* k) { k->max_workspace = uint64_t{4} << 20; }},
      {"c_alignment", [](Fp8LtPlanKey* k) { k->c_alignment = 16; }},
  };
}

// Guards the list above: a field added to the key changes its size.
static_assert(sizeof(Fp8LtPlanKey) == 112,
              "Fp8LtPlanKey changed: give every new field a row in "
              "EveryField() and Tie(), then update this size");

TEST(Fp8LtPlanKeyTest, EveryFieldMakesADistinctKey) {
  const Fp8LtPlanKey base = Base();
  const std::vector<FieldChange> fields = EveryField();
  EXPECT_EQ(fields.size(), std::tuple_size<decltype(base.Tie())>::value)
      << "every field in Tie() needs a row";
  std::vector<Fp8LtPlanKey> keys = {base};
  for (const FieldChange& f : fields) {
    Fp8LtPlanKey changed = base;
    f.change(&changed);
    EXPECT_NE(changed, base) << f.field << " does not reach the key";
    EXPECT_NE(absl::Hash<Fp8LtPlanKey>()(changed),
              absl::Hash<Fp8LtPlanKey>()(base))
        << f.field << " does not reach the hash";
    keys.push_back(changed);
  }
  // Through the cache: one plan per key, and each key finds its own.
  LtPlanCache<Fp8LtPlanKey, int> cache(keys.size());
  int built = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto plan =
        cache.GetOrMake(keys[i], [&]() -> absl::StatusOr<std::unique_ptr<int>> {
          ++built;
          return std::make_unique<int>(static_cast<int>(i));
        });
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(**plan, static_cast<int>(i))
        << (i == 0 ? std::string("base") : fields[i - 1].field)
        << " took another key's plan";
  }
  EXPECT_EQ(built, static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    auto plan =
        cache.GetOrMake(keys[i], [&]() -> absl::StatusOr<std::unique_ptr<int>> {
          ++built;
          return std::make_unique<int>(-1);
        });
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(**plan, static_cast<int>(i));
  }
  EXPECT_EQ(built, static_cast<int>(keys.size())) << "an equal key missed";
}

TEST(Fp8LtPlanKeyTest, ACallsArgumentsReachTheKey) {
  absl::StatusOr<Fp8LtArgs> args =
      internal::Fp8LtGemmArgs({64, 32}, false, Fp8Format::kE4M3, {48, 32}, true,
                              Fp8Format::kE5M2, DType::kBFloat16);
  ASSERT_TRUE(args.ok()) << args.status();
  const Fp8LtPlanKey key = Fp8LtPlanKeyOf(*args, 3, 64);
  EXPECT_EQ(key.device, 3);
  EXPECT_EQ(key.c_alignment, 64u);
  EXPECT_EQ(key.m, args->m);
  EXPECT_EQ(key.n, args->n);
  EXPECT_EQ(key.k, args->k);
  EXPECT_EQ(key.ld_first, args->ld_first);
  EXPECT_EQ(key.ld_second, args->ld_second);
  EXPECT_EQ(key.ldc, args->ldc);
  EXPECT_EQ(key.first_type, CUDA_R_8F_E5M2);  // b's format: b goes first.
  EXPECT_EQ(key.second_type, CUDA_R_8F_E4M3);
  EXPECT_EQ(key.c_type, CUDA_R_16BF);
  EXPECT_EQ(key.op_first, CUBLAS_OP_T);
  EXPECT_EQ(key.op_second, CUBLAS_OP_N);
  EXPECT_EQ(key.compute, CUBLAS_COMPUTE_32F);
  EXPECT_EQ(key.scale_type, CUDA_R_32F);
  EXPECT_EQ(key.epilogue, CUBLASLT_EPILOGUE_DEFAULT);
  EXPECT_EQ(key.first_scale_mode, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
  EXPECT_EQ(key.second_scale_mode, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
  EXPECT_EQ(key.max_workspace, kCublasLtWorkspaceBytes);

  // The same call again is the same key; another c dtype, format or
  // device is not.
  EXPECT_EQ(Fp8LtPlanKeyOf(*args, 3, 64), key);
  EXPECT_NE(Fp8LtPlanKeyOf(*args, 2, 64), key);
  EXPECT_NE(Fp8LtPlanKeyOf(*args, 3, 32), key);
  absl::StatusOr<Fp8LtArgs> fp32_c =
      internal::Fp8LtGemmArgs({64, 32}, false, Fp8Format::kE4M3, {48, 32}, true,
                              Fp8Format::kE5M2, DType::kFloat32);
  ASSERT_TRUE(fp32_c.ok());
  EXPECT_NE(Fp8LtPlanKeyOf(*fp32_c, 3, 64), key);
  absl::StatusOr<Fp8LtArgs> e4m3 =
      internal::Fp8LtGemmArgs({64, 32}, false, Fp8Format::kE4M3, {48, 32}, true,
                              Fp8Format::kE4M3, DType::kBFloat16);
  ASSERT_TRUE(e4m3.ok());
  EXPECT_NE(Fp8LtPlanKeyOf(*e4m3, 3, 64), key);
  absl::StatusOr<Fp8LtArgs> taller =
      internal::Fp8LtGemmArgs({80, 32}, false, Fp8Format::kE4M3, {48, 32}, true,
                              Fp8Format::kE5M2, DType::kBFloat16);
  ASSERT_TRUE(taller.ok());
  EXPECT_NE(Fp8LtPlanKeyOf(*taller, 3, 64), key);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
