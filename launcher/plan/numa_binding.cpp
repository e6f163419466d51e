// Worker CPU and memory binding from the sysfs topology (numa_binding.hpp).
#include "plan/numa_binding.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <spdlog/spdlog.h>

#include "ddp/contract/parse.hpp"
#include "errors.hpp"
#include "plan/devices.hpp"

namespace ddprun {
namespace fs = std::filesystem;
namespace {

constexpr int kMaxCpu = 1 << 16;

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::optional<int> read_int(const fs::path& path) {
  auto text = read_text(path);
  if (!text) return std::nullopt;
  auto n = ddp::contract::parse_integer(trimmed(*text));
  if (!n) return std::nullopt;
  return static_cast<int>(*n);
}

std::set<int> read_cpu_list(const fs::path& path) {
  auto text = read_text(path);
  if (!text) throw LaunchError("--numa_binding: cannot read " + path.string());
  return parse_cpu_list(*text);
}

// The CPUs sharing the highest-level data or unified cache with `cpu_dir`'s CPU.
std::optional<std::set<int>> last_level_cache(const fs::path& cpu_dir) {
  std::error_code ec;
  int best_level = -1;
  std::optional<std::set<int>> shared;
  for (const auto& entry : fs::directory_iterator(cpu_dir / "cache", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0) continue;
    auto type = read_text(entry.path() / "type");
    auto level = read_int(entry.path() / "level");
    if (!type || !level || (trimmed(*type) != "Unified" && trimmed(*type) != "Data") || *level <= best_level) continue;
    best_level = *level;
    shared = read_cpu_list(entry.path() / "shared_cpu_list");
  }
  return shared;
}

// Groups `cpus` by a key each CPU maps to (the smallest CPU of its core or cache).
std::map<int, std::set<int>> group_by_smallest(const std::set<int>& cpus, const std::map<int, std::set<int>>& sets) {
  std::map<int, std::set<int>> groups;
  for (int cpu : cpus) {
    auto it = sets.find(cpu);
    int key = it == sets.end() || it->second.empty() ? cpu : *it->second.begin();
    groups[key].insert(cpu);
  }
  return groups;
}

std::set<int> node_allowed(const CpuTopology& t, int node, const std::set<int>& allowed) {
  std::set<int> out;
  auto it = t.node_cpus.find(node);
  if (it == t.node_cpus.end()) throw LaunchError("--numa_binding: NUMA node " + std::to_string(node) + " has no CPUs");
  for (int cpu : it->second) {
    if (allowed.count(cpu)) out.insert(cpu);
  }
  if (out.empty()) {
    throw LaunchError("--numa_binding: NUMA node " + std::to_string(node) + " (CPUs " + cpu_list_text(it->second) +
                      ") has no CPU this process may run on (allowed: " + cpu_list_text(allowed) + ")");
  }
  return out;
}

int socket_of(const CpuTopology& t, int cpu) {
  auto it = t.cpu_socket.find(cpu);
  if (it == t.cpu_socket.end()) {
    throw LaunchError("--numa_binding=socket: no topology/physical_package_id for CPU " + std::to_string(cpu));
  }
  return it->second;
}

std::set<int> socket_cpus(const CpuTopology& t, int node, const std::set<int>& allowed) {
  int socket = socket_of(t, *node_allowed(t, node, allowed).begin());
  std::set<int> cpus;
  for (const auto& [other, all] : t.node_cpus) {
    std::set<int> mine;
    for (int cpu : all) {
      if (allowed.count(cpu)) mine.insert(cpu);
    }
    if (!mine.empty() && socket_of(t, *mine.begin()) == socket) cpus.insert(mine.begin(), mine.end());
  }
  return cpus;
}

// The `index`-th of `devices` devices' share of the node's physical cores.
std::set<int> exclusive_cpus(const CpuTopology& t, int node, const std::set<int>& allowed, int index, int devices) {
  auto cores = group_by_smallest(node_allowed(t, node, allowed), t.cpu_siblings);
  int per = static_cast<int>(cores.size()) / devices;
  int extra = static_cast<int>(cores.size()) % devices;
  if (per < 1) {
    throw LaunchError("--numa_binding=exclusive: NUMA node " + std::to_string(node) + " has " +
                      std::to_string(cores.size()) + " physical core(s) for " + std::to_string(devices) + " devices");
  }
  int start = index * per + std::min(index, extra);
  int end = start + per + (index < extra ? 1 : 0);
  std::set<int> cpus;
  int i = 0;
  for (const auto& [key, core] : cores) {
    if (i >= start && i < end) cpus.insert(core.begin(), core.end());
    ++i;
  }
  return cpus;
}

std::set<int> core_complex_cpus(const CpuTopology& t, int node, const std::set<int>& allowed, int index) {
  auto caches = group_by_smallest(node_allowed(t, node, allowed), t.cpu_llc);
  std::vector<std::pair<int, std::set<int>>> order(caches.begin(), caches.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second.size() > b.second.size();  // more CPUs first; then the smaller key (map order)
  });
  return order[index % order.size()].second;
}

std::vector<unsigned long> mask_of(const std::set<int>& bits) {
  constexpr int kWord = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask(bits.empty() ? 1 : *bits.rbegin() / kWord + 1, 0);
  for (int b : bits) mask[b / kWord] |= 1UL << (b % kWord);
  return mask;
}

std::set<int> own_affinity() {
  std::set<int> cpus;
  cpu_set_t* set = CPU_ALLOC(kMaxCpu);
  size_t size = CPU_ALLOC_SIZE(kMaxCpu);
  if (sched_getaffinity(0, size, set) == 0) {
    for (int cpu = 0; cpu < kMaxCpu; ++cpu) {
      if (CPU_ISSET_S(cpu, size, set)) cpus.insert(cpu);
    }
  }
  CPU_FREE(set);
  return cpus;
}

}  // namespace

std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  const std::string list = trimmed(text);
  std::string_view rest = list;
  auto number = [&](std::string_view s) {
    auto n = ddp::contract::parse_integer(s);
    if (!n || *n < 0 || *n >= kMaxCpu) throw LaunchError("--numa_binding: bad CPU list '" + text + "'");
    return static_cast<int>(*n);
  };
  while (!rest.empty()) {
    std::string_view item = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), item.size() + 1));
    if (item.empty()) continue;
    auto dash = item.find('-');
    int lo = number(item.substr(0, dash));
    int hi = dash == std::string_view::npos ? lo : number(item.substr(dash + 1));
    if (hi < lo) throw LaunchError("--numa_binding: bad CPU list '" + text + "'");
    for (int cpu = lo; cpu <= hi; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

std::string cpu_list_text(const std::set<int>& cpus) {
  std::string out;
  for (auto it = cpus.begin(); it != cpus.end();) {
    int lo = *it, hi = lo;
    while (++it != cpus.end() && *it == hi + 1) ++hi;
    if (!out.empty()) out += ',';
    out += std::to_string(lo);
    if (hi > lo) out += "-" + std::to_string(hi);
  }
  return out;
}

fs::path sysfs_root() {
  const char* root = std::getenv("DDPRUN_SYSFS_ROOT");
  return root != nullptr && *root != '\0' ? fs::path(root) : fs::path("/sys");
}

CpuTopology read_cpu_topology(const fs::path& root) {
  CpuTopology t;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root / "devices/system/node", ec)) {
    std::string name = entry.path().filename().string();
    auto id = ddp::contract::parse_integer(name.rfind("node", 0) == 0 ? name.substr(4) : "");
    if (!id || !fs::exists(entry.path() / "cpulist")) continue;
    std::set<int> cpus = read_cpu_list(entry.path() / "cpulist");
    if (!cpus.empty()) t.node_cpus[static_cast<int>(*id)] = std::move(cpus);  // memory-only nodes hold no workers
  }
  if (t.node_cpus.empty()) t.node_cpus[0] = read_cpu_list(root / "devices/system/cpu/online");
  for (const auto& [node, cpus] : t.node_cpus) {
    for (int cpu : cpus) {
      fs::path dir = root / "devices/system/cpu" / ("cpu" + std::to_string(cpu));
      if (auto socket = read_int(dir / "topology/physical_package_id")) t.cpu_socket[cpu] = *socket;
      if (fs::exists(dir / "topology/thread_siblings_list")) {
        t.cpu_siblings[cpu] = read_cpu_list(dir / "topology/thread_siblings_list");
      }
      if (auto llc = last_level_cache(dir)) t.cpu_llc[cpu] = std::move(*llc);
    }
  }
  return t;
}

int pci_numa_node(const fs::path& root, const std::string& pci_address) {
  fs::path path = root / "bus/pci/devices" / pci_address / "numa_node";
  auto node = read_int(path);
  if (!node) throw LaunchError("--numa_binding: cannot read " + path.string());
  return std::max(*node, 0);
}

std::vector<WorkerBinding> compute_numa_binding(NumaBinding mode, const CpuTopology& t, const std::set<int>& allowed,
                                                const std::vector<int>& device_nodes, int nproc) {
  std::vector<int> nodes = device_nodes;
  if (nodes.empty()) {  // no GPUs: the workers in blocks over the nodes with allowed CPUs
    std::vector<int> usable;
    for (const auto& [node, cpus] : t.node_cpus) {
      if (std::any_of(cpus.begin(), cpus.end(), [&](int c) { return allowed.count(c) > 0; })) usable.push_back(node);
    }
    if (usable.empty()) {
      throw LaunchError("--numa_binding: no NUMA node has a CPU this process may run on (allowed: " +
                        cpu_list_text(allowed) + ")");
    }
    for (int lr = 0; lr < nproc; ++lr) nodes.push_back(usable[static_cast<size_t>(lr) * usable.size() / nproc]);
  }
  std::vector<WorkerBinding> out;
  for (int lr = 0; lr < nproc; ++lr) {
    int node = nodes[lr];
    int index = 0, devices = 0;  // this device's place among its node's devices
    for (size_t d = 0; d < nodes.size(); ++d) {
      if (nodes[d] != node) continue;
      if (static_cast<int>(d) < lr) ++index;
      ++devices;
    }
    WorkerBinding b;
    b.memory_node = node;
    switch (mode) {
      case NumaBinding::Node: b.cpus = node_allowed(t, node, allowed); break;
      case NumaBinding::Socket: b.cpus = socket_cpus(t, node, allowed); break;
      case NumaBinding::Exclusive: b.cpus = exclusive_cpus(t, node, allowed, index, devices); break;
      case NumaBinding::CoreComplex: b.cpus = core_complex_cpus(t, node, allowed, index); break;
      case NumaBinding::None: break;
    }
    b.device = device_nodes.empty() ? "no GPU" : "GPU " + std::to_string(lr);
    b.cpu_mask = mask_of(b.cpus);
    b.node_mask = mask_of({node});
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<WorkerBinding> plan_numa_binding(NumaBinding mode, int nproc) {
  fs::path root = sysfs_root();
  CpuTopology topology = read_cpu_topology(root);
  std::string error;
  std::vector<std::string> gpus = gpu_pci_addresses(error);
  if (!error.empty() && cuda_driver_present()) {
    // A driver that fails must not pass for a machine without GPUs unnoticed.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      spdlog::warn("--numa_binding: cannot list the GPUs ({}); workers are bound as on a machine without GPUs", error);
    });
  }
  std::vector<int> device_nodes;
  if (!gpus.empty()) {
    if (static_cast<int>(gpus.size()) < nproc) {
      throw LaunchError("--numa_binding: " + std::to_string(nproc) + " workers but " + std::to_string(gpus.size()) +
                        " GPU(s); worker i is bound by GPU i");
    }
    for (const auto& address : gpus) device_nodes.push_back(pci_numa_node(root, address));
  }
  auto bindings = compute_numa_binding(mode, topology, own_affinity(), device_nodes, nproc);
  for (size_t i = 0; i < gpus.size() && i < bindings.size(); ++i) bindings[i].device += " (" + gpus[i] + ")";
  return bindings;
}

}  // namespace ddprun
