// The store rank 0 hosts outside ddprun (torchrun-style variables): it listens on
// MASTER_ADDR when that is this host's address, requires DDPRUN_TOKEN when it is set,
// and otherwise warns once that anyone can reach it. Real worker processes
// (collective_worker) and real clients on loopback.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <boost/asio/ip/address.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "e2e.hpp"
#include "hosted_store.hpp"
#include "rdzv/store.hpp"
#include "rdzv/tcp_store.hpp"
#include "subprocess.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kCollectiveWorker = COLLECTIVE_WORKER_BIN;
const std::string kWarning = "accepts anyone who can reach it";

// Rank `rank` of a 2-rank job as a plain process with torchrun-style variables.
std::unique_ptr<Process> start_rank(int rank, const std::string& master_addr, int port,
                                    const std::map<std::string, std::string>& extra = {}) {
  ProcessOptions o;
  o.set_env = extra;
  o.set_env["MASTER_ADDR"] = master_addr;
  o.set_env["MASTER_PORT"] = std::to_string(port);
  o.set_env["RANK"] = std::to_string(rank);
  o.set_env["WORLD_SIZE"] = "2";
  o.set_env["LOCAL_RANK"] = std::to_string(rank);
  o.set_env["LOCAL_WORLD_SIZE"] = "2";
  o.unset_env = {"DDPRUN_STORE_ADDR", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "TORCHELASTIC_RUN_ID"};
  if (!extra.contains("DDPRUN_TOKEN")) o.unset_env.push_back("DDPRUN_TOKEN");
  return std::make_unique<Process>(std::vector<std::string>{kCollectiveWorker, "matrix", "--big", "10007"}, o);
}

// The local addresses of the TCP sockets listening on `port` ("127.0.0.1", "0.0.0.0",
// "::1", "::"), from /proc/net/tcp and tcp6.
std::vector<std::string> listeners(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.find(':');
      if (state != "0A" || std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;  // 0A: LISTEN
      const std::string hex = local.substr(0, colon);
      if (hex.size() == 8) {  // one 32-bit word in host order
        out.push_back(boost::asio::ip::address_v4(ntohl(static_cast<uint32_t>(std::stoul(hex, nullptr, 16))))
                          .to_string());
      } else {  // four 32-bit words, each in host order
        boost::asio::ip::address_v6::bytes_type bytes;
        for (int w = 0; w < 4; ++w) {
          const auto word = static_cast<uint32_t>(std::stoul(hex.substr(static_cast<size_t>(w) * 8, 8), nullptr, 16));
          std::memcpy(bytes.data() + w * 4, &word, 4);
        }
        out.push_back(boost::asio::ip::address_v6(bytes).to_string());
      }
    }
  }
  return out;
}

// Waits (up to 20 s) until something listens on `port`; returns where.
std::vector<std::string> wait_for_listener(int port, const Process& rank0) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto found = listeners(port);
    if (!found.empty()) return found;
    if (!process_alive(rank0.pid())) break;
    std::this_thread::sleep_for(20ms);
  }
  return {};
}

rdzv::TcpStoreOptions client_to(int port, const std::string& token) {
  rdzv::TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = static_cast<uint16_t>(port);
  o.token = token;
  o.connect_timeout = 5s;
  o.io_timeout = 5s;
  return o;
}

// Both ranks finish every check and exit 0.
void expect_formed(Process& rank0, Process& rank1) {
  for (Process* p : {&rank0, &rank1}) {
    auto status = p->wait(120s);
    INFO("stdout: " << p->out() << "\nstderr: " << p->err());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
    CHECK(p->out().find(" 0 failed") != std::string::npos);
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("with MASTER_ADDR=127.0.0.1, rank 0's store listens on 127.0.0.1 only", "[hosted_store]") {
  const int port = e2e::free_port();
  auto rank0 = start_rank(0, "127.0.0.1", port);
  const auto where = wait_for_listener(port, *rank0);
  INFO("stderr: " << rank0->err());
  CHECK(where == std::vector<std::string>{"127.0.0.1"});
  auto rank1 = start_rank(1, "127.0.0.1", port);
  expect_formed(*rank0, *rank1);
}

TEST_CASE("a MASTER_ADDR name is resolved: localhost gives a loopback listener, not every interface",
          "[hosted_store]") {
  const int port = e2e::free_port();
  auto rank0 = start_rank(0, "localhost", port);
  const auto where = wait_for_listener(port, *rank0);
  INFO("stderr: " << rank0->err());
  REQUIRE(where.size() == 1);
  CHECK(boost::asio::ip::make_address(where[0]).is_loopback());
  auto rank1 = start_rank(1, "localhost", port);
  expect_formed(*rank0, *rank1);
}

TEST_CASE("with DDPRUN_TOKEN the store refuses a client without it, and the ranks still form", "[hosted_store]") {
  const int port = e2e::free_port();
  const std::map<std::string, std::string> token{{"DDPRUN_TOKEN", "rank0-secret"}};
  auto rank0 = start_rank(0, "127.0.0.1", port, token);
  REQUIRE_FALSE(wait_for_listener(port, *rank0).empty());
  CHECK_THROWS_AS(rdzv::TcpStore(client_to(port, "")), rdzv::StoreAuthError);
  CHECK_THROWS_WITH(rdzv::TcpStore(client_to(port, "a-guess")), Catch::Contains("authentication failed"));
  auto rank1 = start_rank(1, "127.0.0.1", port, token);
  expect_formed(*rank0, *rank1);
  CHECK(rank0->err().find(kWarning) == std::string::npos);
}

TEST_CASE("a rank without the token cannot join a store that requires one", "[hosted_store]") {
  const int port = e2e::free_port();
  auto rank0 = start_rank(0, "127.0.0.1", port, {{"DDPRUN_TOKEN", "rank0-secret"}, {"DDP_TIMEOUT_SEC", "5"}});
  REQUIRE_FALSE(wait_for_listener(port, *rank0).empty());
  auto rank1 = start_rank(1, "127.0.0.1", port);
  auto status = rank1->wait(60s);
  REQUIRE(status.has_value());
  CHECK(*status != 0);
  CHECK_THAT(rank1->err(), Catch::Contains("requires a token"));
}

TEST_CASE("without a token rank 0 warns once that its store is unauthenticated", "[hosted_store]") {
  const int port = e2e::free_port();
  auto rank0 = start_rank(0, "127.0.0.1", port);
  REQUIRE_FALSE(wait_for_listener(port, *rank0).empty());
  auto rank1 = start_rank(1, "127.0.0.1", port);
  expect_formed(*rank0, *rank1);
  const std::string err = rank0->err();
  INFO("rank 0 stderr: " << err);
  CHECK(count(err, kWarning) == 1);
  CHECK_THAT(err, Catch::Contains("ddp: warning: the rendezvous store rank 0 hosts on 127.0.0.1:" +
                                  std::to_string(port) + " accepts anyone who can reach it; set DDPRUN_TOKEN"));
  CHECK(count(rank1->err(), kWarning) == 0);  // only the rank that hosts it says so
}

TEST_CASE("the listening address: MASTER_ADDR where it is this host's, else every interface", "[hosted_store]") {
  using ddp::detail::hosted_store_address;
  CHECK(hosted_store_address("127.0.0.1", true) == "127.0.0.1");
  CHECK(hosted_store_address("127.0.0.2", true) == "127.0.0.2");
  // Ranks on other hosts cannot reach a loopback address.
  CHECK(hosted_store_address("127.0.0.1", false) == "0.0.0.0");
  CHECK(hosted_store_address("192.0.2.1", true) == "0.0.0.0");  // TEST-NET-1: nobody's
  CHECK(hosted_store_address("no-such-host.invalid", true) == "0.0.0.0");
  // An address of one of this host's interfaces is taken as it is.
  ifaddrs* list = nullptr;
  REQUIRE(getifaddrs(&list) == 0);
  int checked = 0;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    const std::string a = boost::asio::ip::address_v4(ntohl(in->sin_addr.s_addr)).to_string();
    CHECK(hosted_store_address(a, false) == (a.rfind("127.", 0) == 0 ? "0.0.0.0" : a));
    ++checked;
  }
  freeifaddrs(list);
  CHECK(checked >= 1);  // lo at least
}
