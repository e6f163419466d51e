// ddprun: launch one worker per GPU/CPU slot with torchrun's environment, supervise
// them, and exit with the root cause's status.
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <iostream>

#include "errors.hpp"
#include "launch_plan.hpp"
#include "options.hpp"
#include "output.hpp"
#include "summary.hpp"
#include "supervisor.hpp"

namespace {

void set_up_logging() {
  auto logger = spdlog::stderr_logger_st("ddprun");
  logger->set_pattern("ddprun: %l: %v");
  spdlog::set_default_logger(logger);
}

void print_plan(const ddprun::LaunchPlan& plan) {
  const auto& o = plan.options;
  spdlog::info("run id {}, host {}, {} worker(s) (--nproc_per_node={}), world size {}, node {} of {}", plan.run_id,
               plan.hostname, plan.nproc, o.nproc_per_node, plan.world_size, o.node_rank, o.nnodes);
  std::string cmd;
  for (const auto& a : plan.command.argv) cmd += (cmd.empty() ? "" : " ") + a;
  spdlog::info("command: {} (exec {})", cmd, plan.command.path);
  spdlog::info("MASTER_ADDR={} MASTER_PORT={}{}", o.master_addr, plan.master_port,
               o.standalone ? " (--standalone: free port)" : "");
  if (plan.log_root) spdlog::info("logs: {}", plan.log_root->string());
}

int launch(const ddprun::LaunchPlan& plan) {
  // Orphans of the workers are re-parented to ddprun, so none escapes supervision.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // A closed console must not kill ddprun (and with it the job); writes get EPIPE instead.
  signal(SIGPIPE, SIG_IGN);

  ddprun::Supervisor supervisor(plan);
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 && plan.log_root) ddprun::create_log_dirs(plan, attempt);
    ddprun::AttemptResult result = supervisor.run_attempt(attempt);
    if (result.succeeded()) return 0;
    ddprun::write_fully(STDERR_FILENO, ddprun::format_failure_summary(plan, result, attempt));
    if (result.stop_signal == 0 && attempt < plan.options.max_restarts) {
      spdlog::warn("restarting the workers ({} of {} restarts)", attempt + 1, plan.options.max_restarts);
      continue;
    }
    return result.exit_status();
  }
}

}  // namespace

int main(int argc, char** argv) {
  set_up_logging();
  try {
    ddprun::ParsedCommandLine parsed = ddprun::parse_command_line(argc, argv);
    if (!parsed.options) return 0;  // --help / --version
    ddprun::LaunchPlan plan = ddprun::prepare_launch(*parsed.options);
    if (plan.set_omp_num_threads) {
      spdlog::warn("OMP_NUM_THREADS is not set; setting it to 1 for each of the {} workers so they do not "
                   "oversubscribe the CPUs (set it yourself to tune)", plan.nproc);
    }
    if (plan.log_root && !plan.options.log_dir) {
      spdlog::info("--redirects/--tee without --log_dir: worker logs go to {}", plan.log_root->string());
    }
    if (plan.options.verbose) print_plan(plan);
    return launch(plan);
  } catch (const ddprun::UsageError& e) {
    spdlog::error("{}", e.what());
    return ddprun::kExitUsage;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return ddprun::kExitLaunch;
  }
}
