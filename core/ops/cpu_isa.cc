#include "core/ops/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "glog/logging.h"

namespace mcc {
namespace ops {
namespace {

CpuIsa DetectIsa() {
  const char* env = std::getenv("MCC_CPU_ISA");
  if (env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v == "avx2") return CpuIsa::kAvx2;
    if (v != "avx512") {
      LOG(FATAL) << "MCC_CPU_ISA must be avx2 or avx512, got '" << v << "'";
    }
    if (!CpuSupportsAvx512()) {
      LOG(FATAL) << "MCC_CPU_ISA=avx512, but this CPU (or its operating "
                    "system) does not support AVX-512";
    }
  }
  return CpuSupportsAvx512() ? CpuIsa::kAvx512 : CpuIsa::kAvx2;
}

std::atomic<int> g_isa{-1};

}  // namespace

bool CpuSupportsAvx512() {
  // libgcc's checks include the OS's XSAVE support for the 512-bit state.
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  return supported;
}

bool CpuSupportsAvx512Bf16() {
  static const bool supported =
      CpuSupportsAvx512() && __builtin_cpu_supports("avx512bf16");
  return supported;
}

CpuIsa KernelIsa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    int expected = -1;
    g_isa.compare_exchange_strong(expected, static_cast<int>(DetectIsa()));
    isa = g_isa.load(std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(isa);
}

const char* CpuIsaName(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 ? "AVX-512" : "AVX2";
}

namespace internal {

CpuIsa SetKernelIsaForTesting(CpuIsa isa) {
  const CpuIsa previous = KernelIsa();
  if (isa == CpuIsa::kAvx512 && !CpuSupportsAvx512()) isa = CpuIsa::kAvx2;
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return previous;
}

}  // namespace internal
}  // namespace ops
}  // namespace mcc
