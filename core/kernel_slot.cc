#include "core/kernel_slot.h"

#include <mutex>
#include <vector>

namespace mcc {
namespace {

struct SlotList {
  std::mutex mu;
  std::vector<const KernelSlotInfo*> slots;
};

SlotList& Slots() {
  static auto* list = new SlotList;  // Never destroyed: slots outlive main.
  return *list;
}

}  // namespace

std::vector<const KernelSlotInfo*> AllKernelSlots() {
  SlotList& list = Slots();
  std::lock_guard<std::mutex> lock(list.mu);
  return list.slots;
}

bool ListKernelSlot(const KernelSlotInfo* slot) {
  SlotList& list = Slots();
  std::lock_guard<std::mutex> lock(list.mu);
  list.slots.push_back(slot);
  return true;
}

}  // namespace mcc
