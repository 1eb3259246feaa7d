#include "core/comm/call_observer.h"

#include <atomic>

namespace mcc {
namespace comm {
namespace {

std::atomic<CallObserver*> g_observer{nullptr};

}  // namespace

void SetCallObserver(CallObserver* observer) {
  g_observer.store(observer, std::memory_order_release);
}

CallObserver* CurrentCallObserver() {
  return g_observer.load(std::memory_order_acquire);
}

}  // namespace comm
}  // namespace mcc
