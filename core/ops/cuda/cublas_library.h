// cuBLAS and cuBLASLt, loaded with dlopen on the first CUDA GEMM instead of
// linked. Loading libcublasLt costs every process that links it about half a
// second and 200 MB of mappings at start (measured here: `train --version`
// 1.01 s / 228 MB linked, 0.11 s / 13 MB without), although most runs of
// train and eval, and every CPU-only test, never call a cuBLAS function. Only
// the headers are needed at build time; the libraries are found the way
// dlopen finds them (LD_LIBRARY_PATH, the cache), then under
// /usr/local/cuda/lib64.
//
// The table holds exactly the functions this project calls, each typed by
// the header's own declaration, so a signature the header changes fails the
// build rather than the call.
#ifndef CORE_OPS_CUDA_CUBLAS_LIBRARY_H_
#define CORE_OPS_CUDA_CUBLAS_LIBRARY_H_

#include <cublasLt.h>
#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace mcc {
namespace ops {
namespace cuda {

// X(function) for each function of libcublas ...
#define MCC_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate)               \
  X(cublasSetStream)            \
  X(cublasGetStatusString)      \
  X(cublasGemmGroupedBatchedEx)

// ... those the header overloads in C++ (an inline form takes the old
// cudaDataType compute type), typed in cublas_types below ...
#define MCC_CUBLAS_OVERLOADED_FUNCTIONS(X) \
  X(cublasGemmEx)                          \
  X(cublasGemmStridedBatchedEx)

// ... and of libcublasLt.
#define MCC_CUBLASLT_FUNCTIONS(X)         \
  X(cublasLtCreate)                       \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)

// The exported forms of the overloaded functions (cublas_library.cc checks
// at compile time that the header declares exactly these).
namespace cublas_types {
using cublasGemmEx = cublasStatus_t (*)(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* a, cudaDataType a_type,
    int lda, const void* b, cudaDataType b_type, int ldb, const void* beta,
    void* c, cudaDataType c_type, int ldc, cublasComputeType_t compute_type,
    cublasGemmAlgo_t algo);
using cublasGemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const void* alpha, const void* a, cudaDataType a_type,
    int lda, long long stride_a, const void* b,        // NOLINT(runtime/int)
    cudaDataType b_type, int ldb, long long stride_b,  // NOLINT(runtime/int)
    const void* beta, void* c, cudaDataType c_type, int ldc, long long stride_c,
    int batch_count,  // NOLINT(runtime/int)
    cublasComputeType_t compute_type, cublasGemmAlgo_t algo);
}  // namespace cublas_types

// One pointer per function, named like the function (cublas_v2.h's macros
// such as cublasCreate -> cublasCreate_v2 apply to the member names too).
struct CublasLibrary {
#define MCC_CUBLAS_MEMBER(name) decltype(&::name) name = nullptr;
  MCC_CUBLAS_FUNCTIONS(MCC_CUBLAS_MEMBER)
  MCC_CUBLASLT_FUNCTIONS(MCC_CUBLAS_MEMBER)
#undef MCC_CUBLAS_MEMBER
#define MCC_CUBLAS_TYPED_MEMBER(name) cublas_types::name name = nullptr;
  MCC_CUBLAS_OVERLOADED_FUNCTIONS(MCC_CUBLAS_TYPED_MEMBER)
#undef MCC_CUBLAS_TYPED_MEMBER
};

// Loads both libraries and resolves every function once per process
// (thread-safe). The error names the library or symbol that failed and the
// paths tried; it is returned again on every later call.
absl::StatusOr<const CublasLibrary*> LoadCublas();

// The table, for callers that already hold a handle (so LoadCublas
// succeeded); dies otherwise.
const CublasLibrary& Cublas();

// Whether LoadCublas has succeeded in this process (tests check that a
// CPU-only run never loads it).
bool CublasLoaded();

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_CUBLAS_LIBRARY_H_
