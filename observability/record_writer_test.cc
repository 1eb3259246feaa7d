#include "observability/record_writer.h"

#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace observability {
namespace {

// The masked CRC as TFRecord defines it, from the plain CRC-32C of the
// standard check string "123456789" (0xE3069283).
TEST(RecordWriterTest, MaskedCrcFollowsTheDefinition) {
  const uint32_t crc = 0xE3069283u;
  const uint32_t want = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
  EXPECT_EQ(MaskedCrc32c("123456789", 9), want);
}

TEST(RecordWriterTest, FramesLengthDataAndBothCrcs) {
  std::string out;
  AppendRecord("abc", &out);
  ASSERT_EQ(out.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(out.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  uint32_t header_crc = 0, data_crc = 0;
  for (int i = 0; i < 4; ++i) {
    header_crc |= static_cast<uint32_t>(static_cast<uint8_t>(out[8 + i]))
                  << (8 * i);
    data_crc |= static_cast<uint32_t>(static_cast<uint8_t>(out[15 + i]))
                << (8 * i);
  }
  EXPECT_EQ(header_crc, MaskedCrc32c(out.data(), 8));
  EXPECT_EQ(out.substr(12, 3), "abc");
  EXPECT_EQ(data_crc, MaskedCrc32c("abc", 3));
}

TEST(RecordWriterTest, OpenNamesTheFileOnError) {
  RecordWriter writer;
  const absl::Status status =
      RecordWriter::Open("/nonexistent-dir/events.out", &writer);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/events.out"),
            std::string::npos);
  EXPECT_FALSE(writer.Write("x").ok());
}

}  // namespace
}  // namespace observability
}  // namespace mcc
