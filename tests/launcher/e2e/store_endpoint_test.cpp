// Reaching the store at --rdzv_endpoint through the real ddprun: a listener there that
// is not a ddprun store is named as such, and a name whose DNS server never answers
// keeps the wait within its budget, one notice per interval.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>

#include "e2e.hpp"
#include "ports.hpp"

using namespace testing;

namespace {

// Runs `argv` in a network and mount namespace of its own whose resolv.conf names a
// DNS server on a link where nobody answers: every lookup waits out the resolver's
// timeout (5 s, two attempts).
RunResult run_with_silent_dns(const std::vector<std::string>& argv) {
  if (geteuid() != 0) FAIL("this test needs root to create network and mount namespaces (CI runs as root)");
  TempDir dir;
  const std::string script =
      "set -e; ip link set lo up; ip link add v0 type veth peer name v1; ip link set v0 up; ip link set v1 up; "
      "ip addr add 10.77.0.1/24 dev v0; "
      "printf 'nameserver 10.77.0.2\\noptions timeout:5 attempts:2\\n' > " + (dir / "resolv.conf").string() + "; "
      "mount --bind " + (dir / "resolv.conf").string() + " /etc/resolv.conf; exec \"$@\"";
  std::vector<std::string> full = {"unshare", "-n", "-m", "--propagation", "private", "sh", "-c", script, "sh"};
  full.insert(full.end(), argv.begin(), argv.end());
  return run(full, {{{"DDP_WAIT_NOTICE_SEC", "2"}}, {}}, 60s);
}

}  // namespace

TEST_CASE("a name no DNS server answers for gives up at the join timeout, one notice per interval",
          "[e2e][store_endpoint]") {
  auto r = run_with_silent_dns(
      e2e::ddprun({"--nnodes", "2", "--join_timeout", "7", "--rdzv_endpoint", "nosuchhost-xyz.invalid", "true"}));
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("cannot reach the store at nosuchhost-xyz.invalid:29400 within 7 s"));
  // The join wait's 7 s, after at most the host lookup's own bound; the resolver alone
  // would take 10 s and more for each lookup.
  CHECK(r.seconds < 7 + 2 + 1.5);
  for (std::string at : {"(2 s of 7 s)", "(4 s of 7 s)", "(6 s of 7 s)"}) {
    auto lines = lines_of(r.err);
    CHECK(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
            return l.find(at) != std::string::npos;
          }) == 1);
  }
}

TEST_CASE("a listener at the endpoint that is not a ddprun store is named, after a greeting wait, exit 1",
          "[e2e][store_endpoint]") {
  uint16_t port = 0;
  const int fd = loopback_listener(port);
  REQUIRE(fd >= 0);
  auto r = run(e2e::ddprun({"--nnodes", "2", "--join_timeout", "8", "--rdzv_endpoint",
                            "127.0.0.1:" + std::to_string(port), "true"}));
  close(fd);
  INFO(r.err);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("something listens at 127.0.0.1:" + std::to_string(port) +
                                    " but is not a ddprun store (a torchrun TCPStore?)"));
  CHECK(r.seconds > 4);  // the greeting was awaited, not a 100 ms connect slice
  CHECK(r.seconds < 8);
}
