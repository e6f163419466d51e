// Counting the devices --nproc_per_node=gpu|xpu|cpu|auto stands for, and where the
// GPUs sit on the PCI bus (for --numa_binding).
#pragma once

#include <string>
#include <vector>

namespace ddprun {

struct GpuCount {
  int count = 0;       // GPUs visible to this process (honours CUDA_VISIBLE_DEVICES)
  std::string error;   // why counting failed (no driver, driver error); empty on success
};

// Whether the CUDA driver (libcuda.so.1) loads: false on a machine without NVIDIA's
// driver, where no GPUs is the answer rather than an error.
bool cuda_driver_present();

// Asks the CUDA driver (libcuda.so.1, loaded at run time so ddprun needs no CUDA to
// build or start) how many GPUs are visible.
GpuCount count_gpus();

// The PCI address of each visible GPU in CUDA's order, as sysfs names it
// ("0000:3b:00.0"); an empty list and `error` set when they cannot be asked.
std::vector<std::string> gpu_pci_addresses(std::string& error);

struct XpuCount {
  int count = 0;      // Intel GPUs Level Zero shows this process (honours ZE_AFFINITY_MASK)
  std::string error;  // why counting failed (no Level Zero loader, driver error); empty on success
};

// Asks the Level Zero loader (libze_loader.so.1, loaded at run time) for its GPU
// devices, as torch.xpu.device_count() sees them through SYCL.
XpuCount count_xpus();

// CPUs this process may run on (its affinity mask, as set by taskset, cgroups or Slurm).
int count_usable_cpus();

}  // namespace ddprun
