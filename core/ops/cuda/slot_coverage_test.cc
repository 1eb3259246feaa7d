// Every dispatch slot of the program has a CUDA kernel once
// //core/ops/cuda:registrations is linked. The slots are enumerated, not
// listed by hand: MCC_KERNEL_SLOT (core/kernel_slot.h) lists each one at
// load time, and this test links every library that defines slots, so a
// slot added without a CUDA kernel fails here, in CI, without a GPU.
//
// Slots allowed to lack one would be named below while their CUDA kernels
// are being written; the test also fails when one of them gains
// a kernel, so the list only shrinks.
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/kernel_slot.h"
#include "core/ops/cuda/registrations.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

// Slots whose CUDA kernel is still to be written, each with the reason
// (none at present).
const std::vector<std::string> kAwaitingCudaKernel = {};

TEST(CudaSlotCoverageTest, EverySlotHasACudaKernel) {
  ASSERT_TRUE(RegisterCudaKernels());
  const std::set<std::string> awaiting(kAwaitingCudaKernel.begin(),
                                       kAwaitingCudaKernel.end());
  std::set<std::string> seen;
  const std::vector<const KernelSlotInfo*> slots = AllKernelSlots();
  for (const KernelSlotInfo* slot : slots) {
    const std::string op = slot->op();
    EXPECT_TRUE(seen.insert(op).second) << "two slots are named " << op;
    const bool has = slot->HasKernel(DeviceType::kCUDA);
    if (awaiting.count(op) > 0) {
      EXPECT_FALSE(has) << op
                        << " now has a CUDA kernel: remove it from "
                           "kAwaitingCudaKernel in this test";
    } else {
      EXPECT_TRUE(has) << op
                       << " has no CUDA kernel: write one and register it "
                          "in core/ops/cuda/registrations.cc";
    }
  }
  // The listing reaches slots nothing here calls by name (so every slot
  // library's load-time listing ran), and the exceptions are real slots.
  for (const std::string& op : awaiting) {
    EXPECT_EQ(seen.count(op), 1u)
        << op
        << " is not a slot of this program: rename or remove it in "
           "kAwaitingCudaKernel, or link its library into this test";
  }
  EXPECT_GE(slots.size(), 40u) << "fewer slots than the program had when "
                                  "this test was written: is a library "
                                  "missing from its deps?";
}

// Every slot has a CPU kernel: the reference the device kernels are tested
// against.
TEST(CudaSlotCoverageTest, EverySlotHasACpuKernel) {
  for (const KernelSlotInfo* slot : AllKernelSlots()) {
    EXPECT_TRUE(slot->HasKernel(DeviceType::kCPU)) << slot->op();
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
