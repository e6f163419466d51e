// The TCP client as one pipelined link (rdzv/tcp_store.hpp): many threads on one
// client, a blocked get beside other requests, each request's own deadline, the
// server going away with requests in flight, asynchronous requests, and the fork rule.
// Against the real server, or against a test playing the server when a server must
// misbehave (answer late, or not at all).
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "forked.hpp"
#include "protocol.hpp"
#include "ports.hpp"
#include "raw_client.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using rdzv::wire::Type;
using testing::eventually;
using testing::RawConnection;
using testing::ServerThread;

namespace {

// A test playing the store server on loopback: it greets one client as a server
// without a token does, then the test reads its requests and answers as it likes.
class PlayedServer {
 public:
  PlayedServer() { REQUIRE((listen_fd_ = testing::loopback_listener(port_)) >= 0); }
  ~PlayedServer() { close(listen_fd_); }

  rdzv::TcpStoreOptions options(rdzv::Millis io_timeout) const {
    rdzv::TcpStoreOptions o;
    o.port = port_;
    o.connect_timeout = 5s;
    o.io_timeout = io_timeout;
    o.heartbeat_timeout = rdzv::Millis(0);
    return o;
  }

  // Connects a client while this side accepts it and runs the handshake.
  std::pair<std::unique_ptr<rdzv::TcpStore>, std::unique_ptr<RawConnection>> connect(rdzv::Millis io_timeout) {
    auto greeted = std::async(std::launch::async, [this] {
      auto conn = std::make_unique<RawConnection>(RawConnection::Adopt{}, accept(listen_fd_, nullptr, nullptr));
      conn->send_bytes(rdzv::wire::make_frame(
          Type::kChallenge, 0, rdzv::wire::BodyWriter().bytes(std::string(32, 's')).u32(0).take()));
      auto hello = conn->read_frame();
      REQUIRE(hello);
      REQUIRE(hello->header.type == Type::kHello);
      conn->send_bytes(rdzv::wire::make_frame(Type::kOk, hello->header.request_id, rdzv::wire::BodyWriter().bytes("").take()));
      return conn;
    });
    auto client = std::make_unique<rdzv::TcpStore>(options(io_timeout));
    return {std::move(client), greeted.get()};
  }

 private:
  int listen_fd_ = -1;
  uint16_t port_ = 0;
};

void answer_ok(RawConnection& conn, uint32_t id) { conn.send_bytes(rdzv::wire::make_frame(Type::kOk, id, "")); }

template <typename Fn>
Clock::duration timed(Fn&& fn) {
  const auto start = Clock::now();
  fn();
  return Clock::now() - start;
}

}  // namespace

TEST_CASE("16 threads share one client: every answer reaches its own request", "[client]") {
  ServerThread server;
  auto store = server.client();
  constexpr int kThreads = 16, kRounds = 500;
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const std::string mine = "key/" + std::to_string(t);
        for (int i = 0; i < kRounds; ++i) {
          store->set(mine, std::to_string(i));
          if (store->get(mine, 1s) != std::to_string(i)) ++wrong;
          store->add("counter", 1);
        }
      } catch (const std::exception&) {
        ++failed;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failed == 0);
  CHECK(wrong == 0);
  CHECK(store->add("counter", 0) == kThreads * kRounds);
}

TEST_CASE("a get blocked on one thread does not hold up requests from others", "[client]") {
  ServerThread server;
  auto store = server.client();
  auto blocked = std::async(std::launch::async, [&] { return store->get("later", 10s); });
  REQUIRE(eventually([&] { return server.stats().waiters == 1; }));
  const auto quick = timed([&] {
    store->set("now", "1");
    CHECK(store->get("now", 1s) == "1");
    CHECK(store->add("n", 5) == 5);
  });
  CHECK(quick < 500ms);
  CHECK(blocked.wait_for(0s) == std::future_status::timeout);  // still waiting
  store->set("later", "value");
  REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
  CHECK(blocked.get() == "value");
}

TEST_CASE("requests in flight together end each by its own deadline, in their own order", "[client]") {
  ServerThread server;
  auto store = server.client();
  auto setter = server.client();
  const auto start = Clock::now();
  auto long_wait = std::async(std::launch::async, [&] { return store->get("b", 5s); });
  auto short_wait = std::async(std::launch::async, [&]() -> std::vector<std::string> {
    try {
      store->get("a", 300ms);
    } catch (const rdzv::StoreTimeout& e) {
      return e.missing_keys();
    }
    return {"<no timeout>"};
  });
  CHECK(short_wait.get() == std::vector<std::string>{"a"});  // the later request ends first
  CHECK(Clock::now() - start < 2s);
  CHECK(long_wait.wait_for(0s) == std::future_status::timeout);
  setter->set("b", "bee");
  CHECK(long_wait.get() == "bee");
}

TEST_CASE("a request the server leaves unanswered is given up alone and its late answer dropped", "[client]") {
  PlayedServer played;
  auto [store, conn] = played.connect(1000ms);
  auto stuck = std::async(std::launch::async, [&, &store = store] { return timed([&] { store->ping(); }); });
  auto first = conn->read_frame();
  REQUIRE(first);
  // The server keeps answering other requests meanwhile, so it is alive: only the one
  // request is given up, with StoreTimeout, and the connection goes on.
  std::atomic<bool> done{false};
  auto other = std::async(std::launch::async, [&, &store = store] {
    while (!done) {
      try {
        store->ping();
      } catch (const rdzv::StoreError&) {
      }
      std::this_thread::sleep_for(20ms);
    }
  });
  auto answer_others_until = [&, &conn = conn](std::future<void>& f) {
    while (f.wait_for(0s) != std::future_status::ready) {
      if (auto asked = conn->read_frame(50ms)) answer_ok(*conn, asked->header.request_id);
    }
  };
  while (stuck.wait_for(0s) != std::future_status::ready) {
    if (auto f = conn->read_frame(50ms)) answer_ok(*conn, f->header.request_id);
  }
  done = true;
  // The stuck ping ended by its own deadline (io_timeout), as a timeout.
  std::exception_ptr error;
  try {
    stuck.get();
  } catch (...) {
    error = std::current_exception();
  }
  REQUIRE(error);
  CHECK_THROWS_AS(std::rethrow_exception(error), rdzv::StoreTimeout);
  // Its answer, late, is dropped; the next request gets its own answer.
  answer_ok(*conn, first->header.request_id);
  answer_others_until(other);
  auto next = std::async(std::launch::async, [&, &store = store] { return store->add("k", 1); });
  auto asked = conn->read_frame();
  REQUIRE(asked);
  REQUIRE(asked->header.type == Type::kAdd);
  conn->send_bytes(rdzv::wire::make_frame(Type::kOk, asked->header.request_id, rdzv::wire::BodyWriter().i64(42).take()));
  CHECK(next.get() == 42);
}

TEST_CASE("a server that says nothing past a deadline counts as gone: everything in flight fails", "[client]") {
  PlayedServer played;
  auto [store, conn] = played.connect(300ms);
  auto blocked = std::async(std::launch::async, [&, &store = store] { return store->get("k", 60s); });
  auto pinged = std::async(std::launch::async, [&, &store = store] { store->ping(); });
  const auto start = Clock::now();
  CHECK_THROWS_AS(pinged.get(), rdzv::StoreConnectionError);
  CHECK_THROWS_WITH(blocked.get(), Catch::Contains("no answer within the I/O timeout"));
  CHECK(Clock::now() - start < 3s);
  CHECK_THROWS_AS(store->set("k", "v"), rdzv::StoreConnectionError);  // final: no reconnect
}

TEST_CASE("the server going away fails every request in flight at once, and every later one", "[client]") {
  auto server = std::make_unique<ServerThread>();
  auto store = server->client();
  std::vector<std::future<std::string>> waits;
  for (int i = 0; i < 8; ++i) {
    waits.push_back(std::async(std::launch::async, [&, i] {
      try {
        store->get("never/" + std::to_string(i), 60s);
      } catch (const rdzv::StoreConnectionError&) {
        return std::string("lost");
      } catch (const std::exception& e) {
        return std::string("other: ") + e.what();
      }
      return std::string("answered");
    }));
  }
  REQUIRE(eventually([&] { return server->stats().waiters == 8; }));
  const auto start = Clock::now();
  server.reset();
  for (auto& w : waits) CHECK(w.get() == "lost");
  CHECK(Clock::now() - start < 2s);
  CHECK_THROWS_AS(store->ping(), rdzv::StoreConnectionError);
}

TEST_CASE("asynchronous requests complete on the link thread, a cancelled one never", "[client]") {
  ServerThread server;
  auto store = server.client();
  std::promise<std::pair<std::string, std::thread::id>> got;
  store->get_async("k", 5s, [&](rdzv::Outcome<std::string> o) { got.set_value({o.get(), std::this_thread::get_id()}); });
  std::atomic<bool> ran{false};
  const rdzv::RequestId cancelled = store->get_async("gone", 5s, [&](rdzv::Outcome<std::string>) { ran = true; });
  CHECK(store->cancel(cancelled));
  CHECK_FALSE(store->cancel(cancelled));
  store->set("gone", "x");
  store->set("k", "v");
  auto answer = got.get_future();
  REQUIRE(answer.wait_for(5s) == std::future_status::ready);
  const auto [value, thread] = answer.get();
  CHECK(value == "v");
  CHECK(thread != std::this_thread::get_id());

  // Tasks run on that thread too, in order of when they are due; a synchronous
  // request from there would wait for itself and is refused.
  std::promise<std::string> order;
  std::string seen;
  store->post_after(100ms, [&] {
    seen += "late";
    try {
      store->ping();
    } catch (const rdzv::StoreError& e) {
      seen += std::string(" | ") + e.what();
    }
    order.set_value(seen);
  });
  store->post([&] { seen += "soon,"; });
  auto told = order.get_future();
  REQUIRE(told.wait_for(5s) == std::future_status::ready);
  CHECK_THAT(told.get(), Catch::StartsWith("soon,late | ") && Catch::Contains("would wait for itself"));
  CHECK_FALSE(ran);
  // An asynchronous add and set, and their outcomes.
  std::promise<int64_t> added;
  store->add_async("n", 3, [&](rdzv::Outcome<int64_t> o) { added.set_value(o.get()); });
  CHECK(added.get_future().get() == 3);
  std::promise<bool> stored;
  store->set_async("s", "v", [&](rdzv::Done d) { stored.set_value(d.ok()); });
  CHECK(stored.get_future().get());
}

TEST_CASE("abort() ends the requests of every thread at once", "[client]") {
  ServerThread server;
  auto store = server.client();
  auto blocked = std::async(std::launch::async, [&] { store->wait({"never"}, 60s); });
  std::promise<bool> async_failed;
  store->get_async("never", 60s, [&](rdzv::Outcome<std::string> o) { async_failed.set_value(!o.ok()); });
  REQUIRE(eventually([&] { return server.stats().waiters == 2; }));
  const auto start = Clock::now();
  store->abort();
  CHECK_THROWS_AS(blocked.get(), rdzv::StoreConnectionError);
  CHECK(async_failed.get_future().get());
  CHECK(Clock::now() - start < 1s);
}

TEST_CASE("a forked child cannot use its parent's client and destroys its copy without harm", "[client][fork]") {
  ServerThread server;
  auto store = server.client();
  auto blocked = std::async(std::launch::async, [&] { return store->get("key", 20s); });
  REQUIRE(eventually([&] { return server.stats().waiters == 1; }));
  for (int i = 0; i < 5; ++i) {  // forks land at random points of the link thread's work
    testing::ForkedChild child([&] {
      std::string said;
      if (!store->forked()) return std::string("not forked?");
      try {
        store->set("from-child", "1");
        said = "used";
      } catch (const rdzv::StoreConnectionError& e) {
        said = e.what();
      }
      store.reset();  // leaves the parent's thread, locks and socket alone
      rdzv::TcpStore own(server.client_options());  // a child connects its own
      own.set("child/" + std::to_string(getpid()), "1");
      return said;
    });
    const auto r = child.wait(10s);
    REQUIRE(r.ok);
    CHECK_THAT(r.payload, Catch::Contains("forked"));
  }
  CHECK_FALSE(store->forked());
  CHECK_FALSE(store->check({"from-child"}));
  store->set("key", "still here");
  CHECK(blocked.get() == "still here");
}
