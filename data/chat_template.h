#ifndef DATA_CHAT_TEMPLATE_H_
#define DATA_CHAT_TEMPLATE_H_

// Hugging Face chat templates (tokenizer_config.json's "chat_template"): the
// subset of Jinja that the common templates use, interpreted here because
// Debian packages no C++ Jinja. Rendering follows transformers'
// apply_chat_template: trim_blocks and lstrip_blocks on, the variables
// `messages` (a list of {"role", "content"} dicts), `add_generation_prompt`,
// `bos_token`, `eos_token`; every other name is undefined (so `tools` is
// false).
//
// Supported:
//   text, {{ expr }}, {# comments #}, whitespace control ({%- -%} {{- -}}
//   and {%+ +%})
//   {% if %} / {% elif %} / {% else %} / {% endif %}
//   {% for x in expr %} ... {% else %} ... {% endfor %}, with loop.index,
//   loop.index0, loop.revindex, loop.revindex0, loop.first, loop.last,
//   loop.length
//   {% set name = expr %}, scoped as Jinja (a for body's sets stay in it)
//   {% generation %} / {% endgeneration %} (transformers' assistant-mask
//   markers), rendered as their body
//   literals: 'strings' "strings" (\n \t \r \\ \' \" escapes), integers,
//   true/false/none (either case), [lists], {dicts}
//   operators: or, and, not, == != < <= > >=, in, not in, + - * // %, ~,
//   unary -, x if c else y, (parentheses)
//   access: a.b, a['b'], a[i] (negative i counts from the end), a[i:j:k]
//   tests: is [not] defined, undefined, none, string, number, boolean,
//   mapping, sequence, iterable, true, false, even, odd, equalto/eq/ne(x)
//   filters: trim, length, count, upper, lower, capitalize, title, string,
//   int, first, last, default(x) / d(x), join(sep), reverse, tojson
//   (keyword indent=N, Python's json.dumps layout), select(test[, x]),
//   reject(test[, x])
//   methods: strip, lstrip, rstrip, upper, lower, title, startswith,
//   endswith, split, replace, get, items, keys, values
//   functions: raise_exception(msg) (rendering fails with msg), range(n),
//   range(a, b[, step]), strftime_now(format) (local time, as
//   transformers'); all three are defined names
// So Llama 3, 3.1/3.2 (without builtin tools), Qwen2.5, Mistral and ChatML
// templates render.
// Everything else (macro, call, block, extends, include, import, filter,
// with, raw, break, continue, namespace, floats, other filters, tests,
// methods and functions) is refused when the template is parsed; keyword
// arguments other than tojson's indent when they are reached. Either way the
// error is one line naming the construct and its line:column.
//
// The source is untrusted: parsing bounds nesting depth, rendering bounds
// steps, loop lengths, value sizes and the output's size (ChatTemplateLimits),
// so no template or conversation can crash, hang or exhaust memory.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc::data {

struct ChatMessage {
  std::string role;
  std::string content;
};

struct ChatTemplateLimits {
  int max_depth = 64;                   // nesting of blocks and expressions
  int64_t max_steps = 4'000'000;        // evaluations per render
  int64_t max_output_bytes = 16 << 20;  // also any one string's size
  int64_t max_list_items = 1'000'000;   // range(), list building
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
};

class ChatTemplate {
 public:
  // Parses `source`; a construct outside the subset above is an error naming
  // it and its line:column.
  static absl::StatusOr<ChatTemplate> Parse(absl::string_view source,
                                            ChatTemplateLimits limits = {});

  // The rendered text, or the template's raise_exception message, or an
  // error naming the construct that failed.
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  struct Program;  // the parsed template (chat_template.cc)

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace mcc::data

#endif  // DATA_CHAT_TEMPLATE_H_
