// The launch plan's log folders: torchrun's default run id "none" is every such job's,
// so each launch keeps its own folder; an explicit id names the folder as before.
#include "plan/launch_plan.hpp"

#include <catch2/catch.hpp>

#include "command_line.hpp"
#include "subprocess.hpp"

TEST_CASE("runs under the run id none keep their log folders apart", "[plan]") {
  testing::TempDir dir;
  auto options =
      command_line::parse({"--nnodes=2", "--rdzv_endpoint=h", "--log_dir", dir.path().string(), "/bin/true"});
  REQUIRE(options.run_id == "none");
  ddprun::LaunchPlan first = ddprun::prepare_launch(options);
  ddprun::LaunchPlan second = ddprun::prepare_launch(options);
  REQUIRE(first.log_root.has_value());
  REQUIRE(second.log_root.has_value());
  CHECK(first.log_root->parent_path() == dir.path());
  CHECK(first.log_root->filename().string().rfind("none_", 0) == 0);
  CHECK(first.log_root->filename().string().size() == 5 + 12);
  CHECK(*first.log_root != *second.log_root);
  CHECK(first.launch_id != second.launch_id);
  CHECK(std::filesystem::is_directory(ddprun::worker_log_dir(first, 0, 0)));

  auto named = command_line::parse({"--nnodes=2", "--rdzv_endpoint=h", "--rdzv_id=job7", "--log_dir",
                                    dir.path().string(), "/bin/true"});
  CHECK(ddprun::prepare_launch(named).log_root == dir.path() / "job7");
}
