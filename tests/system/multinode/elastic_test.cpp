// Elastic jobs end to end: `ddprun --nnodes 2:3`, one ddprun per network
// namespace, training the real Fashion-MNIST with examples/fashion_mnist, which
// resumes from its checkpoint (a file every node sees, as on a shared filesystem)
// each time the job re-forms. Nodes are lost in every way a host can be lost
// (ddprun SIGKILLed, link cut, host frozen), nodes join, the job falls below MIN,
// and a node flaps.
//
// Each attempt of the job is told apart by what the example prints when it starts:
// its world size and TORCHELASTIC_RESTART_COUNT. A failure (a node lost) adds one to
// the restart count; a node joining does not.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <regex>
#include <thread>

#include "e2e.hpp"
#include "fashion_output.hpp"
#include "netns.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

const std::string kRendezvousBin = RENDEZVOUS_BIN;
const std::string kFashion = FASHION_MNIST_BIN;
constexpr double kTargetAccuracy = 0.885;  // test accuracy a re-formed job must still reach
constexpr int kDaemonPort = 29400;

struct JobOptions {
  int hosts = 3;         // network namespaces
  int daemon_host = -1;  // runs ddp-rendezvous there; -1: node 0 hosts the store
  int max_restarts = 3;
  int join_timeout = 30;  // seconds
};

// One elastic job at 2:3 over a cluster of namespace hosts, running `program` (by
// default the example, checkpointing in the job's folder). Nodes are started on a
// host with an order hint (--node_rank); every node's ddprun is kept for its output.
class ElasticJob {
 public:
  ElasticJob(JobOptions o, std::vector<std::string> fashion_args) : o_(o), cluster_(o.hosts) {
    program_ = {kFashion, "--checkpoint", (dir_ / "fm.ckpt").string()};
    program_.insert(program_.end(), fashion_args.begin(), fashion_args.end());
    write_file(dir_ / "token", "elastic-test-token\n");
    if (o_.daemon_host >= 0) {
      daemon_ = std::make_unique<Process>(cluster_.on(
          o_.daemon_host, {kRendezvousBin, "--port=" + std::to_string(kDaemonPort), "--heartbeat-timeout=3",
                           "--token-file", (dir_ / "token").string()}));
      REQUIRE(daemon_->wait_for_stdout([](const std::string& s) { return s.find("listening") != std::string::npos; },
                                       10s));
    }
  }

  NetnsCluster& cluster() { return cluster_; }
  void set_program(std::vector<std::string> argv) { program_ = std::move(argv); }

  // Starts a ddprun on `host` with order hint `hint`; returns its index for node().
  size_t start(int host, int hint) {
    std::vector<std::string> a = {e2e::kDdprun,
                                  "--nnodes=2:3",
                                  "--node_rank=" + std::to_string(hint),
                                  "--nproc_per_node=1",
                                  "--rdzv_id=elastic-test",
                                  "--rdzv_conf=last_call_timeout=1",
                                  "--rdzv_token_file=" + (dir_ / "token").string(),
                                  "--join_timeout=" + std::to_string(o_.join_timeout),
                                  "--heartbeat_timeout=3",
                                  "--grace_period=3",
                                  "--max_restarts=" + std::to_string(o_.max_restarts)};
    if (o_.daemon_host >= 0) {
      a.push_back("--rdzv_endpoint=" + cluster_.address(o_.daemon_host) + ":" + std::to_string(kDaemonPort));
    } else {
      a.insert(a.end(), {"--master_addr=" + cluster_.address(0), "--master_port=29500"});
    }
    a.insert(a.end(), program_.begin(), program_.end());
    nodes_.push_back(std::make_unique<Process>(cluster_.on(host, a)));
    return nodes_.size() - 1;
  }

  Process& node(size_t i) { return *nodes_.at(i); }

  // Every node's stdout, node after node.
  std::string all_out() const {
    std::string out;
    for (const auto& n : nodes_) out += n->out();
    return out;
  }

  // Everything every node wrote, for a failing check's message.
  std::string transcript() const {
    std::string t;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const std::string name = "---- node " + std::to_string(i);
      t += name + " stdout:\n" + nodes_[i]->out() + name + " stderr:\n" + nodes_[i]->err();
    }
    return t;
  }

  // Waits until `ready` holds for some node's stdout.
  bool wait_any(const std::function<bool(const std::string&)>& ready, std::chrono::milliseconds timeout) const {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      for (const auto& n : nodes_) {
        if (ready(n->out())) return true;
      }
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }

  // Waits until the attempt with this world size and restart count has started its
  // workers and reported `trained` epochs: the attempt is really running. Rank 0's
  // node prints it; which node holds rank 0 changes as the job re-forms.
  // FAILs the test with every node's output when it does not come in time.
  void wait_attempt(int world, int restart_count, int trained, std::chrono::milliseconds timeout) const {
    if (!wait_any([&](const std::string& out) { return epochs_in_attempt(out, world, restart_count) >= trained; },
                  timeout)) {
      FAIL("no attempt with " << world << " workers and restart count " << restart_count << " trained " << trained
                              << " epoch(s)\n" << transcript());
    }
  }

  // How many attempts with this world size have started so far.
  size_t starts_of(int world) const {
    const auto s = fashion::starts(all_out());
    return static_cast<size_t>(std::count_if(s.begin(), s.end(), [&](const auto& x) { return x.world == world; }));
  }

 private:
  // Epochs reported after the start banner of (world, restart_count) in one node's
  // output; -1 when that attempt did not start there.
  static int epochs_in_attempt(const std::string& out, int world, int restart_count) {
    const std::string banner = "fashion_mnist: " + std::to_string(world) + " worker(s)";
    const std::string count = "restart_count " + std::to_string(restart_count) + "\n";
    for (size_t p = out.find(banner); p != std::string::npos; p = out.find(banner, p + 1)) {
      const size_t eol = out.find('\n', p);
      if (eol == std::string::npos) return -1;
      if (out.compare(eol + 1 - count.size(), count.size(), count) != 0) continue;
      const size_t next = out.find("fashion_mnist: ", eol);
      return static_cast<int>(fashion::epochs_run(out.substr(eol, next == std::string::npos ? next : next - eol)).size());
    }
    return -1;
  }

  JobOptions o_;
  NetnsCluster cluster_;
  TempDir dir_;
  std::vector<std::string> program_;
  std::unique_ptr<Process> daemon_;
  std::vector<std::unique_ptr<Process>> nodes_;
};

// A frozen host: its ddprun and its workers stop at once (SIGSTOP), alive to TCP.
void freeze(const Process& node) {
  for (pid_t p : child_pids(node.pid())) ::kill(p, SIGSTOP);
  node.send_signal(SIGSTOP);
}

// The (world, restart count) of every start of the example, sorted.
std::vector<std::pair<int, int>> attempts(const std::string& out) {
  std::vector<std::pair<int, int>> a;
  for (const auto& s : fashion::starts(out)) a.emplace_back(s.world, s.restart_count);
  std::sort(a.begin(), a.end());
  return a;
}

// Every node in `which` ends with status 0 within the timeout.
void require_success(ElasticJob& job, std::initializer_list<size_t> which, std::chrono::seconds timeout) {
  for (size_t i : which) {
    const auto status = job.node(i).wait(timeout);
    INFO("node " << i << " did not succeed\n" << job.transcript());
    REQUIRE(status);
    REQUIRE(*status == 0);
  }
}

}  // namespace

TEST_CASE("elastic 2:3 on a daemon: a node killed, one cut off, one frozen, two replaced: done on two at the target",
          "[multinode][elastic]") {
  // The daemon keeps the store, so the node with hint 0 (the first one killed) may be
  // lost too. Hosts 0-2 start the job, 3 and 4 replace lost nodes, 5 runs the daemon.
  // Three failures exactly use the three restarts: the two joins must use none.
  // 10 epochs leave the last three-node attempt epochs to run even when the joins
  // before it were slow (a loaded machine); the freeze comes as soon as it started.
  ElasticJob job({.hosts = 6, .daemon_host = 5, .max_restarts = 3}, {"--epochs", "10"});
  const size_t a = job.start(0, 0), b = job.start(1, 1), c = job.start(2, 2);
  job.wait_attempt(3, 0, 1, 120s);

  job.node(a).send_signal(SIGKILL);  // 1: ddprun killed (rank 0's node)
  job.wait_attempt(2, 1, 1, 60s);
  const size_t d = job.start(3, 2);  // a replacement joins: no restart used
  job.wait_attempt(3, 1, 1, 60s);

  job.cluster().cut(1);  // 2: host cut off
  job.wait_attempt(2, 2, 1, 60s);
  const auto cut_status = job.node(b).wait(30s);  // it finds its store gone and ends by itself
  REQUIRE(cut_status);
  CHECK(*cut_status != 0);
  const size_t e = job.start(4, 2);
  job.wait_attempt(3, 2, 0, 60s);

  freeze(job.node(d));  // 3: host frozen
  require_success(job, {c, e}, 300s);
  const std::string out = job.all_out();
  INFO(job.transcript());
  CHECK(attempts(out) == std::vector<std::pair<int, int>>{{2, 1}, {2, 2}, {2, 3}, {3, 0}, {3, 1}, {3, 2}});
  // Every attempt after the first resumed from the checkpoint; the last one ran to
  // the end on two workers.
  CHECK(fashion::resumed_at(out).size() == 5);
  const auto epochs = fashion::epochs_run(out);
  REQUIRE(!epochs.empty());
  CHECK(*std::max_element(epochs.begin(), epochs.end()) == 10);
  CHECK(out.find("RESULT world 2 ") != std::string::npos);
  const auto acc = fashion::final_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= kTargetAccuracy);
}

TEST_CASE("elastic 2:3: a third node joins a running two-node job, the world grows to 3 from the checkpoint",
          "[multinode][elastic]") {
  ElasticJob job({.hosts = 3}, {"--epochs", "6"});
  const size_t n0 = job.start(0, 0), n1 = job.start(1, 1);
  job.wait_attempt(2, 0, 1, 120s);
  const size_t n2 = job.start(2, 2);
  job.wait_attempt(3, 0, 0, 60s);
  require_success(job, {n0, n1, n2}, 300s);
  const std::string out = job.all_out();
  INFO(job.transcript());
  CHECK(attempts(out) == std::vector<std::pair<int, int>>{{2, 0}, {3, 0}});  // a join uses no restart
  const auto resumed = fashion::resumed_at(out);
  REQUIRE(resumed.size() == 1);
  CHECK(resumed[0] >= 2);
  const auto epochs = fashion::epochs_run(out);
  REQUIRE(!epochs.empty());
  CHECK(*std::max_element(epochs.begin(), epochs.end()) == 6);
  // The newcomer (hint 2) comes after the nodes that stay: its worker is rank 2.
  CHECK(job.node(n2).out().find("[rank2]:rank 2 params_hash") != std::string::npos);
  const auto acc = fashion::final_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= kTargetAccuracy);
}

TEST_CASE("elastic 2:3: below MIN the survivor waits join_timeout, then ends saying how many were needed",
          "[multinode][elastic]") {
  ElasticJob job({.hosts = 2, .join_timeout = 5}, {});
  job.set_program({e2e::kWorker, "trap", std::to_string(SIGTERM)});
  const size_t n0 = job.start(0, 0), n1 = job.start(1, 1);
  const auto ready = [](int rank) {
    return [rank](const std::string& out) {
      const auto lines = e2e::by_rank(out);
      const auto it = lines.find(rank);
      return it != lines.end() && std::find(it->second.begin(), it->second.end(), "ready") != it->second.end();
    };
  };
  REQUIRE(job.node(n0).wait_for_stdout(ready(0), 60s));
  REQUIRE(job.node(n1).wait_for_stdout(ready(1), 60s));
  job.node(n1).send_signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  const auto status = job.node(n0).wait(60s);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  INFO(job.transcript());
  REQUIRE(status);
  CHECK(*status == 1);
  CHECK_THAT(job.node(n0).err(), Catch::Contains("needs at least 2 nodes") && Catch::Contains("1 present"));
  CHECK(waited >= 4.5);  // it did wait for nodes to come
  CHECK(waited < 20);
}

TEST_CASE("elastic 2:3: a node that joins and dies three times within a minute does not wedge the job",
          "[multinode][elastic]") {
  // Accuracy is not the point: a small training set, many short epochs, so that the
  // job is still training through every flap.
  ElasticJob job({.hosts = 3, .max_restarts = 5}, {"--epochs", "40", "--limit-train", "6000", "--no-eval"});
  const size_t n0 = job.start(0, 0), n1 = job.start(1, 1);
  job.wait_attempt(2, 0, 1, 120s);
  const auto flaps_started = std::chrono::steady_clock::now();
  const auto more_starts = [&](int world, size_t than) {
    if (!job.wait_any([&](const std::string&) { return job.starts_of(world) > than; }, 60s)) {
      FAIL("no new attempt with " << world << " workers\n" << job.transcript());
    }
  };
  // 1: admitted and training, then killed; the job goes on on two.
  size_t flapper = job.start(2, 2);
  more_starts(3, 0);
  job.node(flapper).send_signal(SIGKILL);
  more_starts(2, 1);
  // 2: killed while it joins (the job may be re-forming for it).
  flapper = job.start(2, 2);
  std::this_thread::sleep_for(300ms);
  job.node(flapper).send_signal(SIGKILL);
  // 3: admitted again, then killed.
  const size_t grown = job.starts_of(3);
  flapper = job.start(2, 2);
  more_starts(3, grown);
  job.node(flapper).send_signal(SIGKILL);
  const double flapping_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - flaps_started).count();
  CHECK(flapping_s < 60);
  require_success(job, {n0, n1}, 300s);
  const std::string out = job.all_out();
  INFO(job.transcript());
  const auto s = fashion::starts(out);
  REQUIRE(!s.empty());
  // The job went on on two: it trained to the end, restarted at most once per flap.
  const auto epochs = fashion::epochs_run(out);
  REQUIRE(!epochs.empty());
  CHECK(*std::max_element(epochs.begin(), epochs.end()) == 40);
  CHECK(out.find("RESULT world 2 ") != std::string::npos);
  CHECK(job.starts_of(2) >= 3);  // it re-formed on two after the first and the last flap
  for (const auto& start : s) CHECK(start.restart_count <= 3);
}
