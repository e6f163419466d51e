// The launching ddprun's pieces (--hostfile/--hosts): the agent's command line (it
// must parse back to the same per-node options), shell quoting for the remote shell,
// which hosts are this machine, and the line relay of the agents' output.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <string>
#include <vector>

#include "remote/agent_command.hpp"
#include "remote/line_relay.hpp"
#include "plan/local_host.hpp"
#include "cli/options.hpp"
#include "command_line.hpp"

using ddprun::AgentPlace;
using ddprun::LaunchOptions;

namespace {

using command_line::parse;

// What `sh -c` makes of a line: its words (printf ends each with a NUL byte).
std::vector<std::string> shell_words(const std::string& line) {
  std::string script = "printf '%s\\000' " + line;
  std::string cmd = "sh -c " + ddprun::shell_quote(script);
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  std::vector<std::string> words;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\0', start);
    words.push_back(out.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

}  // namespace

TEST_CASE("an agent's command line parses back to the launcher's per-node options", "[remote]") {
  LaunchOptions l = parse({"--hosts", "a:2,b:2", "--grace_period", "2.5", "--max_restarts", "3", "--log_dir",
                           "/tmp/logs dir", "--redirects", "0:3,1:1", "--tee", "2", "--local_ranks_filter", "0,2",
                           "--role", "trainer", "--join_timeout", "77", "--heartbeat_timeout", "4",
                           "--exit_barrier_timeout", "12", "--stall_timeout", "0", "--stall_action", "stop",
                           "--monitor_interval", "0.3", "-v", "--no_python", "prog", "--x", "y z"});
  AgentPlace place;
  place.node_rank = 1;
  place.nnodes = 2;
  place.nproc_per_node = "2";
  place.run_id = "job7";
  place.store_endpoint = "10.0.0.1:4242";
  LaunchOptions a = parse(ddprun::agent_arguments(l, place));
  CHECK(a.remote.agent_stdin);
  CHECK_FALSE(a.remote.launching());
  CHECK(a.nnodes == 2);
  CHECK(a.min_nodes == 2);
  CHECK(a.node_rank == 1);
  CHECK(a.nproc_per_node == "2");
  CHECK(a.run_id == "job7");
  CHECK(a.rdzv_host == "10.0.0.1");
  CHECK(a.rdzv_port == 4242);
  CHECK(a.grace_period == l.grace_period);
  CHECK(a.max_restarts == 3);
  CHECK(a.log_dir == l.log_dir);
  CHECK(a.redirects.text() == "0:3,1:1");
  CHECK(a.tee.text() == "2");
  CHECK(a.local_ranks_filter == l.local_ranks_filter);
  CHECK(a.role == "trainer");
  CHECK(a.join_timeout == 77);
  CHECK(a.heartbeat_timeout == 4);
  CHECK(a.exit_barrier_timeout == 12);
  CHECK(a.stall_timeout == 0);
  CHECK(a.stall_stop);
  CHECK(a.monitor_interval == l.monitor_interval);
  CHECK(a.verbose);
  CHECK(a.no_python);
  CHECK_FALSE(a.module);
  CHECK(a.program == "prog");
  CHECK(a.program_args == std::vector<std::string>{"--x", "y z"});
}

TEST_CASE("with --master_addr an agent is told node 0's store, not the launcher's", "[remote]") {
  LaunchOptions l = parse({"--hosts", "a,b", "--master_addr", "10.1.2.3", "--master_port", "29999", "-m", "pkg.train"});
  AgentPlace place;
  place.node_rank = 0;
  place.nnodes = 2;
  place.run_id = "r";
  LaunchOptions a = parse(ddprun::agent_arguments(l, place));
  CHECK_FALSE(a.rdzv_host.has_value());
  CHECK(a.master_addr == "10.1.2.3");
  CHECK(a.master_port == 29999);
  CHECK(a.module);
  CHECK(a.program == "pkg.train");
  CHECK(a.grace_period == 30);
}

TEST_CASE("shell quoting gives the remote shell back every word as it was", "[remote]") {
  std::vector<std::string> words = {"plain", "with space", "it's", "'", "$HOME", "`id`", "a\"b", "semi;colon",
                                    "back\\slash", "*", "", "new\nline", "--flag=x,y", "=ls"};
  std::string line;
  for (const auto& w : words) {
    line += ' ';
    line += ddprun::shell_quote(w);
  }
  CHECK(shell_words(line) == words);
  CHECK(ddprun::shell_quote("/usr/bin/ddprun") == "/usr/bin/ddprun");
  CHECK(ddprun::shell_quote("it's") == "'it'\\''s'");
  CHECK(ddprun::shell_quote("=ls") == "'=ls'");  // zsh would expand =ls to ls's path
  CHECK(ddprun::shell_quote("a=b") == "a=b");
}

TEST_CASE("the ssh command puts the user's options first and runs ddprun in the same directory", "[remote]") {
  ddprun::SshCommand c;
  c.ssh_command = {"ssh", "-p", "2222"};
  c.host = "node1";
  c.cwd = "/work/my dir";
  c.ddprun = "/opt/ddprun";
  c.arguments = {"--agent_stdin", "--", "train", "a b"};
  c.heartbeat_timeout_s = 10;
  auto argv = ddprun::ssh_argv(c);
  REQUIRE(argv.size() == 15);
  CHECK(std::vector<std::string>(argv.begin(), argv.begin() + 3) == c.ssh_command);
  CHECK(argv[3] == "-T");  // no terminal: it would echo the handoff
  CHECK(argv[4] == "-o");
  CHECK(argv[5] == "BatchMode=yes");
  CHECK(argv[7] == "ConnectTimeout=10");
  // A cut connection ends ssh within about the heartbeat timeout: 3 probes 4 s apart.
  CHECK(argv[9] == "ServerAliveInterval=4");
  CHECK(argv[11] == "ServerAliveCountMax=3");
  CHECK(argv[12] == "--");
  CHECK(argv[13] == "node1");
  CHECK(argv[14] == "cd '/work/my dir' && exec /opt/ddprun --agent_stdin -- train 'a b'");
}

TEST_CASE("this machine's names and addresses are local, other hosts are not", "[remote]") {
  CHECK(ddprun::is_local_host("localhost"));
  CHECK(ddprun::is_local_host("127.0.0.1"));
  CHECK(ddprun::is_local_host("127.3.4.5"));
  CHECK(ddprun::is_local_host("::1"));
  char name[256] = {};
  REQUIRE(gethostname(name, sizeof(name) - 1) == 0);
  CHECK(ddprun::is_local_host(name));
  CHECK_FALSE(ddprun::is_local_host("192.0.2.77"));  // TEST-NET-1: never assigned here
  CHECK_FALSE(ddprun::is_local_host("some-other-host.invalid"));
  CHECK(ddprun::source_address_towards("127.0.0.1") == "127.0.0.1");
  CHECK_THROWS(ddprun::source_address_towards("no-such-host.invalid"));
}

TEST_CASE("the line relay passes whole lines only, bounds a long one and flushes the last at the end", "[remote]") {
  std::vector<std::string> got;
  ddprun::LineRelay relay([&](std::string lines) { got.push_back(std::move(lines)); });
  relay.feed("[rank0]: hel");
  CHECK(got.empty());
  relay.feed("lo\n[rank1]: a\n[rank0]: b");
  REQUIRE(got.size() == 1);
  CHECK(got[0] == "[rank0]: hello\n[rank1]: a\n");
  CHECK(relay.last_line() == "[rank1]: a");
  relay.feed(std::string(ddprun::LineRelay::kMaxLine * 2, 'x'));
  REQUIRE(got.size() == 2);
  CHECK(got[1].size() == 2 * (ddprun::LineRelay::kMaxLine + 1));
  CHECK(got[1].find("[rank0]: b") == 0);
  relay.feed("tail");
  relay.finish();
  REQUIRE(got.size() == 3);
  CHECK(got[2].back() == '\n');
  CHECK(got[2].find("tail\n") != std::string::npos);
  relay.finish();  // nothing held: nothing more
  CHECK(got.size() == 3);
}

TEST_CASE("the line relay hides the first whole line equal to the hidden one, even in pieces", "[remote]") {
  std::string got;
  ddprun::LineRelay relay([&](std::string lines) { got += lines; });
  relay.hide_once("I run");
  relay.feed("motd\nI r");
  CHECK_FALSE(relay.hidden_seen());
  relay.feed("un\n[rank0]: I run\nI run\n");
  CHECK(relay.hidden_seen());
  CHECK(got == "motd\n[rank0]: I run\nI run\n");  // only the first one is hidden
}
