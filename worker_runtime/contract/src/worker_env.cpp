#include "ddp/contract/worker_env.hpp"

#include <algorithm>
#include <cstdint>

#include "ddp/contract/slurm.hpp"

namespace ddp::contract {
namespace {

constexpr long long kMaxInt = 1 << 30;
constexpr const char* kStartHint = "start this program with ddprun or torchrun, as a task of srun, or under mpirun";

int integer(const Variables& v, const char* name, long long lo, long long hi) {
  return static_cast<int>(v.integer(name, lo, hi, kStartHint));
}
int integer_or(const Variables& v, const char* name, long long fallback, long long lo, long long hi) {
  return static_cast<int>(v.integer_or(name, fallback, lo, hi));
}

// A port in [20000, 32768) every process of a job derives alike from `key`: below
// Linux's default ephemeral range (32768-60999), where any outgoing connection on the
// host may hold the port and rank 0 could not listen on it.
int derived_port(const std::string& key) {
  uint32_t hash = 2166136261u;  // FNV-1a
  for (char c : key) hash = (hash ^ static_cast<uint8_t>(c)) * 16777619u;
  return 20000 + static_cast<int>(hash % 12768);
}

// srun with one task per GPU and no launcher.
WorkerEnv from_slurm(const Variables& vars) {
  auto step = slurm::Step::from_variables(vars);
  if (!step) integer(vars, "SLURM_JOB_ID", 0, INT32_MAX);  // names the missing variable
  WorkerEnv env;
  env.launcher = Launcher::Slurm;
  env.world_size = integer(vars, "SLURM_NTASKS", 1, kMaxInt);
  env.rank = integer(vars, "SLURM_PROCID", 0, env.world_size - 1);
  env.group_world_size = step->nnodes;
  env.group_rank = integer_or(vars, "SLURM_NODEID", 0, 0, env.group_world_size - 1);
  env.local_rank = step->local_id.value_or(0);
  env.local_world_size = step->tasks_on(env.group_rank);
  if (env.local_rank >= env.local_world_size) {
    throw ContractError("SLURM_LOCALID=" + std::to_string(env.local_rank) + " but only " +
                        std::to_string(env.local_world_size) + " tasks on this node");
  }
  env.master_addr = vars.get("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) env.master_addr = step->first_host();
  env.master_port = integer_or(vars, "MASTER_PORT", slurm::rendezvous_port(step->job_id, step->step_id), 1, 65535);
  env.run_id = step->run_id();
  return env;
}

// mpirun (Open MPI) with no launcher variables.
WorkerEnv from_openmpi(const Variables& vars) {
  WorkerEnv env;
  env.launcher = Launcher::Mpirun;
  env.world_size = integer(vars, "OMPI_COMM_WORLD_SIZE", 1, kMaxInt);
  env.rank = integer(vars, "OMPI_COMM_WORLD_RANK", 0, env.world_size - 1);
  env.local_world_size = integer_or(vars, "OMPI_COMM_WORLD_LOCAL_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = integer_or(vars, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, env.local_world_size - 1);
  // Open MPI does not number nodes; with its default by-slot mapping every node
  // holds a consecutive block of local_world_size ranks.
  env.group_world_size = (env.world_size + env.local_world_size - 1) / env.local_world_size;
  env.group_rank = std::min(env.rank / env.local_world_size, env.group_world_size - 1);
  env.master_addr = vars.get("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) {
    if (env.local_world_size != env.world_size) {
      throw ContractError("MASTER_ADDR is not set: with ranks on several hosts, pass the host of rank 0 "
                          "(mpirun -x MASTER_ADDR=<host>)");
    }
    env.master_addr = "127.0.0.1";
  }
  // Every rank derives the same port from the job id unless MASTER_PORT is given.
  const std::string job = vars.get("OMPI_MCA_ess_base_jobid").value_or(vars.get("PMIX_NAMESPACE").value_or(""));
  if (!vars.has("MASTER_PORT") && job.empty()) {
    throw ContractError("MASTER_PORT is not set and no Open MPI job id (OMPI_MCA_ess_base_jobid) to derive it from");
  }
  env.master_port = integer_or(vars, "MASTER_PORT", derived_port(job), 1, 65535);
  env.run_id = "mpi-" + job;
  return env;
}

// ddprun's store, when it gave one.
std::optional<StoreEndpoint> store_of(const Variables& vars) {
  auto addr = vars.get("DDPRUN_STORE_ADDR");
  if (!addr) return std::nullopt;
  StoreEndpoint s;
  s.addr = *addr;
  s.port = integer(vars, "DDPRUN_STORE_PORT", 1, 65535);
  s.token = vars.get("DDPRUN_STORE_TOKEN").value_or("");
  s.ns = vars.get("DDPRUN_STORE_NAMESPACE").value_or("");
  s.prefix = vars.get("DDPRUN_STORE_PREFIX").value_or("");
  if (vars.get("DDPRUN_STORE_ATTEMPT")) s.attempt = integer(vars, "DDPRUN_STORE_ATTEMPT", 0, 1 << 30);
  return s;
}

// ddprun or torchrun (or the same variables set by hand).
WorkerEnv from_launcher_variables(const Variables& vars) {
  WorkerEnv env;
  env.store = store_of(vars);
  env.launcher = env.store ? Launcher::Ddprun : Launcher::Torchrun;
  env.world_size = integer(vars, "WORLD_SIZE", 1, kMaxInt);
  env.rank = integer(vars, "RANK", 0, env.world_size - 1);
  env.local_world_size = integer_or(vars, "LOCAL_WORLD_SIZE", env.world_size, 1, env.world_size);
  env.local_rank = integer_or(vars, "LOCAL_RANK", env.rank, 0, env.local_world_size - 1);
  env.group_world_size = integer_or(vars, "GROUP_WORLD_SIZE", 1, 1, env.world_size);
  env.group_rank = integer_or(vars, "GROUP_RANK", 0, 0, env.group_world_size - 1);
  env.role_name = vars.get("ROLE_NAME").value_or("default");
  env.master_addr = vars.get("MASTER_ADDR").value_or("");
  if (env.master_addr.empty()) throw ContractError("MASTER_ADDR is not set: " + std::string(kStartHint));
  env.master_port = integer(vars, "MASTER_PORT", 1, 65535);
  env.run_id = vars.get("TORCHELASTIC_RUN_ID").value_or("");
  env.restart_count = integer_or(vars, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMaxInt);
  env.max_restarts = integer_or(vars, "TORCHELASTIC_MAX_RESTARTS", 0, 0, kMaxInt);
  env.use_agent_store = vars.get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  env.error_file = vars.get("TORCHELASTIC_ERROR_FILE").value_or("");
  env.nccl_async_error_handling = vars.get("TORCH_NCCL_ASYNC_ERROR_HANDLING").value_or(env.nccl_async_error_handling);
  env.signals_to_handle = vars.get("TORCHELASTIC_SIGNALS_TO_HANDLE").value_or(env.signals_to_handle);
  env.single_omp_thread = vars.get("OMP_NUM_THREADS").value_or("") == "1";
  return env;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::Ddprun: return "ddprun";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Slurm: return "slurm";
    case Launcher::Mpirun: return "mpirun";
  }
  return "?";
}

int WorkerEnv::store_port() const {
  if (!use_agent_store) return master_port;
  // torchrun's agent holds its own store (PyTorch's protocol) on MASTER_PORT.
  const int port = derived_port(run_id + "/" + std::to_string(master_port) + "/" + std::to_string(restart_count));
  return port == master_port ? port + 1 : port;
}

bool WorkerEnv::wants_single_omp_thread(const Variables& launcher_env, int local_world_size) {
  return local_world_size > 1 && !launcher_env.has("OMP_NUM_THREADS");
}

std::map<std::string, std::string> WorkerEnv::to_env() const {
  std::map<std::string, std::string> env = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"GROUP_RANK", std::to_string(group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(group_world_size)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"ROLE_NAME", role_name},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
      {"TORCHELASTIC_RUN_ID", run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", use_agent_store ? "True" : "False"},
      {"TORCHELASTIC_SIGNALS_TO_HANDLE", signals_to_handle},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", nccl_async_error_handling},
  };
  if (!error_file.empty()) env["TORCHELASTIC_ERROR_FILE"] = error_file;
  if (!visible_device.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = visible_device;
    if (hip_visible_device) env["HIP_VISIBLE_DEVICES"] = visible_device;
  }
  if (store) {
    env["DDPRUN_STORE_ADDR"] = store->addr;
    env["DDPRUN_STORE_PORT"] = std::to_string(store->port);
    env["DDPRUN_STORE_TOKEN"] = store->token;
    env["DDPRUN_STORE_NAMESPACE"] = store->ns;
    env["DDPRUN_STORE_PREFIX"] = store->prefix;
    if (store->attempt >= 0) env["DDPRUN_STORE_ATTEMPT"] = std::to_string(store->attempt);
    env["DDPRUN_RUN_ID"] = run_id;
    env["DDPRUN_NODE_RANK"] = std::to_string(group_rank);
  }
  if (single_omp_thread) env["OMP_NUM_THREADS"] = "1";
  return env;
}

WorkerEnv WorkerEnv::from_environment() { return from_variables(Variables::from_process()); }

WorkerEnv WorkerEnv::from_variables(const Variables& vars) {
  WorkerEnv env = !vars.has("RANK") && vars.has("SLURM_PROCID")           ? from_slurm(vars)
                  : !vars.has("RANK") && vars.has("OMPI_COMM_WORLD_RANK") ? from_openmpi(vars)
                                                                          : from_launcher_variables(vars);
  if (!env.store) env.token = vars.get("DDPRUN_TOKEN").value_or("");
  return env;
}

Millis wait_notice_every(const Variables& vars) {
  return vars.seconds("DDP_WAIT_NOTICE_SEC").value_or(kDefaultWaitNotice);
}

CommSettings CommSettings::from_environment() { return from_variables(Variables::from_process()); }

CommSettings CommSettings::from_variables(const Variables& vars) {
  constexpr long long kMaxBytes = 1LL << 40;
  CommSettings s;
  s.timeout = vars.seconds("DDP_TIMEOUT_SEC");
  s.wait_notice_every = contract::wait_notice_every(vars);
  s.backend = vars.get("DDP_BACKEND");
  s.disable_shm = vars.flag("DDP_DISABLE_SHM");
  s.disable_cma = vars.flag("DDP_DISABLE_CMA");
  s.socket_ifname = vars.get("DDP_SOCKET_IFNAME");
  s.spin_us = static_cast<long>(vars.integer_or("DDP_SPIN_US", -1, -1, 1'000'000));
  auto bytes = [&](const char* name, size_t fallback) {
    return static_cast<size_t>(vars.integer_or(name, static_cast<long long>(fallback), 0, kMaxBytes));
  };
  s.shm_ring_bytes = bytes("DDP_SHM_RING_BYTES", 0);
  s.small_allreduce_bytes = bytes("DDP_SMALL_ALLREDUCE_BYTES", s.small_allreduce_bytes);
  s.small_broadcast_bytes = bytes("DDP_SMALL_BROADCAST_BYTES", s.small_broadcast_bytes);
  s.direct_allreduce_bytes = bytes("DDP_DIRECT_ALLREDUCE_BYTES", s.direct_allreduce_bytes);
  s.staged_allreduce_bytes = bytes("DDP_STAGED_ALLREDUCE_BYTES", s.staged_allreduce_bytes);
  s.flight_recorder_entries =
      static_cast<size_t>(vars.integer_or("DDP_FLIGHT_RECORDER", static_cast<long long>(s.flight_recorder_entries), 0, 10'000'000));
  return s;
}

}  // namespace ddp::contract
