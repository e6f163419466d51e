// What the command line asked for, validated (options.hpp parses it): torchrun's
// flags and ddprun's own. Durations are in seconds; to_ms() converts one.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/remote_options.hpp"
#include "cli/stream_spec.hpp"

namespace ddprun {

// --numa_binding: where each worker's CPUs come from (plan/numa_binding.hpp).
enum class NumaBinding {
  None,
  Node,         // every CPU of the worker's NUMA node
  Socket,       // every CPU of the NUMA nodes of that node's socket
  Exclusive,    // the node's physical cores, split evenly among the node's workers
  CoreComplex,  // one L3 cache's CPUs of the node, a different one per worker where there are enough
};

struct LaunchOptions {
  std::string nproc_per_node = "1";       // "N", "gpu", "cpu" or "auto" (resolved in the plan)
  bool nproc_per_node_given = false;      // --nproc_per_node on the command line (overrides slots)
  int nnodes = 1;                         // a fixed count N, or MAX of --nnodes MIN:MAX
  int min_nodes = 1;                      // MIN of --nnodes MIN:MAX; == nnodes for a fixed count
  int node_rank = 0;                      // elastic: only an order hint (0 hosts the embedded store)
  bool node_rank_given = false;           // --node_rank (or SLURM_NODEID) was given
  std::string master_addr = "127.0.0.1";
  bool master_addr_given = false;         // --master_addr (or Slurm's) was given: with --hostfile, node 0 hosts the store
  std::optional<int> master_port;         // unset: 29500, or a free port with --standalone
  bool standalone = false;
  // Torch workers' store (TORCHELASTIC_USE_AGENT_STORE=True, as torchrun 2.x): a store
  // this ddprun or node 0's serves on MASTER_PORT. --no_agent_store: False, and rank 0
  // hosts its own store on a free MASTER_PORT (store/worker_store.hpp).
  bool agent_store = true;
  std::string role = "default";
  std::string run_id;                     // --rdzv_id; empty: generated
  int max_restarts = 0;
  std::optional<std::string> log_dir;
  StreamSpec redirects;                   // streams kept off the console (log file only)
  StreamSpec tee;                         // streams written to the log file and the console
  std::optional<std::set<int>> local_ranks_filter;  // local ranks whose output reaches the console
  bool no_python = false;
  bool module = false;
  double monitor_interval = 0.1;          // seconds; accepted for torchrun compatibility
  double grace_period = 30.0;             // seconds between SIGTERM and SIGKILL (--shutdown_timeout too)
  NumaBinding numa_binding = NumaBinding::None;
  bool virtual_local_rank = false;        // LOCAL_RANK=0 and one visible GPU per worker
  std::vector<std::string> duplicate_stdout_filters;  // lines holding any of them also go to filtered_stdout.log
  std::vector<std::string> duplicate_stderr_filters;  // ... filtered_stderr.log
  std::optional<std::string> log_line_prefix_template;  // ${rank} ${local_rank} ${role_name} ${hostname}
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";  // as given (TORCHELASTIC_SIGNALS_TO_HANDLE)
  std::vector<int> handled_signals;       // the signals of --signals_to_handle that stop the job
  bool run_path = false;                  // run a .py with runpy.run_path under the interpreter
  std::vector<std::string> torchrun_notes;  // torchrun flags accepted without effect, and why
  // --rdzv_endpoint HOST[:PORT] (store/endpoint_store.hpp): a ddp-rendezvous daemon there, or,
  // as torchrun's c10d backend, a store the node that HOST names hosts there.
  std::optional<std::string> rdzv_host;
  int rdzv_port = 0;                      // 29400 when the endpoint names no port
  std::optional<bool> rdzv_is_host;       // --rdzv_conf is_host: whether this node hosts the endpoint's store
  bool run_id_defaulted = false;          // an endpoint without --rdzv_id: torchrun's "none"
  // An endpoint, a fixed --nnodes N > 1 and no --node_rank: node ranks by arrival, as
  // torchrun's c10d rendezvous assigns them (elastic rounds with MIN = MAX = N).
  bool ranks_by_arrival = false;
  std::string token;                      // --rdzv_token_file or DDPRUN_TOKEN; empty: none given
  double join_timeout = 600.0;            // seconds to wait for every node to join
  double last_call_timeout = 30.0;        // elastic: seconds after MIN nodes joined before starting without MAX
  std::vector<std::string> rdzv_conf_notes;  // --rdzv_conf keys accepted but without effect, and why
  double heartbeat_timeout = 10.0;        // seconds until a silent, unreachable node counts as failed
  double exit_barrier_timeout = 300.0;    // seconds a finished node waits for the others
  double stall_timeout = 300.0;           // seconds without a completed call before a stall report; 0: off
  bool stall_stop = false;                // --stall_action=stop: a stall ends the job
  // DDP_WAIT_NOTICE_SEC: how often a node that waits for the store or for other nodes
  // says whom it waits for (the workers read it too).
  std::chrono::milliseconds wait_notice_every{30000};
  bool verbose = false;
  std::optional<std::string> local_addr;  // --local_addr: the address this node advertises to the others
  RemoteOptions remote;                   // --hostfile/--hosts launches and the agents they start
  std::vector<std::string> slurm_notes;   // what was taken from a Slurm step, and from where
  std::vector<std::string> value_notes;   // -v: values from the command line and PET_* (cli/env_defaults.hpp)
  std::string program;
  std::vector<std::string> program_args;

  // --nnodes MIN:MAX with MIN < MAX: nodes may leave and join while the job runs.
  bool elastic() const { return min_nodes < nnodes; }
  // Nodes meet in elastic rounds (membership/elastic/): an elastic job, or ranks by arrival.
  bool elastic_rounds() const { return elastic() || ranks_by_arrival; }
};

// A duration of the options (seconds) in milliseconds.
inline std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace ddprun
