// Python programs: .py scripts run under python3 -u, -m runs a module, PYTHON_EXEC
// picks the interpreter, and an unmodified PyTorch DDP script trains under ddprun.
#include <catch2/catch.hpp>

#include "e2e.hpp"

using namespace testing;

namespace {
const char* kProbe =
    "import os, sys\n"
    "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'write_through', sys.stdout.write_through,\n"
    "      'args', ' '.join(sys.argv[1:]))\n";
// Debian's python3-torch lives under the system interpreter (scripts/setup installs it).
const char* kSystemPython = "/usr/bin/python3";
}  // namespace

TEST_CASE("a .py script runs under python3 -u with its arguments", "[e2e][python]") {
  TempDir dir;
  write_file(dir / "probe.py", kProbe);
  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", (dir / "probe.py").string(), "--lr", "0.1"}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  CHECK(ranks[0] == std::vector<std::string>{"rank 0 of 2 write_through True args --lr 0.1"});
  CHECK(ranks[1] == std::vector<std::string>{"rank 1 of 2 write_through True args --lr 0.1"});
}

TEST_CASE("module mode (-m) runs a module and PYTHON_EXEC picks the interpreter", "[e2e][python]") {
  TempDir dir;
  write_file(dir / "ddprun_probe_mod.py", kProbe);
  auto r = run(e2e::ddprun({"--standalone", "-m", "ddprun_probe_mod", "x"}),
               {{{"PYTHONPATH", dir.path().string()}, {"PYTHON_EXEC", kSystemPython}}, {}});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(e2e::by_rank(r.out)[0] == std::vector<std::string>{"rank 0 of 1 write_through True args x"});

  auto bad = run(e2e::ddprun({"--standalone", "-m", "ddprun_probe_mod"}),
                 {{{"PYTHON_EXEC", "/no/such/python"}}, {}});
  CHECK(bad.status == 1);
  CHECK_THAT(bad.err, Catch::Contains("Python interpreter (PYTHON_EXEC) '/no/such/python' not found"));
}

TEST_CASE("an unmodified PyTorch DDP script trains under ddprun", "[e2e][python][torch]") {
  // Requires Debian's python3-torch (installed by scripts/setup); a missing torch fails loudly.
  auto check = run({kSystemPython, "-c", "import torch, torch.distributed; print(torch.__version__)"});
  INFO("python3-torch is required for this test (scripts/setup installs it): " << check.err);
  REQUIRE(check.status == 0);

  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", TESTS_SOURCE_DIR "/launcher/e2e/torch_ddp_probe.py"}),
               {{{"PYTHON_EXEC", kSystemPython}}, {}}, 180s);
  INFO(r.err);
  REQUIRE(r.status == 0);
  auto ranks = e2e::by_rank(r.out);
  REQUIRE(ranks[0].size() == 1);
  REQUIRE(ranks[1].size() == 1);
  CHECK_THAT(ranks[0][0], Catch::StartsWith("rank=0 world=2 allreduce=3 checksum="));
  CHECK_THAT(ranks[1][0], Catch::StartsWith("rank=1 world=2 allreduce=3 checksum="));
  // DDP broadcast rank 0's parameters and averaged the gradients: identical after the step.
  CHECK(ranks[0][0].substr(ranks[0][0].find("checksum=")) == ranks[1][0].substr(ranks[1][0].find("checksum=")));
}

TEST_CASE("a PyTorch worker's @record exception reaches the failure summary", "[e2e][python][torch]") {
  auto check = run({kSystemPython, "-c", "import torch.distributed.elastic.multiprocessing.errors"});
  INFO("python3-torch is required for this test (scripts/setup installs it): " << check.err);
  REQUIRE(check.status == 0);

  TempDir dir;
  write_file(dir / "fails.py",
             "import os, time\n"
             "from torch.distributed.elastic.multiprocessing.errors import record\n"
             "@record\n"
             "def main():\n"
             "    print('error_file=' + os.environ.get('TORCHELASTIC_ERROR_FILE', ''), flush=True)\n"
             "    print('nccl=' + os.environ['TORCH_NCCL_ASYNC_ERROR_HANDLING'] + ' signals=' +\n"
             "          os.environ['TORCHELASTIC_SIGNALS_TO_HANDLE'], flush=True)\n"
             "    if os.environ['RANK'] == '0':\n"
             "        open(os.path.join(os.path.dirname(__file__), 'rank0.printed'), 'w').close()\n"
             "    if os.environ['RANK'] == '1':\n"
             "        # Rank 0 must print before the group is stopped; its import can be slower.\n"
             "        deadline = time.monotonic() + 60\n"
             "        marker = os.path.join(os.path.dirname(__file__), 'rank0.printed')\n"
             "        while not os.path.exists(marker) and time.monotonic() < deadline:\n"
             "            time.sleep(0.05)\n"
             "        raise ValueError('bad batch 7')\n"
             "main()\n");
  SECTION("without --log_dir: a private folder, gone at exit") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", (dir / "fails.py").string()}),
                 {{{"PYTHON_EXEC", kSystemPython}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"}}, {}}, 120s);
    INFO(r.err);
    CHECK(r.status == 1);
    auto ranks = e2e::by_rank(r.out);
    REQUIRE(ranks[0].size() == 2);
    REQUIRE(ranks[1].size() == 2);
    const std::string file = ranks[1][0].substr(std::string("error_file=").size());
    CHECK_FALSE(file.empty());
    CHECK(ranks[0][0] != ranks[1][0]);  // a file per worker
    CHECK(ranks[1][1] == "nccl=3 signals=SIGTERM,SIGINT,SIGHUP,SIGQUIT");  // the user's value wins
    CHECK_THAT(r.err, Catch::Contains("exception (from its TORCHELASTIC_ERROR_FILE, written by @record): "
                                      "ValueError: bad batch 7\n"));
    CHECK_THAT(r.err, !Catch::Contains("error file: "));
    CHECK_THAT(r.err, Catch::Contains("| Traceback (most recent call last):"));
    CHECK_THAT(r.err, Catch::Contains("raise ValueError('bad batch 7')"));
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(file).parent_path()));
  }
  SECTION("with --log_dir: kept beside the logs") {
    auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", "--log_dir", (dir / "logs").string(), "--run_id",
                              "rec", (dir / "fails.py").string()}),
                 {{{"PYTHON_EXEC", kSystemPython}}, {}}, 120s);
    INFO(r.err);
    CHECK(r.status == 1);
    const auto file = dir / "logs" / "rec" / "attempt_0" / "1" / "error.json";
    CHECK(std::filesystem::exists(file));
    CHECK_THAT(r.err, Catch::Contains("written by @record): ValueError: bad batch 7\n    error file: " + file.string()));
    CHECK_THAT(e2e::by_rank(r.out)[1].at(1), Catch::StartsWith("nccl=1 "));
  }
}
