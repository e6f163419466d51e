// The double's knobs, read from the environment once per process (see gpu_double.hpp).
#pragma once

#include <string>
#include <vector>

namespace gpu_double {

// One entry of DDP_GPU_DOUBLE_FAULTS: "name[@rank][=n]".
struct Fault {
  std::string name;  // "init_hang", "async_error", ...
  int rank = -1;     // -1: every rank
  long after = 0;    // after how many successful calls on the communicator
};

struct Knobs {
  int devices = 4;            // DDP_GPU_DOUBLE_DEVICES
  std::vector<Fault> faults;  // DDP_GPU_DOUBLE_FAULTS
  bool trace = false;         // DDP_GPU_DOUBLE_TRACE=1
  long delay_us = 0;          // DDP_GPU_DOUBLE_DELAY_US: up to this long before each stream task
};

// Parsed once; a malformed value is reported on stderr once and ignored.
const Knobs& knobs();

// The fault `name` for `rank` (a communicator's rank in the root communicator), or
// nullptr. `rank` -1 matches only faults given without @rank.
const Fault* find_fault(const std::string& name, int rank);

// The fault `name` where no communicator is in scope: @rank is matched against the
// process's RANK environment variable (absent: only faults without @rank match).
const Fault* find_process_fault(const std::string& name);

}  // namespace gpu_double
