// A LaunchPlan is the command line resolved against this machine: the worker count,
// the exact command each worker execs, MASTER_PORT, the run id and log folders.
// prepare_launch() does every check that can fail before a worker starts, so a bad
// launch ends with one message and no half-started group.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/launch_options.hpp"

namespace ddprun {

struct WorkerCommand {
  std::string path;               // what execve() runs (absolute or relative to the cwd)
  std::vector<std::string> argv;  // argv[0] included
};

struct LaunchPlan {
  LaunchOptions options;
  int nproc = 1;                  // workers on this node
  int master_port = 0;            // one node: MASTER_PORT; several: where node 0 hosts the store
  std::string run_id;
  std::string hostname;
  std::string launch_id;          // 12 random hex digits: this launch's own, told from every other
  WorkerCommand command;
  std::optional<std::filesystem::path> log_base;  // --log_dir, or a temporary dir for --redirects/--tee
  std::optional<std::filesystem::path> log_root;  // <log_base>/<run_id>, when logs are kept
  bool set_omp_num_threads = false;               // OMP_NUM_THREADS=1 for the workers
};

// Resolves and checks everything; throws UsageError or LaunchError.
LaunchPlan prepare_launch(const LaunchOptions& options);

// A fresh run id (12 hex digits), for a job whose --rdzv_id was not given.
std::string generate_run_id();

// Adopts the run id the nodes agreed on (it names the log folder too: <run_id>, or
// none_<launch_id> for torchrun's default id "none", which many jobs share).
void set_run_id(LaunchPlan& plan, const std::string& run_id);

// <log_root>/attempt_<attempt>/<local_rank>; only meaningful when plan.log_root is set.
std::filesystem::path worker_log_dir(const LaunchPlan& plan, int attempt, int local_rank);

// Creates the log folders of one attempt. Throws LaunchError naming the folder.
void create_log_dirs(const LaunchPlan& plan, int attempt);

// Finds `name` as execvp would: a name with a '/' is taken as a path, otherwise
// each PATH entry is tried. Returns the path of an executable regular file, or
// throws LaunchError saying what was wrong (not found, a directory, not executable).
std::string resolve_executable(const std::string& name, const std::string& what);

}  // namespace ddprun
