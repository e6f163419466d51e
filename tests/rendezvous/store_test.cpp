// Every Store operation, on the in-memory store and on the TCP store against a real
// server, plus the PrefixStore view; what a timeout reports on each.
#include <catch2/catch.hpp>

#include <atomic>
#include <optional>
#include <thread>

#include "rdzv/memory_store.hpp"
#include "rdzv/prefix_store.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;
using rdzv::Millis;

namespace {

// A store under test plus whatever keeps it alive.
struct Subject {
  std::unique_ptr<testing::ServerThread> server;
  std::unique_ptr<rdzv::Store> store;
  // Another connection to the same data (for waits woken from elsewhere).
  std::function<std::unique_ptr<rdzv::Store>()> another;
};

Subject make_subject(const std::string& kind) {
  Subject s;
  if (kind == "memory") {
    auto mem = std::make_shared<rdzv::MemoryStore>();
    struct Shared : rdzv::PrefixStore {
      Shared(std::shared_ptr<rdzv::MemoryStore> m) : rdzv::PrefixStore("t", *m), keep(std::move(m)) {}
      std::shared_ptr<rdzv::MemoryStore> keep;
    };
    // A PrefixStore over a shared MemoryStore: both views see the same data.
    s.store = std::make_unique<Shared>(mem);
    s.another = [mem] { return std::unique_ptr<rdzv::Store>(new Shared(mem)); };
  } else {
    s.server = std::make_unique<testing::ServerThread>();
    s.store = s.server->client();
    auto* server = s.server.get();
    s.another = [server] { return std::unique_ptr<rdzv::Store>(server->client()); };
  }
  return s;
}

}  // namespace

TEST_CASE("store operations behave the same on the memory and TCP stores", "[store]") {
  const std::string kind = GENERATE("memory", "tcp");
  INFO("store: " << kind);
  Subject s = make_subject(kind);
  rdzv::Store& st = *s.store;

  SECTION("set and get, binary values included") {
    std::string binary("a\0b\xff", 4);
    st.set("k", binary);
    CHECK(st.get("k", 1s) == binary);
    st.set("k", "");
    CHECK(st.get("k", 1s).empty());
  }
  SECTION("add counts from zero and rejects non-integers") {
    CHECK(st.add("n", 5) == 5);
    CHECK(st.add("n", -7) == -2);
    CHECK(st.get("n", 1s) == "-2");
    st.set("text", "abc");
    CHECK_THROWS_AS(st.add("text", 1), rdzv::StoreError);
  }
  SECTION("compare_set sets only on a match and reports the value after") {
    CHECK(st.compare_set("c", "", "first") == "first");
    CHECK(st.compare_set("c", "", "second") == "first");
    CHECK(st.compare_set("c", "first", "third") == "third");
    CHECK(st.compare_set("missing", "x", "y").empty());
    CHECK_FALSE(st.check({"missing"}));
  }
  SECTION("check, delete_key and num_keys") {
    int64_t before = st.num_keys();
    st.set("a", "1");
    st.set("b", "2");
    CHECK(st.check({"a", "b"}));
    CHECK_FALSE(st.check({"a", "zz"}));
    CHECK(st.num_keys() == before + 2);
    CHECK(st.delete_key("a"));
    CHECK_FALSE(st.delete_key("a"));
    CHECK(st.num_keys() == before + 1);
  }
  SECTION("multi_set and multi_get keep order") {
    st.multi_set({"x", "y", "z"}, {"1", "2", "3"});
    CHECK(st.multi_get({"z", "x", "y"}, 1s) == std::vector<std::string>{"3", "1", "2"});
    CHECK(st.multi_get({}, 1s).empty());
    CHECK_THROWS_AS(st.multi_set({"a"}, {}), rdzv::StoreError);
  }
  SECTION("append builds a value") {
    st.append("log", "ab");
    st.append("log", "cd");
    CHECK(st.get("log", 1s) == "abcd");
  }
  SECTION("a blocking get wakes up on set") {
    auto other = s.another();
    auto start = std::chrono::steady_clock::now();
    std::thread setter([&] {
      std::this_thread::sleep_for(100ms);
      other->set("late", "here");
    });
    CHECK(st.get("late", 10s) == "here");
    setter.join();
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }
  SECTION("wait wakes up when the last key arrives") {
    auto other = s.another();
    std::thread setter([&] {
      other->set("w1", "1");
      std::this_thread::sleep_for(50ms);
      other->multi_set({"w2", "w3"}, {"2", "3"});
    });
    st.wait({"w1", "w2", "w3"}, 10s);
    setter.join();
    CHECK(st.check({"w1", "w2", "w3"}));
  }
  SECTION("get and wait time out on time and name the missing keys") {
    auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(st.get("never", 200ms), rdzv::StoreTimeout);
    auto took = std::chrono::steady_clock::now() - start;
    CHECK(took >= 190ms);
    CHECK(took < 5s);
    st.set("present", "1");
    CHECK_THROWS_WITH(st.wait({"present", "absent"}, 100ms), Catch::Contains("absent'") && !Catch::Contains("present'"));
    CHECK_THROWS_AS(st.multi_get({"present", "absent"}, 50ms), rdzv::StoreTimeout);
    st.set("after", "ok");  // the store still works after timeouts
    CHECK(st.get("after", 1s) == "ok");
  }
}

TEST_CASE("64 threads x 10000 add on one key give the exact total", "[store]") {
  const std::string kind = GENERATE("memory", "tcp");
  INFO("store: " << kind);
  Subject s = make_subject(kind);
  constexpr int kThreads = 64, kAdds = 10000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      try {
        auto store = s.another();  // its own connection for the TCP store
        for (int i = 0; i < kAdds; ++i) store->add("counter", 1);
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(s.store->get("counter", 1s) == std::to_string(kThreads * kAdds));
}

TEST_CASE("a prefix store keeps its keys apart", "[store]") {
  rdzv::MemoryStore base;
  rdzv::PrefixStore a("job/a", base), b("job/b", base);
  a.set("k", "from a");
  b.set("k", "from b");
  CHECK(a.get("k", 1s) == "from a");
  CHECK(b.get("k", 1s) == "from b");
  CHECK(base.get("job/a/k", 1s) == "from a");
  CHECK(a.full_key("x") == "job/a/x");
}

namespace {

// The keys a StoreTimeout reported, or {"<no timeout>"} when `call` did not time out.
template <typename Fn>
std::vector<std::string> missing_after_timeout(Fn&& call) {
  try {
    call();
  } catch (const rdzv::StoreTimeout& e) {
    return e.missing_keys();
  }
  return {"<no timeout>"};
}

}  // namespace

TEST_CASE("a timeout names the keys still missing as data on every store kind", "[store]") {
  const std::string kind = GENERATE("memory", "tcp", "prefix over memory", "prefix over tcp");
  INFO("store: " << kind);
  rdzv::MemoryStore memory;
  std::unique_ptr<testing::ServerThread> server;
  std::unique_ptr<rdzv::Store> tcp;
  rdzv::Store* base = &memory;
  if (kind.find("tcp") != std::string::npos) {
    server = std::make_unique<testing::ServerThread>();
    tcp = server->client();
    base = tcp.get();
  }
  std::optional<rdzv::PrefixStore> view;
  if (kind.rfind("prefix", 0) == 0) view.emplace("job/attempt/0", *base);
  rdzv::Store& st = view ? static_cast<rdzv::Store&>(*view) : *base;

  st.set("present", "1");
  st.set("also/present", "2");
  CHECK(missing_after_timeout([&] { st.get("never", 50ms); }) == std::vector<std::string>{"never"});
  CHECK(missing_after_timeout([&] { st.wait({"b/2", "present", "a/1", "also/present"}, 50ms); }) ==
        std::vector<std::string>{"b/2", "a/1"});
  CHECK(missing_after_timeout([&] { st.multi_get({"present", "z", "y"}, 0ms); }) ==
        std::vector<std::string>{"z", "y"});
  // The message, for people, still names them too.
  CHECK_THROWS_WITH(st.get("never", 0ms), Catch::Contains("never'"));
  if (view) {
    // The base store reports the keys as it holds them.
    CHECK(missing_after_timeout([&] { base->wait({"job/attempt/0/present", "job/attempt/0/q"}, 0ms); }) ==
          std::vector<std::string>{"job/attempt/0/q"});
  }
  st.set("after", "ok");  // the store still works after timeouts
  CHECK(st.get("after", 1s) == "ok");
}
