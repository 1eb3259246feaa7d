#include "core/comm/store_auth.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

std::string Nonce() {
  std::string n;
  for (int i = 0; i < 32; ++i) n.push_back(static_cast<char>(i));
  return n;
}

// The hello's MAC is HMAC-SHA256 over the store-message framing of
// ("mcc-store-hello-v1", nonce, job, rank); the expected value is Python's
// hmac.new(b"secret", message, hashlib.sha256) of the same bytes.
TEST(StoreAuthTest, HelloMacMatchesAnIndependentHmac) {
  EXPECT_EQ(
      absl::BytesToHexString(StoreHelloMac("secret", Nonce(), "job-7", 3)),
      "af5b2f58012a7d414ca05730dafde938af67bd39f73370134ca6a95ae088dd6e");
}

TEST(StoreAuthTest, HelloMacBindsEveryInput) {
  const std::string mac = StoreHelloMac("secret", Nonce(), "job-7", 3);
  EXPECT_EQ(mac.size(), kStoreMacBytes);
  EXPECT_NE(mac, StoreHelloMac("secreT", Nonce(), "job-7", 3));
  EXPECT_NE(mac, StoreHelloMac("secret", Nonce() + "x", "job-7", 3));
  EXPECT_NE(mac, StoreHelloMac("secret", Nonce(), "job-8", 3));
  EXPECT_NE(mac, StoreHelloMac("secret", Nonce(), "job-7", -1));
}

TEST(StoreAuthTest, RandomBytesAndSecrets) {
  const std::string a = RandomBytes(32).value(), b = RandomBytes(32).value();
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
  const std::string secret = RandomSecretHex().value();
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(StoreAuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
}

}  // namespace
}  // namespace comm
}  // namespace mcc
