// `ddprun --print-completion bash|zsh|tcsh` (torchrun's flag): each script run by the
// real shell. bash's completion function is called with the variables readline sets
// (bash_complete.sh), alone and under the bash-completion package; zsh completes in a
// real interactive shell on a pseudo-terminal (zsh_complete.zsh), sourced and through
// $fpath; tcsh takes its one `complete` line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "e2e.hpp"

using namespace testing;

namespace {

using Words = std::set<std::string>;

std::string script_for(const std::string& shell) {
  auto r = run(e2e::ddprun({"--print-completion", shell}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  REQUIRE(r.err.empty());
  return r.out;
}

Words words_of(const std::string& text) {
  Words out;
  for (const auto& l : lines_of(text)) {
    if (!l.empty()) out.insert(l);
  }
  return out;
}

// The words a shell offers for `typed`, run in `cwd` by the helper script `helper`.
Words shell_offers(const std::vector<std::string>& helper, const std::string& typed, const std::filesystem::path& cwd) {
  std::vector<std::string> argv = {"bash", "-c", "cd \"$1\" && shift && exec \"$@\"", "_", cwd.string()};
  argv.insert(argv.end(), helper.begin(), helper.end());
  argv.push_back(typed);
  auto r = run(argv, {}, std::chrono::seconds(40));
  INFO(typed << "\n" << r.err);
  REQUIRE(r.status == 0);
  return words_of(r.out);
}

const std::string kBashHelper = TESTS_SOURCE_DIR "/launcher/e2e/bash_complete.sh";
const std::string kZshHelper = TESTS_SOURCE_DIR "/launcher/e2e/zsh_complete.zsh";

}  // namespace

TEST_CASE("ddprun --print-completion bash: options and their values and the program with its own arguments",
          "[e2e][completion]") {
  TempDir dir;
  write_file(dir / "ddprun.bash", script_for("bash"));
  write_file(dir / "train.py", "");
  std::filesystem::create_directory(dir / "my runs");
  auto bash = [&](const std::string& typed) {
    return shell_offers({"bash", kBashHelper, (dir / "ddprun.bash").string()}, typed, dir.path());
  };
  CHECK(bash("ddprun --rdzv_b") == Words{"--rdzv_backend"});
  CHECK(bash("ddprun --nproc-per") == Words{"--nproc-per-node"});
  CHECK(bash("ddprun --print_comp") == Words{"--print_completion"});
  // A value, as the next word or after '=' (a word break of bash's).
  CHECK(bash("ddprun --rdzv_backend ") == Words{"static", "c10d", "ddprun"});
  CHECK(bash("ddprun --rdzv_backend=") == Words{"static", "c10d", "ddprun"});
  CHECK(bash("ddprun --rdzv_backend=c") == Words{"c10d"});
  CHECK(bash("ddprun -r 3 --stall_action ") == Words{"report", "stop"});
  CHECK(bash("ddprun --hostfile my") == Words{"my runs"});
  // Values holding ':' or '=' (word breaks too) and the short-only -x do not lose the place.
  CHECK(bash("ddprun --nnodes 1:2 --rdzv_b") == Words{"--rdzv_backend"});
  CHECK(bash("ddprun --rdzv_endpoint=node0:29400 --nn") == Words{"--nnodes"});
  CHECK(bash("ddprun --rdzv_conf join_timeout=5 --print-completion z") == Words{"zsh"});
  CHECK(bash("ddprun --hosts a:4,b:4 -x NCCL_DEBUG --stall_action ") == Words{"report", "stop"});
  // The program: a file or command (and `status` first); after it, the program's words.
  CHECK(bash("ddprun --standalone --nproc_per_node 2 trai") == Words{"train.py"});
  CHECK(bash("ddprun statu").count("status") == 1);
  CHECK(bash("ddprun train.py --rdzv").empty());
  CHECK(bash("ddprun -- --rdzv").empty());
  CHECK(bash("ddprun status --run-") == Words{"--run-id"});
  // Under bash-completion, the program's own completion takes its arguments.
  auto with_package = [&](const std::string& typed) {
    return shell_offers({"bash", kBashHelper, (dir / "ddprun.bash").string(), "--with-bash-completion"}, typed,
                        dir.path());
  };
  const auto python = with_package("ddprun --nnodes 1:2 --rdzv_endpoint=h:1 python3 -");
  CHECK(python.count("-m") == 1);
  CHECK(python.count("--nnodes") == 0);
  CHECK(with_package("ddprun --nnodes 1:2 --rdzv_b") == Words{"--rdzv_backend"});
}

TEST_CASE("ddprun --print-completion zsh: an interactive zsh completes options and values and the program's arguments",
          "[e2e][completion]") {
  TempDir dir;
  std::filesystem::create_directory(dir / "functions");
  write_file(dir / "functions" / "_ddprun", script_for("zsh"));
  write_file(dir / "train.py", "");
  for (const auto& loaded : {dir / "functions" / "_ddprun", dir / "functions"}) {  // sourced, then from $fpath
    INFO("loaded from " << loaded);
    auto zsh = [&](const std::string& typed) {
      return shell_offers({"zsh", "-f", kZshHelper, loaded.string()}, typed, dir.path());
    };
    CHECK(zsh("ddprun --nproc") == Words{"--nproc_per_node", "--nproc-per-node"});
    CHECK(zsh("ddprun --rdzv_backend ") == Words{"static", "c10d", "ddprun"});
    CHECK(zsh("ddprun --rdzv_backend=") == Words{"static", "c10d", "ddprun"});
    CHECK(zsh("ddprun --nnodes 1:2 -x NCCL_DEBUG=1 -r 3 --stall_action ") == Words{"report", "stop"});
    CHECK(zsh("ddprun --nproc_per_node 2 trai") == Words{"train.py"});
    CHECK(zsh("ddprun status --run") == Words{"--run_id", "--run-id"});
    // After the program, its own completion: python3's options, not ddprun's.
    const auto python = zsh("ddprun --nnodes 1 python3 -");
    CHECK(python.count("-m") == 1);
    CHECK(python.count("--nnodes") == 0);
  }
}

TEST_CASE("ddprun --print-completion tcsh: one complete line that tcsh takes with every long option",
          "[e2e][completion]") {
  const std::string script = script_for("tcsh");
  CHECK(std::count(script.begin(), script.end(), '\n') == 1);
  TempDir dir;
  write_file(dir / "ddprun.tcsh", script);
  auto r = run({"tcsh", "-f", "-c", "source " + (dir / "ddprun.tcsh").string() + "; complete ddprun"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("'c/--/(help version nproc_per_node nproc-per-node nnodes "));
  CHECK_THAT(r.out, Catch::Contains("print_completion print-completion"));
  CHECK_THAT(r.out, Catch::Contains("'n/--rdzv_backend/(static c10d ddprun)/'"));
  CHECK_THAT(r.out, Catch::Contains("'c/--rdzv_backend=/(static c10d ddprun)/'"));
  // tcsh takes the first pattern that matches: the values' come before c/--/.
  CHECK(r.out.find("'c/--rdzv_backend=/") < r.out.find("'c/--/"));
}

TEST_CASE("ddprun --print-completion: another shell is refused with exit 2 and PET_PRINT_COMPLETION is not read",
          "[e2e][completion]") {
  auto fish = run(e2e::ddprun({"--print-completion", "fish"}));
  CHECK(fish.status == 2);
  CHECK(fish.out.empty());
  CHECK_THAT(fish.err, Catch::Contains("--print_completion: fish not in {bash,zsh,tcsh}"));
  // torchrun reads no PET_ variable for it either: the job runs.
  auto job = run(e2e::ddprun({"--standalone", e2e::kWorker, "env", "RANK"}), {{{"PET_PRINT_COMPLETION", "bash"}}, {}});
  INFO(job.err);
  CHECK(job.status == 0);
  CHECK(e2e::by_rank(job.out)[0] == std::vector<std::string>{"RANK=0"});
}
