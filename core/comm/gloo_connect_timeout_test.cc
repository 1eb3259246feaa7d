// A gloo group whose connection never returns (as Debian's gloo can hang in
// connectFullMesh when a peer stops after publishing its address) fails at
// twice the group's timeout, naming the group, instead of hanging the rank.
#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/comm/gloo_process_group.h"
#include "core/comm/tcp_store.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

std::shared_ptr<TcpStore> Server() {
  TcpStore::Options o;
  o.is_server = true;
  o.rank = 0;
  o.timeout = absl::Seconds(10);
  return TcpStore::Connect(o).value();
}

TEST(GlooConnectTimeoutTest,
     AConnectionThatNeverReturnsFailsAtTwiceTheTimeout) {
  std::shared_ptr<TcpStore> store = Server();
  // Stands for gloo's wait on a stopped peer: blocks the connecting thread
  // until the test ends.
  auto release = std::make_shared<absl::Notification>();
  auto entered = std::make_shared<std::atomic<bool>>(false);
  internal::SetGlooConnectHookForTesting([release, entered] {
    entered->store(true);
    release->WaitForNotification();
  });
  GroupOptions options;
  options.timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  auto group = CreateGlooProcessGroup(store, 0, 1, "stuck", {0}, options);
  const absl::Duration took = absl::Now() - start;
  internal::SetGlooConnectHookForTesting(nullptr);
  release->Notify();
  EXPECT_TRUE(entered->load());
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(group.status().message().find("gloo group 'stuck'"),
            absl::string_view::npos)
      << group.status();
  EXPECT_NE(group.status().message().find("did not connect within 400ms"),
            absl::string_view::npos)
      << group.status();
  EXPECT_GE(took, absl::Milliseconds(400));
  EXPECT_LT(took, absl::Seconds(10));
}

TEST(GlooConnectTimeoutTest, AGroupConnectsWithoutTheHook) {
  std::shared_ptr<TcpStore> store = Server();
  GroupOptions options;
  options.timeout = absl::Seconds(10);
  auto group = CreateGlooProcessGroup(store, 0, 1, "alone", {0}, options);
  ASSERT_TRUE(group.ok()) << group.status();
}

}  // namespace
}  // namespace comm
}  // namespace mcc
