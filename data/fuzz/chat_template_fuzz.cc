// Fuzzes chat templates: an input is a template and a conversation, joined
// by mcc::fuzz::kPartSeparator; the conversation is one message a line,
// "role:content" (\n in the content written as \\n). Any template, valid or
// not, must parse or fail with an error saying "chat template:", and render
// within the limits: no crash, no hang, no output past max_output_bytes,
// the same text twice.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "data/chat_template.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  mcc::data::ChatTemplateLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_list_items = 100'000;
  auto t = mcc::data::ChatTemplate::Parse(parts[0], limits);
  if (!t.ok()) {
    CHECK(t.status().message().find("chat template:") != std::string::npos)
        << t.status();
    return 0;
  }
  mcc::data::ChatTemplateInputs in;
  for (absl::string_view line : absl::StrSplit(parts[1], '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    in.messages.push_back(
        {std::string(line.substr(0, colon)),
         absl::StrReplaceAll(line.substr(colon + 1), {{"\\n", "\n"}})});
  }
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  for (bool prompt : {false, true}) {
    in.add_generation_prompt = prompt;
    auto first = t->Render(in);
    auto second = t->Render(in);
    CHECK_EQ(first.ok(), second.ok());
    if (!first.ok()) {
      CHECK(first.status().message().find("chat template:") !=
            std::string::npos)
          << first.status();
      continue;
    }
    CHECK_LE(first->size(), static_cast<size_t>(limits.max_output_bytes));
    CHECK(*first == *second);
  }
  return 0;
}
