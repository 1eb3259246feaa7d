#include "checkpoint/hf_common.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

TEST(FindTensorOfShapeTest, ReturnsTheTensorOfTheRightShape) {
  const std::map<std::string, Tensor> tensors = {
      {"a", Tensor::Full({2, 3}, 1.5, DType::kFloat32)}};
  absl::StatusOr<Tensor> t =
      FindTensorOfShape(tensors, "a", {2, 3}, "GPT-2 import: tensor");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{2, 3}));
  EXPECT_EQ(t->ToFloats()[5], 1.5f);
  t = FindTensorOfShape(tensors, "a", {2, 3}, "export: parameter",
                        /*to_cpu=*/true);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->device().is_cpu());
}

TEST(FindTensorOfShapeTest, ErrorsNameTheTensorAndTheShapeNeeded) {
  const Tensor a = Tensor::Zeros({2, 3}, DType::kFloat32);
  const std::map<std::string, Tensor> tensors = {{"a", a}};
  absl::Status s =
      FindTensorOfShape(tensors, "b", {2, 3}, "Llama import: tensor").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "Llama import: tensor b is missing");
  s = FindTensorOfShape(tensors, "a", {3, 2}, "Llama export: parameter")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            absl::StrCat("Llama export: parameter a is ", a.Describe(),
                         ", the configuration needs ", ShapeToString({3, 2})));
}

TEST(ParseHfConfigJsonTest, WantsAnObjectAndNamesThePath) {
  absl::StatusOr<JsonDocument> doc =
      ParseHfConfigJson(R"({"n_layer": 2})", "dir/config.json");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_EQ((*doc)["n_layer"].get<int>(), 2);
  absl::Status s = ParseHfConfigJson("[1, 2]", "dir/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "dir/config.json: not a JSON object");
  s = ParseHfConfigJson("{", "dir/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("dir/config.json: ", 0), 0u) << s.message();
}

}  // namespace
}  // namespace mcc
