#ifndef CORE_COMM_STORE_MESSAGE_H_
#define CORE_COMM_STORE_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mcc {
namespace comm {

// The TCP store's wire format. A message is a head byte (the request's
// operation or the reply's code), a u32 argument count, then each argument
// as a u32 length and its bytes (little-endian, as x86-64 stores them).
inline constexpr uint32_t kMaxStoreArgs = 1 << 20;
inline constexpr uint32_t kMaxStoreArgBytes = 1u << 30;

// Request operations (the head byte of a request).
enum StoreOp : char {
  kStoreSet = 'S',
  kStoreGet = 'G',
  kStoreWait = 'W',
  kStoreAdd = 'A',
  kStoreCheck = 'C',
  kStoreDelete = 'D',
  kStoreChallenge = 'N',  // Asks for a nonce to answer in the hello.
  kStoreHello = 'H',
  kStoreBye = 'B',
  kStoreLost = 'L',
};
// Reply codes (the head byte of a reply).
enum StoreCode : char {
  kStoreOk = 0,
  kStoreTimeout = 1,
  kStoreError = 2,
  kStoreDenied = 3,  // Not authenticated, or not of this job.
};

std::string EncodeStoreMessage(char head, const std::vector<std::string>& args);

// Fills exactly n bytes at data, or fails (closed connection, deadline).
using ReadExactly = std::function<absl::Status(void* data, size_t n)>;

// Reads one message through `read`. Counts and lengths past the limits above,
// or a message (with its framing) longer than max_message_bytes, are
// DataLoss errors; an argument's buffer grows as its bytes arrive, so a
// peer that announces a large argument and then stops costs little more
// memory than it sent (64 KiB, or twice what it sent).
absl::Status ReadStoreMessage(const ReadExactly& read, char* head,
                              std::vector<std::string>* args,
                              uint64_t max_message_bytes = UINT64_MAX);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_STORE_MESSAGE_H_
