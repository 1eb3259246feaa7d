#ifndef CORE_OPS_CPU_ISA_H_
#define CORE_OPS_CPU_ISA_H_

// The vector instruction set the CPU kernels use, chosen at run time.
//
// The build targets AVX2 + FMA + F16C (every supported machine has them);
// kernels that gain from 512-bit vectors also carry an AVX-512 version,
// compiled with a target attribute and taken only where the CPU and the
// operating system support AVX-512 F, VL, BW and DQ. Both versions compute
// the same sums in the same order where a kernel says so; tests run both.

namespace mcc {
namespace ops {

enum class CpuIsa { kAvx2, kAvx512 };

// The widest ISA for kernels on this machine. MCC_CPU_ISA=avx2 caps it (to
// compare paths, or to rule a path out); any other value is an error.
CpuIsa KernelIsa();
const char* CpuIsaName(CpuIsa isa);
// What the CPU itself supports (ignores MCC_CPU_ISA).
bool CpuSupportsAvx512();
// AVX-512 plus the bf16 dot-product instruction (AVX512-BF16, vdpbf16ps).
bool CpuSupportsAvx512Bf16();

namespace internal {
// For tests: the ISA the kernels use from now on (kAvx512 only where the CPU
// supports it; returns the previous value).
CpuIsa SetKernelIsaForTesting(CpuIsa isa);
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CPU_ISA_H_
