// ddp-rendezvous: the rendezvous store as a standalone daemon, serving many jobs
// (each in its own namespace). SIGTERM and SIGINT stop it; SIGHUP re-reads the token
// and secret files.
//
//   ddp-rendezvous --port 29400 --secret-file /etc/ddprun/secret
//   ddp-rendezvous credential --job job42 --secret-file /etc/ddprun/secret > job42.cred
//   ddprun --rdzv_endpoint host:29400 --rdzv_id job42 --rdzv_token_file job42.cred ...   (on every node)
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "heap_blocks.hpp"
#include "metrics_http.hpp"
#include "metrics_text.hpp"
#include "rdzv/server.hpp"
#include "rdzv/token.hpp"

namespace {

// Thousands of clients need thousands of descriptors: raise the soft limit to the hard one.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// Where the daemon's keys come from; read again on SIGHUP.
struct KeyFiles {
  std::string token_file;   // else DDPRUN_TOKEN
  std::string secret_file;  // none: no job credentials

  // Both keys, or StoreError naming the file that could not be read.
  std::pair<std::string, std::string> read() const {
    return {rdzv::configured_token(token_file), secret_file.empty() ? "" : rdzv::read_token_file(secret_file, "secret")};
  }
};

const char* auth_mode(const rdzv::ServerOptions& o) {
  if (o.token.empty()) return o.secret.empty() ? "no authentication" : "job credentials required";
  return o.secret.empty() ? "token required" : "shared token or job credentials required";
}

// --torch-clients ID[=PORT]: which job's namespace torch's TCPStore clients join, on
// the daemon's port or on a port of their own.
struct TorchJob {
  std::string job;
  std::optional<uint16_t> port;  // none: the daemon's --port
};

// Parses the --torch-clients values; nullopt (after logging why) when one is invalid.
std::optional<std::vector<TorchJob>> parse_torch_jobs(const std::vector<std::string>& values) {
  std::vector<TorchJob> jobs;
  bool on_main_port = false;
  for (const auto& v : values) {
    TorchJob t;
    auto eq = v.find('=');
    t.job = v.substr(0, eq);
    if (auto error = rdzv::job_id_error("--torch-clients", t.job)) {
      spdlog::error("{}", *error);
      return std::nullopt;
    }
    if (eq != std::string::npos) {
      const std::string port = v.substr(eq + 1);
      unsigned long n = 0;
      size_t used = 0;
      try {
        n = std::stoul(port, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (port.empty() || used != port.size() || n > 65535) {
        spdlog::error("invalid --torch-clients '{}': expected ID or ID=PORT with a port from 0 to 65535", v);
        return std::nullopt;
      }
      t.port = static_cast<uint16_t>(n);
    } else if (on_main_port) {
      spdlog::error("--torch-clients '{}': one job per listener; give further jobs a port of their own (ID=PORT)", v);
      return std::nullopt;
    } else {
      on_main_port = true;
    }
    jobs.push_back(t);
  }
  return jobs;
}

// The lines about torch connections, written on the store's thread: they go through a
// bounded queue to a thread of their own, so a stderr that stops being read (a paused
// pager, a stuck log shipper) never stalls the store; when the queue is full the
// oldest line is dropped, and the drops are counted (dropped_connection_lines()).
constexpr size_t kConnectionLogQueue = 1024;

std::shared_ptr<spdlog::details::thread_pool>& connection_log_pool() {
  static auto pool = std::make_shared<spdlog::details::thread_pool>(kConnectionLogQueue, 1);
  return pool;
}

spdlog::logger& connection_log() {
  static auto logger = [] {
    auto l = std::make_shared<spdlog::async_logger>("ddp-rendezvous-connections",
                                                    std::make_shared<spdlog::sinks::stderr_sink_mt>(),
                                                    connection_log_pool(), spdlog::async_overflow_policy::overrun_oldest);
    l->set_pattern("ddp-rendezvous: %l: %v");
    return l;
  }();
  return *logger;
}

size_t dropped_connection_lines() { return connection_log_pool()->overrun_counter(); }

// Every torch connection is logged once: it is unauthenticated.
void log_torch_clients(rdzv::ServerOptions& options) {
  options.on_torch_client = [](const std::string& peer, rdzv::Dialect dialect, const std::string& job) {
    connection_log().info("torch client {} ({}) joined job '{}' unauthenticated", peer,
                          dialect == rdzv::Dialect::kTorch ? "torch >= 2.1" : "torch 1.13", job);
  };
}

// A torch client where none is admitted (no --torch-clients) is logged once, with the fix.
void log_refused_torch_clients(rdzv::ServerOptions& options) {
  options.on_torch_refused = [](const std::string& peer) {
    connection_log().warn(
        "refused a torch TCPStore client from {}: this store admits none (ddp-rendezvous --torch-clients ID)", peer);
  };
}

std::string signal_name(int sig) { return std::string("SIG") + sigabbrev_np(sig); }

// SIGHUP: new keys for connections from now on, or the old ones when a file cannot be read.
void reload(rdzv::StoreServer& server, const KeyFiles& files) {
  if (files.token_file.empty() && files.secret_file.empty()) {
    spdlog::info("received SIGHUP: no --token-file or --secret-file to re-read; nothing changed");
    return;
  }
  try {
    auto [token, secret] = files.read();
    server.set_credentials(std::move(token), std::move(secret));
    std::string t = files.token_file.empty() ? "" : "token file '" + files.token_file + "'";
    std::string s = files.secret_file.empty() ? "" : "secret file '" + files.secret_file + "'";
    spdlog::info("received SIGHUP: re-read {}{}{}; new connections need the new keys, connected ones go on", t,
                 t.empty() || s.empty() ? "" : " and ", s);
  } catch (const std::exception& e) {
    spdlog::error("received SIGHUP: {}; keeping the previous keys", e.what());
  }
}

// `ddp-rendezvous credential --job ID`: prints the job's credential.
int print_credential(const std::string& secret_file, const std::string& job) {
  if (secret_file.empty()) {
    spdlog::error("credential: needs --secret-file, the file the daemon's --secret-file names");
    return 2;
  }
  if (auto error = rdzv::job_id_error("--job", job)) {
    spdlog::error("credential: {}", *error);
    return 2;
  }
  std::printf("%s\n", rdzv::job_credential(rdzv::read_token_file(secret_file, "secret"), job).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rdzv::heap::tune_allocator();  // what the memory budget charges stays what the process holds
  auto logger = spdlog::stderr_logger_st("ddp-rendezvous");
  logger->set_pattern("ddp-rendezvous: %l: %v");
  spdlog::set_default_logger(logger);

  CLI::App app{"ddp-rendezvous: the ddprun rendezvous store as a standalone daemon serving many jobs."};
  app.set_version_flag("--version", std::string("ddp-rendezvous ") + DDPRUN_VERSION);
  rdzv::ServerOptions options;
  options.port = 29400;
  KeyFiles files;
  double heartbeat = 10;
  size_t max_memory_mib = options.max_memory >> 20;
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--token-file,--token_file", files.token_file,
                 "File whose first line is the shared token, which opens every job (else DDPRUN_TOKEN)");
  const char* secret_help = "File whose first line is the secret each job's credential is derived from";
  app.add_option("--secret-file,--secret_file", files.secret_file, secret_help);
  app.add_option("--max-connections,--max_connections", options.max_connections, "Connections served at once")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  app.add_option("--max-memory-mib,--max_memory_mib", max_memory_mib, "MiB held for clients, all jobs together: keys and values, partly read requests, "
                 "blocked requests, queued replies (PROTOCOL.md)")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--heartbeat-timeout,--heartbeat_timeout", heartbeat,
                 "Seconds after which an unreachable client is dropped (0: never)")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  rdzv::metrics::HttpOptions metrics;
  CLI::Option* metrics_port = app.add_option("--metrics-port,--metrics_port", metrics.port,
      "Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, printed at start; unset: none)")
      ->check(CLI::Range(0, 65535));
  CLI::Option* metrics_host = app.add_option("--metrics-host,--metrics_host", metrics.host,
                                             "Address the metrics endpoint listens on (default: --host)")
                                  ->needs(metrics_port);
  std::vector<std::string> torch_values;
  app.add_option("--torch-clients,--torch_clients", torch_values,
                 "ID or ID=PORT, repeatable: admit PyTorch's TCPStore clients (torch.distributed.TCPStore, "
                 "torchrun's c10d rendezvous) into the job with this id (ddprun's --rdzv_id), on --port beside "
                 "ddprun's own clients (one job), or on PORT (a listener of its own, same store and memory budget). "
                 "UNAUTHENTICATED: anyone who can reach the port can read and write that job's keys");
  std::string job;
  CLI::App* credential = app.add_subcommand("credential", "Print a job's credential (its --rdzv_token_file) and exit");
  credential->add_option("--job", job, "The job id (ddprun's --rdzv_id)")->required();
  credential->add_option("--secret-file,--secret_file", files.secret_file, secret_help);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  options.max_memory = max_memory_mib << 20;
  auto torch_jobs = parse_torch_jobs(torch_values);
  if (!torch_jobs) return 2;
  for (const auto& t : *torch_jobs) {
    if (!t.port) options.torch_namespace = t.job;
  }
  if (!torch_jobs->empty()) log_torch_clients(options);
  log_refused_torch_clients(options);

  try {
    if (credential->parsed()) return print_credential(files.secret_file, job);
    std::tie(options.token, options.secret) = files.read();
    raise_fd_limit();
    boost::asio::io_context io;
    rdzv::StoreServer server(io, options);
    for (const auto& t : *torch_jobs) {  // every port opens before the daemon says it listens
      uint16_t port = t.port ? server.add_torch_listener(*t.port, t.job) : server.port();
      spdlog::warn("admitting torch TCPStore clients, unauthenticated, into job '{}' on port {}", t.job, port);
    }
    std::optional<rdzv::metrics::HttpServer> metrics_http;  // scraped on this thread: stats() needs no lock
    if (metrics_port->count() > 0) {
      if (metrics_host->count() == 0) metrics.host = options.host;
      metrics_http.emplace(io, metrics, [&server] { return rdzv::metrics::exposition(server.stats()); });
    }
    boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
    std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec,
                                                                              int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        reload(server, files);
        signals.async_wait(on_signal);
        return;
      }
      spdlog::info("received {}: stopped accepting; closing {} open connection(s) and exiting", signal_name(sig),
                   server.stats().connections);
      if (size_t dropped = dropped_connection_lines(); dropped > 0) {
        spdlog::warn("{} line(s) about torch connections were dropped: stderr did not keep up", dropped);
      }
      server.stop();
      io.stop();
    };
    signals.async_wait(on_signal);
    std::printf("ddp-rendezvous listening on %s:%u (%s)\n", options.host.c_str(), server.port(), auth_mode(options));
    if (metrics_http) {
      bool v6 = metrics.host.find(':') != std::string::npos;
      std::printf("ddp-rendezvous metrics at http://%s%s%s:%u/metrics\n", v6 ? "[" : "", metrics.host.c_str(),
                  v6 ? "]" : "", metrics_http->port());
    }
    std::fflush(stdout);
    while (true) {  // an error escaping one client's handling must not end every job's store
      try {
        io.run();
        return 0;
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
