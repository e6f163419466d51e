// A LaunchPlan is the command line resolved against this machine: the worker count,
// the exact command each worker execs, MASTER_PORT, the run id and log folders.
// prepare_launch() does every check that can fail before a worker starts, so a bad
// launch ends with one message and no half-started group.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ddp/contract/worker_env.hpp"
#include "cli/options.hpp"

namespace ddprun {

namespace contract = ddp::contract;

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
  WorkerCommand command;
  std::optional<std::filesystem::path> log_base;  // --log_dir, or a temporary dir for --redirects/--tee
  std::optional<std::filesystem::path> log_root;  // <log_base>/<run_id>, when logs are kept
  bool set_omp_num_threads = false;               // OMP_NUM_THREADS=1 for the workers
};

// What one attempt of the job looks like from this node, once every node joined.
struct JobLayout {
  int attempt = 0;                // the attempt joined (an elastic node may join a later one than asked)
  int node_rank = 0;              // GROUP_RANK: this node's place among the attempt's nodes
  int nnodes = 1;                 // GROUP_WORLD_SIZE: the attempt's nodes
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT: failures the job restarted after
  int world_size = 1;             // workers in the job
  int rank_offset = 0;            // global rank of this node's local rank 0
  std::string master_addr;        // MASTER_ADDR / MASTER_PORT: where rank 0 may host a store
  int master_port = 0;
  contract::StoreEndpoint store;  // DDPRUN_STORE_*: the job's store and this attempt's groups prefix
};

// Resolves and checks everything; throws UsageError or LaunchError.
LaunchPlan prepare_launch(const LaunchOptions& options);

// A fresh run id (12 hex digits), for a job whose --rdzv_id was not given.
std::string generate_run_id();

// Adopts the run id the nodes agreed on (it names the log folder too).
void set_run_id(LaunchPlan& plan, const std::string& run_id);

// <log_root>/attempt_<attempt>/<local_rank>; only meaningful when plan.log_root is set.
std::filesystem::path worker_log_dir(const LaunchPlan& plan, int attempt, int local_rank);

// Creates the log folders of one attempt. Throws LaunchError naming the folder.
void create_log_dirs(const LaunchPlan& plan, int attempt);

// The launch contract of one worker (contract::WorkerEnv); `error_file` becomes its
// TORCHELASTIC_ERROR_FILE (none when empty).
contract::WorkerEnv worker_contract(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                    const std::string& error_file = {});

// The environment of one worker: ddprun's own environment plus its launch contract.
std::vector<std::string> worker_environment(const LaunchPlan& plan, const JobLayout& layout, int local_rank,
                                            const std::string& error_file = {});

// Finds `name` as execvp would: a name with a '/' is taken as a path, otherwise
// each PATH entry is tried. Returns the path of an executable regular file, or
// throws LaunchError saying what was wrong (not found, a directory, not executable).
std::string resolve_executable(const std::string& name, const std::string& what);

}  // namespace ddprun
