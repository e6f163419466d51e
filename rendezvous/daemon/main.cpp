// ddp-rendezvous: the rendezvous store as a standalone daemon, serving many jobs
// (each in its own namespace) until SIGTERM or SIGINT.
//
//   ddp-rendezvous --port 29400 --token-file /etc/ddprun/token
//   ddprun --rdzv_endpoint host:29400 --rdzv_id job42 ...   (on every node)
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <cstdlib>

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

}  // namespace

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_logger_st("ddp-rendezvous");
  logger->set_pattern("ddp-rendezvous: %l: %v");
  spdlog::set_default_logger(logger);

  CLI::App app{"ddp-rendezvous: the ddprun rendezvous store as a standalone daemon serving many jobs."};
  app.set_version_flag("--version", std::string("ddp-rendezvous ") + DDPRUN_VERSION);
  rdzv::ServerOptions options;
  options.port = 29400;
  std::string token_file;
  double heartbeat = 10;
  size_t max_memory_mib = options.max_memory >> 20;
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--token-file,--token_file", token_file,
                 "File whose first line is the shared token (else DDPRUN_TOKEN; else no authentication)");
  app.add_option("--max-connections,--max_connections", options.max_connections, "Connections served at once")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  app.add_option("--max-memory-mib,--max_memory_mib", max_memory_mib, "MiB held for clients, all jobs together: keys and values, partly read requests, "
                 "blocked requests, queued replies (PROTOCOL.md)")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--heartbeat-timeout,--heartbeat_timeout", heartbeat,
                 "Seconds after which an unreachable client is dropped (0: never)")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    spdlog::error("{}", e.what());
    return 2;
  }
  options.max_memory = max_memory_mib << 20;
  options.heartbeat_timeout = rdzv::Millis(static_cast<int64_t>(heartbeat * 1000));

  try {
    options.token = rdzv::configured_token(token_file);
    raise_fd_limit();
    boost::asio::io_context io;
    rdzv::StoreServer server(io, options);
    boost::asio::signal_set stop(io, SIGINT, SIGTERM);
    stop.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      spdlog::info("received signal {}; shutting down", sig);
      server.stop();
      io.stop();
    });
    std::printf("ddp-rendezvous listening on %s:%u (%s)\n", options.host.c_str(), server.port(),
                options.token.empty() ? "no authentication" : "token required");
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
