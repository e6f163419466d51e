// The flags torchrun 2.x added (NUMA binding, virtual local rank, duplicated and
// prefixed output, the signals it handles, the shutdown timeout, --run_path) and those
// ddprun accepts without effect (--start_method, --event_log_handler, --logs_specs).
// parse_command_line (options.hpp) defines them with add_torchrun_flags and validates
// them with apply_torchrun_flags; what they do lives where they act: plan/numa_binding,
// supervise/line_prefix, supervise/output, supervise/worker_group, plan/launch_plan.
#pragma once

#include <string>
#include <vector>

#include "cli/launch_options.hpp"

namespace CLI {
class App;
}

namespace ddprun {

// The flags as read from the command line (empty: not given).
struct TorchrunFlags {
  std::string numa_binding;
  bool virtual_local_rank = false;
  std::string duplicate_stdout_filters;
  std::string duplicate_stderr_filters;
  std::string log_line_prefix_template;
  std::string signals_to_handle;
  std::string shutdown_timeout;
  bool run_path = false;
  std::string start_method;
  std::string event_log_handler;
  std::string logs_specs;
};

// Defines the flags on `app`, each with its --snake_case and --kebab-case spelling.
void add_torchrun_flags(CLI::App& app, TorchrunFlags& raw);

// Validates `raw` and fills the options' fields. Reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT
// and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (the flags win). `grace_period_given` is
// whether --grace_period was on the command line. Throws UsageError (one line, naming
// the flag or variable) for a bad value.
void apply_torchrun_flags(const TorchrunFlags& raw, bool grace_period_given, LaunchOptions& options);

// The flags that give another ddprun (an agent of a --hostfile launch) the same values
// of these options; the grace period travels as --grace_period, the notes stay here.
std::vector<std::string> torchrun_flag_arguments(const LaunchOptions& options);

// torchrun's name of a --numa_binding mode ("core-complex"); "none" for None.
const char* numa_binding_name(NumaBinding mode);

// torchrun's comma-separated list: items split at ',', and ",," stands for a ','
// inside an item.
std::vector<std::string> split_filter_list(const std::string& text);

// The signal number of a name torchrun accepts in --signals_to_handle ("SIGUSR1"),
// or 0 when ddprun cannot handle it.
int handled_signal_number(const std::string& name);

}  // namespace ddprun
