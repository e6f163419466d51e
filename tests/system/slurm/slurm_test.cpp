// ddprun under a real Slurm (slurmctld + slurmd per node, munge): batch jobs with
// `srun ddprun`, the task-per-GPU style, scancel, and an elastic job that loses a node.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "cluster.hpp"
#include "e2e.hpp"
#include "fashion_output.hpp"

using namespace testing;
using namespace std::chrono_literals;

namespace {

// Writes a batch script and submits it with sbatch; returns the job id.
std::string submit(SlurmCluster& c, const std::string& name, const std::string& body,
                   const std::vector<std::string>& sbatch_flags) {
  auto script = c.dir() / (name + ".sh");
  write_file(script, "#!/bin/sh\n" + body, true);
  std::vector<std::string> cmd = {"sbatch", "--parsable", "-o", (c.dir() / (name + ".out")).string()};
  cmd.insert(cmd.end(), sbatch_flags.begin(), sbatch_flags.end());
  cmd.push_back(script.string());
  auto r = c.run_on_head(cmd);
  INFO(r.err);
  REQUIRE(r.status == 0);
  std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
  REQUIRE(!id.empty());
  return id;
}

// Waits until the job has left the queue; returns its output file.
std::string wait_job(SlurmCluster& c, const std::string& name, const std::string& id,
                     std::chrono::seconds limit = 90s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto q = c.run_on_head({"squeue", "-h", "-j", id, "-o", "%T"});
    if (q.out.empty()) return read_file(c.dir() / (name + ".out"));
    std::this_thread::sleep_for(200ms);
  }
  FAIL("job " << id << " did not finish; output so far:\n" << read_file(c.dir() / (name + ".out")));
  return {};
}

std::string job_state(SlurmCluster& c, const std::string& id) {
  // Without accounting, scontrol remembers finished jobs for a while (MinJobAge).
  auto r = c.run_on_head({"scontrol", "show", "job", id});
  std::smatch m;
  std::regex state("JobState=(\\S+)");
  return std::regex_search(r.out, m, state) ? m[1].str() : "?";
}

// Submits a 2-node job whose 4 workers each start two grandchildren (one leaves the
// worker's process group), waits until all 12 pids are written, scancels it, and
// returns the seconds until none of them is alive (or -1 if some outlive `limit`).
double cancel_and_time(SlurmCluster& c, const std::string& name, std::chrono::seconds limit) {
  auto pids_dir = c.dir() / (name + "-pids");
  std::filesystem::create_directories(pids_dir);
  auto id = submit(c, name,
                   "srun " + e2e::kDdprun + " --nproc_per_node=2 " + e2e::kWorker + " tree " + pids_dir.string() + "\n",
                   {"-N2", "--ntasks-per-node=1"});
  std::vector<pid_t> pids;
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (pids.size() < 12 && std::chrono::steady_clock::now() < deadline) {
    pids.clear();
    for (int r = 0; r < 4; ++r) {
      std::istringstream in(read_file(pids_dir / ("pids." + std::to_string(r))));
      pid_t p;
      while (in >> p) pids.push_back(p);
    }
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(pids.size() == 12);  // 4 workers, each with a grandchild in its group and one that left it
  auto cancelled = std::chrono::steady_clock::now();
  REQUIRE(c.run_on_head({"scancel", id}).status == 0);
  auto alive = [&] { return std::count_if(pids.begin(), pids.end(), [](pid_t p) { return process_alive(p); }); };
  while (alive() > 0 && std::chrono::steady_clock::now() - cancelled < limit) std::this_thread::sleep_for(5ms);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled).count();
  std::string out = wait_job(c, name, id);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("stopped by SIGTERM"));
  return alive() == 0 ? seconds : -1;
}

bool has(const std::vector<std::string>& lines, const std::string& kv) {
  return std::find(lines.begin(), lines.end(), kv) != lines.end();
}

}  // namespace

TEST_CASE("a 1-node sbatch of srun ddprun runs the example", "[slurm_cluster]") {
  SlurmCluster c(1);
  auto id = submit(c, "one", "srun " + e2e::kDdprun + " --nproc_per_node=2 " + HELLO_RANKS_BIN + "\n", {"-N1"});
  std::string out = wait_job(c, "one", id);
  INFO(out);
  CHECK(job_state(c, id) == "COMPLETED");
  CHECK_THAT(out, Catch::Contains("[rank0]:rank 0 of 2 (local rank 0 of 2, node 0 of 1) on n0"));
  CHECK_THAT(out, Catch::Contains("[rank1]:rank 1 of 2 (local rank 1 of 2, node 0 of 1) on n0"));
  CHECK_THAT(out, Catch::Contains("run slurm-" + id + ".0"));
}

TEST_CASE("a 2-node job of srun ddprun needs no flags beyond --nproc_per_node", "[slurm_cluster]") {
  SlurmCluster c(2);
  auto id = submit(c, "two",
                   "srun " + e2e::kDdprun + " --nproc_per_node=2 " + e2e::kWorker +
                       " env RANK WORLD_SIZE LOCAL_RANK GROUP_RANK MASTER_ADDR DDPRUN_STORE_ADDR TORCHELASTIC_RUN_ID\n",
                   {"-N2", "--ntasks-per-node=1"});
  std::string out = wait_job(c, "two", id);
  INFO(out);
  CHECK(job_state(c, id) == "COMPLETED");
  auto ranks = e2e::by_rank(out);
  REQUIRE(ranks.size() == 4);
  for (int r = 0; r < 4; ++r) {
    CHECK(has(ranks[r], "RANK=" + std::to_string(r)));
    CHECK(has(ranks[r], "WORLD_SIZE=4"));
    CHECK(has(ranks[r], "LOCAL_RANK=" + std::to_string(r % 2)));
    CHECK(has(ranks[r], "GROUP_RANK=" + std::to_string(r / 2)));
    CHECK(has(ranks[r], "MASTER_ADDR=n0"));        // the store host, from the nodelist
    CHECK(has(ranks[r], "DDPRUN_STORE_ADDR=n0"));
    CHECK(has(ranks[r], "TORCHELASTIC_RUN_ID=slurm-" + id + ".0"));
  }
}

TEST_CASE("the task-per-GPU style runs without ddprun", "[slurm_cluster]") {
  SlurmCluster c(2);
  auto id = submit(c, "tasks", std::string("srun ") + HELLO_RANKS_BIN + "\n", {"-N2", "--ntasks-per-node=2"});
  std::string out = wait_job(c, "tasks", id);
  INFO(out);
  CHECK(job_state(c, id) == "COMPLETED");
  for (int r = 0; r < 4; ++r) {
    CHECK_THAT(out, Catch::Contains("rank " + std::to_string(r) + " of 4 (local rank " + std::to_string(r % 2) +
                                    " of 2, node " + std::to_string(r / 2) + " of 2) on n" + std::to_string(r / 2)));
  }
  CHECK_THAT(out, Catch::Contains("rank 0 may host a store at n0:"));
  CHECK_THAT(out, Catch::Contains("for run slurm-" + id + ".0"));
}

// Submits `script` to a 2-node cluster and checks that the job completed and all 4
// ranks of the collective matrix passed every check.
static void run_matrix_job(const std::string& name, const std::string& script, const std::string& tasks_per_node) {
  SlurmCluster c(2);
  auto id = submit(c, name, script, {"-N2", "--ntasks-per-node=" + tasks_per_node});
  std::string out = wait_job(c, name, id);
  INFO(out);
  CHECK(job_state(c, id) == "COMPLETED");
  int passed = 0;
  std::regex done(R"(rank (\d+): (\d+) checks, 0 failed)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), done); it != std::sregex_iterator(); ++it) ++passed;
  CHECK(passed == 4);
  CHECK(out.find("FAILED") == std::string::npos);
}

TEST_CASE("collectives under srun ddprun on 2 nodes pass the check matrix", "[slurm_cluster]") {
  run_matrix_job("coll", "srun " + e2e::kDdprun + " --nproc_per_node=2 " + COLLECTIVE_WORKER_BIN + " matrix --big 1001\n",
                 "1");
}

TEST_CASE("collectives in the task-per-GPU style (srun without ddprun) pass the check matrix", "[slurm_cluster]") {
  run_matrix_job("colltasks", std::string("srun ") + COLLECTIVE_WORKER_BIN + " matrix --big 1001\n", "2");
}

TEST_CASE("scancel leaves no worker behind on any node", "[slurm_cluster]") {
  SlurmCluster c(2);
  // Within Slurm's KillWait (5 s here), so nothing is left for its SIGKILL.
  CHECK(cancel_and_time(c, "cancel", 5s) >= 0);
}

// Not a test: `scripts/bench/slurm` runs it for the launch-latency figure.
TEST_CASE("benchmark: srun start to all workers running, 2 nodes x 2 workers", "[.bench]") {
  SlurmCluster c(2);
  std::vector<double> latencies;
  for (int i = 0; i < 5; ++i) {
    std::string name = "lat" + std::to_string(i);
    auto id = submit(c, name,
                     "echo \"srun-start $(date +%s.%N)\"\nsrun " + e2e::kDdprun + " --nproc_per_node=2 " +
                         e2e::kWorker + " now\n",
                     {"-N2", "--ntasks-per-node=1"});
    std::string out = wait_job(c, name, id);
    double start = 0, last = 0;
    for (const auto& line : lines_of(out)) {
      if (line.rfind("srun-start ", 0) == 0) start = std::stod(line.substr(11));
      auto at = line.find("]:started ");
      if (at != std::string::npos) last = std::max(last, std::stod(line.substr(at + 10)));
    }
    REQUIRE(start > 0);
    REQUIRE(last > 0);
    latencies.push_back(last - start);
  }
  std::sort(latencies.begin(), latencies.end());
  std::printf("srun start -> all 4 workers running (2 nodes x 2), 5 jobs: median %.1f ms, min %.1f ms, max %.1f ms\n",
              latencies[2] * 1e3, latencies[0] * 1e3, latencies[4] * 1e3);
  std::vector<double> cancels;
  for (int i = 0; i < 5; ++i) {
    double s = cancel_and_time(c, "cancel" + std::to_string(i), 5s);
    REQUIRE(s >= 0);
    cancels.push_back(s);
  }
  std::sort(cancels.begin(), cancels.end());
  std::printf("scancel -> 0 surviving workers/grandchildren on both nodes, 5 jobs: median %.1f ms, max %.1f ms "
              "(KillWait 5 s)\n",
              cancels[2] * 1e3, cancels[4] * 1e3);
}

TEST_CASE("a failing node ends the Slurm job on all nodes with the summary in its output", "[slurm_cluster]") {
  SlurmCluster c(2);
  // Global rank 3 (node 1) fails; the others would sleep for 10 minutes.
  auto id = submit(c, "fail", "srun " + e2e::kDdprun + " --nproc_per_node=2 " + e2e::kWorker + " fail 3 7\n",
                   {"-N2", "--ntasks-per-node=1"});
  std::string out = wait_job(c, "fail", id, 60s);
  INFO(out);
  CHECK(job_state(c, id) == "FAILED");
  // Both nodes' ddprun printed a summary naming the same root cause.
  CHECK_THAT(out, Catch::Contains("rank 3 (local_rank 1) on n1") && Catch::Contains("exited with code 7"));
  CHECK_THAT(out, Catch::Contains("rank 3 on node 1 (n1): exited with code 7"));
}

TEST_CASE("elastic srun ddprun --nnodes=2:3 in a --no-kill allocation drops a failed node and finishes on two",
          "[slurm_cluster][elastic]") {
  // A node fails as a host does: its link goes down. Slurm declares it DOWN after
  // SlurmdTimeout (10 s here); ddprun re-forms on the two others within its heartbeat
  // timeout, long before. What Slurm must be told so that it does not end the job
  // itself (found by trying, Slurm 22.05; see launcher/README.md, "Elastic jobs under Slurm"):
  //   sbatch/salloc --no-kill      else the whole job is cancelled (and requeued) when
  //                                the node is declared DOWN;
  //   srun --no-kill               else the step's other tasks are killed then;
  //   srun --kill-on-bad-exit=0    else a node whose ddprun exits non-zero (a site's
  //                                KillOnBadExit=1) ends the step.
  SlurmCluster c(3, {.slurmd_timeout_s = 10});
  const std::string ckpt = (c.dir() / "fm.ckpt").string();
  auto id = submit(c, "elastic",
                   "srun --no-kill --kill-on-bad-exit=0 " + e2e::kDdprun +
                       " --nnodes=2:3 --nproc_per_node=1 --rdzv_conf=last_call_timeout=1 --heartbeat_timeout=3"
                       " --max_restarts=1 " + FASHION_MNIST_BIN + " --epochs 6 --checkpoint " + ckpt + "\n",
                   {"-N3", "--ntasks-per-node=1", "--no-kill"});
  // Wait until the three-node job has trained an epoch, then fail node 2 (node 0
  // holds the store and slurmctld).
  const auto out_file = c.dir() / "elastic.out";
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  auto trained_on_three = [&] {
    const std::string out = read_file(out_file);
    const auto at = out.find("fashion_mnist: 3 worker(s)");
    return at != std::string::npos && out.find("epoch 1 loss", at) != std::string::npos;
  };
  while (!trained_on_three() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(200ms);
  REQUIRE(trained_on_three());
  c.cut(2);
  const std::string out = wait_job(c, "elastic", id, 300s);
  INFO(out);
  CHECK(job_state(c, id) == "COMPLETED");  // srun itself succeeded: the failed node was dropped
  std::vector<std::pair<int, int>> attempts;
  for (const auto& s : fashion::starts(out)) attempts.emplace_back(s.world, s.restart_count);
  CHECK(attempts == std::vector<std::pair<int, int>>{{3, 0}, {2, 1}});
  CHECK(fashion::resumed_at(out).size() == 1);
  CHECK_THAT(out, Catch::Contains("RESULT world 2 "));
  const auto acc = fashion::final_accuracy(out);
  REQUIRE(acc);
  CHECK(*acc >= 0.885);
}
