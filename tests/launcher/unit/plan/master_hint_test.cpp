// A multi-node launch without --master_addr in an environment whose MASTER_ADDR names
// the master (a Kubeflow PyTorchJob pod) is told at once how to name it.
#include <catch2/catch.hpp>

#include "plan/master_hint.hpp"

using ddprun::LaunchOptions;
using ddprun::unused_master_addr_hint;

namespace {

LaunchOptions nodes(int n) {
  LaunchOptions o;
  o.nnodes = n;
  o.min_nodes = n;
  return o;
}

}  // namespace

TEST_CASE("a multi-node launch with the default master address and MASTER_ADDR set is told to pass it",
          "[master_hint]") {
  auto hint = unused_master_addr_hint(nodes(3), "pt-master-0");
  REQUIRE(hint);
  CHECK_THAT(*hint, Catch::Contains("MASTER_ADDR=pt-master-0") && Catch::Contains("127.0.0.1") &&
                        Catch::Contains("--master_addr=$(MASTER_ADDR) --master_port=$(MASTER_PORT)"));
}

TEST_CASE("no hint where the master address is given, needed nowhere else or not in the environment",
          "[master_hint]") {
  CHECK_FALSE(unused_master_addr_hint(nodes(1), "pt-master-0"));  // one node: the default is right
  CHECK_FALSE(unused_master_addr_hint(nodes(3), nullptr));
  CHECK_FALSE(unused_master_addr_hint(nodes(3), ""));
  CHECK_FALSE(unused_master_addr_hint(nodes(3), "127.0.0.1"));
  auto given = nodes(3);
  given.master_addr = "node0";
  given.master_addr_given = true;  // --master_addr, PET_MASTER_ADDR or a Slurm step
  CHECK_FALSE(unused_master_addr_hint(given, "pt-master-0"));
  auto endpoint = nodes(3);
  endpoint.rdzv_host = "el-worker-0";  // the c10d endpoint names the store
  CHECK_FALSE(unused_master_addr_hint(endpoint, "pt-master-0"));
}
