#include "core/comm/store_auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/comm/store_message.h"

namespace mcc {
namespace comm {
namespace {

// OpenSSL without its atexit clean-up: the rendezvous store's service
// threads may still be answering (and hashing) while the process exits, and
// OPENSSL_cleanup freeing the library's state under them crashed rank 0 of a
// finished job ("double free or corruption" in OPENSSL_cleanup from exit,
// moe_parity_test ep2_pp2, 2026-12-05). The process's exit frees the memory.
void InitOpenSsl() {
  static const bool done = [] {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
    return true;
  }();
  (void)done;
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  InitOpenSsl();
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(&out[0]),
                          static_cast<int>(n)) != 1) {
    return absl::UnavailableError(absl::StrCat(
        "no random bytes from OpenSSL (RAND_bytes): error ", ERR_get_error()));
  }
  return out;
}

absl::StatusOr<std::string> RandomSecretHex() {
  absl::StatusOr<std::string> bytes = RandomBytes(32);
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes);
}

std::string StoreHelloMac(absl::string_view secret, absl::string_view nonce,
                          absl::string_view job_id, int rank) {
  InitOpenSsl();
  // Framed as a store message, so no two (nonce, job, rank) share an input.
  const std::string input =
      EncodeStoreMessage('h', {"mcc-store-hello-v1", std::string(nonce),
                               std::string(job_id), std::to_string(rank)});
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac,
       &mac_len);
  return std::string(reinterpret_cast<const char*>(mac), mac_len);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Lengths are public (a MAC's is fixed); contents are compared in full.
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace comm
}  // namespace mcc
