// The host list of a launch from one command (--hostfile, --hosts, --include,
// --exclude), the variables sent to every host (defaults, --env_file, -x) and the -v
// listing of both: parsed from a real command line, files written to a temp dir.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <algorithm>
#include <fstream>

#include "command_line.hpp"
#include "errors.hpp"
#include "cli/options.hpp"
#include "remote/hosts.hpp"
#include "remote/propagated_env.hpp"
#include "remote/remote_plan.hpp"
#include "scoped_env.hpp"
#include "subprocess.hpp"

using ddprun::HostEntry;
using ddprun::LaunchError;
using ddprun::UsageError;
using Catch::Contains;
using testing::ScopedEnv;
constexpr auto parse = command_line::parse_flags;

namespace {

std::vector<HostEntry> hosts_of(std::vector<std::string> args) { return ddprun::resolve_hosts(parse(std::move(args))); }

// The UsageError of resolving the hosts (or of parsing the flags) for `args`.
std::string hosts_error(std::vector<std::string> args) {
  try {
    hosts_of(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a UsageError");
  return {};
}

// A hostfile (or env file) with `text` in a directory that lives as long as the test.
struct File {
  testing::TempDir dir;
  std::string path = (dir / "list").string();
  explicit File(const std::string& text) { std::ofstream(path) << text; }
};

std::vector<std::string> names(const std::vector<HostEntry>& hosts) {
  std::vector<std::string> out;
  for (const auto& h : hosts) out.push_back(h.host);
  return out;
}

using Env = std::vector<std::pair<std::string, std::string>>;

std::optional<std::string> value_in(const Env& env, const std::string& name) {
  for (const auto& [k, v] : env) {
    if (k == name) return v;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("a hostfile as OpenMPI and DeepSpeed write it", "[hosts]") {
  File f(
      "# the cluster\n"
      "\n"
      "worker-1 slots=4\n"
      "  worker-2   slots=2   max_slots=8   # trailing comment\n"
      "10.0.0.3\n"
      "\t\n"
      "alice@worker-4 slots=1\r\n");
  auto hosts = hosts_of({"--hostfile", f.path});
  REQUIRE(names(hosts) == std::vector<std::string>{"worker-1", "worker-2", "10.0.0.3", "alice@worker-4"});
  CHECK(hosts[0].slots == 4);
  CHECK(hosts[1].slots == 2);  // max_slots has no effect
  CHECK_FALSE(hosts[2].slots.has_value());
  CHECK(hosts[3].slots == 1);
  for (const auto& h : hosts) CHECK_FALSE(h.devices.has_value());
  File v6("::1 slots=2\nme@fe80::1%eth0\n");  // a ':' only in IPv6 addresses
  CHECK(names(hosts_of({"--hostfile", v6.path})) == std::vector<std::string>{"::1", "me@fe80::1%eth0"});
}

TEST_CASE("bad hostfile lines are usage errors naming FILE:LINE and the token", "[hosts]") {
  File twice("a slots=1\nb slots=1\na slots=2\n");
  CHECK_THAT(hosts_error({"--hostfile", twice.path}), Contains(twice.path + ":3") && Contains("'a' is given twice"));
  File token("a slots=1\nb gpus=2\n");
  CHECK_THAT(hosts_error({"--hostfile", token.path}), Contains(token.path + ":2") && Contains("unknown token 'gpus=2'"));
  File bare_word("a slots=1 extra\n");
  CHECK_THAT(hosts_error({"--hostfile", bare_word.path}), Contains(":1") && Contains("unknown token 'extra'"));
  File zero("a slots=0\n");
  CHECK_THAT(hosts_error({"--hostfile", zero.path}), Contains(":1") && Contains("slots=0") && Contains("leave the host out"));
  File not_number("a slots=four\n");
  CHECK_THAT(hosts_error({"--hostfile", not_number.path}), Contains("'slots=four'"));
  File negative("a slots=-1\n");
  CHECK_THAT(hosts_error({"--hostfile", negative.path}), Contains("'slots=-1'"));
  File repeated("a slots=1 slots=2\n");
  CHECK_THAT(hosts_error({"--hostfile", repeated.path}), Contains("slots given twice"));
  File bad_max("a slots=1 max_slots=\n");
  CHECK_THAT(hosts_error({"--hostfile", bad_max.path}), Contains("'max_slots='"));
  File option_like("-oProxyCommand=evil slots=1\n");
  CHECK_THAT(hosts_error({"--hostfile", option_like.path}), Contains("is not a host name or address"));
  File shell("a;reboot slots=1\n");
  CHECK_THAT(hosts_error({"--hostfile", shell.path}), Contains("'a;reboot'"));
  File mpich("h1:4\nh2:4\n");  // MPICH/Horovod's HOST:SLOTS
  CHECK_THAT(hosts_error({"--hostfile", mpich.path}), Contains(":1") && Contains("'h1:4'") && Contains("'h1 slots=4'"));
  File empty("# nothing here\n\n");
  CHECK_THAT(hosts_error({"--hostfile", empty.path}), Contains("names no host"));
}

TEST_CASE("an unreadable hostfile is a launch error", "[hosts]") {
  testing::TempDir dir;
  const std::string missing = (dir / "nope").string();
  auto options = parse({"--hostfile", missing});
  CHECK_THROWS_MATCHES(ddprun::resolve_hosts(options), LaunchError,
                       Catch::Matchers::Message("cannot read --hostfile " + missing + ": No such file or directory"));
}

TEST_CASE("the --hosts list: hosts with optional slots and IPv6 in brackets", "[hosts]") {
  auto hosts = hosts_of({"--hosts", "h1:4,h2,[::1]:2,[fe80::1%eth0]"});
  REQUIRE(names(hosts) == std::vector<std::string>{"h1", "h2", "::1", "fe80::1%eth0"});
  CHECK(hosts[0].slots == 4);
  CHECK_FALSE(hosts[1].slots.has_value());
  CHECK(hosts[2].slots == 2);
  CHECK_FALSE(hosts[3].slots.has_value());

  CHECK_THAT(hosts_error({"--hosts", "h1,h1:2"}), Contains("'h1' is given twice"));
  CHECK_THAT(hosts_error({"--hosts", "h1,,h2"}), Contains("empty host"));
  CHECK_THAT(hosts_error({"--hosts", "h1:0"}), Contains("'h1:0'") && Contains("slots"));
  CHECK_THAT(hosts_error({"--hosts", "h1:x"}), Contains("'h1:x'"));
  CHECK_THAT(hosts_error({"--hosts", "::1:2"}), Contains("brackets"));
  CHECK_THAT(hosts_error({"--hosts", "[::1"}), Contains("brackets"));
  CHECK_THAT(hosts_error({"--hosts", "-lroot"}), Contains("'-lroot'"));
}

TEST_CASE("an --include keeps the named hosts in the list's order with their GPU picks", "[hosts]") {
  File f("a slots=4\nb slots=4\nc slots=4\n");
  auto hosts = hosts_of({"--hostfile", f.path, "--include", "c@a:2,0,2"});
  REQUIRE(names(hosts) == std::vector<std::string>{"a", "c"});  // node ranks follow the file
  CHECK(hosts[0].devices == std::vector<int>{0, 2});            // sorted, duplicates dropped
  CHECK(ddprun::cuda_visible_devices(hosts[0]) == "0,2");
  CHECK_FALSE(hosts[1].devices.has_value());  // named without indices: all of its GPUs
  CHECK_FALSE(ddprun::cuda_visible_devices(hosts[1]).has_value());
  auto options = parse({"--hostfile", f.path, "--include", "c@a:2,0,2"});
  CHECK(ddprun::nproc_for(hosts[0], options) == "2");  // the picked GPUs
  CHECK(ddprun::nproc_for(hosts[1], options) == "4");  // the slots

  // A host without slots may have any index picked: its GPU count is only known there.
  auto bare = hosts_of({"--hosts", "x,y", "--include", "y:5"});
  REQUIRE(names(bare) == std::vector<std::string>{"y"});
  CHECK(bare[0].devices == std::vector<int>{5});
  CHECK(bare[0].host == "y");

  auto v6 = hosts_of({"--hosts", "[::1]:2,h", "--include", "[::1]:1"});
  REQUIRE(names(v6) == std::vector<std::string>{"::1"});
  CHECK(v6[0].devices == std::vector<int>{1});
}

TEST_CASE("an --exclude drops whole hosts or only GPU indices", "[hosts]") {
  File f("a slots=4\nb slots=2\nc\n");
  auto hosts = hosts_of({"--hostfile", f.path, "--exclude", "a:1,3@c"});
  REQUIRE(names(hosts) == std::vector<std::string>{"a", "b"});
  CHECK(hosts[0].devices == std::vector<int>{0, 2});
  CHECK_FALSE(hosts[1].devices.has_value());
  CHECK(ddprun::nproc_for(hosts[0], parse({"--hostfile", f.path, "--exclude", "a:1,3@c"})) == "2");
}

TEST_CASE("each --include and --exclude error is one clear line", "[hosts]") {
  File f("a slots=2\nb slots=2\nc\n");
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a", "--exclude", "b"}),
             Contains("--include and --exclude cannot be used together"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "d"}), Contains("'d' is not in the host list"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--exclude", "d:0"}), Contains("'d' is not in the host list"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a:2"}),
             Contains("GPU index 2 of 'a' is not below its slots=2"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--exclude", "b:5"}), Contains("GPU index 5"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a:x"}), Contains("'x' in 'a:x' is not a GPU index"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a:"}), Contains("is not a GPU index"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a@@b"}), Contains("empty host between '@'"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--include", "a:0@a:1"}), Contains("'a' is named twice"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--exclude", "a:0,1"}),
             Contains("leaves host 'a' no GPU") && Contains("--exclude a"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--exclude", "c:0"}), Contains("'c' has no slots"));
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--exclude", "a@b@c"}), Contains("no host is left"));
}

TEST_CASE("a given --nproc_per_node overrides slots and must agree with GPU picks", "[hosts]") {
  File f("a slots=4\nb slots=2\n");
  auto options = parse({"--hostfile", f.path, "--nproc_per_node", "3"});
  auto hosts = ddprun::resolve_hosts(options);
  CHECK(ddprun::nproc_for(hosts[0], options) == "3");
  CHECK(ddprun::nproc_for(hosts[1], options) == "3");
  auto gpu = parse({"--hostfile", f.path, "--nproc_per_node", "gpu", "--include", "a:1,2"});
  auto picked = ddprun::resolve_hosts(gpu);
  CHECK(ddprun::nproc_for(picked[0], gpu) == "gpu");  // resolved on the host, where only 1,2 are visible
  auto agreeing = parse({"--hostfile", f.path, "--nproc_per_node", "2", "--include", "a:1,2@b"});
  CHECK(ddprun::resolve_hosts(agreeing).size() == 2);
  CHECK_THAT(hosts_error({"--hostfile", f.path, "--nproc_per_node", "3", "--include", "a:1,2"}),
             Contains("--nproc_per_node=3 but --include picks 2 GPU(s) on 'a' (1,2)"));
  auto defaults = parse({"--hosts", "h"});
  CHECK(ddprun::nproc_for(ddprun::resolve_hosts(defaults)[0], defaults) == "1");
}

TEST_CASE("the variables sent: defaults then --env_file then -x", "[hosts][env]") {
  ScopedEnv env;
  env.set("NCCL_DEBUG", "INFO");
  env.set("DDP_SOCKET_IFNAME", "eth1");
  env.set("PYTHONPATH", "/src");
  env.set("OMP_NUM_THREADS", "4");
  env.set("CUDA_HOME", "/usr/local/cuda");
  env.set("CUDA_VISIBLE_DEVICES", "0,1");
  env.set("DDPRUN_TOKEN", "secret");
  env.set("HOME_IS_NOT_SENT", "x");
  env.set("FROM_HERE", "here-value");
  env.set("LD_LIBRARY_PATH", "/opt/lib");
  File file(
      "# settings\n"
      "\n"
      "LR=0.1\n"
      "export OMP_NUM_THREADS=8\n"
      "  QUOTED=\"a # b \"\n"
      "SINGLE='$HOME'\n"
      "TRAILING=value   \n"
      "EMPTY=\n"
      "URL=http://x/#frag\n");
  auto options = parse({"--hosts", "h", "--env_file", file.path, "-x", "FROM_HERE", "-x", "LR=0.2", "-x", "NEW=a=b"});
  Env sent = ddprun::propagated_environment(options);
  CHECK(value_in(sent, "NCCL_DEBUG") == "INFO");
  CHECK(value_in(sent, "DDP_SOCKET_IFNAME") == "eth1");
  CHECK(value_in(sent, "PYTHONPATH") == "/src");
  CHECK(value_in(sent, "CUDA_HOME") == "/usr/local/cuda");
  CHECK(value_in(sent, "PATH") == std::string(getenv("PATH")));
  CHECK(value_in(sent, "LD_LIBRARY_PATH") == "/opt/lib");
  CHECK_FALSE(value_in(sent, "CUDA_VISIBLE_DEVICES"));
  CHECK_FALSE(value_in(sent, "DDPRUN_TOKEN"));
  CHECK_FALSE(value_in(sent, "HOME_IS_NOT_SENT"));
  CHECK(value_in(sent, "OMP_NUM_THREADS") == "8");  // the env file replaces the default
  CHECK(value_in(sent, "QUOTED") == "a # b ");
  CHECK(value_in(sent, "SINGLE") == "$HOME");
  CHECK(value_in(sent, "TRAILING") == "value");
  CHECK(value_in(sent, "EMPTY") == "");
  CHECK(value_in(sent, "URL") == "http://x/#frag");
  CHECK(value_in(sent, "FROM_HERE") == "here-value");
  CHECK(value_in(sent, "LR") == "0.2");  // -x wins over the file
  CHECK(value_in(sent, "NEW") == "a=b");

  // Each name once, and a replaced one keeps its first position.
  std::vector<std::string> order;
  for (const auto& [k, v] : sent) order.push_back(k);
  auto pos = [&](const std::string& n) { return std::find(order.begin(), order.end(), n) - order.begin(); };
  CHECK(std::count(order.begin(), order.end(), "LR") == 1);
  CHECK(std::count(order.begin(), order.end(), "OMP_NUM_THREADS") == 1);
  CHECK(pos("OMP_NUM_THREADS") < pos("LR"));  // a default, so before the file's names
  CHECK(pos("LR") < pos("QUOTED"));
  CHECK(pos("URL") < pos("FROM_HERE"));
  CHECK(pos("FROM_HERE") < pos("NEW"));
}

TEST_CASE("bad variables to send are usage errors", "[hosts][env]") {
  ScopedEnv env;
  env.set("DDPRUN_HOSTS_TEST_UNSET", std::nullopt);
  auto error_of = [](std::vector<std::string> args) {
    try {
      ddprun::propagated_environment(parse(std::move(args)));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    FAIL("expected a UsageError");
    return std::string();
  };
  CHECK_THAT(error_of({"--hosts", "h", "-x", "DDPRUN_HOSTS_TEST_UNSET"}),
             Contains("DDPRUN_HOSTS_TEST_UNSET is not set here") && Contains("-x DDPRUN_HOSTS_TEST_UNSET=VALUE"));
  CHECK_THAT(error_of({"--hosts", "h", "-x", "1BAD=x"}), Contains("'1BAD' is not a variable name"));
  CHECK_THAT(error_of({"--hosts", "h", "-x", "A-B=x"}), Contains("'A-B' is not a variable name"));
  CHECK_THAT(error_of({"--hosts", "h", "-x", "=x"}), Contains("'' is not a variable name"));
  CHECK_THAT(error_of({"--hosts", "h", "-x", "DDPRUN_TOKEN=abc"}), Contains("DDPRUN_TOKEN is never sent"));
  File no_eq("A=1\nJUST_A_NAME\n");
  CHECK_THAT(error_of({"--hosts", "h", "--env_file", no_eq.path}),
             Contains(no_eq.path + ":2") && Contains("expected VAR=value"));
  File bad_name("A=1\n\nMY VAR=1\n");
  CHECK_THAT(error_of({"--hosts", "h", "--env_file", bad_name.path}),
             Contains(bad_name.path + ":3") && Contains("'MY VAR' is not a variable name"));
  File token("DDPRUN_TOKEN=abc\n");
  CHECK_THAT(error_of({"--hosts", "h", "--env_file", token.path}), Contains("DDPRUN_TOKEN is never sent"));
  testing::TempDir dir;
  const std::string missing = (dir / "none.env").string();
  CHECK_THROWS_MATCHES(ddprun::propagated_environment(parse({"--hosts", "h", "--env_file", missing})), LaunchError,
                       Catch::Matchers::Message("cannot read --env_file " + missing + ": No such file or directory"));
}

TEST_CASE("the -v plan lists every node and every variable sent", "[hosts][env]") {
  ScopedEnv env_here;
  env_here.set("DDPRUN_SSH", std::nullopt);
  File f("a slots=4\nb slots=2\nc\n");
  auto options = parse({"--hostfile", f.path, "--exclude", "a:1", "--ssh_args", "-p 2222", "--remote_ddprun",
                        "/opt/bin/ddprun"});
  auto hosts = ddprun::resolve_hosts(options);
  Env env = {{"PATH", "/usr/bin"}, {"ODD", "two\nlines"}};
  const std::string text = ddprun::describe_remote_plan(hosts, env, options);
  CHECK_THAT(text, Contains("3 node(s) from --hostfile " + f.path));
  CHECK_THAT(text, Contains("node 0: a  workers=3 (GPUs picked)  CUDA_VISIBLE_DEVICES=0,2,3\n"));
  CHECK_THAT(text, Contains("node 1: b  workers=2 (slots)\n"));
  CHECK_THAT(text, Contains("node 2: c  workers=1 (default)\n"));
  CHECK_THAT(text, Contains("ssh -p 2222 HOST /opt/bin/ddprun"));
  CHECK_THAT(text, Contains("variables sent to every node (2):\n    PATH=/usr/bin\n    ODD=two\\nlines\n"));
}
