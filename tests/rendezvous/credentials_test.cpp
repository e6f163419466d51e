// The ddp-rendezvous daemon as a real process: per-job credentials derived from its
// secret, the shared token beside them, `credential --job`, and its signals (SIGHUP
// re-reads the key files, SIGTERM drains). Clients are the real TcpStore, on loopback.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>
#include <thread>

#include "rdzv/tcp_store.hpp"
#include "rdzv/token.hpp"
#include "subprocess.hpp"
#include "torch_client.hpp"

using namespace std::chrono_literals;
using testing::Process;
using testing::TempDir;
using testing::write_file;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;

// A daemon on an ephemeral loopback port.
class Daemon {
 public:
  explicit Daemon(const std::vector<std::string>& args) : process_(argv(args)) {
    std::smatch m;
    std::regex listening(R"(listening on 127\.0\.0\.1:(\d+))");
    bool up = process_.wait_for_stdout([&](const std::string& out) { return std::regex_search(out, m, listening); }, 10s);
    INFO(process_.err());
    REQUIRE(up);
    std::string out = process_.out();
    REQUIRE(std::regex_search(out, m, listening));
    port_ = static_cast<uint16_t>(std::stoi(m[1]));
  }

  Process& process() { return process_; }
  uint16_t port() const { return port_; }

  std::unique_ptr<rdzv::TcpStore> client(const std::string& job, const std::string& token) const {
    rdzv::TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port_;
    o.ns = job;
    o.token = token;
    o.connect_timeout = 5s;
    o.io_timeout = 5s;
    return std::make_unique<rdzv::TcpStore>(o);
  }

  // Waits (bounded) until the daemon's stderr holds `count` lines containing `text`.
  bool logged(const std::string& text, size_t count = 1) const {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (true) {
      size_t seen = 0;
      for (const auto& line : testing::lines_of(process_.err())) seen += line.find(text) != std::string::npos;
      if (seen >= count) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);  // test-side polling of a capture file
    }
  }

 private:
  static std::vector<std::string> argv(const std::vector<std::string>& args) {
    std::vector<std::string> a = {kRendezvousBin, "--host=127.0.0.1", "--port=0"};
    a.insert(a.end(), args.begin(), args.end());
    return a;
  }
  Process process_;
  uint16_t port_ = 0;
};

// What `ddp-rendezvous credential` prints, written where --rdzv_token_file would read it.
std::string credential_file(const TempDir& dir, const std::string& secret_file, const std::string& job) {
  auto r = testing::run({kRendezvousBin, "credential", "--job", job, "--secret-file", secret_file}, {}, 10s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::string path = (dir / (job + ".cred")).string();
  write_file(path, r.out);
  return path;
}

}  // namespace

TEST_CASE("a job credential opens only its own job and the shared token opens every job", "[daemon][auth]") {
  TempDir dir;
  write_file(dir / "token", "site-wide-token\n");
  write_file(dir / "secret", "daemon-secret\n");
  Daemon daemon({"--token-file", (dir / "token").string(), "--secret-file", (dir / "secret").string()});
  CHECK_THAT(daemon.process().out(), Catch::Contains("shared token or job credentials required"));

  // The credential as an administrator hands it out, read as ddprun reads its token file.
  std::string alpha = rdzv::read_token_file(credential_file(dir, (dir / "secret").string(), "alpha"));
  std::string beta = rdzv::read_token_file(credential_file(dir, (dir / "secret").string(), "beta"));
  CHECK(std::regex_match(alpha, std::regex("[0-9a-f]{64}")));
  CHECK(alpha == rdzv::job_credential("daemon-secret", "alpha"));
  CHECK(alpha != beta);

  auto a = daemon.client("alpha", alpha);
  auto b = daemon.client("beta", beta);
  a->set("failure", "alpha's own");
  b->set("failure", "beta's own");
  CHECK(a->get("failure", 1s) == "alpha's own");

  // Job A's credential naming job B: refused, with the reason.
  CHECK_THROWS_WITH(daemon.client("beta", alpha),
                    Catch::Contains("refused us: authentication failed") && Catch::Contains("credential") &&
                        Catch::Contains("opens only the job it was made for"));
  CHECK_THROWS_AS(daemon.client("alpha", beta), rdzv::StoreAuthError);
  CHECK_THROWS_AS(daemon.client("alpha", "daemon-secret"), rdzv::StoreAuthError);  // the secret is no token
  CHECK_THROWS_WITH(daemon.client("alpha", ""), Catch::Contains("requires a token"));
  CHECK(b->get("failure", 1s) == "beta's own");  // untouched

  // The shared token opens any job, its keys included.
  auto admin = daemon.client("beta", "site-wide-token");
  CHECK(admin->get("failure", 1s) == "beta's own");
  CHECK(daemon.client("gamma", "site-wide-token")->num_keys() == 0);
}

TEST_CASE("with only a secret every job needs its own credential", "[daemon][auth]") {
  TempDir dir;
  write_file(dir / "secret", "only-secret\n");
  Daemon daemon({"--secret-file", (dir / "secret").string()});
  CHECK_THAT(daemon.process().out(), Catch::Contains("(job credentials required)"));
  daemon.client("job7", rdzv::job_credential("only-secret", "job7"))->set("k", "v");
  CHECK_THROWS_WITH(daemon.client("job8", rdzv::job_credential("only-secret", "job7")),
                    Catch::Contains("authentication failed"));
}

TEST_CASE("credential refuses a missing secret file or job with a clear error", "[daemon][auth]") {
  TempDir dir;
  auto no_file = testing::run({kRendezvousBin, "credential", "--job", "alpha"}, {}, 10s);
  CHECK(no_file.status == 2);
  CHECK_THAT(no_file.err, Catch::Contains("needs --secret-file"));
  auto unreadable = testing::run(
      {kRendezvousBin, "credential", "--job", "alpha", "--secret-file", (dir / "absent").string()}, {}, 10s);
  CHECK(unreadable.status == 1);
  CHECK_THAT(unreadable.err, Catch::Contains("cannot read secret file '" + (dir / "absent").string() + "'"));
  CHECK(unreadable.out.empty());
  auto no_job = testing::run({kRendezvousBin, "credential", "--secret-file", (dir / "absent").string()}, {}, 10s);
  CHECK(no_job.status == 2);
  CHECK_THAT(no_job.err, Catch::Contains("--job"));
}

TEST_CASE("SIGHUP re-reads the keys and keeps connected clients and survives a bad file", "[daemon][auth][signals]") {
  TempDir dir;
  const std::string token_file = (dir / "token").string(), secret_file = (dir / "secret").string();
  write_file(token_file, "token-1\n");
  write_file(secret_file, "secret-1\n");
  Daemon daemon({"--token-file", token_file, "--secret-file", secret_file});
  std::string old_credential = rdzv::read_token_file(credential_file(dir, secret_file, "alpha"));
  auto connected = daemon.client("alpha", old_credential);
  connected->set("before", "1");

  write_file(token_file, "token-2\n");
  write_file(secret_file, "secret-2\n");
  daemon.process().send_signal(SIGHUP);
  REQUIRE(daemon.logged("received SIGHUP: re-read token file '" + token_file + "' and secret file '" + secret_file + "'"));
  std::string new_credential = rdzv::read_token_file(credential_file(dir, secret_file, "alpha"));
  CHECK(new_credential != old_credential);

  CHECK_THROWS_WITH(daemon.client("alpha", old_credential), Catch::Contains("authentication failed"));
  CHECK_THROWS_WITH(daemon.client("alpha", "token-1"), Catch::Contains("authentication failed"));
  auto fresh = daemon.client("alpha", new_credential);
  CHECK(fresh->get("before", 1s) == "1");  // the same job, its keys kept
  CHECK(daemon.client("beta", "token-2")->num_keys() == 0);
  connected->set("after", "2");             // the session from before goes on
  CHECK(fresh->get("after", 1s) == "2");

  // A re-read that fails keeps the keys in force, says so, and the daemon stays up.
  std::filesystem::remove(secret_file);
  daemon.process().send_signal(SIGHUP);
  REQUIRE(daemon.logged("keeping the previous keys"));
  CHECK_THAT(daemon.process().err(), Catch::Contains("error: received SIGHUP: cannot read secret file '" + secret_file + "'"));
  CHECK(daemon.client("alpha", new_credential)->get("after", 1s) == "2");
  CHECK(testing::process_alive(daemon.process().pid()));

  daemon.process().send_signal(SIGTERM);
  auto status = daemon.process().wait(10s);
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK_THAT(daemon.process().err(), Catch::Contains("received SIGTERM: stopped accepting; closing ") &&
                                             Catch::Contains(" open connection(s) and exiting"));
}

TEST_CASE("SIGHUP without key files changes nothing and says so and SIGINT drains", "[daemon][signals]") {
  Daemon daemon({});
  auto c = daemon.client("job", "");
  daemon.process().send_signal(SIGHUP);
  REQUIRE(daemon.logged("received SIGHUP: no --token-file or --secret-file to re-read; nothing changed"));
  c->set("k", "v");
  CHECK(c->get("k", 1s) == "v");
  daemon.process().send_signal(SIGINT);
  auto status = daemon.process().wait(10s);
  REQUIRE(status.has_value());
  CHECK(*status == 0);
  CHECK_THAT(daemon.process().err(), Catch::Contains("received SIGINT: stopped accepting; closing 1 open connection(s) and exiting"));
}

TEST_CASE("the daemon with --torch-clients admits torch's clients into that job only, each logged once", "[daemon][torch]") {
  Daemon daemon({"--torch-clients=job1"});
  CHECK(daemon.logged("admitting torch TCPStore clients, unauthenticated, into job 'job1'"));
  auto job1 = daemon.client("job1", "");
  auto job2 = daemon.client("job2", "");
  job1->set("k", "v");
  job2->set("other", "x");
  testing::TorchClient torch2(daemon.port());
  testing::TorchClient torch1(daemon.port(), rdzv::Dialect::kTorchLegacy);
  CHECK(torch2.get("k") == "v");
  CHECK(torch1.get("k") == "v");
  CHECK(torch1.num_keys() == 1);
  CHECK(daemon.logged("(torch >= 2.1) joined job 'job1' unauthenticated"));
  CHECK(daemon.logged("(torch 1.13) joined job 'job1' unauthenticated"));
  CHECK(daemon.logged("joined job 'job1'", 2));
  CHECK(job2->get("other", 5s) == "x");
}

TEST_CASE("the daemon's --torch-clients ID=PORT gives a further job a port of its own", "[daemon][torch]") {
  Daemon daemon({"--torch-clients=job1", "--torch-clients=job2=0"});
  std::smatch m;
  std::regex extra(R"(into job 'job2' on port (\d+))");
  REQUIRE(daemon.logged("into job 'job2' on port"));
  std::string err = daemon.process().err();
  REQUIRE(std::regex_search(err, m, extra));
  const auto job2_port = static_cast<uint16_t>(std::stoi(m[1]));
  auto job1 = daemon.client("job1", "");
  auto job2 = daemon.client("job2", "");
  job1->set("one", "1");
  job2->set("two", "2");
  testing::TorchClient on_main(daemon.port());
  testing::TorchClient on_extra(job2_port);
  CHECK(on_main.num_keys() == 1);
  CHECK(on_main.get("one") == "1");
  CHECK(on_extra.num_keys() == 1);
  CHECK(on_extra.get("two") == "2");
  CHECK(daemon.logged("joined job 'job2' unauthenticated"));
}

TEST_CASE("the daemon's --torch-clients takes valid job ids, one per listener", "[daemon][torch]") {
  auto twice = testing::run({kRendezvousBin, "--port=0", "--torch-clients=a", "--torch-clients=b"}, {}, 10s);
  CHECK(twice.status == 2);
  CHECK_THAT(twice.err, Catch::Contains("one job per listener"));
  auto bad = testing::run({kRendezvousBin, "--port=0", "--torch-clients=a/b"}, {}, 10s);
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("invalid --torch-clients 'a/b'"));
  auto bad_port = testing::run({kRendezvousBin, "--port=0", "--torch-clients=a=70000"}, {}, 10s);
  CHECK(bad_port.status == 2);
  CHECK_THAT(bad_port.err, Catch::Contains("ID=PORT"));
}

TEST_CASE("a daemon whose stderr is not read goes on serving torch connections", "[daemon][torch]") {
  // stderr is a FIFO this test holds open and never reads: once its 64 KiB fill, a
  // write to it blocks. Each torch connection is logged; the store must not stall.
  TempDir dir;
  const auto fifo = dir / "stderr";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  Process daemon({"/bin/bash", "-c", "exec \"$0\" \"$@\" 2>" + fifo.string(), kRendezvousBin, "--host", "127.0.0.1",
                  "--port", "0", "--torch-clients", "alpha"});
  std::smatch m;
  std::regex listening(R"(listening on 127\.0\.0\.1:(\d+))");
  REQUIRE(daemon.wait_for_stdout([&](const std::string& out) { return std::regex_search(out, m, listening); }, 10s));
  std::string out = daemon.out();
  REQUIRE(std::regex_search(out, m, listening));
  const auto port = static_cast<uint16_t>(std::stoi(m[1]));
  for (int i = 0; i < 3000; ++i) testing::TorchClient passing(port);  // ~100 bytes of log each
  testing::TorchClient last(port);
  last.set("k", "v");
  CHECK(last.get("k") == "v");
  close(reader);
}
