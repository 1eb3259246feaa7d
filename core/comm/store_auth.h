#ifndef CORE_COMM_STORE_AUTH_H_
#define CORE_COMM_STORE_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace comm {

// The rendezvous store's challenge-response (OpenSSL's libcrypto): the
// server sends a random nonce, the client answers with an HMAC-SHA256 keyed
// by the job's secret over the nonce, its job and its rank. The secret never
// crosses the network.

// Bytes of a challenge nonce and of a hello's MAC.
inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreMacBytes = 32;

// n bytes from the system's cryptographic random source.
absl::StatusOr<std::string> RandomBytes(size_t n);
// A fresh job secret: 32 random bytes as 64 hex digits.
absl::StatusOr<std::string> RandomSecretHex();
// The MAC a client with `secret` sends in its hello.
std::string StoreHelloMac(absl::string_view secret, absl::string_view nonce,
                          absl::string_view job_id, int rank);
// Equality that takes the same time wherever the strings differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_STORE_AUTH_H_
