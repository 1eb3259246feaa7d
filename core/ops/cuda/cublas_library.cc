#include "core/ops/cuda/cublas_library.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

#define MCC_CUBLAS_STRINGIFY_EXPANDED(x) #x
#define MCC_CUBLAS_STRINGIFY(x) MCC_CUBLAS_STRINGIFY_EXPANDED(x)

constexpr char kFallbackDir[] = "/usr/local/cuda/lib64/";

// Opens the soname of the major version the headers declare (the ABI they
// describe), first where dlopen looks, then under kFallbackDir.
absl::StatusOr<void*> Open(const std::string& stem) {
  const std::string soname =
      absl::StrCat(stem, ".so.", MCC_CUBLAS_STRINGIFY(CUBLAS_VER_MAJOR));
  // RTLD_GLOBAL: libcublas finds libcublasLt's symbols already loaded.
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle != nullptr) return handle;
  const std::string first_error = dlerror();
  const std::string fallback = kFallbackDir + soname;
  handle = dlopen(fallback.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle != nullptr) return handle;
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot load ", soname, " (needed by the CUDA GEMM): ", first_error,
      "; then ", fallback, ": ", dlerror(),
      ". Put the CUDA toolkit's lib64 on LD_LIBRARY_PATH."));
}

template <typename Fn>
absl::Status Resolve(void* library, const char* library_name,
                     const char* symbol, Fn* out) {
  dlerror();
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(library_name, " has no ", symbol,
                     " (a cuBLAS older than the headers "
                     "this was built with?)"));
  }
  *out = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

// Each typed form matches the header's declaration of the exported symbol
// (unevaluated: nothing is linked).
#define MCC_CUBLAS_CHECK_TYPE(name)                                      \
  static_assert(                                                         \
      std::is_same_v<decltype(static_cast<cublas_types::name>(&::name)), \
                     cublas_types::name>,                                \
      #name);
MCC_CUBLAS_OVERLOADED_FUNCTIONS(MCC_CUBLAS_CHECK_TYPE)
#undef MCC_CUBLAS_CHECK_TYPE

absl::Status LoadInto(CublasLibrary* lib) {
  // cuBLASLt first: libcublas depends on it.
  absl::StatusOr<void*> lt = Open("libcublasLt");
  if (!lt.ok()) return lt.status();
  absl::StatusOr<void*> blas = Open("libcublas");
  if (!blas.ok()) return blas.status();
#define MCC_CUBLAS_RESOLVE(library, name)                                      \
  if (absl::Status s =                                                         \
          Resolve(*library, #library, MCC_CUBLAS_STRINGIFY(name), &lib->name); \
      !s.ok()) {                                                               \
    return s;                                                                  \
  }
#define MCC_RESOLVE_BLAS(name) MCC_CUBLAS_RESOLVE(blas, name)
#define MCC_RESOLVE_LT(name) MCC_CUBLAS_RESOLVE(lt, name)
  MCC_CUBLAS_FUNCTIONS(MCC_RESOLVE_BLAS)
  MCC_CUBLAS_OVERLOADED_FUNCTIONS(MCC_RESOLVE_BLAS)
  MCC_CUBLASLT_FUNCTIONS(MCC_RESOLVE_LT)
#undef MCC_RESOLVE_LT
#undef MCC_RESOLVE_BLAS
#undef MCC_CUBLAS_RESOLVE
  return absl::OkStatus();
}

absl::once_flag g_once;
CublasLibrary* g_library = nullptr;  // Never freed: handles outlive main.
absl::Status* g_error = nullptr;
std::atomic<bool> g_loaded{false};

}  // namespace

absl::StatusOr<const CublasLibrary*> LoadCublas() {
  absl::call_once(g_once, [] {
    auto* lib = new CublasLibrary;
    absl::Status status = LoadInto(lib);
    if (status.ok()) {
      VLOG(1) << "Loaded cuBLAS and cuBLASLt " << CUBLAS_VER_MAJOR;
      g_library = lib;
      g_loaded.store(true, std::memory_order_release);
    } else {
      delete lib;
      g_error = new absl::Status(std::move(status));
    }
  });
  if (g_library == nullptr) return *g_error;
  return g_library;
}

const CublasLibrary& Cublas() {
  absl::StatusOr<const CublasLibrary*> lib = LoadCublas();
  CHECK(lib.ok()) << lib.status();
  return **lib;
}

bool CublasLoaded() { return g_loaded.load(std::memory_order_acquire); }

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
