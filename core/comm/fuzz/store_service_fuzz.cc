// Fuzzes the rendezvous store's request handling (StoreService) without
// sockets: arbitrary (session, op, args) sequences, against a store with or
// without a secret, checking after every request that
//  - the reply code is one the clients know;
//  - with a secret, a session that has not proved it gets nothing but a
//    denial (and the connection closed), and the data does not change;
//  - the running count of stored bytes matches the map and stays within
//    the limit.
//
// Input: a config byte (bit 0: a secret; bit 1: a 4 KiB byte limit), then
// records of one selector byte and, unless the selector says otherwise, one
// request in the wire format (store_message.h). Selector bits 0-1 pick one of
// four sessions; bit 7 makes that session authenticate properly (the fuzzer
// answers the challenge with the right MAC, as rank bits 2-4); bit 6 ends
// the session (a dropped connection). Seeds: tools/fuzz/make_seeds.py.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/comm/store_auth.h"
#include "core/comm/store_message.h"
#include "core/comm/store_service.h"
#include "glog/logging.h"

namespace {

constexpr char kSecret[] = "fuzz secret";
constexpr char kJob[] = "fuzz-job";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mcc::comm;  // NOLINT: one entry point.
  // The service logs refused requests; thousands a second say nothing here.
  static const bool quiet = (FLAGS_minloglevel = google::GLOG_ERROR, true);
  (void)quiet;
  if (size == 0) return 0;
  const bool with_secret = data[0] & 1;
  StoreLimits limits;
  limits.max_wait = absl::ZeroDuration();  // Gets and Waits never block.
  if (data[0] & 2) limits.max_stored_bytes = 4 << 10;
  StoreService service(kJob, with_secret ? kSecret : "", limits, 1234);
  StoreSession sessions[4];
  for (int i = 0; i < 4; ++i) sessions[i].peer = absl::StrCat("peer", i);

  size_t pos = 1;
  auto read = [&](void* out, size_t n) {
    if (n > size - pos) return absl::UnavailableError("input ended");
    std::memcpy(out, data + pos, n);
    pos += n;
    return absl::OkStatus();
  };
  while (pos < size) {
    const uint8_t selector = data[pos++];
    StoreSession& session = sessions[selector & 3];
    if (selector & 0x40) {
      service.EndSession(session);
      session = StoreSession{absl::StrCat("peer", selector & 3)};
      continue;
    }
    if (selector & 0x80) {
      const int rank = (selector >> 2) & 7;
      StoreReply nonce = service.Handle(&session, kStoreChallenge, {});
      CHECK_EQ(nonce.code, kStoreOk);
      CHECK_EQ(nonce.args.size(), 1u);
      StoreReply hello =
          service.Handle(&session, kStoreHello,
                         {std::to_string(rank), kJob,
                          StoreHelloMac(kSecret, nonce.args[0], kJob, rank)});
      // A session says one hello; a second is refused.
      CHECK(hello.code == kStoreOk || hello.code == kStoreError);
      continue;
    }
    char op = 0;
    std::vector<std::string> args;
    if (!ReadStoreMessage(read, &op, &args, 64 << 10).ok()) break;
    const bool authorized = service.Authorized(session);
    const int64_t before = service.CountStoredBytes();
    StoreReply reply = service.Handle(&session, op, args);
    CHECK(reply.code == kStoreOk || reply.code == kStoreTimeout ||
          reply.code == kStoreError || reply.code == kStoreDenied);
    if (with_secret && !authorized && op != kStoreChallenge &&
        op != kStoreHello) {
      CHECK_EQ(reply.code, kStoreDenied) << "op " << static_cast<int>(op);
      CHECK(reply.close);
      CHECK_EQ(service.CountStoredBytes(), before);
    }
    if (with_secret && !service.Authorized(session)) {
      CHECK(reply.code != kStoreOk || op == kStoreChallenge)
          << "op " << static_cast<int>(op);
    }
    if (reply.code == kStoreOk && op == kStoreGet) {
      CHECK_EQ(reply.args.size(), 1u);
    }
    const int64_t stored = service.stored_bytes();
    CHECK_EQ(stored, service.CountStoredBytes());
    CHECK_LE(stored, limits.max_stored_bytes);
    if (reply.close) {
      service.EndSession(session);
      session = StoreSession{absl::StrCat("peer", selector & 3)};
    }
  }
  for (StoreSession& s : sessions) service.EndSession(s);
  return 0;
}
