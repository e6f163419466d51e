// ddprun as a Kubernetes container's command, one ddprun per pod, each pod a
// network-namespace host with its own host name, hosts file and exactly the
// environment its controller sets (pods.hpp, controllers.hpp). The program is a small
// script that reports the worker's environment, then runs the test worker.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <regex>
#include <set>
#include <thread>

#include "controllers.hpp"
#include "e2e.hpp"
#include "pods.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

// What the other pods exit with when a pod of a fixed job is lost (ddprun's kExitNodeLost).
constexpr int kExitPodLost = 75;

// How long the cluster DNS takes to answer for the name marked `later`.
constexpr auto kNameDelay = 3s;

// What one worker reported about itself.
struct Report {
  std::string pod;
  int rank = -1, local_rank = -1, world = -1, local_world = -1, group_rank = -1, group_world = -1, restart = -1;
  std::string master;
  std::string run_id;
};

// The container's program: one line of the worker's environment, then the test
// worker in the given mode, or (mode "until FILE") waiting for FILE to exist.
std::string write_program(const TempDir& dir) {
  const auto path = dir / "train";
  write_file(path,
             "#!/bin/sh\n"
             "echo \"report pod=$(hostname) rank=$RANK local_rank=$LOCAL_RANK world=$WORLD_SIZE"
             " local_world=$LOCAL_WORLD_SIZE group_rank=$GROUP_RANK group_world=$GROUP_WORLD_SIZE"
             " restart=$TORCHELASTIC_RESTART_COUNT master=$MASTER_ADDR:$MASTER_PORT run_id=$TORCHELASTIC_RUN_ID\"\n"
             "if [ \"$1\" = until ]; then\n"
             "  i=0\n"
             "  while [ ! -e \"$2\" ]; do i=$((i + 1)); [ $i -gt 600 ] && exit 99; sleep 0.1; done\n"
             "  exit 0\n"
             "fi\n"
             "exec " + e2e::kWorker + " \"$@\"\n",
             true);
  return path.string();
}

// Every report in a container's output.
std::vector<Report> reports(const std::string& out) {
  static const std::regex re(
      R"(report pod=(\S+) rank=(\d+) local_rank=(\d+) world=(\d+) local_world=(\d+) group_rank=(\d+) )"
      R"(group_world=(\d+) restart=(\d+) master=(\S*) run_id=(\S*))");
  std::vector<Report> found;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    const auto& m = *it;
    found.push_back({m[1], std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]), std::stoi(m[6]),
                     std::stoi(m[7]), std::stoi(m[8]), m[9], m[10]});
  }
  return found;
}

// Starts every pod, publishes the late names after kNameDelay. Until then no pod can
// reach the one that hosts the store, so no worker may have started.
void start_all(k8s::Pods& pods, const std::function<std::vector<std::string>(int)>& command) {
  for (int p = 0; p < pods.size(); ++p) pods.start(p, command(p));
  std::this_thread::sleep_for(kNameDelay);
  for (size_t c = 0; c < pods.containers(); ++c) {
    INFO(pods.transcript());
    CHECK(reports(pods.container(c).out()).empty());
  }
  pods.publish();
}

// Waits for every container to end; FAILs with every container's output if one does not.
std::vector<int> wait_all(k8s::Pods& pods, std::chrono::seconds limit) {
  std::vector<int> status;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (size_t i = 0; i < pods.containers(); ++i) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    auto s = pods.container(i).wait(std::max(left, std::chrono::milliseconds(1)));
    if (!s) FAIL("container " << i << " still runs after " << limit.count() << " s\n" << pods.transcript());
    status.push_back(*s);
  }
  return status;
}

// The job every pod of a fixed-size set formed: each pod's workers report the pod's
// node rank (PET_NODE_RANK) as GROUP_RANK, consecutive global ranks from
// node rank × nproc, local ranks 0..nproc-1, and the whole world; ranks are unique.
// Every worker's MASTER_ADDR names node 0's pod: its address, its host name, or the
// name the command or PET_MASTER_ADDR gave for it.
void check_fixed_world(k8s::Pods& pods, int nproc) {
  const int world = pods.size() * nproc;
  const auto& env0 = pods.spec(0).env;
  std::set<std::string> node0 = {pods.address(0), pods.spec(0).name};
  for (const char* name : {"PET_MASTER_ADDR", "MASTER_ADDR"}) {
    if (env0.count(name)) node0.insert(env0.at(name));
  }
  std::set<int> ranks;
  for (int p = 0; p < pods.size(); ++p) {
    const auto& spec = pods.spec(p);
    const int node_rank = std::stoi(spec.env.at("PET_NODE_RANK"));
    auto got = reports(pods.container(p).out());
    INFO(pods.transcript());
    REQUIRE(got.size() == static_cast<size_t>(nproc));
    for (const auto& r : got) {
      CHECK(r.pod == spec.name);
      CHECK(r.world == world);
      CHECK(r.local_world == nproc);
      CHECK(r.group_rank == node_rank);
      CHECK(r.group_world == pods.size());
      CHECK(r.rank == node_rank * nproc + r.local_rank);
      CHECK(r.restart == 0);
      CHECK(node0.count(r.master.substr(0, r.master.rfind(':'))) == 1);
      ranks.insert(r.rank);
    }
  }
  CHECK(ranks.size() == static_cast<size_t>(world));
}

// Every worker of every container got rank 0's key from the job's one store, after
// all ranks of the world had arrived (the test worker's store mode).
void check_store_joined(k8s::Pods& pods, int nproc) {
  for (size_t i = 0; i < pods.containers(); ++i) {
    const std::string out = pods.container(i).out();
    int joined = 0;
    for (const auto& line : lines_of(out)) joined += line.find("got 'from rank 0', arrival") != std::string::npos;
    CHECK(joined == nproc);
  }
}

// Waits until container `c` has reported a worker of an attempt with this world size
// and restart count; FAILs with every container's output if it does not in time.
void wait_report(k8s::Pods& pods, size_t c, int world, int restart, std::chrono::seconds limit) {
  const bool seen = pods.container(c).wait_for_stdout(
      [&](const std::string& out) {
        for (const auto& r : reports(out)) {
          if (r.world == world && r.restart == restart) return true;
        }
        return false;
      },
      limit);
  if (!seen) {
    FAIL("container " << c << " reported no worker of world " << world << ", restart " << restart << " within "
                      << limit.count() << " s\n"
                      << pods.transcript());
  }
}

// A PyTorchJob (no elasticPolicy) container's command: the operator sets no
// PET_MASTER_ADDR, only the pod-level MASTER_ADDR/MASTER_PORT, so the command names
// them, `ddprun --master_addr=$(MASTER_ADDR) --master_port=$(MASTER_PORT) train ...`
// (Kubernetes expands $(VAR) from the container's environment); without them torchrun's
// master address, and ddprun's, is 127.0.0.1 on every pod.
std::vector<std::string> pytorchjob_command(const k8s::Pods& pods, int pod, std::vector<std::string> program) {
  const auto& env = pods.spec(pod).env;
  std::vector<std::string> argv = {"--master_addr=" + env.at("MASTER_ADDR"), "--master_port=" + env.at("MASTER_PORT")};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

// A pod set ready to start, the containers' program in a folder of its own.
struct PodJob {
  explicit PodJob(const k8s::PodSet& set) : program(write_program(dir)), pods(set.pods, set.names) {}
  TempDir dir;
  std::string program;
  k8s::Pods pods;
};

// Every container of a fixed-size job ends with status 0, having formed the one job
// (check_fixed_world) and met every rank at its store (check_store_joined).
void check_formed(k8s::Pods& pods, int nproc) {
  auto status = wait_all(pods, 45s);
  INFO(pods.transcript());
  for (int s : status) CHECK(s == 0);
  check_fixed_world(pods, nproc);
  check_store_joined(pods, nproc);
}

// The lines of a container's stderr from the failure summary's root cause on.
std::string root_cause_part(const std::string& err) {
  const auto at = err.find("Root cause");
  return at == std::string::npos ? "" : err.substr(at);
}

}  // namespace

TEST_CASE("PyTorchJob pods (master-0 and 2 workers with nprocPerNode 2) form one job of 6 ranks",
          "[k8s][pytorchjob]") {
  PodJob job(k8s::pytorchjob({}));
  auto& pods = job.pods;
  const auto& program = job.program;
  // Every rank joins the job's one store and waits there for all the others.
  start_all(pods, [&](int p) { return pytorchjob_command(pods, p, {program, "store"}); });
  check_formed(pods, 2);
}

TEST_CASE("PyTorchJob pods whose command names no master are told at once how to name it", "[k8s][pytorchjob]") {
  PodJob job(k8s::pytorchjob({.master_name_later = false}));
  auto& pods = job.pods;
  for (int p = 0; p < pods.size(); ++p) pods.start(p, {job.program, "store"});
  // Every pod looks for node 0's store at 127.0.0.1, its own loopback, as torchrun's
  // would: each says so and how to pass the pod's MASTER_ADDR, before it waits.
  const auto until = std::chrono::steady_clock::now() + 20s;
  auto all_told = [&] {
    for (size_t c = 0; c < pods.containers(); ++c) {
      if (pods.container(c).err().find("--master_addr=$(MASTER_ADDR) --master_port=$(MASTER_PORT)") ==
          std::string::npos) {
        return false;
      }
    }
    return true;
  };
  while (!all_told() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(100ms);
  INFO(pods.transcript());
  CHECK(all_told());
  for (size_t c = 0; c < pods.containers(); ++c) {
    CHECK_THAT(pods.container(c).err(), Catch::Contains("MASTER_ADDR=pt-master-0"));
    CHECK(reports(pods.container(c).out()).empty());
    pods.container(c).send_signal(SIGTERM);  // as Kubernetes stops a pod
  }
  for (size_t c = 0; c < pods.containers(); ++c) CHECK(pods.container(c).wait(20s) == 128 + SIGTERM);
}

TEST_CASE("A PyTorchJob worker's failure ends every pod with its exit status and its rank named in each",
          "[k8s][pytorchjob]") {
  PodJob job(k8s::pytorchjob({}));
  auto& pods = job.pods;
  const auto& program = job.program;
  // Rank 3 (worker-0's local rank 1) exits 7; the other ranks would sleep for minutes.
  start_all(pods, [&](int p) { return pytorchjob_command(pods, p, {program, "fail", "3", "7"}); });
  auto status = wait_all(pods, 30s);
  INFO(pods.transcript());
  // Every pod exits with the failed worker's status: a podFailurePolicy rule on the
  // program's exit codes acts on whichever pod the Job controller sees first.
  for (int s : status) CHECK(s == 7);
  for (int p = 0; p < pods.size(); ++p) {
    const std::string cause = root_cause_part(pods.container(p).err());
    CHECK_THAT(cause, Catch::Contains("rank 3") && Catch::Contains("pt-worker-0") &&
                          Catch::Contains("exited with code 7"));
  }
}

TEST_CASE("A lost PyTorchJob pod ends every other pod and each names it", "[k8s][pytorchjob]") {
  PodJob job(k8s::pytorchjob({}));
  auto& pods = job.pods;
  const auto& program = job.program;
  start_all(pods, [&](int p) { return pytorchjob_command(pods, p, {program, "until", (job.dir / "never").string()}); });
  for (int p = 0; p < pods.size(); ++p) wait_report(pods, p, 6, 0, 30s);
  // worker-1's node goes away: its ddprun is SIGKILLed (its workers die with it).
  pods.container(2).send_signal(SIGKILL);
  auto status = wait_all(pods, 30s);
  INFO(pods.transcript());
  CHECK(status[2] == 128 + SIGKILL);
  for (int p = 0; p < 2; ++p) {
    CHECK(status[p] == kExitPodLost);
    CHECK_THAT(root_cause_part(pods.container(p).err()), Catch::Contains("pt-worker-1") && Catch::Contains("lost"));
  }
}

TEST_CASE("Elastic PyTorchJob pods (2:3 with the c10d endpoint on worker-0): a killed pod restarted rejoins and the job finishes",
          "[k8s][elastic]") {
  PodJob job(k8s::elastic_pytorchjob({}));
  auto& pods = job.pods;
  const auto& program = job.program;
  const std::string finish = (job.dir / "finish").string();
  start_all(pods, [&](int) { return std::vector<std::string>{program, "until", finish}; });

  // All three pods form one job: world 3, one rank each, node ranks by arrival.
  for (size_t c = 0; c < 3; ++c) wait_report(pods, c, 3, 0, 40s);
  std::set<int> ranks;
  for (size_t c = 0; c < 3; ++c) {
    for (const auto& r : reports(pods.container(c).out())) {
      if (r.world != 3) continue;
      CHECK(r.pod == pods.spec(static_cast<int>(c)).name);
      CHECK(r.local_rank == 0);
      CHECK(r.local_world == 1);
      CHECK(r.group_world == 3);
      CHECK(r.group_rank == r.rank);
      CHECK(r.run_id == "el");  // PET_RDZV_ID
      ranks.insert(r.rank);
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2});

  // worker-2's node is lost (its ddprun SIGKILLed): the other two go on as a world of
  // 2 after one restart.
  pods.container(2).send_signal(SIGKILL);
  REQUIRE(pods.container(2).wait(10s) == 128 + SIGKILL);
  for (size_t c = 0; c < 2; ++c) wait_report(pods, c, 2, 1, 30s);

  // The pod's container starts again (restartPolicy OnFailure): it rejoins, and the
  // job grows back to 3 without using a restart.
  const size_t again = pods.start(2, {program, "until", finish});
  for (size_t c : {size_t{0}, size_t{1}, again}) wait_report(pods, c, 3, 1, 30s);

  write_file(finish, "");
  INFO(pods.transcript());
  for (size_t c : {size_t{0}, size_t{1}, again}) CHECK(pods.container(c).wait(30s) == 0);
}

TEST_CASE("Trainer v2 TrainJob pods (a JobSet of 2 nodes x 2) form one job from PET_* alone with the master name late",
          "[k8s][trainjob]") {
  PodJob job(k8s::trainjob({}));
  auto& pods = job.pods;
  start_all(pods, [&](int) { return std::vector<std::string>{job.program, "store"}; });
  check_formed(pods, 2);
}

TEST_CASE("Elastic PyTorchJob pods without rdzvId or rdzvConf form at maxReplicas with the run id none",
          "[k8s][elastic]") {
  // No PET_RDZV_ID (torchrun's --rdzv_id default "none") and no PET_RDZV_CONF: the job
  // forms as soon as maxReplicas pods have joined, without a last call.
  PodJob job(k8s::elastic_pytorchjob({.job = "plain", .rdzv_id = "", .rdzv_conf = ""}));
  auto& pods = job.pods;
  start_all(pods, [&](int) { return std::vector<std::string>{job.program, "store"}; });
  auto status = wait_all(pods, 45s);
  INFO(pods.transcript());
  for (int s : status) CHECK(s == 0);
  std::set<int> ranks;
  for (size_t c = 0; c < pods.containers(); ++c) {
    for (const auto& r : reports(pods.container(c).out())) {
      CHECK(r.world == 3);
      CHECK(r.run_id == "none");
      ranks.insert(r.rank);
    }
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  check_store_joined(pods, 1);
}

TEST_CASE("TrainJob pods: losing node-0-0 (the store's host) ends the other pods with status 75", "[k8s][trainjob]") {
  PodJob job(k8s::trainjob({.num_nodes = 3, .nproc_per_node = 1}));
  auto& pods = job.pods;
  start_all(pods, [&](int) { return std::vector<std::string>{job.program, "until", (job.dir / "never").string()}; });
  for (int p = 0; p < pods.size(); ++p) wait_report(pods, p, 3, 0, 30s);
  pods.container(0).send_signal(SIGKILL);
  auto status = wait_all(pods, 30s);
  INFO(pods.transcript());
  CHECK(status[0] == 128 + SIGKILL);
  for (int p = 1; p < pods.size(); ++p) {
    CHECK(status[p] == kExitPodLost);
    CHECK_THAT(root_cause_part(pods.container(p).err()), Catch::Contains("tj-node-0-0.tj") && Catch::Contains("gone"));
  }
}
