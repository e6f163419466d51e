// `ddprun --print-completion bash|zsh|tcsh` (torchrun's flag): each script run by the
// real shell. bash's completion function is called as bash calls it (COMP_WORDS split
// at '=' as bash's word breaks do); zsh completes in a real interactive shell on a
// pseudo-terminal (zsh_complete.zsh); tcsh takes its one `complete` line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "e2e.hpp"

using namespace testing;

namespace {

std::string script_for(const std::string& shell) {
  auto r = run(e2e::ddprun({"--print-completion", shell}));
  INFO(r.err);
  REQUIRE(r.status == 0);
  REQUIRE(r.err.empty());
  return r.out;
}

std::set<std::string> words_of(const std::string& text) {
  std::set<std::string> out;
  for (const auto& l : lines_of(text)) {
    if (!l.empty()) out.insert(l);
  }
  return out;
}

// What bash's completion offers for `words` (the last one is being completed).
std::set<std::string> bash_completes(const std::filesystem::path& script, const std::vector<std::string>& words,
                                     const std::filesystem::path& cwd) {
  std::vector<std::string> argv = {"bash", "-c",
                                   "cd \"$1\" && source \"$2\" && shift 2 && COMP_WORDS=(\"$@\") && "
                                   "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)) && _ddprun && "
                                   "printf '%s\\n' \"${COMPREPLY[@]}\"",
                                   "_", cwd.string(), script.string()};
  argv.insert(argv.end(), words.begin(), words.end());
  auto r = run(argv);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return words_of(r.out);
}

std::set<std::string> zsh_completes(const std::filesystem::path& script, const std::string& typed,
                                    const std::filesystem::path& cwd) {
  auto r = run({"zsh", "-f", "-c", "cd \"$1\" && zsh -f \"$2\" \"$3\" \"$4\"", "_", cwd.string(),
                TESTS_SOURCE_DIR "/launcher/e2e/zsh_complete.zsh", script.string(), typed},
               {}, std::chrono::seconds(30));
  INFO(r.err);
  REQUIRE(r.status == 0);
  return words_of(r.out);
}

using Words = std::set<std::string>;

}  // namespace

TEST_CASE("ddprun --print-completion bash: options and their values and the program with its own arguments", "[e2e][completion]") {
  TempDir dir;
  write_file(dir / "ddprun.bash", script_for("bash"));
  write_file(dir / "train.py", "");
  const auto script = dir / "ddprun.bash";
  CHECK(bash_completes(script, {"ddprun", "--rdzv_b"}, dir.path()) == Words{"--rdzv_backend"});
  CHECK(bash_completes(script, {"ddprun", "--nproc-per"}, dir.path()) == Words{"--nproc-per-node"});
  CHECK(bash_completes(script, {"ddprun", "--print-completion"}, dir.path()) == Words{"--print-completion"});
  // A value, as the next word or after '=' (which bash's word breaks split off).
  CHECK(bash_completes(script, {"ddprun", "--rdzv_backend", ""}, dir.path()) == Words{"static", "c10d", "ddprun"});
  CHECK(bash_completes(script, {"ddprun", "--rdzv_backend", "="}, dir.path()) == Words{"static", "c10d", "ddprun"});
  CHECK(bash_completes(script, {"ddprun", "--rdzv_backend", "=", "c"}, dir.path()) == Words{"c10d"});
  CHECK(bash_completes(script, {"ddprun", "-r", "3", "--stall_action", ""}, dir.path()) == Words{"report", "stop"});
  CHECK(bash_completes(script, {"ddprun", "--nnodes", "=", "2", "--print-completion", "z"}, dir.path()) ==
        Words{"zsh"});
  CHECK(bash_completes(script, {"ddprun", "--hostfile", "tr"}, dir.path()) == Words{"train.py"});
  // The program: a file or command (and `status` first); after it, the program's words.
  CHECK(bash_completes(script, {"ddprun", "--standalone", "--nproc_per_node", "2", "train."}, dir.path()) ==
        Words{"train.py"});
  CHECK(bash_completes(script, {"ddprun", "statu"}, dir.path()).count("status") == 1);
  CHECK(bash_completes(script, {"ddprun", "train.py", "--rdzv"}, dir.path()).empty());
  CHECK(bash_completes(script, {"ddprun", "--", "--rdzv"}, dir.path()).empty());
  CHECK(bash_completes(script, {"ddprun", "status", "--j"}, dir.path()) == Words{"--json"});
}

TEST_CASE("ddprun --print-completion zsh: an interactive zsh completes options and values and the program's arguments",
          "[e2e][completion]") {
  TempDir dir;
  write_file(dir / "_ddprun", script_for("zsh"));
  write_file(dir / "train.py", "");
  const auto script = dir / "_ddprun";
  CHECK(zsh_completes(script, "ddprun --nproc", dir.path()) == Words{"--nproc_per_node", "--nproc-per-node"});
  CHECK(zsh_completes(script, "ddprun --rdzv_backend ", dir.path()) == Words{"static", "c10d", "ddprun"});
  CHECK(zsh_completes(script, "ddprun --rdzv_backend=", dir.path()) == Words{"static", "c10d", "ddprun"});
  CHECK(zsh_completes(script, "ddprun -r 3 --stall_action ", dir.path()) == Words{"report", "stop"});
  CHECK(zsh_completes(script, "ddprun --standalone ./tr", dir.path()) == Words{"train.py"});
  CHECK(zsh_completes(script, "ddprun status --j", dir.path()) == Words{"--json"});
  // After the program, its own completion: python3's options, not ddprun's.
  const auto python = zsh_completes(script, "ddprun --nnodes 1 python3 -", dir.path());
  CHECK(python.count("-m") == 1);
  CHECK(python.count("--nnodes") == 0);
}

TEST_CASE("ddprun --print-completion tcsh: one complete line that tcsh takes with every long option", "[e2e][completion]") {
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
