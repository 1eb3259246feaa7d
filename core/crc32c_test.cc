#include "core/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace {

// Bit-at-a-time reference, straight from the definition.
uint32_t ReferenceCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0);
  }
  return ~c;
}

TEST(Crc32cTest, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // RFC 3720 (iSCSI), appendix B.4.
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Crc32c(buf.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32cTest, ImplementationsMatchReferenceAtAllAlignmentsAndLengths) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(4096 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096}) {
      const uint8_t* p = data.data() + offset;
      const uint32_t want = ReferenceCrc32c(p, n);
      EXPECT_EQ(crc32c_internal::ExtendPortable(0, p, n), want)
          << "offset " << offset << " n " << n;
      EXPECT_EQ(crc32c_internal::ExtendHardware(0, p, n), want)
          << "offset " << offset << " n " << n;
      EXPECT_EQ(Crc32c(p, n), want);
    }
  }
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::mt19937 rng(11);
  std::vector<uint8_t> data(10000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {0, 1, 5, 8, 333, 4096, 9999, 10000}) {
    uint32_t c = Crc32c(data.data(), split);
    c = Crc32cExtend(c, data.data() + split, data.size() - split);
    EXPECT_EQ(c, whole) << "split " << split;
  }
}

TEST(Crc32cTest, DetectsSingleBitFlips) {
  std::vector<uint8_t> data(256, 0x5A);
  const uint32_t base = Crc32c(data.data(), data.size());
  for (size_t i = 0; i < data.size(); i += 17) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= (1 << bit);
      EXPECT_NE(Crc32c(data.data(), data.size()), base);
      data[i] ^= (1 << bit);
    }
  }
}

}  // namespace
}  // namespace mcc
