#include "plan/launch_plan.hpp"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ddp/contract/worker_env.hpp"
#include "errors.hpp"
#include "plan/devices.hpp"
#include "plan/local_host.hpp"
#include "plan/ports.hpp"

namespace ddprun {
namespace {

constexpr int kDefaultMasterPort = 29500;

int resolve_nproc(const std::string& spec) {
  if (spec == "cpu") return count_usable_cpus();
  if (spec == "gpu" || spec == "auto") {
    GpuCount gpus = count_gpus();
    if (spec == "auto") return gpus.count > 0 ? gpus.count : count_usable_cpus();
    if (!gpus.error.empty()) throw LaunchError("--nproc_per_node=gpu: cannot count GPUs: " + gpus.error);
    if (gpus.count == 0) throw LaunchError("--nproc_per_node=gpu: no GPU is visible (check CUDA_VISIBLE_DEVICES)");
    return gpus.count;
  }
  if (spec == "xpu") {
    XpuCount xpus = count_xpus();
    if (!xpus.error.empty()) throw LaunchError("--nproc_per_node=xpu: cannot count XPUs: " + xpus.error);
    if (xpus.count == 0) throw LaunchError("--nproc_per_node=xpu: no XPU is visible (check ZE_AFFINITY_MASK)");
    return xpus.count;
  }
  return std::stoi(spec);  // validated by the parser
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What torchrun's --run_path runs in its worker: the script as __main__ with sys.argv
// set to the script and its arguments.
constexpr const char* kRunPathCode =
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')";

WorkerCommand build_command(const LaunchOptions& o) {
  WorkerCommand cmd;
  bool python = o.run_path || o.module || (!o.no_python && ends_with(o.program, ".py"));
  if (!python) {
    cmd.path = resolve_executable(o.program, "program");
    cmd.argv.push_back(o.program);
  } else {
    const char* exec = std::getenv("PYTHON_EXEC");
    std::string interpreter = exec != nullptr && *exec != '\0' ? exec : "python3";
    cmd.path = resolve_executable(interpreter, "Python interpreter (PYTHON_EXEC)");
    cmd.argv = {interpreter, "-u"};
    if (o.run_path) {  // wins over --module and --no_python, as in torchrun
      cmd.argv.insert(cmd.argv.end(), {"-c", kRunPathCode});
    } else if (o.module) {
      cmd.argv.push_back("-m");
    }
    if ((o.run_path || !o.module) && access(o.program.c_str(), R_OK) != 0) {
      throw LaunchError("script '" + o.program + "' cannot be read: " + std::strerror(errno));
    }
    cmd.argv.push_back(o.program);
  }
  cmd.argv.insert(cmd.argv.end(), o.program_args.begin(), o.program_args.end());
  return cmd;
}

// torchrun's virtual local rank: worker i sees the i-th GPU of the launcher's own list
// (HIP_VISIBLE_DEVICES when set, else CUDA_VISIBLE_DEVICES), or GPU i when none is set.
void plan_visible_devices(LaunchPlan& plan) {
  const char* hip = std::getenv("HIP_VISIBLE_DEVICES");
  plan.hip_visible_devices = hip != nullptr && *hip != '\0';
  const char* var = plan.hip_visible_devices ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES";
  const char* list = plan.hip_visible_devices ? hip : std::getenv("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> gpus;
  if (list != nullptr) {
    std::string_view rest = list;
    while (true) {
      auto comma = rest.find(',');
      std::string item(rest.substr(0, comma));
      item.erase(0, item.find_first_not_of(' '));
      item.erase(item.find_last_not_of(' ') + 1);
      gpus.push_back(item);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  for (int lr = 0; lr < plan.nproc; ++lr) {
    if (list == nullptr) {
      plan.visible_devices.push_back(std::to_string(lr));
    } else if (lr < static_cast<int>(gpus.size())) {
      plan.visible_devices.push_back(gpus[lr]);
    } else {
      throw LaunchError("--virtual_local_rank: local rank " + std::to_string(lr) + " has no GPU in " + var + "=" +
                        list);
    }
  }
}

}  // namespace

std::string generate_run_id() {
  unsigned char bytes[6];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    throw LaunchError(std::string("cannot generate a run id: ") + std::strerror(errno));
  }
  char text[2 * sizeof(bytes) + 1];
  for (size_t i = 0; i < sizeof(bytes); ++i) std::snprintf(text + 2 * i, 3, "%02x", bytes[i]);
  return text;
}

std::string resolve_executable(const std::string& name, const std::string& what) {
  auto check = [&](const std::string& path, bool searched) -> std::string {
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) {
      if (searched) return {};
      throw LaunchError(what + " '" + name + "' not found: " + std::strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
      if (searched) return {};
      throw LaunchError(what + " '" + name + "' is a directory");
    }
    if (access(path.c_str(), X_OK) != 0) {
      if (searched) return {};  // execvp also skips PATH entries it may not run
      throw LaunchError(what + " '" + path + "' is not executable (chmod +x, or run a .py script without --no_python)");
    }
    return path;
  };
  if (name.find('/') != std::string::npos) return check(name, false);
  const char* path_env = std::getenv("PATH");
  std::string path_list = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path_list.size()) {
    size_t end = path_list.find(':', start);
    if (end == std::string::npos) end = path_list.size();
    std::string dir = path_list.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (std::string found = check(candidate, true); !found.empty()) return found;
    start = end + 1;
  }
  throw LaunchError(what + " '" + name + "' not found in PATH");
}

LaunchPlan prepare_launch(const LaunchOptions& options) {
  LaunchPlan plan;
  plan.options = options;
  plan.command = build_command(options);
  plan.nproc = resolve_nproc(options.nproc_per_node);

  auto check_rank_map = [&](const char* flag, int max_rank) {
    if (max_rank >= plan.nproc) {
      throw UsageError(std::string(flag) + " names local rank " + std::to_string(max_rank) + " but there are only " +
                       std::to_string(plan.nproc) + " workers per node");
    }
  };
  check_rank_map("--redirects", options.redirects.max_rank());
  check_rank_map("--tee", options.tee.max_rank());
  if (options.local_ranks_filter) check_rank_map("--local_ranks_filter", *options.local_ranks_filter->rbegin());

  if (options.standalone) {
    plan.master_port = options.master_port ? *options.master_port : pick_free_port();
  } else {
    plan.master_port = options.master_port.value_or(kDefaultMasterPort);
  }
  // One node: rank 0 binds MASTER_PORT. Several: node 0 hosts the store there (it says so itself
  // if it cannot); the other nodes only connect to it.
  // A port the user chose must be had; the default (29500) may be another job's on this
  // machine, and then this one takes a free port rather than fail as torchrun would.
  if (options.nnodes == 1) {
    if (std::string why = port_unavailable_reason(plan.master_port); !why.empty()) {
      if (options.master_port) {
        throw LaunchError("master port " + std::to_string(plan.master_port) + " cannot be bound (" + why +
                          "); pick another with --master_port or use --standalone");
      }
      int taken = plan.master_port;
      plan.master_port = pick_free_port();
      spdlog::warn("the default master port {} is taken ({}): MASTER_PORT is {} for this job; --master_port "
                   "chooses one", taken, why, plan.master_port);
    }
  }

  // The other nodes (and, on node 0, the workers as MASTER_ADDR) will connect to it:
  // an address that is not this host's would only surface as their timeouts.
  if (options.local_addr) {
    if (std::string why = foreign_address_reason(*options.local_addr); !why.empty()) {
      throw LaunchError("--local_addr " + *options.local_addr + " is not an address of this host (" + why +
                        "); give one of its own addresses, which the other nodes can reach");
    }
  }

  plan.launch_id = generate_run_id();
  plan.run_id = options.run_id.empty() ? generate_run_id() : options.run_id;
  plan.hostname = local_hostname();
  plan.set_omp_num_threads =
      ddp::contract::WorkerEnv::wants_single_omp_thread(ddp::contract::Variables::from_process(), plan.nproc);

  if (options.virtual_local_rank) plan_visible_devices(plan);
  if (options.numa_binding != NumaBinding::None) plan.numa = plan_numa_binding(options.numa_binding, plan.nproc);

  // torchrun keeps logs when asked for a log dir, and makes a temporary one when
  // --redirects/--tee/--duplicate_*_filters need files but no dir was given.
  bool duplicates = !options.duplicate_stdout_filters.empty() || !options.duplicate_stderr_filters.empty();
  if (options.log_dir) {
    plan.log_base = std::filesystem::path(*options.log_dir);
  } else if (options.redirects.any() || options.tee.any() || duplicates) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ddprun_XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw LaunchError("cannot create a temporary log dir: " + std::string(std::strerror(errno)));
    }
    plan.log_base = std::filesystem::path(tmpl);
  }
  set_run_id(plan, plan.run_id);
  // Several nodes without --rdzv_id take node 0's run id later; their folders wait for it.
  if (plan.log_root && (options.nnodes == 1 || !options.run_id.empty())) create_log_dirs(plan, 0);
  return plan;
}

void set_run_id(LaunchPlan& plan, const std::string& run_id) {
  plan.run_id = run_id;
  if (plan.log_base) plan.log_root = *plan.log_base / (run_id == "none" ? "none_" + plan.launch_id : run_id);
}

std::filesystem::path worker_log_dir(const LaunchPlan& plan, int attempt, int local_rank) {
  return *plan.log_root / ("attempt_" + std::to_string(attempt)) / std::to_string(local_rank);
}

void create_log_dirs(const LaunchPlan& plan, int attempt) {
  for (int lr = 0; lr < plan.nproc; ++lr) {
    std::filesystem::path dir = worker_log_dir(plan, attempt, lr);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw LaunchError("cannot create log dir '" + dir.string() + "': " + ec.message());
    if (access(dir.c_str(), W_OK) != 0) {
      throw LaunchError("log dir '" + dir.string() + "' is not writable: " + std::strerror(errno));
    }
  }
}

}  // namespace ddprun
