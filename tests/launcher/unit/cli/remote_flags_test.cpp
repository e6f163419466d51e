// The flags of a launch from one command on the command line: the ssh command
// (DDPRUN_SSH, --ssh_args), the conflicts with one-node flags, launcher-only flags
// without a host list, --remote_ddprun, --local_addr, and Slurm's step variables
// (never applied to a launching ddprun or to the agents it starts).
#include <catch2/catch.hpp>

#include "command_line.hpp"
#include "cli/remote_flags.hpp"
#include "scoped_env.hpp"

using Catch::Contains;
using testing::ScopedEnv;
constexpr auto parse = command_line::parse_flags;
constexpr auto usage_error = command_line::flags_error;
using Words = std::vector<std::string>;

TEST_CASE("the ssh command: ssh or DDPRUN_SSH's words then --ssh_args' words", "[options][remote]") {
  ScopedEnv env;
  env.set("DDPRUN_SSH", std::nullopt);
  CHECK(parse({"--hosts", "h"}).remote.ssh_command == Words{"ssh"});
  CHECK(parse({"--hosts", "h", "--ssh_args", "-p 2222  -J 'jump host' -o \"ProxyCommand=nc %h \\\"22\\\"\""})
            .remote.ssh_command == Words{"ssh", "-p", "2222", "-J", "jump host", "-o", "ProxyCommand=nc %h \"22\""});
  CHECK(parse({"--hosts", "h", "--ssh-args=-F\\ my\\ cfg"}).remote.ssh_command == Words{"ssh", "-F my cfg"});

  env.set("DDPRUN_SSH", "  /usr/bin/ssh   -F /etc/cfg ");
  CHECK(parse({"--hosts", "h", "--ssh_args", "-q"}).remote.ssh_command == Words{"/usr/bin/ssh", "-F", "/etc/cfg", "-q"});
  // Split as --ssh_args is: quotes keep a path with blanks in one word.
  env.set("DDPRUN_SSH", "'/opt/my ssh/ssh' -F \"/etc/a cfg\"");
  CHECK(parse({"--hosts", "h"}).remote.ssh_command == Words{"/opt/my ssh/ssh", "-F", "/etc/a cfg"});
  env.set("DDPRUN_SSH", "ssh -o 'unclosed");
  CHECK_THAT(usage_error({"--hosts", "h"}), Contains("DDPRUN_SSH") && Contains("not closed"));
  env.set("DDPRUN_SSH", " \t ");
  CHECK_THAT(usage_error({"--hosts", "h"}), Contains("DDPRUN_SSH is set but empty"));
  // Only a launcher uses ssh: a bad DDPRUN_SSH does not stop a one-node run.
  CHECK(parse({}).remote.ssh_command.empty());
  env.set("DDPRUN_SSH", "ssh");

  CHECK_THAT(usage_error({"--hosts", "h", "--ssh_args", "-o 'unclosed"}), Contains("--ssh_args") && Contains("not closed"));
  CHECK_THAT(usage_error({"--hosts", "h", "--ssh_args", "-o \"unclosed"}), Contains("not closed"));
  CHECK_THAT(usage_error({"--hosts", "h", "--ssh_args", "-v \\"}), Contains("ends in a backslash"));
  CHECK_THAT(usage_error({"--hosts", "h", "--ssh_args", "   "}), Contains("no arguments"));
}

TEST_CASE("shell-like word splitting keeps empty quoted words", "[options][remote]") {
  CHECK(ddprun::split_shell_words("--ssh_args", "a '' \"\" b") == Words{"a", "", "", "b"});
  CHECK(ddprun::split_shell_words("--ssh_args", "x'y z'\"w\"") == Words{"xy zw"});
  CHECK(ddprun::split_shell_words("--ssh_args", "'a\\b'") == Words{"a\\b"});  // no escapes in '...'
  CHECK(ddprun::split_shell_words("--ssh_args", "\"a\\b\"") == Words{"a\\b"});  // only \" and \\ in "..."
}

TEST_CASE("a host list refuses the flags it decides itself", "[options][remote]") {
  CHECK_THAT(usage_error({"--hostfile", "f", "--hosts", "h"}), Contains("--hostfile and --hosts cannot be used together"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--nnodes", "2"}),
             Contains("--nnodes cannot be used with --hostfile") && Contains("--include/--exclude"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--nnodes", "1:3"}),
             Contains("an elastic --nnodes MIN:MAX cannot be used with --hostfile"));
  CHECK_THAT(usage_error({"--hosts", "h", "--node_rank", "0"}),
             Contains("--node_rank cannot be used with --hosts") && Contains("host list's order"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--rdzv_endpoint", "d:29400", "--rdzv_id", "j"}),
             Contains("--rdzv_endpoint cannot be used with --hostfile") && Contains("--master_addr"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--standalone"}), Contains("--standalone cannot be used with --hostfile"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--rdzv_endpoint", "localhost:0"}),
             Contains("cannot be used with --hostfile"));
  CHECK_THAT(usage_error({"--hostfile", "f", "--agent_stdin"}), Contains("--agent_stdin cannot be used with --hostfile"));
  // What a launch from one command does allow: the store on node 0, a run id, restarts.
  auto o = parse({"--hostfile", "f", "--master_addr", "10.0.0.1", "--master_port", "29600", "--rdzv_id", "job"});
  CHECK(o.remote.launching());
  CHECK(o.master_addr == "10.0.0.1");
}

TEST_CASE("launcher-only flags need a host list", "[options][remote]") {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--include", "h"}, {"--exclude", "h"}, {"-x", "A"}, {"--env_file", "f"}, {"--ssh_args", "-q"},
           {"--remote_ddprun", "/bin/ddprun"}}) {
    CHECK_THAT(usage_error({flag, value}), Contains(flag + " needs --hostfile or --hosts"));
  }
  CHECK_THAT(usage_error({"--hosts", "h", "--include", "h", "--exclude", "h"}),
             Contains("--include and --exclude cannot be used together"));
}

TEST_CASE("a --remote_ddprun is absolute and a --local_addr is one word", "[options][remote]") {
  CHECK(parse({"--hosts", "h", "--remote_ddprun", "/opt/ddprun/bin/ddprun"}).remote.remote_ddprun ==
        "/opt/ddprun/bin/ddprun");
  CHECK_FALSE(parse({"--hosts", "h"}).remote.remote_ddprun.has_value());
  CHECK_THAT(usage_error({"--hosts", "h", "--remote_ddprun", "bin/ddprun"}),
             Contains("invalid --remote_ddprun 'bin/ddprun'") && Contains("absolute path"));
  CHECK(parse({"--local_addr", "10.1.0.2"}).local_addr == "10.1.0.2");
  CHECK(parse({"--hosts", "h", "--local-addr=fe80::1"}).local_addr == "fe80::1");
  CHECK_THAT(usage_error({"--local_addr", "10.0.0.1 10.0.0.2"}), Contains("invalid --local_addr"));
  CHECK_THAT(usage_error({"--local_addr="}), Contains("empty value for --local_addr"));
}

TEST_CASE("Slurm's step variables are not applied to a launcher or its agents", "[options][remote]") {
  ScopedEnv env;
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NNODES", "4"}, {"SLURM_STEP_NUM_NODES", "4"},
           {"SLURM_NODEID", "2"}, {"SLURM_STEP_NODELIST", "n[0-3]"}, {"SLURM_JOB_NODELIST", "n[0-3]"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x4)"}}) {
    env.set(k, v);
  }
  // A one-node ddprun in this step takes Slurm's values (here: refuses 2 tasks a node).
  CHECK_THAT(usage_error({}), Contains("tasks on this node"));
  auto launcher = parse({"--hosts", "a,b"});
  CHECK(launcher.nnodes == 1);
  CHECK_FALSE(launcher.node_rank_given);
  CHECK_FALSE(launcher.master_port.has_value());
  CHECK(launcher.slurm_notes.empty());
  auto agent = parse({"--agent_stdin", "--nnodes", "3", "--node_rank", "1", "--rdzv_endpoint", "10.0.0.1:29400",
                      "--rdzv_id", "job"});
  CHECK(agent.nnodes == 3);
  CHECK(agent.node_rank == 1);
  CHECK(agent.run_id == "job");
  CHECK_FALSE(agent.master_port.has_value());
  CHECK(agent.slurm_notes.empty());
}
