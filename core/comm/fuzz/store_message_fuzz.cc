// Fuzzes the TCP store's wire messages as the server (requests) and the
// clients (replies) read them: a stream of bytes is read message by message
// until it runs out or is refused. Each message read must re-encode to
// exactly the bytes it came from, and a message may not cost more memory
// than the bytes that arrived.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/comm/store_message.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pos = 0;
  auto read = [&](void* out, size_t n) {
    if (n > size - pos) return absl::UnavailableError("connection closed");
    std::memcpy(out, data + pos, n);
    pos += n;
    return absl::OkStatus();
  };
  while (pos < size) {
    const size_t start = pos;
    char head = 0;
    std::vector<std::string> args;
    absl::Status s = mcc::comm::ReadStoreMessage(read, &head, &args);
    size_t held = 0;
    for (const std::string& a : args) held += a.capacity();
    // Allocation follows arrival (store_message.cc: a 64 KiB first chunk,
    // then at most as much again as arrived, and string capacity doubling).
    CHECK_LE(held, 4 * (pos - start) + (128 << 10) + 64 * args.size());
    if (!s.ok()) break;
    const std::string again = mcc::comm::EncodeStoreMessage(head, args);
    CHECK_EQ(again.size(), pos - start);
    CHECK(std::memcmp(again.data(), data + start, again.size()) == 0);
  }
  return 0;
}
