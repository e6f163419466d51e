// A stop signal during an ssh launch: one real sshd host (ssh_hosts.hpp) whose agent
// runs and waits for the other node, and one address whose ssh connect hangs (the login
// node's neighbour entry for it names a MAC no host has, so nothing ever answers).
// SIGINT to the launcher must end the launch at once: the agent that runs is told to
// stop, the ssh still connecting is ended, and the launcher exits 130, having said
// which host it waited for. scripts/bench/signals measures the time.
#include <catch2/catch.hpp>
#include <signal.h>

#include <chrono>
#include <thread>

#include "e2e.hpp"
#include "ssh_hosts.hpp"

using namespace testing;
using namespace std::chrono_literals;

TEST_CASE("SIGINT while ssh still connects to a host ends the launch at once with 130", "[hostfile][signals]") {
  SshHosts h(1);
  const std::string silent = h.unreachable_address();
  auto neigh = run(h.on_login({"ip", "neigh", "replace", silent, "lladdr", "02:00:00:00:00:c8", "dev", "eth0", "nud",
                               "permanent"}),
                   {}, 10s);
  REQUIRE(neigh.status == 0);
  const auto file = h.dir() / "hostfile";
  write_file(file, h.address(0) + " slots=1\n" + silent + " slots=1\n");
  ProcessOptions o;
  o.set_env = h.ssh_env();
  o.set_env["DDP_WAIT_NOTICE_SEC"] = "1";
  Process launcher(h.on_login({e2e::kDdprun, "--hostfile", file.string(), "/bin/sleep", "120"}), o);

  // The launcher says whom it waits for.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  auto said_whom = [&] {
    return launcher.err().find("still waiting for the agent to start on " + silent + " (node 1)") != std::string::npos;
  };
  while (!said_whom() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  INFO(launcher.err());
  REQUIRE(said_whom());

  const e2e::Ended end = e2e::signal_and_wait(launcher, SIGINT, 20s);
  INFO(launcher.err());
  REQUIRE(end.status.has_value());
  CHECK(*end.status == 130);
  CHECK(end.seconds < 5.0);  // ssh's ConnectTimeout is 10 s and the grace period 30 s: neither was waited for
  CHECK_THAT(launcher.err(), Catch::Contains("the agent on host " + silent + " (node 1) has not started yet; ending "
                                             "its ssh") &&
                                 Catch::Contains("stopped by SIGINT sent to ddprun"));
  auto gone = h.wait_no_job_processes(10s);
  INFO("left on the hosts:\n" << SshHosts::describe(h.job_processes()));
  CHECK(gone.has_value());
}
