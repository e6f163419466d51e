// The server's own duties: cleaning up after clients, authentication, namespaces,
// wills, limits, and surviving malformed frames.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "protocol.hpp"
#include "raw_client.hpp"
#include "server_fixture.hpp"
#include "session.hpp"  // kSessionBytes: what a connection costs the budget

using namespace std::chrono_literals;
using testing::eventually;
using testing::RawConnection;
using testing::ServerThread;

namespace {

std::string error_text(const std::string& frames) {
  // Skip the CHALLENGE, find the ERROR frame and return its message.
  size_t at = 0;
  while (at + rdzv::wire::kHeaderSize <= frames.size()) {
    auto h = rdzv::wire::decode_header(frames.data() + at, {});
    std::string_view body(frames.data() + at + rdzv::wire::kHeaderSize, h.body_size);
    if (h.type == rdzv::wire::Type::kError) {
      rdzv::wire::BodyReader r(body, {});
      return r.bytes();
    }
    at += rdzv::wire::kHeaderSize + h.body_size;
  }
  return "<no error frame>";
}

}  // namespace

TEST_CASE("a client that disconnects mid-wait leaves no server state behind", "[server]") {
  ServerThread server;
  {
    auto waiter = server.client("job");
    std::thread t([&] {
      try {
        waiter->get("never", 60s);
      } catch (const rdzv::StoreError&) {
      }
    });
    REQUIRE(eventually([&] { return server.stats().waiters == 1; }));
    // Close the client's socket from under the blocked get.
    for (int fd = 3; fd < 1024; ++fd) {
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) == 0 && ntohs(peer.sin_port) == server.port()) {
        ::shutdown(fd, SHUT_RDWR);
      }
    }
    t.join();
  }
  CHECK(eventually([&] {
    auto st = server.stats();
    return st.waiters == 0 && st.connections == 0;
  }));
  CHECK(server.stats().namespaces == 0);  // the job's namespace went with its last client
}

TEST_CASE("with a token, clients without it or with a wrong one get nothing", "[server][auth]") {
  rdzv::ServerOptions options;
  options.token = "s3cret";
  ServerThread server(options);
  auto good = server.client();
  good->set("k", "v");

  auto no_token = server.client_options();
  no_token.token = "";
  CHECK_THROWS_AS(rdzv::TcpStore(no_token), rdzv::StoreAuthError);
  auto wrong = server.client_options();
  wrong.token = "guess";
  CHECK_THROWS_WITH(rdzv::TcpStore(wrong), Catch::Contains("authentication failed"));

  // A raw client that skips HELLO can neither read nor write.
  RawConnection raw(server.port());
  rdzv::wire::Request get;
  get.type = rdzv::wire::Type::kGet;
  get.keys = {"k"};
  get.number = 100;
  raw.send_bytes(rdzv::wire::make_frame(get.type, 7, rdzv::wire::encode_request(get)));
  std::string reply = raw.read_until_closed();
  CHECK_THAT(error_text(reply), Catch::Contains("not authenticated"));
  // The only frames it got were the challenge and the error: no value.
  size_t frames = 0;
  for (size_t at = 0; at + rdzv::wire::kHeaderSize <= reply.size(); ++frames) {
    auto h = rdzv::wire::decode_header(reply.data() + at, {});
    CHECK(h.type != rdzv::wire::Type::kOk);
    at += rdzv::wire::kHeaderSize + h.body_size;
  }
  CHECK(frames == 2);
  CHECK(good->get("k", 1s) == "v");  // the server carries on
}

TEST_CASE("a client with a token refuses a server that cannot prove it", "[server][auth]") {
  ServerThread server;  // no token
  auto options = server.client_options();
  options.token = "mine";
  CHECK_THROWS_AS(rdzv::TcpStore(options), rdzv::StoreAuthError);
}

TEST_CASE("namespaces keep jobs apart on one server", "[server]") {
  ServerThread server;
  auto a = server.client("job-a");
  auto b = server.client("job-b");
  a->set("nccl_id", "A");
  b->set("nccl_id", "B");
  CHECK(a->get("nccl_id", 1s) == "A");
  CHECK(b->get("nccl_id", 1s) == "B");
  CHECK(a->num_keys() == 1);
  CHECK_FALSE(b->check({"job-a/nccl_id"}));
  CHECK(server.stats().namespaces == 2);
}

TEST_CASE("a will is published when a client drops, not when it says goodbye", "[server]") {
  ServerThread server;
  auto watcher = server.client("job");
  {
    auto node = server.client("job");
    node->set_will("failure", "node 1 lost");
    node->close();
  }
  CHECK_FALSE(watcher->check({"failure"}));
  {
    auto node = server.client("job");
    node->set_will("failure", "node 2 lost");
  }  // destroyed without close(): the connection just drops
  CHECK(watcher->get("failure", 5s) == "node 2 lost");
  {
    auto node = server.client("job");
    node->set_will("failure", "node 3 lost");
  }
  std::this_thread::sleep_for(100ms);
  CHECK(watcher->get("failure", 1s) == "node 2 lost");  // the first failure stays the root cause
}

TEST_CASE("several wills are each published when the connection drops, and replaced as a set", "[server]") {
  ServerThread server;
  auto watcher = server.client("job");
  watcher->set("failure", "an earlier failure");
  {
    auto node = server.client("job");
    node->set_wills({{"stale", "replaced before the drop"}});
    node->set_wills({{"failure", "node 7 lost"}, {"lost/7", "1"}});
  }  // dropped without close()
  CHECK(watcher->get("lost/7", 5s) == "1");
  CHECK(watcher->get("failure", 1s) == "an earlier failure");  // a will never overwrites
  CHECK_FALSE(watcher->check({"stale"}));
  {
    auto node = server.client("job");
    node->set_wills({{"lost/8", "1"}, {"failure/8", "x"}});
    node->close();  // GOODBYE discards them all
  }
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(watcher->check({"lost/8"}));
  CHECK_FALSE(watcher->check({"failure/8"}));
  auto greedy = server.client("job");
  std::vector<std::pair<std::string, std::string>> many;
  for (int i = 0; i < 17; ++i) many.emplace_back("w" + std::to_string(i), "v");
  CHECK_THROWS_AS(greedy->set_wills(many), rdzv::StoreError);
}

TEST_CASE("malformed frames close only that connection, with an error", "[server][protocol]") {
  ServerThread server;
  auto bystander = server.client("job");
  bystander->set("k", "v");
  const std::string hello_frame = [] {
    rdzv::wire::Request h;
    h.type = rdzv::wire::Type::kHello;
    h.values = {"job", std::string(rdzv::wire::kNonceSize, 'n'), ""};
    return rdzv::wire::make_frame(h.type, 1, rdzv::wire::encode_request(h));
  }();

  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;
  };
  std::string huge = rdzv::wire::make_frame(rdzv::wire::Type::kSet, 2, "");
  huge[12] = huge[13] = huge[14] = huge[15] = '\xff';  // body size 4 GiB
  std::string bad_count = hello_frame + rdzv::wire::make_frame(rdzv::wire::Type::kMultiGet, 3,
                                                               rdzv::wire::BodyWriter().u32(0x7fffffff).i64(1).take());
  std::string long_key = hello_frame + rdzv::wire::make_frame(
                                           rdzv::wire::Type::kGet, 3,
                                           rdzv::wire::BodyWriter().bytes(std::string(5000, 'k')).i64(1).take());
  std::string trailing = hello_frame + rdzv::wire::make_frame(rdzv::wire::Type::kPing, 3, "xx");
  std::vector<Case> cases = {
      {"garbage", std::string(64, 'G'), "bad magic"},
      {"oversized body", huge, "exceeds the limit"},
      {"impossible key count", bad_count, "key count"},
      {"key too long", long_key, "key of 5000 bytes"},
      {"trailing bytes", trailing, "unexpected bytes"},
      {"server-only type", hello_frame + rdzv::wire::make_frame(rdzv::wire::Type::kOk, 3, ""), "may not send"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    RawConnection raw(server.port());
    raw.send_bytes(c.bytes);
    std::string reply = raw.read_until_closed();
    CHECK(reply.find("<no close>") == std::string::npos);
    CHECK_THAT(error_text(reply), Catch::Contains(c.expect));
  }
  CHECK(bystander->get("k", 1s) == "v");
  CHECK(eventually([&] { return server.stats().connections == 1; }));
}

TEST_CASE("memory and connection limits are enforced with clear errors", "[server]") {
  rdzv::ServerOptions options;
  // Two connections, their namespace and three 1000-byte values with their table (about 3.7 KB).
  options.max_memory = 4000 + 2 * rdzv::kSessionBytes;
  options.max_value = 1024;
  options.max_connections = 2;
  ServerThread server(options);
  auto a = server.client();
  auto b = server.client();
  CHECK_THROWS_WITH(a->set("big", std::string(2000, 'x')), Catch::Contains("exceeds the limit of 1024"));
  a->set("v1", std::string(1000, 'x'));
  a->set("v2", std::string(1000, 'x'));
  a->set("v3", std::string(1000, 'x'));
  CHECK_THROWS_WITH(a->set("v4", std::string(1000, 'x')), Catch::Contains("memory limit"));
  CHECK(a->delete_key("v1"));
  a->set("v4", std::string(1000, 'x'));  // room again
  auto opts = server.client_options();
  opts.connect_timeout = 200ms;
  CHECK_THROWS_WITH(rdzv::TcpStore(opts), Catch::Contains("server full"));
}

TEST_CASE("answers too big for a frame and too many blocked requests are errors, not crashes", "[server]") {
  rdzv::ServerOptions options;
  options.max_value = 1 << 16;
  ServerThread server(options);
  auto a = server.client();
  a->set("big", std::string(60000, 'x'));
  // 64 KiB asked for 100 times would be a 6 MB reply: refused, and the connection stays.
  std::vector<std::string> same(100, "big");
  CHECK_THROWS_WITH(a->multi_get(same, 1s), Catch::Contains("exceeds the frame limit"));
  CHECK(a->get("big", 1s).size() == 60000);

  // 1,025 blocked GETs pipelined on one raw connection: the last is refused.
  RawConnection raw(server.port());
  rdzv::wire::Request hello;
  hello.type = rdzv::wire::Type::kHello;
  hello.values = {"", std::string(rdzv::wire::kNonceSize, 'n'), ""};
  std::string frames = rdzv::wire::make_frame(hello.type, 1, rdzv::wire::encode_request(hello));
  for (uint32_t i = 0; i < 1025; ++i) {
    rdzv::wire::Request get;
    get.type = rdzv::wire::Type::kGet;
    get.keys = {"never"};
    get.number = 60000;
    frames += rdzv::wire::make_frame(get.type, 2 + i, rdzv::wire::encode_request(get));
  }
  raw.send_bytes(frames);
  REQUIRE(eventually([&] { return server.stats().waiters == 1024; }));
  char buf[4096];
  std::string got;
  while (got.find("too many blocked requests") == std::string::npos) {
    pollfd p{raw.fd, POLLIN, 0};
    REQUIRE(poll(&p, 1, 5000) > 0);
    ssize_t n = recv(raw.fd, buf, sizeof(buf), 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
}

TEST_CASE("a client with a silence limit that goes quiet counts as dead", "[server]") {
  ServerThread server;
  auto watcher = server.client("job");
  auto quiet = server.client("job");
  quiet->set_will("failure", "node 1 went silent", 300ms);
  auto chatty = server.client("job");
  chatty->set_will("other", "node 2 went silent", 300ms);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) {  // 1 s of pings, 100 ms apart
    std::this_thread::sleep_for(100ms);
    chatty->ping();
  }
  CHECK(watcher->get("failure", 5s) == "node 1 went silent");
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK_FALSE(watcher->check({"other"}));  // the one that kept talking is alive
}

TEST_CASE("a connection that never authenticates cannot make the server allocate much", "[server]") {
  ServerThread server;
  RawConnection raw(server.port());
  std::string header = rdzv::wire::make_frame(rdzv::wire::Type::kHello, 1, "");
  header[12] = header[13] = '\xff';  // declares a 64 KiB HELLO: more than a HELLO ever needs
  raw.send_bytes(header);
  CHECK_THAT(error_text(raw.read_until_closed()), Catch::Contains("exceeds the limit of 1024"));
}

TEST_CASE("a TIMEOUT reply carries the missing keys as a list checked like a request's", "[server][protocol]") {
  using namespace rdzv::wire;
  TimeoutReply sent{"timed out waiting for 'a', 'b/c'", {"a", "b/c"}};
  std::string body = encode_timeout(sent);
  TimeoutReply got = decode_timeout(body, {});
  CHECK(got.message == sent.message);
  CHECK(got.missing_keys == sent.missing_keys);
  CHECK(decode_timeout(encode_timeout({"", {}}), {}).missing_keys.empty());

  CHECK_THROWS_AS(decode_timeout(body.substr(0, body.size() - 1), {}), ProtocolError);  // truncated
  CHECK_THROWS_AS(decode_timeout(body + "x", {}), ProtocolError);                       // trailing bytes
  // A server from before the key list sends the message alone: no keys, not an error.
  TimeoutReply old = decode_timeout(BodyWriter().bytes("m").take(), {});
  CHECK(old.message == "m");
  CHECK(old.missing_keys.empty());
  CHECK_THROWS_WITH(decode_timeout(BodyWriter().bytes("m").u32(0x7fffffff).take(), {}),
                    Catch::Contains("key count"));
  CHECK_THROWS_WITH(decode_timeout(BodyWriter().bytes("m").u32(1).bytes(std::string(5000, 'k')).take(), {}),
                    Catch::Contains("key of 5000 bytes"));
}

TEST_CASE("APPEND obeys the value limit, on a new key and when it grows one", "[server]") {
  rdzv::ServerOptions options;
  options.max_value = 1024;
  ServerThread server(options);
  auto a = server.client();
  const size_t empty = server.stats().bytes;  // the namespace itself
  CHECK_THROWS_WITH(a->append("new", std::string(1025, 'x')), Catch::Contains("exceeds the limit of 1024"));
  CHECK_FALSE(a->check({"new"}));
  CHECK(server.stats().bytes == empty);  // the refused append left nothing behind
  a->append("grow", std::string(1000, 'x'));
  const size_t grown = server.stats().bytes;
  CHECK_THROWS_WITH(a->append("grow", std::string(25, 'x')), Catch::Contains("exceeds the limit of 1024"));
  CHECK(server.stats().bytes == grown);
  a->append("grow", std::string(24, 'x'));  // exactly the limit
  CHECK(a->get("grow", 1s).size() == 1024);
}
