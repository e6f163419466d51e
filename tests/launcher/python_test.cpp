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

  auto r = run(e2e::ddprun({"--nproc_per_node=2", "--standalone", TESTS_SOURCE_DIR "/launcher/torch_ddp_probe.py"}),
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
