// Made-up sysfs topology trees for --numa_binding's tests: the files the launcher
// reads (devices/system/node, devices/system/cpu/cpuN/{topology,cache}, bus/pci/devices),
// written under a directory that DDPRUN_SYSFS_ROOT (or read_cpu_topology) points at.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace testing {

struct TopologyShape {
  int sockets = 2;
  int nodes_per_socket = 2;
  int cores_per_node = 4;
  int threads_per_core = 2;    // SMT siblings: cpu c and c + total_cores
  int l3_per_node = 2;         // core complexes per node (cores_per_node divisible by it)
  std::map<std::string, int> gpus;  // PCI address -> its numa_node file's value
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text << "\n";
}

// Numbering as Linux gives a 2-way SMT machine: the first thread of every core is
// CPU 0..C-1 (cores in node order), the second thread of core c is CPU C + c.
inline void write_topology(const std::filesystem::path& root, const TopologyShape& s) {
  const int nodes = s.sockets * s.nodes_per_socket;
  const int cores = nodes * s.cores_per_node;
  const int per_l3 = s.cores_per_node / s.l3_per_node;
  auto cpus_of_cores = [&](int first_core, int count) {
    std::string list;
    for (int t = 0; t < s.threads_per_core; ++t) {
      int lo = t * cores + first_core;
      list += (list.empty() ? "" : ",") + std::to_string(lo) + (count > 1 ? "-" + std::to_string(lo + count - 1) : "");
    }
    return list;
  };
  for (int n = 0; n < nodes; ++n) {
    write_text(root / "devices/system/node" / ("node" + std::to_string(n)) / "cpulist",
               cpus_of_cores(n * s.cores_per_node, s.cores_per_node));
  }
  for (int core = 0; core < cores; ++core) {
    int node = core / s.cores_per_node;
    int l3_first = node * s.cores_per_node + ((core % s.cores_per_node) / per_l3) * per_l3;
    for (int t = 0; t < s.threads_per_core; ++t) {
      auto dir = root / "devices/system/cpu" / ("cpu" + std::to_string(t * cores + core));
      write_text(dir / "topology/physical_package_id", std::to_string(node / s.nodes_per_socket));
      write_text(dir / "topology/thread_siblings_list", cpus_of_cores(core, 1));
      write_text(dir / "cache/index0/type", "Data");  // L1d: per core
      write_text(dir / "cache/index0/level", "1");
      write_text(dir / "cache/index0/shared_cpu_list", cpus_of_cores(core, 1));
      write_text(dir / "cache/index1/type", "Instruction");  // never the last level
      write_text(dir / "cache/index1/level", "4");
      write_text(dir / "cache/index1/shared_cpu_list", cpus_of_cores(0, cores));
      write_text(dir / "cache/index3/type", "Unified");  // L3: per core complex
      write_text(dir / "cache/index3/level", "3");
      write_text(dir / "cache/index3/shared_cpu_list", cpus_of_cores(l3_first, per_l3));
    }
  }
  for (const auto& [address, node] : s.gpus) {
    write_text(root / "bus/pci/devices" / address / "numa_node", std::to_string(node));
  }
}

}  // namespace testing
