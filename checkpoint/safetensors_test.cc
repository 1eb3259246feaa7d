#include "checkpoint/safetensors.h"

#include <cmath>
#include <cstring>

#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;

// testdata/fixture.safetensors comes from make_safetensors_fixture.py, which
// follows the specification with Python's standard library alone.
TEST(SafetensorsTest, ReadsIndependentlyWrittenFixture) {
  auto file = ReadSafetensors("checkpoint/testdata/fixture.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  EXPECT_EQ(file->metadata.at("note"), "quote \" and \xc3\xa9");
  ASSERT_EQ(file->tensors.size(), 6u);
  // In data order, whatever the header's order.
  EXPECT_EQ(file->tensors[0].first, "layer.f32");

  const Tensor* f32 = file->Find("layer.f32");
  ASSERT_NE(f32, nullptr);
  EXPECT_EQ(f32->dtype(), DType::kFloat32);
  EXPECT_EQ(f32->shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f32->ToDoubles()[i], i * 0.5 - 1.0);

  const Tensor* bf16 = file->Find("layer.bf16");
  ASSERT_NE(bf16, nullptr);
  EXPECT_EQ(bf16->dtype(), DType::kBFloat16);
  const std::vector<double> want_bf16 = {1.0, -2.5, 0.15625};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bf16->ToDoubles()[i], want_bf16[i]);
  // 3e38 truncated to bf16: within bf16's relative precision.
  EXPECT_NEAR(bf16->ToDoubles()[3] / 3.0e38, 1.0, 1.0 / 128);

  const Tensor* f16 = file->Find("f16");
  ASSERT_NE(f16, nullptr);
  EXPECT_EQ(f16->ToDoubles(), (std::vector<double>{0.5, -1.0, 65504.0}));

  const Tensor* i64 = file->Find("ints.i64");
  ASSERT_NE(i64, nullptr);
  EXPECT_EQ(i64->dtype(), DType::kInt64);
  EXPECT_EQ(i64->data<int64_t>()[2], int64_t{1} << 40);
  EXPECT_EQ(i64->data<int64_t>()[0], -7);
  const Tensor* i32 = file->Find("ints.i32");
  ASSERT_NE(i32, nullptr);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(i32->data<int32_t>()[i], i - 3);
  const Tensor* empty = file->Find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->shape(), (Shape{0, 4}));
}

TEST(SafetensorsTest, RoundTripAndLayout) {
  const std::string path = FreshDir("st_roundtrip") + "/model.safetensors";
  NamedTensors tensors = {
      {"b.weight", RandomTensor({3, 5}, DType::kFloat32, 1)},
      {"a.bias", RandomTensor({7}, DType::kBFloat16, 2)},
      {"c", RandomTensor({2, 2, 2}, DType::kFloat16, 3)},
      {"d", RandomTensor({3}, DType::kInt64, 4)},
      {"e\"quoted\"", RandomTensor({1}, DType::kInt32, 5)},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto bytes = file_util::ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);  // Padded so the data starts 8-byte aligned.
  // An independent parse of the header (plain nlohmann::json, no checks of
  // ours).
  const nlohmann::json header = nlohmann::json::parse(bytes->substr(8, n));
  EXPECT_EQ(header["b.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.bias"]["dtype"], "BF16");
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(header.contains(name)) << name;
    const int64_t begin = header[name]["data_offsets"][0].get<int64_t>();
    EXPECT_EQ(begin % DTypeSize(t.dtype()), 0) << name << " is misaligned";
  }
  // A name that is not UTF-8 cannot be written as JSON.
  auto bad_name = WriteSafetensors(path + ".3", {{"\xff", tensors[0].second}});
  EXPECT_NE(bad_name.message().find("UTF-8"), std::string::npos) << bad_name;
  // A repeated name is refused.
  NamedTensors twice = {tensors[0], tensors[0]};
  EXPECT_FALSE(WriteSafetensors(path + ".2", twice).ok());

  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  ASSERT_EQ(file->tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor* got = file->Find(name);
    ASSERT_NE(got, nullptr) << name;
    EXPECT_EQ(got->dtype(), t.dtype());
    EXPECT_EQ(got->shape(), t.shape());
    EXPECT_EQ(got->ToDoubles(), t.ToDoubles()) << name;
  }
}

std::string Build(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header_json + data;
}

TEST(SafetensorsTest, RejectsMalformedFiles) {
  const std::string data(16, '\0');
  struct Case {
    std::string header;
    std::string data;
    std::string expect;  // In the message.
  } cases[] = {
      {R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", data,
       "F64"},
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data,
       "needs 12"},
      {R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       data.substr(0, 8), "truncated"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       data.substr(0, 12), "gap or overlap"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data,
       "after the last tensor"},
      {R"({"x":{"dtype":"F32","shape":[2]}})", data, "data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"x":{}})", data,
       "duplicate key"},
      {R"({"x":)", data, "bad header"},
  };
  for (const auto& c : cases) {
    auto file = ParseSafetensors(Build(c.header, c.data), "bad.safetensors");
    ASSERT_FALSE(file.ok()) << c.header;
    EXPECT_NE(file.status().message().find(c.expect), std::string::npos)
        << file.status() << " for " << c.header;
    EXPECT_NE(file.status().message().find("bad.safetensors"),
              std::string::npos);
  }
  EXPECT_FALSE(ParseSafetensors("1234", "short").ok());
  EXPECT_FALSE(ParseSafetensors(
                   std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), "huge")
                   .ok());
}

// Element counts whose byte size wraps int64 to a small number (here 0, so
// that empty data_offsets would match it) are refused before any allocation.
TEST(SafetensorsTest, RejectsShapesWhoseSizeOverflows) {
  for (const std::string shape :
       {"[4294967296,4294967296]", "[4611686018427387904]",
        "[3,3074457345618258603,2]"}) {
    const std::string header = R"({"x":{"dtype":"F32","shape":)" + shape +
                               R"(,"data_offsets":[0,0]}})";
    auto file = ParseSafetensors(Build(header, ""), "big.safetensors");
    ASSERT_FALSE(file.ok()) << shape;
    EXPECT_NE(file.status().message().find("overflows"), std::string::npos)
        << file.status();
    EXPECT_NE(file.status().message().find("big.safetensors: tensor x"),
              std::string::npos)
        << file.status();
  }
}

}  // namespace
}  // namespace mcc
