#include "core/comm/tcp_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <utility>
#include <vector>

#include "core/comm/port_reservation.h"
#include "core/comm/socket.h"
#include "core/comm/store_auth.h"
#include "core/comm/store_message.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

std::shared_ptr<TcpStore> Server(int rank = 0) {
  TcpStore::Options o;
  o.is_server = true;
  o.rank = rank;
  o.timeout = absl::Seconds(10);
  return TcpStore::Connect(o).value();
}

std::shared_ptr<TcpStore> Client(int port, int rank = -1) {
  TcpStore::Options o;
  o.port = port;
  o.rank = rank;
  o.timeout = absl::Seconds(10);
  return TcpStore::Connect(o).value();
}

// Sends one raw request and reads the reply, as a client of another program
// (or an attacker) would.
struct RawReply {
  absl::Status status;
  char code = 0;
  std::vector<std::string> args;
};
RawReply RawCall(int fd, char op, const std::vector<std::string>& args) {
  RawReply r;
  const std::string buf = EncodeStoreMessage(op, args);
  r.status =
      SendAll(fd, buf.data(), buf.size(), absl::Now() + absl::Seconds(5));
  if (!r.status.ok()) return r;
  r.status = ReadStoreMessage(
      [&](void* data, size_t n) {
        return RecvAll(fd, data, n, absl::Now() + absl::Seconds(5));
      },
      &r.code, &r.args);
  return r;
}

// A Get carrying only its timeout once indexed an empty key list and took
// rank 0 (and the job) down. It is an error reply naming the problem, and
// the store keeps serving.
TEST(TcpStoreTest, GetWithoutAKeyIsAnErrorNotACrash) {
  auto server = Server();
  const int fd =
      ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
          .value();
  RawReply r = RawCall(fd, 'G', {"100"});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.code, 2);
  ASSERT_EQ(r.args.size(), 1u);
  EXPECT_NE(r.args[0].find("exactly one key"), std::string::npos) << r.args[0];
  EXPECT_NE(r.args[0].find("127.0.0.1:"), std::string::npos) << r.args[0];
  close(fd);
  auto other = Client(server->port());
  ASSERT_TRUE(other->Set("k", "v").ok());
  EXPECT_EQ(server->Get("k").value(), "v");
}

// Every op's arguments are checked; each bad request is an error reply that
// names the op, and the connection goes on serving.
TEST(TcpStoreTest, MalformedRequestsAreErrorsNamingTheOp) {
  auto server = Server();
  const int fd =
      ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
          .value();
  struct Case {
    char op;
    std::vector<std::string> args;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {'S', {"k"}, "set takes a key and a value"},
      {'S', {"", "v"}, "empty key"},
      {'G', {"abc", "k"}, "timeout 'abc' is not milliseconds"},
      {'G', {"-5", "k"}, "timeout '-5'"},
      {'G', {"10", "a", "b"}, "exactly one key"},
      {'W', {"10"}, "at least one key"},
      {'A', {"n", "x"}, "increment 'x' is not a 64-bit integer"},
      {'A', {"n"}, "add takes a key and an integer"},
      {'D', {}, "delete takes one key"},
      {'H', {"two"}, "rank 'two' is not an integer"},
      {'L', {"x"}, "lost-ranks takes no arguments"},
      {'Z', {}, "unknown store operation"},
      {'\x01', {}, "0x01"},
  };
  for (const Case& c : cases) {
    RawReply r = RawCall(fd, c.op, c.args);
    ASSERT_TRUE(r.status.ok()) << c.op << ": " << r.status;
    EXPECT_EQ(r.code, 2) << c.op;
    ASSERT_EQ(r.args.size(), 1u) << c.op;
    EXPECT_NE(r.args[0].find(c.expect), std::string::npos) << r.args[0];
  }
  RawReply ok = RawCall(fd, 'S', {"k", "v"});
  EXPECT_EQ(ok.code, 0);
  ASSERT_TRUE(server->Set("big", std::to_string(INT64_MAX)).ok());
  absl::StatusOr<int64_t> overflow = server->Add("big", 1);
  EXPECT_NE(overflow.status().message().find("overflows"), std::string::npos)
      << overflow.status();
  close(fd);
  EXPECT_EQ(server->Get("k").value(), "v");
}

std::shared_ptr<TcpStore> SecretServer(const std::string& secret,
                                       StoreLimits limits = StoreLimits()) {
  TcpStore::Options o;
  o.is_server = true;
  o.rank = 0;
  o.job_id = "job";
  o.secret = secret;
  o.limits = limits;
  o.timeout = absl::Seconds(10);
  return TcpStore::Connect(o).value();
}

absl::StatusOr<std::shared_ptr<TcpStore>> SecretClient(
    int port, int rank, const std::string& secret) {
  TcpStore::Options o;
  o.port = port;
  o.rank = rank;
  o.job_id = "job";
  o.secret = secret;
  o.timeout = absl::Seconds(10);
  return TcpStore::Connect(o);
}

// With a job secret, a client must prove it holds it (challenge-response in
// its hello) before anything else: one without it, or with another, can
// neither read nor write a key, and is told why.
TEST(TcpStoreAuthTest, OnlyClientsWithTheSecretReadOrWrite) {
  auto server = SecretServer("right secret");
  ASSERT_TRUE(server->Set("gloo/addr", "10.0.0.1:4000").ok());

  absl::StatusOr<std::shared_ptr<TcpStore>> wrong =
      SecretClient(server->port(), 1, "wrong secret");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(wrong.status().message().find("proof of the job secret is wrong"),
            std::string::npos)
      << wrong.status();
  absl::StatusOr<std::shared_ptr<TcpStore>> none =
      SecretClient(server->port(), 1, "");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(none.status().message().find("MCC_JOB_SECRET"), std::string::npos)
      << none.status();

  // A connection that announces nothing is refused at its first request.
  std::shared_ptr<TcpStore> silent =
      SecretClient(server->port(), -1, "").value();
  absl::Status set = silent->Set("gloo/addr", "attacker:1");
  EXPECT_EQ(set.code(), absl::StatusCode::kPermissionDenied) << set;
  EXPECT_NE(set.message().find("has not proved it"), std::string::npos) << set;

  // Raw requests: denied, no value in the reply, and the connection closed.
  for (char op : {'G', 'S', 'D', 'A', 'W', 'C', 'L'}) {
    const int fd =
        ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
            .value();
    const std::vector<std::string> args =
        op == 'G' || op == 'W' ? std::vector<std::string>{"0", "gloo/addr"}
        : op == 'L'            ? std::vector<std::string>{}
                               : std::vector<std::string>{"gloo/addr", "1"};
    RawReply r = RawCall(
        fd, op,
        op == 'C' || op == 'D' ? std::vector<std::string>{"gloo/addr"} : args);
    ASSERT_TRUE(r.status.ok()) << op << ": " << r.status;
    EXPECT_EQ(r.code, 3) << op;
    ASSERT_EQ(r.args.size(), 1u);
    EXPECT_EQ(r.args[0].find("10.0.0.1"), std::string::npos);
    char byte = 0;
    EXPECT_FALSE(RecvAll(fd, &byte, 1, absl::Now() + absl::Seconds(5)).ok())
        << "the connection stays open after a denied request";
    close(fd);
  }
  // A raw hello answering a challenge with garbage is refused too.
  {
    const int fd =
        ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
            .value();
    RawReply nonce = RawCall(fd, 'N', {});
    ASSERT_EQ(nonce.code, 0);
    ASSERT_EQ(nonce.args.size(), 1u);
    EXPECT_EQ(nonce.args[0].size(), 32u);
    RawReply hello = RawCall(fd, 'H', {"1", "job", std::string(32, 'x')});
    EXPECT_EQ(hello.code, 3);
    close(fd);
  }

  EXPECT_EQ(server->Get("gloo/addr").value(), "10.0.0.1:4000");
  EXPECT_TRUE(server->LostRanks().value().empty());

  // The right secret works, and so do clones (which announce no rank).
  std::shared_ptr<TcpStore> rank1 =
      SecretClient(server->port(), 1, "right secret").value();
  EXPECT_EQ(rank1->Get("gloo/addr").value(), "10.0.0.1:4000");
  std::shared_ptr<TcpStore> clone = rank1->Clone().value();
  ASSERT_TRUE(clone->Set("from-clone", "1").ok());
  EXPECT_EQ(server->Get("from-clone").value(), "1");
  std::shared_ptr<TcpStore> server_clone = server->Clone().value();
  EXPECT_TRUE(server_clone->Check({"from-clone"}).value());
}

// A proof answers one nonce on one connection: replayed on another
// connection it fails. Before the hello, messages are small.
TEST(TcpStoreAuthTest, ProofsDoNotReplayAndEarlyMessagesAreSmall) {
  auto server = SecretServer("s");
  auto connect = [&] {
    return ConnectTcp("127.0.0.1", server->port(),
                      absl::Now() + absl::Seconds(5))
        .value();
  };
  const int a = connect();
  RawReply nonce = RawCall(a, 'N', {});
  ASSERT_EQ(nonce.code, 0);
  const std::string proof = StoreHelloMac("s", nonce.args.at(0), "job", 1);
  RawReply hello = RawCall(a, 'H', {"1", "job", proof});
  EXPECT_EQ(hello.code, 0);
  EXPECT_EQ(RawCall(a, 'S', {"k", "v"}).code, 0);
  EXPECT_EQ(RawCall(a, 'H', {"1", "job", proof}).code, 2) << "second hello";
  const int b = connect();
  ASSERT_EQ(RawCall(b, 'N', {}).code, 0);
  RawReply replay = RawCall(b, 'H', {"1", "job", proof});
  EXPECT_EQ(replay.code, 3);
  EXPECT_NE(replay.args.at(0).find("proof of the job secret is wrong"),
            std::string::npos)
      << replay.args.at(0);
  // A large message before the hello is not read: the connection drops.
  const int c = connect();
  RawReply big = RawCall(c, 'N', {std::string(16 << 10, 'x')});
  EXPECT_FALSE(big.status.ok());
  close(a);
  close(b);
  close(c);
  EXPECT_EQ(server->Get("k").value(), "v");
}

// A connection that never says its hello is dropped after the hello
// deadline, without holding up the others.
TEST(TcpStoreAuthTest, SilentConnectionIsDroppedAfterTheHelloDeadline) {
  StoreLimits limits;
  limits.hello_deadline = absl::Milliseconds(300);
  auto server = SecretServer("s", limits);
  const absl::Time start = absl::Now();
  const int fd =
      ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
          .value();
  std::shared_ptr<TcpStore> rank1 =
      SecretClient(server->port(), 1, "s").value();
  ASSERT_TRUE(rank1->Set("k", "v").ok());
  char byte = 0;
  absl::Status s = RecvAll(fd, &byte, 1, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
  // Authenticated clients may stay quiet for longer than that.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(rank1->Get("k").value(), "v");
}

// A client that announces a large argument and goes silent is dropped once
// the message deadline passes; meanwhile the store serves the others.
TEST(TcpStoreTest, StalledRequestIsDroppedAfterTheMessageDeadline) {
  TcpStore::Options o;
  o.is_server = true;
  o.limits.message_deadline = absl::Milliseconds(500);
  o.timeout = absl::Seconds(10);
  std::shared_ptr<TcpStore> server = TcpStore::Connect(o).value();
  const int fd =
      ConnectTcp("127.0.0.1", server->port(), absl::Now() + absl::Seconds(5))
          .value();
  // 'S', two arguments, the first of 1 MiB, then nothing.
  std::string head = "S";
  const uint32_t n = 2, len = 1 << 20;
  head.append(reinterpret_cast<const char*>(&n), 4);
  head.append(reinterpret_cast<const char*>(&len), 4);
  head.append("abc");
  const absl::Time start = absl::Now();
  ASSERT_TRUE(
      SendAll(fd, head.data(), head.size(), absl::Now() + absl::Seconds(5))
          .ok());
  auto other = Client(server->port(), 1);
  ASSERT_TRUE(other->Set("k", "v").ok());
  EXPECT_EQ(other->Get("k").value(), "v");
  char byte = 0;
  absl::Status s = RecvAll(fd, &byte, 1, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(fd);
  EXPECT_TRUE(server->Check({"k"}).value());
}

// Connections past the limit are refused with a reason; the store goes on,
// and takes new ones once the others have left.
TEST(TcpStoreTest, ConnectionsPastTheLimitAreRefused) {
  TcpStore::Options o;
  o.is_server = true;
  o.limits.max_connections = 3;  // The server's own client is one.
  o.timeout = absl::Seconds(10);
  std::shared_ptr<TcpStore> server = TcpStore::Connect(o).value();
  std::vector<std::shared_ptr<TcpStore>> clients;
  clients.push_back(Client(server->port(), 1));
  clients.push_back(Client(server->port(), 2));
  for (int i = 0; i < 3; ++i) {
    TcpStore::Options c;
    c.port = server->port();
    c.rank = 3;
    c.timeout = absl::Seconds(10);
    absl::StatusOr<std::shared_ptr<TcpStore>> extra = TcpStore::Connect(c);
    ASSERT_FALSE(extra.ok());
    EXPECT_NE(extra.status().message().find("its limit"), std::string::npos)
        << extra.status();
  }
  ASSERT_TRUE(server->Set("k", "v").ok());
  EXPECT_EQ(clients[0]->Get("k").value(), "v");
  clients.clear();
  absl::StatusOr<std::shared_ptr<TcpStore>> later;
  for (int i = 0; i < 100; ++i) {
    later = TcpStore::Connect([&] {
      TcpStore::Options c;
      c.port = server->port();
      c.rank = 4;
      c.timeout = absl::Seconds(10);
      return c;
    }());
    if (later.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ((*later)->Get("k").value(), "v");
}

// Keys and values together are bounded: a Set past the limit is an error
// reply naming the limit, and deleting makes room again.
TEST(TcpStoreTest, StoredBytesAreBounded) {
  TcpStore::Options o;
  o.is_server = true;
  o.limits.max_stored_bytes = 1000;
  o.timeout = absl::Seconds(10);
  std::shared_ptr<TcpStore> server = TcpStore::Connect(o).value();
  ASSERT_TRUE(server->Set("a", std::string(600, 'x')).ok());
  absl::Status full = server->Set("b", std::string(600, 'y'));
  EXPECT_FALSE(full.ok());
  EXPECT_NE(full.message().find("limit of 1000 bytes"), std::string::npos)
      << full;
  EXPECT_FALSE(server->Check({"b"}).value());
  ASSERT_TRUE(server->Set("a", std::string(300, 'x')).ok());  // Shrinks.
  ASSERT_TRUE(server->Set("b", std::string(600, 'y')).ok());
  EXPECT_FALSE(server->Set("c", std::string(200, 'z')).ok());
  ASSERT_TRUE(server->Delete("b").ok());
  ASSERT_TRUE(server->Set("c", std::string(600, 'z')).ok());
}

TEST(TcpStoreTest, SetGetCheckDelete) {
  auto server = Server();
  auto client = Client(server->port());
  ASSERT_TRUE(client->Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(server->Get("a").value(), std::string("x\0y", 3));
  EXPECT_TRUE(server->Check({"a"}).value());
  EXPECT_FALSE(server->Check({"a", "b"}).value());
  ASSERT_TRUE(client->Delete("a").ok());
  EXPECT_FALSE(server->Check({"a"}).value());
}

TEST(TcpStoreTest, GetWaitsForTheKey) {
  auto server = Server();
  auto client = Client(server->port());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    auto other = Client(server->port());
    ASSERT_TRUE(other->Set("late", "v").ok());
  });
  const absl::Time start = absl::Now();
  EXPECT_EQ(client->Get("late", absl::Seconds(5)).value(), "v");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_TRUE(client->Wait({"late"}, absl::Seconds(1)).ok());
  setter.join();
}

TEST(TcpStoreTest, GetAndWaitTimeOutNamingTheKeys) {
  auto server = Server();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = server->Get("never", absl::Milliseconds(200));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("never"), std::string::npos);
  absl::Status s = server->Wait({"x", "y"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("x, y"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(TcpStoreTest, AddIsAtomicAcrossClients) {
  auto server = Server();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto c = Client(server->port());
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(c->Add("n", 2).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(server->Add("n", 0).value(), 400);
  ASSERT_TRUE(server->Set("s", "abc").ok());
  EXPECT_FALSE(server->Add("s", 1).ok());
}

TEST(TcpStoreTest, LostRankIsRecordedCleanExitIsNot) {
  auto server = Server();
  { auto clean = Client(server->port(), 3); }  // Says goodbye.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TcpStore::Options o;
    o.port = server->port();
    o.rank = 5;
    auto c = TcpStore::Connect(o);
    _exit(c.ok() ? 0 : 1);  // Dies without a goodbye.
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::vector<int> lost;
  for (int i = 0; i < 100 && lost.empty(); ++i) {
    lost = server->LostRanks().value();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(lost, std::vector<int>({5}));
}

TEST(TcpStoreTest, LostServerIsAClearError) {
  auto server = Server();
  auto client = Client(server->port());
  server.reset();
  absl::StatusOr<std::string> v = client->Get("k", absl::Seconds(5));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(v.status().message().find("rank 0"), std::string::npos);
}

// A store host that is stopped (SIGSTOP, a hung node) accepts connections
// in the kernel but never answers: the lost-ranks query after a failure
// gives up within 2 s, and later calls fail at once instead of waiting out
// their own deadlines.
TEST(TcpStoreTest, SilentServerFailsTheLostRanksQueryFastAndThenEveryCall) {
  int port = 0;
  absl::StatusOr<int> listener = ListenOnFreePort("127.0.0.1", &port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  TcpStore::Options o;
  o.port = port;
  o.timeout = absl::Seconds(5);
  absl::StatusOr<std::shared_ptr<TcpStore>> client = TcpStore::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Time start = absl::Now();
  absl::StatusOr<std::vector<int>> lost = (*client)->LostRanks();
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  start = absl::Now();
  EXPECT_EQ((*client)->Set("k", "v").code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  close(*listener);
}

TEST(TcpStoreTest, UnreachableServerTimesOut) {
  TcpStore::Options o;
  o.port = 1;  // Nothing listens there.
  o.timeout = absl::Milliseconds(200);
  absl::StatusOr<std::shared_ptr<TcpStore>> c = TcpStore::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), std::string::npos);
}

// A port from the ephemeral range could be taken by any outgoing connection
// before the store listens on it; FindFreePort stays below that range.
TEST(FindFreePortTest, StaysBelowTheEphemeralRangeAndIsListenable) {
  int low = 0, high = 0;
  if (!EphemeralPortRange(&low, &high) || low <= 2048) {
    GTEST_SKIP() << "no ephemeral port range below which to pick";
  }
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<int> port = FindFreePort();
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_LT(*port, low);
    EXPECT_GE(*port, 1024);
    TcpStore::Options o;
    o.is_server = true;
    o.port = *port;
    o.timeout = absl::Seconds(10);
    absl::StatusOr<std::shared_ptr<TcpStore>> server = TcpStore::Connect(o);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->port(), *port);
  }
}

// Two jobs given one port: a rank of the second job that reaches the first
// job's store is refused, naming both jobs, and the first job loses nothing.
TEST(TcpStoreTest, RefusesARankOfAnotherJob) {
  TcpStore::Options o;
  o.is_server = true;
  o.rank = 0;
  o.job_id = "job-a";
  o.timeout = absl::Seconds(10);
  std::shared_ptr<TcpStore> server = TcpStore::Connect(o).value();
  TcpStore::Options other;
  other.port = server->port();
  other.rank = 2;
  other.job_id = "job-b";
  other.timeout = absl::Seconds(10);
  absl::StatusOr<std::shared_ptr<TcpStore>> refused = TcpStore::Connect(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rank 2 of job 'job-b'"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("store of job 'job-a'"),
            std::string::npos)
      << refused.status();
  // A rank without a job id is of another job too.
  other.job_id = "";
  EXPECT_FALSE(TcpStore::Connect(other).ok());
  // The refused ranks were never this job's: they are not reported lost.
  EXPECT_TRUE(server->LostRanks().value().empty());
  other.job_id = "job-a";
  absl::StatusOr<std::shared_ptr<TcpStore>> same = TcpStore::Connect(other);
  ASSERT_TRUE(same.ok()) << same.status();
  ASSERT_TRUE((*same)->Set("k", "v").ok());
  EXPECT_EQ(server->Get("k").value(), "v");
}

// A launcher holds the port and hands the listening socket to rank 0, whose
// store serves on it: binding the port again would fail while it is held.
TEST(TcpStoreTest, ServesOnTheSocketALauncherHanded) {
  PortReservation reservation = PortReservation::Listen("127.0.0.1", 0).value();
  int unused = 0;
  EXPECT_FALSE(ListenTcp("127.0.0.1", reservation.port(), &unused).ok())
      << "the port is not held";
  // As in the forked rank 0: the socket survives exec, named in the
  // environment. The store then owns it, so the reservation must not close
  // it: it moves to a copy that is never destroyed.
  reservation.HandToChild();
  auto* kept = new PortReservation(std::move(reservation));
  TcpStore::Options o;
  o.is_server = true;
  o.port = kept->port();
  o.rank = 0;
  o.timeout = absl::Seconds(10);
  absl::StatusOr<std::shared_ptr<TcpStore>> server = TcpStore::Connect(o);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(std::getenv(kStoreListenFdEnv), nullptr)
      << "the variable must not reach rank 0's own children";
  std::shared_ptr<TcpStore> client = Client(kept->port(), 1);
  ASSERT_TRUE(client->Set("k", "v").ok());
  EXPECT_EQ((*server)->Get("k").value(), "v");
}

// A variable naming a socket that does not listen on the store's port (left
// over, or meant for another port) is ignored: the store binds its own.
TEST(TcpStoreTest, IgnoresAHandedSocketOfAnotherPort) {
  PortReservation held = PortReservation::Listen("127.0.0.1", 0).value();
  held.HandToChild();
  const int port = FindFreePort().value();
  TcpStore::Options o;
  o.is_server = true;
  o.port = port;
  o.timeout = absl::Seconds(10);
  absl::StatusOr<std::shared_ptr<TcpStore>> server = TcpStore::Connect(o);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->port(), port);
  EXPECT_EQ(std::getenv(kStoreListenFdEnv), nullptr);
  int unused = 0;
  EXPECT_FALSE(ListenTcp("127.0.0.1", held.port(), &unused).ok())
      << "the other port's socket must stay open";
}

TEST(PortReservationTest, ReleaseFreesThePort) {
  PortReservation reservation = PortReservation::Listen("127.0.0.1", 0).value();
  const int port = reservation.port();
  ASSERT_TRUE(reservation.held());
  int unused = 0;
  EXPECT_FALSE(ListenTcp("127.0.0.1", port, &unused).ok());
  reservation.Release();
  EXPECT_FALSE(reservation.held());
  absl::StatusOr<int> fd = ListenTcp("127.0.0.1", port, &unused);
  ASSERT_TRUE(fd.ok()) << fd.status();
  close(*fd);
  // A named port is held the same way, and a second holder is refused.
  PortReservation named = PortReservation::Listen("127.0.0.1", port).value();
  EXPECT_EQ(named.port(), port);
  EXPECT_FALSE(PortReservation::Listen("127.0.0.1", port).ok());
}

TEST(PrefixStoreTest, KeysAreNamespaced) {
  auto server = Server();
  PrefixStore a("a", server), b("b", server);
  ASSERT_TRUE(a.Set("k", "1").ok());
  ASSERT_TRUE(b.Set("k", "2").ok());
  EXPECT_EQ(a.Get("k").value(), "1");
  EXPECT_EQ(server->Get("b/k").value(), "2");
}

}  // namespace
}  // namespace comm
}  // namespace mcc
