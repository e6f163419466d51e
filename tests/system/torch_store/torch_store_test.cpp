// torch's own TCPStore client (Debian's PyTorch 1.13, /usr/bin/python3) against two
// servers in one run: torch's own TCPStore server (torch_server.py, a process of its
// own) and `ddp-rendezvous --torch-clients JOB`. tcpstore_calls.py drives the client
// through every call that torch offers and prints one JSON record per call; the test
// requires the same records from both servers: results, exception types and
// messages, and timeouts that take what was asked, within kTolerance.
//
// The reference is torch 1.13's server, the only one 1.13 has (its "legacy" server).
// Where PyTorch 2.x's two servers differ, ddprun's follows the libuv one (PROTOCOL.md),
// and so does this test where 1.13's legacy server agrees with 2.x's legacy one against
// libuv: those records are listed in kLibuvAnswers with libuv's answer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "subprocess.hpp"

using namespace std::chrono_literals;
using testing::Process;

namespace {

const std::string kPython = "/usr/bin/python3";  // Debian's python3-torch (scripts/setup installs it)
const std::string kDir = TORCH_STORE_DIR;
const std::string kRendezvousBin = RENDEZVOUS_BIN;
const std::string kJob = "torchcheck";

// A timeout must take what was asked: not less, and not more than this over it. Two
// servers' durations of one timeout may differ by as much.
constexpr double kTolerance = 0.4;

// Records where torch's legacy server (1.13's only one) misses what its libuv server
// does, and libuv's answer, which ddprun's server must give (measured with PyTorch
// 2.15's client against both of its servers: scripts/bench/torch_store_compat).
const std::map<std::string, std::string> kLibuvAnswers = {
    // The legacy server does not wake waiters when compare_set creates the key.
    {"wait(['later3']) woken by a second client's compare_set",
     R"({"call": "wait(['later3']) woken by a second client's compare_set", "result": null, "woke": true})"},
};

// Records where ddp-rendezvous differs from torch's server on purpose (PROTOCOL.md, "torch's
// dialects"): the daemon drops a job's keys when its last connection closes, so that the
// next job with the same id starts clean; torch's server keeps them while it lives (and
// so does ddprun's embedded store for its current attempt). Whatever the daemon answers
// there is accepted, a timeout still within its bounds.
const std::vector<std::string> kDaemonDrops = {"get('a') by a new client after every client left"};

struct Record {
  std::string line;  // the record without "seconds"
  std::string call;
  double asked = -1;  // the timeout asked, or -1
  double seconds = -1;
};

std::vector<Record> parse(const std::string& out) {
  static const std::regex kSeconds(R"(, "seconds": ([0-9.]+))");
  static const std::regex kAsked(R"("asked": ([0-9.]+))");
  static const std::regex kCall(R"re("call": "((?:[^"\\]|\\.)*)")re");
  std::vector<Record> records;
  for (const auto& line : testing::lines_of(out)) {
    Record r;
    std::smatch m;
    if (std::regex_search(line, m, kSeconds)) r.seconds = std::stod(m[1]);
    if (std::regex_search(line, m, kAsked)) r.asked = std::stod(m[1]);
    if (std::regex_search(line, m, kCall)) r.call = m[1];
    r.line = std::regex_replace(line, kSeconds, "");
    records.push_back(r);
  }
  return records;
}

// A server process that prints "listening on 127.0.0.1:PORT" once it serves.
uint16_t wait_listening(Process& p, const std::string& what) {
  static const std::regex kListening(R"(listening on 127\.0\.0\.1:(\d+))");
  std::smatch m;
  bool up = p.wait_for_stdout([&](const std::string& out) { return std::regex_search(out, m, kListening); }, 60s);
  INFO(what << " did not start: " << p.out() << p.err());
  REQUIRE(up);
  std::string out = p.out();
  REQUIRE(std::regex_search(out, m, kListening));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

std::vector<Record> drive(uint16_t port, const std::string& what) {
  auto r = testing::run({kPython, kDir + "/tcpstore_calls.py", "127.0.0.1:" + std::to_string(port)}, {}, 240s);
  INFO(what << ": tcpstore_calls.py exited " << r.status << "\n" << r.err.substr(0, 4000));
  REQUIRE(r.status == 0);
  auto records = parse(r.out);
  REQUIRE_FALSE(records.empty());
  REQUIRE(records.back().call == "done");
  return records;
}

void check_timeout(const Record& r, const std::string& server) {
  if (r.asked < 0) return;
  INFO(server << ": " << r.call << " asked " << r.asked << " s, took " << r.seconds << " s");
  CHECK(r.seconds >= r.asked - 0.02);
  CHECK(r.seconds <= r.asked + kTolerance);
}

}  // namespace

TEST_CASE("torch's TCPStore client gets the same answers from ddprun's server as from torch's own",
          "[store][torch]") {
  {
    auto check = testing::run({kPython, "-c", "import torch.distributed as d; print(d.TCPStore)"});
    INFO("python3-torch is required for this test (scripts/setup installs it): " << check.err);
    REQUIRE(check.status == 0);
  }

  Process torch_server({kPython, kDir + "/torch_server.py", "--host", "127.0.0.1", "--lifetime", "300"});
  uint16_t torch_port = wait_listening(torch_server, "torch's TCPStore server");
  Process daemon({kRendezvousBin, "--host=127.0.0.1", "--port=0", "--torch-clients", kJob},
                 {{}, {"DDPRUN_TOKEN"}});
  uint16_t ddprun_port = wait_listening(daemon, "ddp-rendezvous");

  auto reference = drive(torch_port, "against torch's server");
  auto ours = drive(ddprun_port, "against ddp-rendezvous");

  size_t differ = 0;
  for (size_t i = 0; i < std::min(reference.size(), ours.size()); ++i) {
    const auto& want = reference[i];
    const auto& got = ours[i];
    auto libuv = kLibuvAnswers.find(want.call);
    if (libuv != kLibuvAnswers.end()) {
      INFO("record " << i << ": torch's legacy server answered " << want.line << "; its libuv server answers "
                     << libuv->second);
      CHECK(got.line == libuv->second);
      differ += got.line != libuv->second;
      continue;
    }
    INFO("record " << i << " (" << want.call << ")");
    if (std::find(kDaemonDrops.begin(), kDaemonDrops.end(), want.call) != kDaemonDrops.end()) {
      CHECK(got.call == want.call);
      check_timeout(got, "ddp-rendezvous");
      continue;
    }
    CHECK(got.line == want.line);
    differ += got.line != want.line;
    check_timeout(want, "torch's server");
    check_timeout(got, "ddp-rendezvous");
    if (want.asked >= 0 && got.asked >= 0) CHECK(std::fabs(got.seconds - want.seconds) <= kTolerance);
  }
  CHECK(ours.size() == reference.size());
  if (differ > 0) WARN(differ << " records differ; ddp-rendezvous's log:\n" << daemon.err().substr(0, 3000));
}
