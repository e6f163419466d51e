// Counting the devices --nproc_per_node=gpu|cpu|auto stands for.
#pragma once

#include <string>

namespace ddprun {

struct GpuCount {
  int count = 0;       // GPUs visible to this process (honours CUDA_VISIBLE_DEVICES)
  std::string error;   // why counting failed (no driver, driver error); empty on success
};

// Asks the CUDA driver (libcuda.so.1, loaded at run time so ddprun needs no CUDA to
// build or start) how many GPUs are visible.
GpuCount count_gpus();

// CPUs this process may run on (its affinity mask, as set by taskset, cgroups or Slurm).
int count_usable_cpus();

}  // namespace ddprun
