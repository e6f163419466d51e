// The launching ddprun (--hostfile/--hosts): sets the job up (run id, token, store,
// one agent per host) and hands it to the loop in agent_loop.cpp, which relays the
// agents' output, forwards stops and tells how the job ended.
#include "remote/remote_launch.hpp"

#include <limits.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "remote/agent_command.hpp"
#include "remote/agent_handoff.hpp"
#include "remote/agent_loop.hpp"
#include "remote/agent_process.hpp"
#include "supervise/console.hpp"
#include "errors.hpp"
#include "remote/hosts.hpp"
#include "remote/propagated_env.hpp"
#include "remote/remote_plan.hpp"
#include "plan/launch_plan.hpp"
#include "plan/local_host.hpp"
#include "rdzv/token.hpp"
#include "store/store_host.hpp"

namespace ddprun {
namespace {

// ssh's ConnectTimeout: as long as mpirun's default wait for a daemon to call back is
// short enough for an unreachable host to fail the launch quickly.
constexpr int kSshConnectTimeoutS = 10;

std::string this_executable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw LaunchError(std::string("cannot find this ddprun's own path: ") + std::strerror(errno));
  return std::string(path, static_cast<size_t>(n));
}

std::string working_directory() {
  char path[PATH_MAX];
  if (getcwd(path, sizeof(path)) == nullptr) {
    throw LaunchError(std::string("cannot read the working directory: ") + std::strerror(errno));
  }
  return path;
}

// The address every host reaches the launcher's store at.
std::string store_address(const LaunchOptions& o, const std::vector<HostEntry>& hosts) {
  if (o.local_addr) return *o.local_addr;
  for (const auto& h : hosts) {
    if (!is_local_host(h.host)) return source_address_towards(h.host);
  }
  return "127.0.0.1";
}

std::string endpoint_text(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

int run_remote_launch(const LaunchOptions& options) {
  const std::vector<HostEntry> hosts = resolve_hosts(options);
  const auto environment = propagated_environment(options);
  const std::string ddprun = options.remote.remote_ddprun ? *options.remote.remote_ddprun : this_executable();
  const std::string cwd = working_directory();
  const std::string run_id = options.run_id.empty() ? generate_run_id() : options.run_id;
  const std::string token = options.token.empty() ? rdzv::generate_token() : options.token;

  // Stop signals and SIGCHLD reach the loop through a signalfd; blocked before any
  // thread starts (the store's) so that no other thread takes them.
  AgentLoop::block_signals();
  signal(SIGPIPE, SIG_IGN);  // an agent gone mid-write gives EPIPE, not death

  std::unique_ptr<StoreHost> store;
  std::optional<std::string> endpoint;
  StoreReader reader;
  if (!options.master_addr_given) {
    rdzv::ServerOptions server;
    server.host = store_address(options, hosts);
    server.port = static_cast<uint16_t>(options.master_port.value_or(0));
    server.token = token;
    server.heartbeat_timeout = to_ms(options.heartbeat_timeout);
    store = std::make_unique<StoreHost>(server);
    endpoint = endpoint_text(server.host, store->port());
    StoreReaderOptions read;
    read.host = server.host;
    read.port = store->port();
    read.token = token;
    read.ns = run_id;
    read.nnodes = static_cast<int>(hosts.size());
    read.max_restarts = options.max_restarts;
    reader = StoreReader(read);
  }

  std::vector<AgentLaunch> launches;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const HostEntry& h = hosts[i];
    AgentPlace place;
    place.node_rank = static_cast<int>(i);
    place.nnodes = static_cast<int>(hosts.size());
    place.nproc_per_node = nproc_for(h, options);
    place.run_id = run_id;
    place.store_endpoint = endpoint;
    AgentHandoff handoff{token, environment};
    // After the -x ones: the host's GPU picks win.
    if (auto devices = cuda_visible_devices(h)) handoff.env.emplace_back("CUDA_VISIBLE_DEVICES", *devices);

    AgentLaunch launch;
    launch.host = h.host;
    launch.node_rank = place.node_rank;
    launch.over_ssh = !is_local_host(h.host);
    launch.cwd = cwd;
    launch.handoff = encode_handoff(handoff);
    if (launch.over_ssh) {
      launch.argv = ssh_argv({options.remote.ssh_command, h.host, cwd, ddprun, agent_arguments(options, place),
                              kSshConnectTimeoutS, options.heartbeat_timeout});
    } else {
      launch.argv = agent_arguments(options, place);
      launch.argv.insert(launch.argv.begin(), ddprun);
    }
    launches.push_back(std::move(launch));
  }

  if (options.verbose) {
    Console::err().write(describe_remote_plan(hosts, environment, options));
    spdlog::info("run id {}; store: {}", run_id, endpoint ? "this ddprun at " + *endpoint : "node 0 at " + options.master_addr);
    std::string cmd;
    for (const auto& a : launches.front().argv) cmd += (cmd.empty() ? "" : " ") + a;
    spdlog::info("node 0's command: {}", cmd);
  }

  AgentLoopOptions loop;
  loop.grace_period_s = options.grace_period;
  loop.heartbeat_timeout_s = options.heartbeat_timeout;
  loop.run_id = run_id;
  loop.reader = reader;
  loop.notice_every = options.wait_notice_every;
  return AgentLoop(std::move(launches), std::move(loop)).run();
}

}  // namespace ddprun
