// cuBLAS and cuBLASLt load lazily: nothing is mapped before the first
// LoadCublas, and after it every function of the table resolves.
#include "core/ops/cuda/cublas_library.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

TEST(CublasLibraryTest, LoadsOnlyOnFirstUseAndResolvesEveryFunction) {
  ASSERT_FALSE(CublasLoaded());
  EXPECT_FALSE(Mapped("libcublasLt.so")) << "linked, not loaded lazily";
  EXPECT_FALSE(Mapped("libcublas.so")) << "linked, not loaded lazily";

  absl::StatusOr<const CublasLibrary*> lib = LoadCublas();
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_TRUE(CublasLoaded());
  EXPECT_TRUE(Mapped("libcublasLt.so"));
  EXPECT_TRUE(Mapped("libcublas.so"));
#define MCC_EXPECT_RESOLVED(name) EXPECT_NE((*lib)->name, nullptr) << #name;
  MCC_CUBLAS_FUNCTIONS(MCC_EXPECT_RESOLVED)
  MCC_CUBLAS_OVERLOADED_FUNCTIONS(MCC_EXPECT_RESOLVED)
  MCC_CUBLASLT_FUNCTIONS(MCC_EXPECT_RESOLVED)
#undef MCC_EXPECT_RESOLVED

  // The same table every time; a host-only function works without a GPU.
  EXPECT_EQ(*LoadCublas(), *lib);
  EXPECT_EQ(&Cublas(), *lib);
  EXPECT_STREQ(Cublas().cublasGetStatusString(CUBLAS_STATUS_SUCCESS),
               "success");
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
