// --numa_binding: which CPUs (and which NUMA node's memory) each worker gets, from
// the machine's topology in sysfs, with torchrun's four modes (torch/numa/binding.py).
//
// A worker's "device" is its GPU: local rank i uses visible GPU i, whose NUMA node is
// /sys/bus/pci/devices/<its PCI address>/numa_node (-1, a machine without NUMA, is
// node 0). The devices of a node are every visible GPU on it. Workers without GPUs
// (torchrun refuses to bind those) each count as their own device, placed on the NUMA
// nodes that have CPUs this process may use in contiguous blocks of local ranks
// (ranks 0..n/k-1 on the first node, ...), so CPU-only jobs spread over the sockets.
//
//   node          every allowed CPU of the device's node
//   socket        every allowed CPU of the nodes on the socket of the device's node
//   exclusive     the node's physical cores (CPUs sharing thread_siblings_list) split
//                 evenly among the node's devices, the first ones one extra core each
//   core-complex  the CPUs sharing the node's highest-level cache (an L3), largest
//                 first; the node's k-th device gets the k-th (wrapping around)
//
// Memory: each worker prefers its device's node (set_mempolicy MPOL_PREFERRED), so its
// allocations land there while the node has free memory; torchrun binds CPUs only.
// Allowed CPUs are those of ddprun's own affinity (taskset, cgroups, Slurm).
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/launch_options.hpp"

namespace ddprun {

struct CpuTopology {
  std::map<int, std::set<int>> node_cpus;     // NUMA node -> its CPUs (nodeN/cpulist)
  std::map<int, int> cpu_socket;              // CPU -> topology/physical_package_id
  std::map<int, std::set<int>> cpu_siblings;  // CPU -> topology/thread_siblings_list
  std::map<int, std::set<int>> cpu_llc;       // CPU -> its highest-level data or unified cache's shared_cpu_list
};

struct WorkerBinding {
  std::set<int> cpus;
  int memory_node = -1;
  std::string device;  // what placed it: "GPU 3 (0000:3b:00.0)" or "no GPU"
  // Prepared for the worker's system calls between fork and exec (no allocation there).
  std::vector<unsigned long> cpu_mask;
  std::vector<unsigned long> node_mask;
};

// The sysfs root: DDPRUN_SYSFS_ROOT (for tests, a made-up tree), else /sys.
std::filesystem::path sysfs_root();

// Reads the topology under `root` (devices/system/node, devices/system/cpu). A machine
// without node directories is one node 0 holding devices/system/cpu/online. Throws
// LaunchError when neither can be read.
CpuTopology read_cpu_topology(const std::filesystem::path& root);

// The NUMA node of the PCI device at `pci_address` (bus/pci/devices/ADDR/numa_node;
// -1 reads as 0). Throws LaunchError when it cannot be read.
int pci_numa_node(const std::filesystem::path& root, const std::string& pci_address);

// The bindings of workers 0..nproc-1. `device_nodes` holds each device's node (worker
// i uses device i) or is empty for workers without GPUs. Throws LaunchError naming
// what is missing (a node without allowed CPUs, fewer cores than devices, a file).
std::vector<WorkerBinding> compute_numa_binding(NumaBinding mode, const CpuTopology& topology,
                                                const std::set<int>& allowed_cpus, const std::vector<int>& device_nodes,
                                                int nproc);

// For the plan: the topology of this machine (sysfs_root()), its GPUs' nodes and
// this process's affinity. Throws LaunchError.
std::vector<WorkerBinding> plan_numa_binding(NumaBinding mode, int nproc);

// "0-3,8,10-11", as sysfs and taskset write CPU lists; and back (throws LaunchError).
std::string cpu_list_text(const std::set<int>& cpus);
std::set<int> parse_cpu_list(const std::string& text);

}  // namespace ddprun
