// Every worker gets torchrun's environment, with ranks that match its place.
#include <catch2/catch.hpp>

#include <set>

#include "e2e.hpp"

using namespace testing;

TEST_CASE("workers get torchrun's environment for N = 1..4", "[e2e][env]") {
  const int n = GENERATE(1, 2, 3, 4);
  auto r = run(e2e::ddprun({"--nproc_per_node=" + std::to_string(n), "--standalone", "--role=trainer",
                            "--rdzv_id=envtest", "--max_restarts=2", e2e::kWorker, "env", "RANK", "LOCAL_RANK",
                            "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                            "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
                            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE"}),
               {{}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING"}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(static_cast<int>(ranks.size()) == n);
  std::string master_port;
  std::set<std::string> error_files;
  for (int rank = 0; rank < n; ++rank) {
    const auto& lines = ranks[rank];
    auto has = [&](const std::string& kv) { return std::find(lines.begin(), lines.end(), kv) != lines.end(); };
    const std::string r_s = std::to_string(rank), n_s = std::to_string(n);
    CHECK(has("RANK=" + r_s));
    CHECK(has("LOCAL_RANK=" + r_s));
    CHECK(has("WORLD_SIZE=" + n_s));
    CHECK(has("LOCAL_WORLD_SIZE=" + n_s));
    CHECK(has("GROUP_RANK=0"));
    CHECK(has("GROUP_WORLD_SIZE=1"));
    CHECK(has("ROLE_RANK=" + r_s));
    CHECK(has("ROLE_WORLD_SIZE=" + n_s));
    CHECK(has("ROLE_NAME=trainer"));
    CHECK(has("MASTER_ADDR=127.0.0.1"));
    CHECK(has("TORCHELASTIC_RESTART_COUNT=0"));
    CHECK(has("TORCHELASTIC_MAX_RESTARTS=2"));
    CHECK(has("TORCHELASTIC_RUN_ID=envtest"));
    CHECK(has("TORCHELASTIC_USE_AGENT_STORE=True"));  // ddprun's store serves MASTER_PORT
    CHECK(has("TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT"));
    CHECK(has("TORCH_NCCL_ASYNC_ERROR_HANDLING=1"));
    // Each worker its own error file, as under torchrun.
    const auto file = std::find_if(lines.begin(), lines.end(),
                                   [](const std::string& l) { return l.rfind("TORCHELASTIC_ERROR_FILE=/", 0) == 0; });
    CHECK(file != lines.end());
    if (file != lines.end()) CHECK(error_files.insert(*file).second);
    for (const auto& l : lines) {
      if (l.rfind("MASTER_PORT=", 0) == 0) {
        if (master_port.empty()) master_port = l;
        CHECK(l == master_port);  // the same port for every rank
      }
    }
  }
  CHECK_FALSE(master_port.empty());
}

TEST_CASE("OMP_NUM_THREADS is set to 1 only when unset and nproc > 1 with one notice", "[e2e][env]") {
  SECTION("unset, 2 workers") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", e2e::kWorker, "env", "OMP_NUM_THREADS"}),
                 {{}, {"OMP_NUM_THREADS"}});
    REQUIRE(r.status == 0);
    for (auto& [rank, lines] : e2e::by_rank(r.out)) CHECK(lines == std::vector<std::string>{"OMP_NUM_THREADS=1"});
    auto notices = e2e::own_lines(r.err);
    REQUIRE(notices.size() == 1);
    CHECK_THAT(notices[0], Catch::Contains("OMP_NUM_THREADS"));
  }
  SECTION("set by the user") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", e2e::kWorker, "env", "OMP_NUM_THREADS"}),
                 {{{"OMP_NUM_THREADS", "4"}}, {}});
    REQUIRE(r.status == 0);
    for (auto& [rank, lines] : e2e::by_rank(r.out)) CHECK(lines == std::vector<std::string>{"OMP_NUM_THREADS=4"});
    CHECK(e2e::own_lines(r.err).empty());
  }
  SECTION("one worker") {
    auto r = run(e2e::ddprun({"--nproc_per_node=1", "--standalone", e2e::kWorker, "env", "OMP_NUM_THREADS"}),
                 {{}, {"OMP_NUM_THREADS"}});
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"OMP_NUM_THREADS unset"});
    CHECK(e2e::own_lines(r.err).empty());
  }
}

TEST_CASE("the switch back (--no_agent_store): rank 0 can bind MASTER_PORT whether explicit or chosen by standalone", "[e2e][env]") {
  SECTION("--standalone") {
    auto r = run(e2e::ddprun({"--standalone", "--no_agent_store", e2e::kWorker, "bind-master-port"}));
    INFO(r.err);
    CHECK(r.status == 0);
  }
  SECTION("--master_port, the switch from PET_NO_AGENT_STORE") {
    std::string port = std::to_string(e2e::free_port());
    auto r = run(e2e::ddprun({"--master_port=" + port, e2e::kWorker, "bind-master-port"}),
                 {{{"PET_NO_AGENT_STORE", "1"}}, {}});
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"bound " + port});
  }
}

TEST_CASE("the agent store: ddprun listens on MASTER_PORT, the switch gives the old variables", "[e2e][env]") {
  const std::string port = std::to_string(e2e::free_port());
  SECTION("default: USE_AGENT_STORE=True, MASTER_PORT = --master_port, held by ddprun") {
    auto r = run(e2e::ddprun({"--master_port=" + port, "--nproc_per_node=2", e2e::kWorker, "env", "MASTER_ADDR",
                              "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}));
    INFO(r.err);
    REQUIRE(r.status == 0);
    for (auto& [rank, lines] : e2e::by_rank(r.out)) {
      CHECK(lines == std::vector<std::string>{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                              "TORCHELASTIC_USE_AGENT_STORE=True"});
    }
    auto bind = run(e2e::ddprun({"--master_port=" + port, e2e::kWorker, "bind-master-port"}));
    INFO(bind.out);
    CHECK(bind.status != 0);  // ddprun's store holds it
  }
  SECTION("--no_agent_store: USE_AGENT_STORE=False, the same MASTER_PORT, free for rank 0") {
    auto r = run(e2e::ddprun({"--master_port=" + port, "--no_agent_store", e2e::kWorker, "env", "MASTER_PORT",
                              "TORCHELASTIC_USE_AGENT_STORE"}));
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] ==
          std::vector<std::string>{"MASTER_PORT=" + port, "TORCHELASTIC_USE_AGENT_STORE=False"});
  }
}

TEST_CASE("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 turns the agent store off where torchrun's c10d rendezvous would",
          "[e2e][env]") {
  const std::map<std::string, std::string> off = {{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"}};
  SECTION("--standalone and --rdzv_backend=c10d: USE_AGENT_STORE=False, MASTER_PORT free for rank 0") {
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{"--standalone"},
          std::vector<std::string>{"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(e2e::free_port())}}) {
      std::vector<std::string> args = flags;
      args.insert(args.end(), {e2e::kWorker, "env", "TORCHELASTIC_USE_AGENT_STORE"});
      auto r = run(e2e::ddprun(args), {off, {}});
      INFO(flags.front() << "\n" << r.err);
      REQUIRE(r.status == 0);
      CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"TORCHELASTIC_USE_AGENT_STORE=False"});
      CHECK_THAT(r.err, Catch::Contains("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: the workers host their own store"));
    }
    auto bind = run(e2e::ddprun({"--standalone", e2e::kWorker, "bind-master-port"}), {off, {}});
    INFO(bind.err);
    CHECK(bind.status == 0);
  }
  SECTION("the static backend (torchrun's default) keeps the agent store, as torchrun's static handler does") {
    auto r = run(e2e::ddprun({e2e::kWorker, "env", "TORCHELASTIC_USE_AGENT_STORE"}), {off, {}});
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"TORCHELASTIC_USE_AGENT_STORE=True"});
    CHECK_THAT(r.err, !Catch::Contains("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"));
  }
  SECTION("any other value changes nothing, as torchrun compares with \"1\"") {
    auto r = run(e2e::ddprun({"--standalone", e2e::kWorker, "env", "TORCHELASTIC_USE_AGENT_STORE"}),
                 {{{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "true"}}, {}});
    REQUIRE(r.status == 0);
    CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"TORCHELASTIC_USE_AGENT_STORE=True"});
  }
}

TEST_CASE("cpu and auto worker counts follow the CPUs this process may use", "[e2e][env]") {
  long cpus = 0;
  cpu_set_t set;
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  cpus = CPU_COUNT(&set);
  auto r = run(e2e::ddprun({"--nproc_per_node=cpu", "--standalone", e2e::kWorker, "env", "LOCAL_WORLD_SIZE"}));
  REQUIRE(r.status == 0);
  CHECK(static_cast<long>(e2e::by_rank(r.out).size()) == cpus);
  // auto: one worker per GPU when the NVIDIA driver shows any, else one per CPU.
  long expected = cpus;
  std::error_code ec;
  if (std::filesystem::exists("/proc/driver/nvidia/gpus", ec)) {
    long gpus = std::distance(std::filesystem::directory_iterator("/proc/driver/nvidia/gpus"),
                              std::filesystem::directory_iterator());
    if (gpus > 0) expected = gpus;
  }
  auto a = run(e2e::ddprun({"--nproc_per_node=auto", "--standalone", e2e::kWorker, "env", "LOCAL_WORLD_SIZE"}));
  REQUIRE(a.status == 0);
  CHECK(e2e::by_rank(a.out)[0] == std::vector<std::string>{"LOCAL_WORLD_SIZE=" + std::to_string(expected)});
}

TEST_CASE("the hello_ranks example reports its place in the job", "[e2e][env]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=3", "--standalone", HELLO_RANKS_BIN}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(!ranks[rank].empty());
    CHECK_THAT(ranks[rank][0], Catch::StartsWith("rank " + std::to_string(rank) + " of 3 (local rank " +
                                                 std::to_string(rank) + " of 3, node 0 of 1)"));
  }
}

TEST_CASE("workers reach the job's store with the DDPRUN_STORE_* variables and token", "[e2e][env]") {
  auto r = run(e2e::ddprun({"--nproc_per_node=3", "--standalone", e2e::kWorker, "store"}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  std::set<std::string> arrivals;
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(ranks[rank].size() == 1);
    CHECK_THAT(ranks[rank][0], Catch::StartsWith("got 'from rank 0', arrival "));
    arrivals.insert(ranks[rank][0].substr(ranks[rank][0].rfind(' ') + 1));
  }
  CHECK(arrivals == std::set<std::string>{"1", "2", "3"});  // one add each, all on the same key
}

TEST_CASE("a single node's store at a localhost endpoint takes a generated token and the workers have it",
          "[e2e][env]") {
  // As without an endpoint: nobody but this job's workers can use the store, so no warning.
  const std::string endpoint = "--rdzv_endpoint=localhost:" + std::to_string(e2e::free_port());
  auto r = run(e2e::ddprun({"-v", "--nproc_per_node=2", endpoint, e2e::kWorker, "store"}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(ranks[rank].size() == 1);
    CHECK_THAT(ranks[rank][0], Catch::StartsWith("got 'from rank 0', arrival "));
  }
  CHECK_THAT(r.err, Catch::Contains("listening on 127.0.0.1 only, with a generated token"));
  CHECK_THAT(r.err, !Catch::Contains("accepts anyone"));
}
