// The real ddp-rendezvous daemon (a child process, --max_memory_mib 64) under the
// memory attacks: half-sent huge frames, huge WAIT key lists, clients that
// never read their replies, more big SETs than the budget holds, and a mixed load of
// all that fills the budget. For each, the daemon stays up, its peak RSS stays within
// the limit + 32 MiB, a normal client is served promptly during and after the attack,
// and the connection count does not leak; once the mixed load's clients left, the
// daemon's RSS is back within 16 MiB of where it started.
#include <sys/resource.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "protocol.hpp"
#include "raw_client.hpp"
#include "rdzv/tcp_store.hpp"
#include "subprocess.hpp"

using namespace std::chrono_literals;
using rdzv::wire::Request;
using rdzv::wire::Type;
using testing::RawConnection;

namespace {

constexpr size_t kLimitMib = 64;
constexpr size_t kSlackMib = 32;
constexpr size_t kMaxConnections = 24;

// Under AddressSanitizer the daemon's RSS also holds ASan's shadow memory and
// allocator; what is measured then is the growth over the idle daemon.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

size_t status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoul(line.substr(field.size() + 1));
  }
  FAIL("no " << field << " for pid " << pid);
  return 0;
}

struct Daemon {
  std::unique_ptr<testing::Process> proc;
  uint16_t port = 0;
  size_t baseline_kib = 0;

  explicit Daemon(size_t max_connections = kMaxConnections) {
    testing::ProcessOptions o;
    o.unset_env = {"DDPRUN_TOKEN"};
    if (kSanitized) o.set_env["ASAN_OPTIONS"] = "quarantine_size_mb=1:detect_leaks=0";
    proc = std::make_unique<testing::Process>(
        std::vector<std::string>{RENDEZVOUS_BIN, "--host", "127.0.0.1", "--port", "0", "--max_memory_mib",
                                 std::to_string(kLimitMib), "--max-connections", std::to_string(max_connections)},
        o);
    REQUIRE(proc->wait_for_stdout([](const std::string& s) { return s.find(" (") != std::string::npos; }, 10s));
    std::string out = proc->out();
    auto colon = out.find("127.0.0.1:");
    REQUIRE(colon != std::string::npos);
    port = static_cast<uint16_t>(std::stoi(out.substr(colon + 10)));
    baseline_kib = status_kib(proc->pid(), "VmRSS");
  }
  bool alive() { return !proc->wait(0ms).has_value(); }
  size_t peak_mib() { return status_kib(proc->pid(), "VmHWM") / 1024; }
  size_t rss_mib() { return status_kib(proc->pid(), "VmRSS") / 1024; }
  size_t peak_bound_mib() const { return kLimitMib + kSlackMib + (kSanitized ? baseline_kib / 1024 : 0); }

  rdzv::TcpStoreOptions client_options(const std::string& ns) const {
    rdzv::TcpStoreOptions o;
    o.port = port;
    o.ns = ns;
    o.connect_timeout = 5s;
    o.io_timeout = 10s;
    return o;
  }

  // A normal job's round trip through the daemon: set then get, timed.
  void check_served(const std::string& what) {
    INFO(what);
    REQUIRE(alive());
    auto start = std::chrono::steady_clock::now();
    rdzv::TcpStore job(client_options("bystander"));
    job.set("addr", "10.0.0.1:1234");
    CHECK(job.get("addr", 1s) == "10.0.0.1:1234");
    CHECK(std::chrono::steady_clock::now() - start < 2s);
  }

  // --max-connections still admits exactly that many: none leaked.
  void check_no_leaked_connections() {
    std::vector<std::unique_ptr<rdzv::TcpStore>> all;
    bool admitted = testing::eventually(
        [&] {
          try {
            while (all.size() < kMaxConnections) {
              auto o = client_options("count");
              o.connect_timeout = 500ms;
              all.push_back(std::make_unique<rdzv::TcpStore>(o));
            }
            return true;
          } catch (const rdzv::StoreError&) {
            return false;
          }
        },
        10s);
    CHECK(admitted);
    CHECK(all.size() == kMaxConnections);
  }
};

// A raw connection authenticated into namespace `ns`.
std::unique_ptr<RawConnection> join(const Daemon& d, const std::string& ns) {
  auto c = std::make_unique<RawConnection>(d.port);
  c->send_bytes(RawConnection::hello(ns));
  auto ok = c->reply_to(1);
  REQUIRE(ok);
  REQUIRE(ok->header.type == Type::kOk);
  return c;
}

// Authenticated raw attackers in namespace "attack".
std::vector<std::unique_ptr<RawConnection>> connect_attackers(const Daemon& d, size_t n) {
  std::vector<std::unique_ptr<RawConnection>> out;
  for (size_t i = 0; i < n; ++i) out.push_back(join(d, "attack"));
  return out;
}

// Sends `q` as request `id` and returns its reply: true for OK, false for an ERROR
// saying the memory limit was reached; anything else fails the test.
bool accepted(RawConnection& c, const Request& q, uint32_t id) {
  c.send_bytes(RawConnection::request(q, id));
  auto reply = c.reply_to(id, 10s);
  REQUIRE(reply);
  if (reply->header.type == Type::kOk) return true;
  INFO(reply->message());
  REQUIRE(reply->header.type == Type::kError);
  REQUIRE_THAT(reply->message(), Catch::Contains("memory limit"));
  return false;
}

std::string digits(size_t n, size_t width) {
  std::string s = std::to_string(n);
  return std::string(width > s.size() ? width - s.size() : 0, '0') + s;
}

}  // namespace

TEST_CASE("20 connections that declare 16 MiB SET bodies and send 300 bytes hold little", "[server][memory]") {
  Daemon d;
  auto attackers = connect_attackers(d, 20);
  for (auto& a : attackers) {
    std::string frame = rdzv::wire::make_frame(Type::kSet, 2, "");
    uint32_t size = 16u << 20;
    std::memcpy(&frame[12], &size, 4);  // little-endian hosts only, as the wire is
    a->send_bytes(frame + std::string(300, 'x'));
  }
  d.check_served("during");
  CHECK(d.peak_mib() <= d.peak_bound_mib());
  attackers.clear();
  d.check_served("after");
  d.check_no_leaked_connections();
  CHECK(d.peak_mib() <= d.peak_bound_mib());
}

TEST_CASE("big SETs beyond the budget get an error, the rest are stored", "[server][memory]") {
  Daemon d;
  constexpr int kClients = 6;  // 96 MiB of values against a 64 MiB budget
  std::vector<std::thread> threads;
  std::atomic<int> stored{0}, refused{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        rdzv::TcpStore c(d.client_options("big"));
        try {
          c.set(std::to_string(i), std::string(16u << 20, 'v'));
          ++stored;
        } catch (const rdzv::StoreError& e) {
          if (std::string(e.what()).find("memory limit") != std::string::npos) ++refused;
        }
        std::this_thread::sleep_for(500ms);  // keep the namespace alive until all have tried
      } catch (const rdzv::StoreError&) {
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(stored + refused == kClients);
  CHECK(refused > 0);
  CHECK(stored >= 1);
  d.check_served("after");
  CHECK(d.peak_mib() <= d.peak_bound_mib());
  d.check_no_leaked_connections();
}

TEST_CASE("20 connections waiting on 65,536 keys each: the budget and the per-connection cap refuse", "[server][memory]") {
  Daemon d;
  auto attackers = connect_attackers(d, 20);
  Request wait;
  wait.type = Type::kWait;
  for (int k = 0; k < 65536; ++k) wait.keys.push_back("key-" + std::to_string(k));
  wait.number = 60000;
  std::string frame = RawConnection::request(wait, 2);
  Request ping;
  ping.type = Type::kPing;
  int blocked = 0, refused = 0;
  for (auto& a : attackers) {
    a->send_bytes(frame + RawConnection::request(ping, 3));
    auto reply = a->read_frame(10s);  // ERROR for the WAIT, or OK for the PING: the WAIT is blocked
    REQUIRE(reply);
    if (reply->header.request_id == 3) {
      ++blocked;
    } else {
      CHECK(reply->header.type == Type::kError);
      CHECK_THAT(reply->message(), Catch::Contains("memory limit"));
      ++refused;
    }
  }
  CHECK(blocked >= 1);
  CHECK(refused >= 1);
  // The first connection holds a blocked 65,536-key wait: one more key is past its cap.
  wait.keys = {"one-more"};
  attackers[0]->send_bytes(RawConnection::request(wait, 4));
  auto capped = attackers[0]->reply_to(4);
  REQUIRE(capped);
  CHECK_THAT(capped->message(), Catch::Contains("too many keys waited for"));
  d.check_served("during");
  CHECK(d.peak_mib() <= d.peak_bound_mib());
  attackers.clear();
  d.check_served("after");
  d.check_no_leaked_connections();
}

TEST_CASE("10 clients that ask for 900 KB values and never read are held to a small queue", "[server][memory]") {
  Daemon d;
  auto owner = std::make_unique<rdzv::TcpStore>(d.client_options("attack"));  // keeps the namespace alive
  owner->set("big", std::string(900u << 10, 'b'));
  auto attackers = connect_attackers(d, 10);
  Request get;
  get.type = Type::kGet;
  get.keys = {"big"};
  std::string frames;
  for (uint32_t i = 0; i < 200; ++i) frames += RawConnection::request(get, 10 + i);  // 180 MB of replies each
  for (auto& a : attackers) {
    // Non-blocking: once the server stops reading, the rest stays in our socket buffer.
    ::send(a->fd, frames.data(), frames.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  std::this_thread::sleep_for(500ms);
  d.check_served("during");
  CHECK(owner->get("big", 1s).size() == 900u << 10);
  CHECK(d.peak_mib() <= d.peak_bound_mib());
  attackers.clear();
  owner.reset();
  d.check_served("after");
  d.check_no_leaked_connections();
}

TEST_CASE("a mixed load that fills the budget stays within it, and its memory is given back", "[server][memory]") {
  rlimit files{};  // 2,000 connections and more: the soft limit may be 1,024
  REQUIRE(getrlimit(RLIMIT_NOFILE, &files) == 0);
  files.rlim_cur = files.rlim_max;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &files) == 0);
  INFO("open files limit " << files.rlim_max);
  REQUIRE(files.rlim_max >= 2200);
  Daemon d(4096);
  // 2,000 idle connections in 200 namespaces, half of them with names of 900 bytes.
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (size_t i = 0; i < 2000; ++i) {
    idle.push_back(join(d, "idle-" + std::to_string(i % 200) + (i % 2 ? std::string(890, 'n') : "")));
  }
  // 4 connections blocked on 16,384 keys each (about 2.5 MiB of the budget apiece).
  std::vector<std::unique_ptr<RawConnection>> waiting;
  for (size_t i = 0; i < 4; ++i) {
    waiting.push_back(join(d, "wait-" + std::to_string(i)));
    Request wait{Type::kWait, {}, {}, 60000};
    for (size_t k = 0; k < 16384; ++k) wait.keys.push_back("never-" + digits(k, 5));
    waiting.back()->send_bytes(RawConnection::request(wait, 2));
    CHECK(accepted(*waiting.back(), Request{Type::kPing, {}, {}, 0}, 3));  // answered: the WAIT is blocked
  }
  // Until the budget refuses both: MULTI_SETs of 4,000 keys of 10 bytes with values of
  // 64 bytes, a new namespace every 4 of them, each holding 16 wills; and 1 MiB values.
  std::vector<std::unique_ptr<RawConnection>> writers;
  auto large = join(d, "large");
  size_t small_keys = 0, large_values = 0;
  int small_refused = 0, large_refused = 0;
  for (size_t round = 0; round < 400 && (small_refused < 3 || large_refused < 3); ++round) {
    if (round % 4 == 0) {
      writers.push_back(join(d, "small-" + std::to_string(round)));
      Request wills{Type::kSetWills, {}, {}, 0};
      for (size_t i = 0; i < 16; ++i) {
        wills.keys.push_back("failed/" + std::to_string(i));
        wills.values.push_back(std::string(64, 'w'));
      }
      accepted(*writers.back(), wills, 2);
    }
    Request many{Type::kMultiSet, {}, {}, 0};
    for (size_t i = 0; i < 4000; ++i) {
      many.keys.push_back("k" + digits(round, 3) + "-" + digits(i, 5));
      many.values.push_back(std::string(64, 'v'));
    }
    if (accepted(*writers.back(), many, static_cast<uint32_t>(10 + round))) {
      small_keys += many.keys.size();
    } else {
      ++small_refused;
    }
    Request big{Type::kSet, {"big-" + std::to_string(round)}, {std::string(1u << 20, 'b')}, 0};
    if (accepted(*large, big, static_cast<uint32_t>(10 + round))) {
      ++large_values;
    } else {
      ++large_refused;
    }
  }
  INFO(small_keys << " small keys and " << large_values << " values of 1 MiB stored in " << writers.size() + 1
                  << " namespaces; RSS at start " << d.baseline_kib / 1024 << " MiB");
  CHECK(small_refused >= 3);
  CHECK(large_refused >= 3);
  CHECK(small_keys >= 40000);  // the charges are real ones, not so large that little fits
  CHECK(large_values >= 4);
  // Full, yet served: an idle connection's request, a stored key read back.
  CHECK(accepted(*idle.front(), Request{Type::kPing, {}, {}, 0}, 2));
  Request get{Type::kGet, {"k000-00000"}, {}, 1000};
  writers.front()->send_bytes(RawConnection::request(get, 5000));
  auto value = writers.front()->reply_to(5000, 10s);
  REQUIRE(value);
  CHECK(value->header.type == Type::kOk);
  CHECK(value->message() == std::string(64, 'v'));
  CHECK(d.peak_mib() <= d.peak_bound_mib());
  // Every client leaves, and with them their namespaces.
  idle.clear();
  waiting.clear();
  writers.clear();
  large.reset();
  size_t after_bound = kSanitized ? d.peak_bound_mib() : d.baseline_kib / 1024 + 16;  // ASan's allocator keeps its own
  bool given_back = testing::eventually([&] { return d.rss_mib() <= after_bound; }, 10s);
  INFO("RSS after every client left: " << d.rss_mib() << " MiB, peak " << d.peak_mib() << " MiB");
  CHECK(given_back);
  d.check_served("after");
  CHECK(d.peak_mib() <= d.peak_bound_mib());
}
