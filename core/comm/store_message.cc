#include "core/comm/store_message.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace comm {

std::string EncodeStoreMessage(char head,
                               const std::vector<std::string>& args) {
  std::string buf;
  buf.push_back(head);
  uint32_t n = static_cast<uint32_t>(args.size());
  buf.append(reinterpret_cast<const char*>(&n), sizeof(n));
  for (const std::string& a : args) {
    uint32_t len = static_cast<uint32_t>(a.size());
    buf.append(reinterpret_cast<const char*>(&len), sizeof(len));
    buf.append(a);
  }
  return buf;
}

absl::Status ReadStoreMessage(const ReadExactly& read, char* head,
                              std::vector<std::string>* args,
                              uint64_t max_message_bytes) {
  args->clear();
  // Bytes the message takes on the wire so far, framing included.
  uint64_t total = 1 + sizeof(uint32_t);
  auto too_long = [&](uint64_t bytes) {
    return absl::DataLossError(absl::StrCat(
        "store message: ", bytes, " bytes or more, more than the limit of ",
        max_message_bytes, " for this connection"));
  };
  if (absl::Status s = read(head, 1); !s.ok()) return s;
  uint32_t n = 0;
  if (absl::Status s = read(&n, sizeof(n)); !s.ok()) return s;
  if (n > kMaxStoreArgs) {
    return absl::DataLossError(absl::StrCat("store message: ", n,
                                            " arguments, more than the limit ",
                                            kMaxStoreArgs));
  }
  if (total + uint64_t{n} * sizeof(uint32_t) > max_message_bytes) {
    return too_long(total + uint64_t{n} * sizeof(uint32_t));
  }
  total += uint64_t{n} * sizeof(uint32_t);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (absl::Status s = read(&len, sizeof(len)); !s.ok()) return s;
    if (len > kMaxStoreArgBytes) {
      return absl::DataLossError(
          absl::StrCat("store message: argument ", i, " of ", len,
                       " bytes, more than the limit ", kMaxStoreArgBytes));
    }
    if (total + len > max_message_bytes) return too_long(total + len);
    total += len;
    args->emplace_back();
    std::string& arg = args->back();
    // 64 KiB, then as much again as has arrived: memory stays within twice
    // the bytes received, in few reads.
    constexpr size_t kFirstChunk = 64 << 10;
    while (arg.size() < len) {
      const size_t done = arg.size();
      const size_t step =
          std::min<size_t>(std::max(kFirstChunk, done), len - done);
      arg.resize(done + step);
      if (absl::Status s = read(&arg[done], step); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace comm
}  // namespace mcc
