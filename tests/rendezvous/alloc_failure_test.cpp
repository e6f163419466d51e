// Allocation failure inside a session, made deterministic: this test binary replaces
// the global operator new with one that, once armed, throws a real std::bad_alloc for
// any allocation of at least a given size made on the server's thread. Nothing in the
// server knows about it; the failures arrive where a real one would (a frame's buffer
// growing, a reply being built, a reply built while another client's SET wakes it up).
//
// Each failing session must close exactly once: its will fires, its namespace's keys
// go with its last connection, the connection count and the memory budget come back,
// and (under AddressSanitizer in CI) nothing is used after it is freed.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>
#include <thread>

#include "raw_client.hpp"
#include "server_fixture.hpp"
#include "torch_client.hpp"

using namespace std::chrono_literals;

namespace {

std::atomic<size_t> g_fail_from{0};  // 0: never fail
std::atomic<std::thread::id> g_fail_thread{};

void* allocate(size_t n) {
  size_t from = g_fail_from.load(std::memory_order_relaxed);
  if (from != 0 && n >= from && std::this_thread::get_id() == g_fail_thread.load()) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}

void* allocate_nothrow(size_t n) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}

// Arms the failure for the scope: allocations of `from` bytes or more on `thread`.
struct FailAllocations {
  FailAllocations(std::thread::id thread, size_t from) {
    g_fail_thread = thread;
    g_fail_from = from;
  }
  ~FailAllocations() { g_fail_from = 0; }
};

}  // namespace

// Every plain, array and nothrow form, so that each new meets its own delete (malloc/free).
void* operator new(size_t n) { return allocate(n); }
void* operator new[](size_t n) { return allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate_nothrow(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

TEST_CASE("an allocation that fails inside a session closes and unregisters it exactly once", "[server][memory]") {
  rdzv::ServerOptions options;
  options.max_connections = 4;
  testing::ServerThread server(options);
  auto watcher = server.client("job");
  watcher->set("big", std::string(2u << 20, 'b'));
  auto reader = server.client("job");
  reader->set_will("failure/reader", "reader lost");
  auto waiter = server.client("job");
  waiter->set_will("failure/waiter", "waiter lost");
  auto solo = server.client("solo");
  solo->set("k", "v");
  {
    FailAllocations fail(server.thread_id(), 1u << 20);
    // A frame's buffer grows past 1 MiB: bad_alloc in the read handler itself.
    CHECK_THROWS_AS(solo->set("huge", std::string(4u << 20, 'h')), rdzv::StoreError);
    // A 2 MiB reply built for a GET.
    CHECK_THROWS_AS(reader->get("big", 2s), rdzv::StoreError);
    // A 2 MiB reply built while another client's SET wakes the request: the waiting
    // client goes, the one that set the key is answered.
    std::thread blocked([&] { CHECK_THROWS_AS(waiter->multi_get({"big", "go"}, 5s), rdzv::StoreError); });
    REQUIRE(testing::eventually([&] { return server.stats().waiters == 1; }));
    watcher->set("go", "1");
    blocked.join();
  }
  // Each will fired (once: a compare_set from nothing), each session left the registry.
  CHECK(watcher->get("failure/reader", 2s) == "reader lost");
  CHECK(watcher->get("failure/waiter", 2s) == "waiter lost");
  CHECK(testing::eventually([&] {
    auto s = server.stats();
    return s.connections == 1 && s.namespaces == 1 && s.waiters == 0 && s.held < (64u << 10);
  }));
  // The abandoned namespace's keys went with it, and the count admits 4 again.
  std::vector<std::unique_ptr<rdzv::TcpStore>> more;
  for (int i = 0; i < 3; ++i) more.push_back(server.client("solo"));
  CHECK(more[0]->num_keys() == 0);
  CHECK(watcher->num_keys() == 4);  // big, go and the two wills
}

TEST_CASE("a SET that wakes its own session's request, which cannot be answered, closes it later", "[server][memory]") {
  testing::ServerThread server;
  auto watcher = server.client("job");
  watcher->set("big", std::string(2u << 20, 'b'));
  const size_t job_bytes = server.stats().bytes;
  // One connection blocks on {big, go} and then, pipelined, sets "go" itself: the wake
  // cannot build its own 2 MiB reply, so the setter's session is the one that goes,
  // while its SET (and the namespace it is walking) is still in use.
  testing::RawConnection raw(server.port());
  raw.send_bytes(testing::RawConnection::hello("mine"));
  REQUIRE(raw.reply_to(1));
  rdzv::wire::Request put{rdzv::wire::Type::kSet, {"big"}, {std::string(2u << 20, 'b')}, 0};
  raw.send_bytes(testing::RawConnection::request(put, 2));
  REQUIRE(raw.reply_to(2));
  rdzv::wire::Request wait{rdzv::wire::Type::kMultiGet, {"big", "go"}, {}, 5000};
  raw.send_bytes(testing::RawConnection::request(wait, 3));
  REQUIRE(testing::eventually([&] { return server.stats().waiters == 1; }));
  {
    FailAllocations fail(server.thread_id(), 1u << 20);
    rdzv::wire::Request go{rdzv::wire::Type::kMultiSet, {"go", "x"}, {"1", "2"}, 0};
    raw.send_bytes(testing::RawConnection::request(go, 4));
    raw.read_until_closed();
  }
  // "mine" went with its only connection, its keys with it; the budget counts exactly
  // what "job" stores, and everything returns to zero once the last client goes.
  CHECK(testing::eventually([&] {
    auto s = server.stats();
    return s.connections == 1 && s.namespaces == 1 && s.waiters == 0;
  }));
  CHECK(server.stats().bytes == job_bytes);
  watcher.reset();
  CHECK(testing::eventually([&] {
    auto s = server.stats();
    return s.connections == 0 && s.namespaces == 0 && s.bytes == 0 && s.held == 0;
  }));
}

TEST_CASE("each connection is charged to the memory budget until it closes", "[server][memory]") {
  rdzv::ServerOptions options;
  options.max_memory = 64u << 10;
  testing::ServerThread server(options);
  std::vector<std::unique_ptr<testing::RawConnection>> idle;
  std::string refusal;
  for (int i = 0; i < 200 && refusal.empty(); ++i) {  // 64 KiB holds a few dozen at most
    idle.push_back(std::make_unique<testing::RawConnection>(server.port()));
    auto first = idle.back()->read_frame();
    REQUIRE(first);
    if (first->header.type == rdzv::wire::Type::kError) refusal = first->message();
  }
  CHECK(refusal.find("store memory limit reached") != std::string::npos);
  CHECK(idle.size() > 4);
  CHECK(server.stats().held > (64u << 10) - (4u << 10));  // the admitted ones fill it
  idle.clear();
  CHECK(testing::eventually([&] { return server.stats().connections == 0 && server.stats().held == 0; }));
  auto client = server.client("again");  // room again
  client->set("k", "v");
  CHECK(client->get("k", std::chrono::seconds(2)) == "v");
}

TEST_CASE("torch LIST_KEYS allocates nothing beyond its reply", "[server][memory][torch]") {
  rdzv::ServerOptions options;
  options.torch_namespace = "job";
  testing::ServerThread server(options);
  testing::TorchClient t(server.port());
  // Keys short enough to sit inside their strings: a copy of them all (32 bytes each)
  // is larger than the reply (8 + 8 + 9 bytes each).
  constexpr size_t kKeys = 4000;
  std::vector<std::string> keys, values;
  for (size_t i = 0; i < kKeys; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "key-%05zu", i);
    keys.emplace_back(key);
    values.emplace_back("v");
  }
  t.send(testing::TorchClient::q(testing::TorchClient::Query::kMultiSet, keys, values));
  REQUIRE(t.num_keys() == static_cast<int64_t>(kKeys));
  const size_t reply = 8 + kKeys * (8 + 9);
  {
    FailAllocations fail(server.thread_id(), reply + 8 * 1024);
    t.send(testing::TorchClient::q(testing::TorchClient::Query::kListKeys));
    REQUIRE(t.i64() == static_cast<int64_t>(kKeys));
    std::vector<std::string> listed;
    for (size_t i = 0; i < kKeys; ++i) listed.push_back(t.bytes());
    std::sort(listed.begin(), listed.end());
    CHECK(listed == keys);
  }
}
