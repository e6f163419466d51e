// --numa_binding's computation from a made-up topology: torchrun's four modes with GPUs
// and for CPU-only workers, the sysfs reading, and the errors.
#include <catch2/catch.hpp>

#include "errors.hpp"
#include "numa_topology.hpp"
#include "plan/numa_binding.hpp"
#include "subprocess.hpp"

using ddprun::NumaBinding;
using ddprun::cpu_list_text;
using ddprun::parse_cpu_list;

namespace {

// 2 sockets x 2 nodes x 4 cores x 2 threads: node n holds cores 4n..4n+3 (CPUs
// 4n..4n+3 and 16+4n..16+4n+3); each node has two L3s of two cores.
struct Machine {
  testing::TempDir dir;
  ddprun::CpuTopology topology;
  std::set<int> all = parse_cpu_list("0-31");
  explicit Machine(testing::TopologyShape shape = {}) {
    testing::write_topology(dir.path(), shape);
    topology = ddprun::read_cpu_topology(dir.path());
  }
  std::vector<std::string> cpus(NumaBinding mode, const std::vector<int>& device_nodes, int nproc) {
    std::vector<std::string> out;
    for (const auto& b : ddprun::compute_numa_binding(mode, topology, all, device_nodes, nproc)) {
      out.push_back(cpu_list_text(b.cpus) + " @" + std::to_string(b.memory_node));
    }
    return out;
  }
};

using List = std::vector<std::string>;

}  // namespace

TEST_CASE("cpu lists read and print as sysfs writes them", "[numa]") {
  CHECK(cpu_list_text(parse_cpu_list("0-3,8,10-11\n")) == "0-3,8,10-11");
  CHECK(cpu_list_text(parse_cpu_list("5")) == "5");
  CHECK(cpu_list_text({}) == "");
  CHECK_THROWS_AS(parse_cpu_list("3-1"), ddprun::LaunchError);
  CHECK_THROWS_AS(parse_cpu_list("a"), ddprun::LaunchError);
}

TEST_CASE("the topology of a 2-socket 4-node tree is read from sysfs", "[numa]") {
  Machine m;
  REQUIRE(m.topology.node_cpus.size() == 4);
  CHECK(cpu_list_text(m.topology.node_cpus.at(1)) == "4-7,20-23");
  CHECK(m.topology.cpu_socket.at(9) == 1);
  CHECK(cpu_list_text(m.topology.cpu_siblings.at(20)) == "4,20");
  CHECK(cpu_list_text(m.topology.cpu_llc.at(6)) == "6-7,22-23");  // the L3, not the level-4 instruction cache
}

TEST_CASE("node: every CPU of the GPU's node with memory from that node", "[numa]") {
  Machine m;
  // GPUs 0,1 on node 0; 2,3 on node 3.
  CHECK(m.cpus(NumaBinding::Node, {0, 0, 3, 3}, 4) == List{"0-3,16-19 @0", "0-3,16-19 @0", "12-15,28-31 @3",
                                                           "12-15,28-31 @3"});
}

TEST_CASE("socket: every CPU of the nodes on the GPU's socket", "[numa]") {
  Machine m;
  CHECK(m.cpus(NumaBinding::Socket, {1, 2}, 2) == List{"0-7,16-23 @1", "8-15,24-31 @2"});
}

TEST_CASE("exclusive: the node's physical cores split among its GPUs with extra cores first", "[numa]") {
  Machine m;
  // Three GPUs on node 0 (4 cores): 2, 1, 1 cores, each core with both threads.
  CHECK(m.cpus(NumaBinding::Exclusive, {0, 0, 0, 2}, 4) ==
        List{"0-1,16-17 @0", "2,18 @0", "3,19 @0", "8-11,24-27 @2"});
  // Five GPUs on a 4-core node cannot each have a core.
  CHECK_THROWS_WITH(m.cpus(NumaBinding::Exclusive, {0, 0, 0, 0, 0}, 5),
                    Catch::Contains("NUMA node 0 has 4 physical core(s) for 5 devices"));
}

TEST_CASE("exclusive counts every GPU of the node, also those without a worker", "[numa]") {
  Machine m;
  // Two workers, but GPUs 0-3 all sit on node 0: each worker gets a quarter.
  CHECK(m.cpus(NumaBinding::Exclusive, {0, 0, 0, 0}, 2) == List{"0,16 @0", "1,17 @0"});
}

TEST_CASE("core-complex: one L3's CPUs per GPU wrapping around when there are more GPUs", "[numa]") {
  Machine m;
  CHECK(m.cpus(NumaBinding::CoreComplex, {1, 1, 1}, 3) == List{"4-5,20-21 @1", "6-7,22-23 @1", "4-5,20-21 @1"});
}

TEST_CASE("CPU-only workers spread over the nodes in blocks of local ranks", "[numa]") {
  Machine m;
  CHECK(m.cpus(NumaBinding::Node, {}, 8) == List{"0-3,16-19 @0", "0-3,16-19 @0", "4-7,20-23 @1", "4-7,20-23 @1",
                                                 "8-11,24-27 @2", "8-11,24-27 @2", "12-15,28-31 @3",
                                                 "12-15,28-31 @3"});
  CHECK(m.cpus(NumaBinding::Exclusive, {}, 4) == List{"0-3,16-19 @0", "4-7,20-23 @1", "8-11,24-27 @2",
                                                      "12-15,28-31 @3"});
  CHECK(m.cpus(NumaBinding::Exclusive, {}, 8) == List{"0-1,16-17 @0", "2-3,18-19 @0", "4-5,20-21 @1", "6-7,22-23 @1",
                                                      "8-9,24-25 @2", "10-11,26-27 @2", "12-13,28-29 @3",
                                                      "14-15,30-31 @3"});
  CHECK(m.cpus(NumaBinding::Socket, {}, 2) == List{"0-7,16-23 @0", "8-15,24-31 @2"});
  // Two workers on a 4-node machine: the first and the third node.
  CHECK(m.cpus(NumaBinding::CoreComplex, {}, 2) == List{"0-1,16-17 @0", "8-9,24-25 @2"});
}

TEST_CASE("only the CPUs this process may use are bound and a node without any is an error", "[numa]") {
  Machine m;
  m.all = parse_cpu_list("0-1,4-5");  // e.g. taskset -c 0-1,4-5
  CHECK(m.cpus(NumaBinding::Node, {}, 2) == List{"0-1 @0", "4-5 @1"});
  CHECK_THROWS_WITH(m.cpus(NumaBinding::Node, {2}, 1),
                    Catch::Contains("NUMA node 2 (CPUs 8-11,24-27) has no CPU this process may run on"));
}

TEST_CASE("a GPU's node comes from its PCI device where -1 (no NUMA) is node 0", "[numa]") {
  testing::TopologyShape shape;
  shape.gpus = {{"0000:3b:00.0", 1}, {"0000:5e:00.0", -1}};
  Machine m(shape);
  CHECK(ddprun::pci_numa_node(m.dir.path(), "0000:3b:00.0") == 1);
  CHECK(ddprun::pci_numa_node(m.dir.path(), "0000:5e:00.0") == 0);
  CHECK_THROWS_WITH(ddprun::pci_numa_node(m.dir.path(), "0000:99:00.0"), Catch::Contains("0000:99:00.0/numa_node"));
}

TEST_CASE("a machine without node directories is one node of its online CPUs", "[numa]") {
  testing::TempDir dir;
  testing::write_text(dir.path() / "devices/system/cpu/online", "0-3");
  auto t = ddprun::read_cpu_topology(dir.path());
  REQUIRE(t.node_cpus.size() == 1);
  CHECK(cpu_list_text(t.node_cpus.at(0)) == "0-3");
  CHECK_THROWS_AS(ddprun::read_cpu_topology(dir.path() / "missing"), ddprun::LaunchError);
}

TEST_CASE("the masks handed to the worker's system calls hold the bound CPUs and node", "[numa]") {
  Machine m;
  auto b = ddprun::compute_numa_binding(NumaBinding::Node, m.topology, m.all, {3}, 1);
  REQUIRE(b.size() == 1);
  REQUIRE(b[0].cpu_mask.size() == 1);
  CHECK(b[0].cpu_mask[0] == ((0xFUL << 12) | (0xFUL << 28)));
  CHECK(b[0].node_mask == std::vector<unsigned long>{1UL << 3});
}
