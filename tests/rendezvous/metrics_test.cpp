// ddp-rendezvous --metrics-port as a real process: traffic from the real TcpStore, read
// back with a real HTTP client (curl) as Prometheus would scrape it, and the endpoint's
// bounds — other paths and methods, a request head that never ends, one that trickles,
// more scrapers than it holds at once — while the store keeps serving.
#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>

#include "raw_client.hpp"
#include "torch_client.hpp"
#include "rdzv/tcp_store.hpp"
#include "subprocess.hpp"

using namespace std::chrono_literals;
using testing::Process;

namespace {

// A daemon on ephemeral loopback ports, its store and its metrics endpoint.
class MetricsDaemon {
 public:
  explicit MetricsDaemon(const std::vector<std::string>& args) : process_(argv(args)) {
    std::regex ports(R"(listening on 127\.0\.0\.1:(\d+)[\s\S]*metrics at (http://127\.0\.0\.1:(\d+)/metrics))");
    std::smatch m;
    bool up = process_.wait_for_stdout([&](const std::string& out) { return std::regex_search(out, ports); }, 10s);
    INFO(process_.err());
    REQUIRE(up);
    std::string out = process_.out();
    REQUIRE(std::regex_search(out, m, ports));
    store_port = static_cast<uint16_t>(std::stoi(m[1]));
    url = m[2];
    metrics_port = static_cast<uint16_t>(std::stoi(m[3]));
  }

  std::unique_ptr<rdzv::TcpStore> client(const std::string& job, const std::string& token,
                                         std::chrono::milliseconds connect_timeout = 5s) const {
    rdzv::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = store_port;
    o.ns = job;
    o.token = token;
    o.connect_timeout = connect_timeout;
    o.io_timeout = 5s;
    return std::make_unique<rdzv::TcpStore>(o);
  }

  Process process_;
  uint16_t store_port = 0;
  uint16_t metrics_port = 0;
  std::string url;

 private:
  static std::vector<std::string> argv(const std::vector<std::string>& args) {
    std::vector<std::string> a = {RENDEZVOUS_BIN, "--host=127.0.0.1", "--port=0", "--metrics-port=0"};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
};

struct HttpAnswer {
  int status = 0;
  std::string content_type;
  std::string body;
};

// One request by curl; `extra` goes before the URL (e.g. {"-X", "POST"}).
HttpAnswer curl(const std::string& url, const std::vector<std::string>& extra = {}) {
  const std::string marker = "\n@@curl@@ ";
  std::vector<std::string> argv = {"curl", "-sS", "--max-time", "10", "-w", marker + "%{http_code} %{content_type}"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(url);
  auto r = testing::run(argv, {}, 20s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  size_t at = r.out.rfind(marker);
  REQUIRE(at != std::string::npos);
  HttpAnswer a;
  a.body = r.out.substr(0, at);
  std::string tail = r.out.substr(at + marker.size());
  a.status = std::stoi(tail.substr(0, tail.find(' ')));
  a.content_type = tail.find(' ') == std::string::npos ? "" : tail.substr(tail.find(' ') + 1);
  return a;
}

// A scrape parsed: every line checked against text format 0.0.4, samples by their
// full name with labels (`name{a="x"}`).
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) \S.*)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? (-?[0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?))");
  std::map<std::string, double> samples;
  std::set<std::string> helped;
  std::map<std::string, std::string> typed;
  REQUIRE(!text.empty());
  REQUIRE(text.back() == '\n');
  for (const auto& line : testing::lines_of(text)) {
    INFO("line: '" << line << "'");
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      CHECK(helped.insert(m[1]).second);  // one family, one HELP
    } else if (std::regex_match(line, m, type)) {
      CHECK(helped.count(m[1]) == 1);  // HELP, then TYPE
      CHECK(typed.emplace(m[1], m[2]).second);
      if (m[2] == "counter") CHECK(std::string(m[1]).ends_with("_total"));
    } else {
      REQUIRE(std::regex_match(line, m, sample));
      CHECK(typed.count(m[1]) == 1);  // its family was declared before it
      CHECK(samples.emplace(std::string(m[1]) + std::string(m[2]), std::stod(m[4])).second);
    }
  }
  return samples;
}

std::map<std::string, double> scrape(const MetricsDaemon& d) {
  HttpAnswer a = curl(d.url);
  REQUIRE(a.status == 200);
  CHECK(a.content_type == "text/plain; version=0.0.4; charset=utf-8");
  return parse_exposition(a.body);
}

// A sample's value; FAILs when the scrape lacks it.
double value(const std::map<std::string, double>& samples, const std::string& name) {
  INFO(name);
  auto it = samples.find(name);
  REQUIRE(it != samples.end());
  return it->second;
}

// Scrapes until `name` reads `want` (the server closes a refused connection after its
// answer is written, a moment after the client has read it); the last value otherwise.
double settles_at(const MetricsDaemon& d, const std::string& name, double want) {
  double got = -1;
  testing::eventually([&] { return (got = value(scrape(d), name)) == want; }, 5s);
  return got;
}

// True once the peer closed `c` (or reset it) within `limit`; bytes it sent go to `seen`.
bool closed_within(int fd, std::chrono::milliseconds limit, std::string& seen) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
    seen.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

TEST_CASE("the metrics endpoint counts real store traffic in Prometheus text format", "[daemon][metrics]") {
  testing::TempDir dir;
  testing::write_file(dir / "token", "metrics-token\n");
  MetricsDaemon d({"--token-file", (dir / "token").string(), "--max-connections", "3", "--max-memory-mib", "64"});

  auto samples = scrape(d);  // before any client: every family is there, at zero
  CHECK(value(samples, R"(ddp_rendezvous_connections{protocol="ddprun"})") == 0);
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="torch",type="SET"})") == 0);
  CHECK(value(samples, "ddp_rendezvous_memory_budget_bytes") == 64.0 * (1 << 20));

  auto a = d.client("alpha", "metrics-token");
  auto b = d.client("beta", "metrics-token");
  a->set("k1", "v1");
  a->set("k2", std::string(1000, 'x'));
  b->set("k1", "v1");
  CHECK_THROWS_AS(a->get("missing", 200ms), rdzv::StoreTimeout);  // a wait that times out
  CHECK_THROWS_AS(d.client("alpha", "wrong-token"), rdzv::StoreAuthError);
  {  // malformed input: a frame with a bad magic
    testing::RawConnection garbage(d.store_port);
    garbage.send_bytes(std::string(16, 'z'));
    std::string seen;
    CHECK(closed_within(garbage.fd, 5s, seen));
  }
  {  // a torch client (1.13's dialect) where none are admitted
    testing::TorchClient torch(d.store_port, rdzv::Dialect::kTorchLegacy);
    torch.send(testing::TorchClient::q(testing::TorchClient::Query::kSet, {"/k"}, {"v"}));
    std::string seen;
    CHECK(closed_within(torch.fd, 5s, seen));
  }
  CHECK(value(scrape(d), R"(ddp_rendezvous_connections{protocol="ddprun"})") == 2);  // counted once admitted
  auto c = d.client("gamma", "metrics-token");
  CHECK_THROWS_WITH(d.client("gamma", "metrics-token", 200ms), Catch::Contains("server full"));

  samples = scrape(d);
  CHECK(value(samples, R"(ddp_rendezvous_connections{protocol="ddprun"})") == 3);
  CHECK(value(samples, R"(ddp_rendezvous_connections{protocol="torch"})") == 0);
  CHECK(value(samples, R"(ddp_rendezvous_connections_total{protocol="ddprun"})") == 3);  // a, b, c: admitted
  CHECK(value(samples, "ddp_rendezvous_jobs") == 3);
  CHECK(value(samples, "ddp_rendezvous_keys") == 3);
  CHECK(value(samples, "ddp_rendezvous_stored_bytes") > 1000);
  CHECK(value(samples, "ddp_rendezvous_held_bytes") > 0);
  CHECK(value(samples, "ddp_rendezvous_memory_budget_bytes") == 64.0 * (1 << 20));
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="ddprun",type="HELLO"})") == 4);
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="ddprun",type="SET"})") == 3);
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="ddprun",type="GET"})") == 1);
  CHECK(value(samples, "ddp_rendezvous_waits") == 0);
  CHECK(value(samples, "ddp_rendezvous_waits_started_total") == 1);
  CHECK(value(samples, "ddp_rendezvous_waits_timed_out_total") == 1);
  CHECK(value(samples, R"(ddp_rendezvous_refusals_total{reason="server_full"})") == 1);
  CHECK(value(samples, R"(ddp_rendezvous_refusals_total{reason="memory"})") == 0);
  CHECK(value(samples, R"(ddp_rendezvous_refusals_total{reason="torch_not_admitted"})") == 1);
  CHECK(value(samples, R"(ddp_rendezvous_connections_total{protocol="torch_legacy"})") == 0);
  CHECK(value(samples, "ddp_rendezvous_auth_failures_total") == 1);
  CHECK(value(samples, "ddp_rendezvous_protocol_errors_total") == 1);

  // A wait that is blocked now, then answered: the gauge follows it.
  std::thread waiter([&] { CHECK(b->get("later", 5s) == "now"); });
  CHECK(settles_at(d, "ddp_rendezvous_waits", 1) == 1);
  b->set("later", "now");  // the same link: requests carry ids
  waiter.join();
  samples = scrape(d);
  CHECK(value(samples, "ddp_rendezvous_waits") == 0);
  CHECK(value(samples, "ddp_rendezvous_waits_started_total") == 2);
  CHECK(value(samples, "ddp_rendezvous_waits_timed_out_total") == 1);
}

TEST_CASE("the metrics endpoint serves only GET /metrics and cuts off slow or endless requests", "[daemon][metrics]") {
  MetricsDaemon d({});
  std::string base = "http://127.0.0.1:" + std::to_string(d.metrics_port);
  CHECK(curl(base + "/").status == 404);
  CHECK(curl(base + "/metrics/extra").status == 404);
  HttpAnswer post = curl(d.url, {"-X", "POST"});
  CHECK(post.status == 405);
  CHECK(curl(d.url + "?name=x").status == 200);

  // A request head that never ends: cut off at the head limit (8 KiB), at once.
  {
    testing::RawConnection endless(d.metrics_port);
    std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Endless: ";
    auto start = std::chrono::steady_clock::now();
    bool cut = false;
    std::string seen;
    while (!cut && std::chrono::steady_clock::now() - start < 10s) {
      ssize_t n = ::send(endless.fd, head.data(), head.size(), MSG_NOSIGNAL);
      head.assign(1024, 'a');
      cut = n < 0 || closed_within(endless.fd, 20ms, seen);
    }
    CHECK(cut);
    CHECK(std::chrono::steady_clock::now() - start < 3s);
    if (!seen.empty()) CHECK_THAT(seen, Catch::StartsWith("HTTP/1.1 431"));
  }

  // A head that trickles in plus idle connections: every slot (8) taken. Scrapers are
  // turned away meanwhile, the store serves as ever, and the deadline (5 s) frees them.
  auto start = std::chrono::steady_clock::now();
  testing::RawConnection trickle(d.metrics_port);
  std::vector<std::unique_ptr<testing::RawConnection>> idle;
  for (int i = 0; i < 7; ++i) idle.push_back(std::make_unique<testing::RawConnection>(d.metrics_port));
  trickle.send_bytes("GET /metr");
  CHECK(testing::eventually([&] { return curl(d.url).status == 503; }, 2s));
  auto store = d.client("job", "");
  auto op = std::chrono::steady_clock::now();
  store->set("k", "v");
  CHECK(store->get("k", 1s) == "v");
  CHECK(std::chrono::steady_clock::now() - op < 1s);
  std::string seen;
  bool cut = false;
  while (!cut && std::chrono::steady_clock::now() - start < 10s) {
    trickle.send_bytes("c");
    cut = closed_within(trickle.fd, 200ms, seen);
  }
  CHECK(cut);
  CHECK(seen.empty());  // cut off without an answer
  auto after = std::chrono::steady_clock::now() - start;
  CHECK(after > 4s);
  CHECK(after < 8s);
  for (auto& c : idle) CHECK(closed_within(c->fd, 2s, seen));
  CHECK(testing::eventually([&] { return curl(d.url).status == 200; }, 2s));
}

TEST_CASE("a metrics port in use is one clear error and exit status 1", "[daemon][metrics]") {
  MetricsDaemon first({});
  auto r = testing::run({RENDEZVOUS_BIN, "--host=127.0.0.1", "--port=0", "--metrics-port",
                         std::to_string(first.metrics_port)},
                        {}, 10s);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("metrics: cannot listen on 127.0.0.1:" + std::to_string(first.metrics_port)) &&
                        Catch::Contains("in use"));
  CHECK(r.out.find("listening on") == std::string::npos);
  auto h = testing::run({RENDEZVOUS_BIN, "--help"}, {}, 10s);
  CHECK_THAT(h.out, Catch::Contains("--metrics-port") && Catch::Contains("--metrics-host"));
}

TEST_CASE("a real torch client is counted under its own protocol", "[daemon][metrics][torch]") {
  MetricsDaemon d({"--torch-clients", "alpha"});
  auto a = d.client("alpha", "");
  a->set("/from_ddprun", "1");  // torch's client puts "/" before every key
  // Debian's PyTorch 1.13: the older dialect.
  std::string script =
      "import sys, datetime, torch.distributed as d\n"
      "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=10))\n"
      "s.set('from_torch', 'x')\n"
      "assert s.add('n', 2) == 2\n"
      "assert s.get('from_ddprun') == b'1'\n"
      "print('ok')\n";
  auto r = testing::run({"/usr/bin/python3", "-c", script, std::to_string(d.store_port)}, {}, 60s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out == "ok\n");
  CHECK(a->get("/from_torch", 1s) == "x");

  auto samples = scrape(d);
  CHECK(value(samples, R"(ddp_rendezvous_connections_total{protocol="torch_legacy"})") == 1);
  CHECK(settles_at(d, R"(ddp_rendezvous_connections{protocol="torch_legacy"})", 0) == 0);  // it exited
  CHECK(value(samples, R"(ddp_rendezvous_connections{protocol="ddprun"})") == 1);
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="torch",type="SET"})") == 1);
  CHECK(value(samples, R"(ddp_rendezvous_requests_total{protocol="torch",type="ADD"})") == 1);
  CHECK(value(samples, "ddp_rendezvous_keys") == 3);
  CHECK(value(samples, "ddp_rendezvous_jobs") == 1);
}
