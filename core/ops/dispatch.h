#ifndef CORE_OPS_DISPATCH_H_
#define CORE_OPS_DISPATCH_H_

// How every op in core/ops reaches its kernel: the one kernel path.
//
// An op is a function such as ops::Gelu(x, &y). It
//   1. validates its arguments once, device-independently: tensors defined,
//      dtypes, shapes, and that every tensor lives on one device (errors
//      name the op and the offending tensor; nothing is written on error);
//   2. calls its slot with that device and the same arguments:
//        return GeluKernels()(x.device(), x, y);
// There is no other path: no op branches on the device type, so a line of
// op code that runs on the CPU runs on every device.
//
// A slot (KernelSlot, core/kernel_slot.h) holds one kernel per device type.
// The CPU kernel is a named function registered where the op is defined,
// with the slot itself: MCC_KERNEL_SLOT(GeluKernel, GeluKernels, "Gelu",
// &GeluCpu), which also lists the slot for the coverage tests
// (AllKernelSlots()). A device library registers its own when it is linked
// in, e.g.
//   GemmKernels().Register(DeviceType::kCUDA, &CudaGemm);
// A device type without a kernel gets Unimplemented naming the op and the
// device. Host-backed devices (the test device, core/testing/test_device.h)
// run the CPU kernel on host views of their tensors unless a kernel of their
// own is registered.
//
// The contract every kernel keeps (each op's header states the rest: which
// outputs are overwritten and which accumulated into):
//   - It gets arguments the op has validated, and may assume them; it does
//     not validate again.
//   - Outputs are passed in, already allocated with the stated shape and
//     dtype; a kernel allocates nothing the caller sees. Outputs are
//     overwritten unless the op says it accumulates (+=).
//   - Work is issued on the device's current stream, in order with the work
//     before and after it; the kernel may return before the work is done.
//     Inputs must stay alive and unmodified until then (the caller's
//     stream order guarantees it).
//   - Nothing synchronises with the host unless the op says so (ops that
//     return a host value, such as Sum, do, and say it).
//   - Errors are returned, never fatal; a failed kernel leaves outputs
//     unspecified unless the op says otherwise.
//   - The CPU kernel runs on the calling thread (and ThreadPool::Global()),
//     so "the current stream" of the CPU is program order.
//
// Thread-safety: ops may be called from any thread; calls that write the
// same output tensor must not overlap.

#include "core/kernel_slot.h"

namespace mcc {
namespace ops {

using ::mcc::KernelSlot;

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_DISPATCH_H_
