// ddprun: launch one worker per GPU/CPU slot with torchrun's environment, supervise
// them, and exit with the root cause's status. This file parses, logs, builds the
// plan and the job's pieces; the job policy (job_policy.hpp) runs the attempts.
#include <signal.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string.h>

#include "supervise/console.hpp"
#include "errors.hpp"
#include "job/job_policy.hpp"
#include "job_adapters.hpp"
#include "plan/launch_plan.hpp"
#include "plan/master_hint.hpp"
#include "remote/launcher_link.hpp"
#include "cli/options.hpp"
#include "cli/torchrun_flags.hpp"
#include "rdzv/token.hpp"
#include "remote/remote_launch.hpp"
#include "membership/rendezvous_agent.hpp"
#include "diagnose/runtime_file.hpp"
#include "diagnose/stall_monitor.hpp"
#include "diagnose/status.hpp"
#include "store/job_link.hpp"
#include "store/endpoint_store.hpp"
#include "store/store_host.hpp"
#include "store/worker_store.hpp"
#include "supervise/supervisor.hpp"

namespace {

// ddprun's own messages go through the same console writer as the workers' lines,
// so they keep their order and never block the supervisor.
class ConsoleSink : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t text;
    formatter_->format(msg, text);
    ddprun::Console::err().write(fmt::to_string(text));
  }
  void flush_() override {}
};

void set_up_logging() {
  auto logger = std::make_shared<spdlog::logger>("ddprun", std::make_shared<ConsoleSink>());
  logger->set_pattern("ddprun: %l: %v");
  spdlog::set_default_logger(logger);
}

void print_plan(const ddprun::LaunchPlan& plan) {
  const auto& o = plan.options;
  if (o.ranks_by_arrival) {
    spdlog::info("run id {}{}, host {}, {} worker(s) (--nproc_per_node={}), one of {} nodes, node rank by arrival "
                 "(--rdzv_endpoint without --node_rank, or --rdzv_backend=c10d){}",
                 plan.run_id, o.run_id_defaulted ? " (torchrun's default)" : "", plan.hostname, plan.nproc,
                 o.nproc_per_node, o.nnodes,
                 o.node_rank_given ? ", order hint " + std::to_string(o.node_rank) : std::string());
  } else if (o.elastic()) {
    spdlog::info("run id {}, host {}, {} worker(s) (--nproc_per_node={}), elastic job of {} to {} nodes{}", plan.run_id,
                 plan.hostname, plan.nproc, o.nproc_per_node, o.min_nodes, o.nnodes,
                 o.node_rank_given ? ", order hint " + std::to_string(o.node_rank) : std::string());
  } else {
    spdlog::info("run id {}, host {}, {} worker(s) (--nproc_per_node={}), node {} of {}", plan.run_id, plan.hostname,
                 plan.nproc, o.nproc_per_node, o.node_rank, o.nnodes);
  }
  std::string cmd;
  for (const auto& a : plan.command.argv) cmd += (cmd.empty() ? "" : " ") + a;
  spdlog::info("command: {} (exec {})", cmd, plan.command.path);
  if (o.rdzv_host && o.remote.agent_stdin) {
    spdlog::info("rendezvous: the launching ddprun's store at {}:{}, job {}", *o.rdzv_host, o.rdzv_port, plan.run_id);
  } else if (o.rdzv_host) {
    spdlog::info("rendezvous: the store at {}:{} (who hosts it: above), job {}", *o.rdzv_host, o.rdzv_port,
                 plan.run_id);
  } else if (o.nnodes > 1) {
    spdlog::info("rendezvous: node 0's store at {}:{}", o.master_addr, plan.master_port);
  } else {
    spdlog::info("MASTER_ADDR={} MASTER_PORT={}{}{}", o.master_addr, plan.master_port,
                 o.standalone ? " (--standalone: free port)" : "",
                 o.agent_store ? " (ddprun's store serves the workers there)" : " (rank 0 binds it)");
  }
  if (plan.log_root) spdlog::info("logs: {}", plan.log_root->string());
  for (size_t lr = 0; lr < plan.numa.size(); ++lr) {
    const auto& b = plan.numa[lr];
    spdlog::info("--numa_binding={}: local rank {} ({}): CPUs {}, memory node {}",
                 ddprun::numa_binding_name(o.numa_binding), lr, b.device, ddprun::cpu_list_text(b.cpus),
                 b.memory_node);
  }
}

// Where this node's ddprun finds the job: a store it hosts itself (one node, node 0
// without --rdzv_endpoint, or the node a c10d endpoint names), its one link to the
// job's store and, with several nodes, the rendezvous agent. Destroyed in reverse: the
// agent, the link, then the store.
struct Job {
  std::unique_ptr<ddprun::StoreHost> store_host;
  std::unique_ptr<ddprun::WorkerStore> worker_store;  // MASTER_ADDR:MASTER_PORT for torch workers
  std::unique_ptr<ddprun::JobLink> link;
  std::unique_ptr<ddprun::RendezvousAgent> agent;
};

// Many nodes' agents and workers connect to a store this ddprun hosts.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

Job set_up_job(ddprun::LaunchPlan& plan, ddprun::Supervisor& supervisor) {
  const auto& o = plan.options;
  Job job;
  rdzv::ServerOptions server;
  server.heartbeat_timeout = ddprun::to_ms(o.heartbeat_timeout);
  ddprun::JobLinkOptions link;
  link.heartbeat_timeout = ddprun::to_ms(o.heartbeat_timeout);
  if (o.nnodes == 1 && !o.rdzv_host) {
    // The workers' store, with a token nobody else knows: this host only. With the agent
    // store it serves torch's workers too, on MASTER_ADDR:MASTER_PORT as torchrun's agent.
    server.host = o.agent_store ? ddprun::single_node_store_address(o.master_addr) : "127.0.0.1";
    if (o.agent_store) server.port = static_cast<uint16_t>(plan.master_port);
    server.token = link.token = o.token.empty() ? rdzv::generate_token() : o.token;
    try {
      job.store_host = std::make_unique<ddprun::StoreHost>(server);
    } catch (const ddprun::LaunchError& e) {
      // The default port, free a moment ago, was taken since by another job (the plan
      // checked it): any free port serves, as when the plan found it taken.
      if (!o.agent_store || o.master_port) throw;
      spdlog::warn("{}: MASTER_PORT is a free port for this job instead; --master_port chooses one", e.what());
      server.port = 0;
      job.store_host = std::make_unique<ddprun::StoreHost>(server);
    }
    if (o.agent_store) plan.master_port = job.store_host->port();
    job.worker_store = std::make_unique<ddprun::WorkerStore>(o.agent_store, job.store_host.get(), o.verbose);
    link.host = server.host;
    link.port = job.store_host->port();
    link.connect_in_background = true;
    job.link = std::make_unique<ddprun::JobLink>(link);
    return job;
  }
  if (!o.rdzv_host && o.node_rank == 0) {
    server.host = "0.0.0.0";
    server.port = static_cast<uint16_t>(plan.master_port);
    server.token = o.token;
    if (o.token.empty()) ddprun::warn_open_store(plan.master_port);
    raise_fd_limit();
    job.store_host = std::make_unique<ddprun::StoreHost>(server);
  }
  if (o.rdzv_host && !o.remote.agent_stdin) {
    // torchrun's c10d endpoint: this node may be the one to host the store there.
    ddprun::EndpointStoreOptions endpoint;
    endpoint.host = *o.rdzv_host;
    endpoint.port = o.rdzv_port;
    endpoint.is_host = o.rdzv_is_host;
    endpoint.server = server;
    endpoint.server.token = o.token;
    endpoint.single_node = o.nnodes == 1;
    raise_fd_limit();
    ddprun::EndpointStore hosted = ddprun::host_endpoint_store(endpoint);
    job.store_host = std::move(hosted.host);
    // Said before the wait for the store, which may be long (or end the launch).
    if (o.verbose) spdlog::info("rendezvous: {}", hosted.role);
  }
  job.worker_store = std::make_unique<ddprun::WorkerStore>(o.agent_store, job.store_host.get(), o.verbose);
  link.host = o.rdzv_host ? *o.rdzv_host : o.master_addr;
  link.port = o.rdzv_host ? o.rdzv_port : plan.master_port;
  link.token = job.store_host ? job.store_host->token() : o.token;  // a single node's endpoint store: generated
  link.ns = o.rdzv_host ? plan.run_id : "";
  link.connect_timeout = ddprun::to_ms(o.join_timeout);  // node 0 may come later
  link.notice_every = o.wait_notice_every;
  link.stop_signal = [&supervisor] { return supervisor.poll_stop_signal(); };
  job.link = std::make_unique<ddprun::JobLink>(link);
  job.agent = std::make_unique<ddprun::RendezvousAgent>(plan, *job.link, *job.worker_store,
                                                        [&supervisor] { return supervisor.poll_stop_signal(); });
  ddprun::set_run_id(plan, job.agent->agree_run_id(plan.run_id));
  return job;
}

int launch(ddprun::LaunchPlan& plan) {
  // Orphans of the workers are re-parented to ddprun, so none escapes supervision.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  // A closed console must not kill ddprun (and with it the job); writes get EPIPE instead.
  signal(SIGPIPE, SIG_IGN);

  ddprun::Supervisor supervisor(plan);  // forks the orphan guard before any thread starts
  // Only now, with the stop signals' handlers in place (and the guard forked), may the
  // launcher's stop lines turn into signals to this process.
  if (plan.options.remote.agent_stdin) ddprun::watch_launcher_link(plan.options);
  Job job;
  try {
    job = set_up_job(plan, supervisor);
  } catch (const ddprun::Interrupted& stop) {
    if (plan.options.remote.agent_stdin && ddprun::launcher_lost()) {
      spdlog::error("lost the connection to the launching ddprun while joining the rendezvous; no worker was started");
      return ddprun::kExitLaunch;
    }
    spdlog::error("received SIG{} while joining the rendezvous; no worker was started", sigabbrev_np(stop.signal));
    return 128 + stop.signal;
  }
  const auto& o = plan.options;
  if (o.verbose) print_plan(plan);

  ddprun::SupervisorWorkers workers(supervisor, plan, job.agent != nullptr);
  std::unique_ptr<ddprun::Membership> membership;
  if (job.agent) {
    membership = std::make_unique<ddprun::AgentMembership>(*job.agent);
  } else {
    membership = std::make_unique<ddprun::SingleNodeMembership>(plan, *job.link, *job.worker_store);
  }
  // Beside each attempt: stall detection, and the runtime file `ddprun status` reads.
  ddprun::StallMonitorOptions stall;
  stall.timeout_s = o.stall_timeout;
  stall.action = o.stall_stop ? ddprun::StallAction::Stop : ddprun::StallAction::Report;
  stall.run_id = plan.run_id;
  stall.hostname = plan.hostname;
  stall.print = [](const std::string& text) { ddprun::Console::err().write(text); };
  stall.store = [&link = *job.link] { return link.client(); };
  ddprun::StallMonitor stall_monitor(std::move(stall));
  ddprun::RuntimeInfo runtime;
  runtime.run_id = plan.run_id;
  runtime.pid = getpid();
  runtime.hostname = plan.hostname;
  ddprun::RuntimeFile runtime_file(std::move(runtime));

  ddprun::JobPolicyOptions policy;
  policy.watches = {&runtime_file, &stall_monitor};
  policy.node_rank = o.node_rank;
  policy.hostname = plan.hostname;
  policy.max_restarts = o.max_restarts;
  policy.elastic = o.elastic_rounds();
  policy.hosts_store = job.store_host != nullptr;
  policy.print = [](const std::string& text) { ddprun::Console::err().write(text); };
  if (o.remote.agent_stdin) {
    policy.wants_summary = ddprun::agent_wants_summary;
    policy.launcher_lost = ddprun::launcher_lost;
  }
  ddprun::SummaryReports reports(plan);
  return ddprun::JobPolicy(workers, *membership, reports, std::move(policy)).run();
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  int status = run(argc, argv);
  // Everything queued for the console goes out before ddprun exits, unless the console
  // has stopped reading (nothing got out for 2 s).
  ddprun::Console::out().flush(2000);
  ddprun::Console::err().flush(2000);
  return status;
}

int run(int argc, char** argv) {
  // A mask inherited from the parent would hide SIGCHLD and the stop signals from us.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  set_up_logging();
  // A subcommand only as the first argument: `ddprun -- status` runs a program named status.
  if (argc > 1 && std::string_view(argv[1]) == "status") return ddprun::run_status(argc - 1, argv + 1);
  try {
    ddprun::ParsedCommandLine parsed = ddprun::parse_command_line(argc, argv);
    if (!parsed.options) return 0;  // --help / --version
    if (parsed.options->verbose) {
      for (const auto& note : parsed.options->value_notes) spdlog::info("{}", note);
    }
    // What --rdzv_conf took and ignored: a launching ddprun's too.
    for (const auto& note : parsed.options->rdzv_conf_notes) spdlog::info("{}", note);
    for (const auto& note : parsed.options->torchrun_notes) spdlog::info("{}", note);
    if (parsed.options->remote.launching()) return ddprun::run_remote_launch(*parsed.options);
    // Started by a launching ddprun: its handoff (token, variables) comes first.
    if (parsed.options->remote.agent_stdin) ddprun::join_launcher(*parsed.options);
    ddprun::LaunchPlan plan = ddprun::prepare_launch(*parsed.options);
    if (!plan.options.slurm_notes.empty()) {
      std::string taken;
      for (const auto& n : plan.options.slurm_notes) taken += (taken.empty() ? "" : ", ") + n;
      spdlog::info("Slurm step: {}", taken);
    }
    if (plan.set_omp_num_threads) {
      spdlog::warn("OMP_NUM_THREADS is not set; setting it to 1 for each of the {} workers so they do not "
                   "oversubscribe the CPUs (set it yourself to tune)", plan.nproc);
    }
    if (auto hint = ddprun::unused_master_addr_hint(plan.options, std::getenv("MASTER_ADDR"))) {
      spdlog::warn("{}", *hint);
    }
    if (plan.log_root && !plan.options.log_dir) {
      spdlog::info("--redirects/--tee without --log_dir: worker logs go to {}", plan.log_root->string());
    }
    return launch(plan);
  } catch (const ddprun::UsageError& e) {
    spdlog::error("{}", e.what());
    return ddprun::kExitUsage;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return ddprun::kExitLaunch;
  }
}
