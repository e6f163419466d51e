#include "ddp/launch_env.hpp"

#include "ddp/slurm.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace ddp {
namespace {

std::optional<std::string> lookup(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// Parses a whole decimal integer within [lo, hi]; anything else is an error naming `name`.
int parse_int(const char* name, const std::string& text, int lo, int hi) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) {
    throw LaunchEnvError(std::string(name) + "='" + text + "' is not an integer in [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return value;
}

int required_int(const char* name, int lo, int hi) {
  auto text = lookup(name);
  if (!text) {
    throw LaunchEnvError(std::string(name) +
                         " is not set: start this program with ddprun or torchrun, as a task of srun, or under mpirun");
  }
  return parse_int(name, *text, lo, hi);
}

int optional_int(const char* name, int fallback, int lo, int hi) {
  auto text = lookup(name);
  return text ? parse_int(name, *text, lo, hi) : fallback;
}

// srun with one task per GPU and no launcher.
LaunchEnv from_slurm() {
  constexpr int kMaxInt = 1 << 30;
  LaunchEnv env;
  env.launcher = "slurm";
  env.world_size = required_int("SLURM_NTASKS", 1, kMaxInt);
  env.rank = required_int("SLURM_PROCID", 0, env.world_size - 1);
  env.group_world_size = optional_int("SLURM_STEP_NUM_NODES", optional_int("SLURM_NNODES", 1, 1, kMaxInt), 1, kMaxInt);
  env.group_rank = optional_int("SLURM_NODEID", 0, 0, env.group_world_size - 1);
  env.local_rank = optional_int("SLURM_LOCALID", 0, 0, kMaxInt);
  auto per_node = lookup("SLURM_STEP_TASKS_PER_NODE");
  if (!per_node) per_node = lookup("SLURM_TASKS_PER_NODE");
  try {
    env.local_world_size = per_node ? slurm::tasks_on_node(*per_node, env.group_rank) : 1;
  } catch (const std::invalid_argument& e) {
    throw LaunchEnvError(e.what());
  }
  if (env.local_rank >= env.local_world_size) {
    throw LaunchEnvError("SLURM_LOCALID=" + std::to_string(env.local_rank) + " but only " +
                         std::to_string(env.local_world_size) + " tasks on this node");
  }
  long job = required_int("SLURM_JOB_ID", 0, INT32_MAX);
  long step = optional_int("SLURM_STEP_ID", 0, 0, INT32_MAX);
  env.master_addr = lookup("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) {
    auto nodes = lookup("SLURM_STEP_NODELIST");
    if (!nodes) nodes = lookup("SLURM_JOB_NODELIST");
    if (!nodes) throw LaunchEnvError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set");
    try {
      env.master_addr = slurm::expand_hostlist(*nodes).front();
    } catch (const std::invalid_argument& e) {
      throw LaunchEnvError(e.what());
    }
  }
  env.master_port = optional_int("MASTER_PORT", slurm::rendezvous_port(job, step), 1, 65535);
  env.store_port = env.master_port;
  env.run_id = "slurm-" + std::to_string(job) + "." + std::to_string(step);
  env.role_name = "default";
  return env;
}

// A port in [20000, 40000) every process of a job derives alike from `key`, below
// Linux's ephemeral range.
int derived_port(const std::string& key) {
  uint32_t hash = 2166136261u;  // FNV-1a
  for (char c : key) hash = (hash ^ static_cast<uint8_t>(c)) * 16777619u;
  return 20000 + static_cast<int>(hash % 20000);
}

// mpirun (Open MPI) with no launcher variables.
LaunchEnv from_openmpi() {
  constexpr int kMaxInt = 1 << 30;
  LaunchEnv env;
  env.launcher = "mpirun";
  env.world_size = required_int("OMPI_COMM_WORLD_SIZE", 1, kMaxInt);
  env.rank = required_int("OMPI_COMM_WORLD_RANK", 0, env.world_size - 1);
  env.local_world_size = optional_int("OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = optional_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, env.local_world_size - 1);
  // Open MPI does not number nodes; with its default by-slot mapping every node
  // holds a consecutive block of local_world_size ranks.
  env.group_world_size = (env.world_size + env.local_world_size - 1) / env.local_world_size;
  env.group_rank = std::min(env.rank / env.local_world_size, env.group_world_size - 1);
  env.master_addr = lookup("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) {
    if (env.local_world_size != env.world_size) {
      throw LaunchEnvError("MASTER_ADDR is not set: with ranks on several hosts, pass the host of rank 0 "
                           "(mpirun -x MASTER_ADDR=<host>)");
    }
    env.master_addr = "127.0.0.1";
  }
  // Every rank derives the same port from the job id unless MASTER_PORT is given.
  const std::string job = lookup("OMPI_MCA_ess_base_jobid").value_or(lookup("PMIX_NAMESPACE").value_or(""));
  env.master_port = optional_int("MASTER_PORT", derived_port(job), 1, 65535);
  env.store_port = env.master_port;
  if (!lookup("MASTER_PORT") && job.empty()) {
    throw LaunchEnvError("MASTER_PORT is not set and no Open MPI job id (OMPI_MCA_ess_base_jobid) to derive it from");
  }
  env.run_id = "mpi-" + job;
  env.role_name = "default";
  return env;
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  constexpr int kMaxInt = 1 << 30;
  if (!lookup("RANK") && lookup("SLURM_PROCID")) return from_slurm();
  if (!lookup("RANK") && lookup("OMPI_COMM_WORLD_RANK")) return from_openmpi();
  LaunchEnv env;
  env.launcher = "torchrun";
  env.world_size = required_int("WORLD_SIZE", 1, kMaxInt);
  env.rank = required_int("RANK", 0, env.world_size - 1);
  env.local_world_size = optional_int("LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = optional_int("LOCAL_RANK", env.rank, 0, env.local_world_size - 1);
  env.group_world_size = optional_int("GROUP_WORLD_SIZE", 1, 1, env.world_size);
  env.group_rank = optional_int("GROUP_RANK", 0, 0, env.group_world_size - 1);
  env.role_name = lookup("ROLE_NAME").value_or("default");
  env.master_addr = lookup("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) throw LaunchEnvError("MASTER_ADDR is not set");
  env.master_port = required_int("MASTER_PORT", 1, 65535);
  env.run_id = lookup("TORCHELASTIC_RUN_ID").value_or("");
  env.restart_count = optional_int("TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt);
  env.store_port = env.master_port;
  if (lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    // torchrun's agent holds its own store (PyTorch's protocol) on MASTER_PORT.
    const int port = derived_port(env.run_id + "/" + std::to_string(env.master_port) + "/" +
                                  std::to_string(env.restart_count));
    env.store_port = port == env.master_port ? port + 1 : port;
  }
  return env;
}

}  // namespace ddp
