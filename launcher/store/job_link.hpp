// A node's one link to its job's store (DESIGN.md: each process keeps one link to the
// store). The rendezvous agent's requests (registration, wills, the exit barrier,
// elastic rounds), its failure watch, the worker exit records and stall detection all
// go through one client; its link thread does the I/O, sends the heartbeat and writes
// the exit records, so none of them needs a connection or a thread of its own.
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "rdzv/tcp_store.hpp"
#include "store/exit_publisher.hpp"

namespace ddprun {

struct JobLinkOptions {
  std::string host;
  int port = 0;
  std::string token;
  std::string ns;  // the job's namespace: empty on a store a ddprun hosts, the run id on a daemon
  std::chrono::milliseconds connect_timeout{30000};  // nodes start in any order: keep trying until then
  // The store's answers may take this long, and a store unreachable this long counts
  // as lost (the client's io_timeout and heartbeat_timeout).
  std::chrono::milliseconds heartbeat_timeout{10000};
  // While connecting: a line every this long saying so (0: none), and a stop signal
  // (its number, or 0) that ends the wait.
  std::chrono::milliseconds notice_every{0};
  std::function<int()> stop_signal;
  // Connect on a thread of its own, the first use waiting for it: a single node needs
  // nothing from its own store before its workers run, so they start without waiting.
  bool connect_in_background = false;
};

class JobLink {
 public:
  // Connects (or starts to, in the background). Throws LaunchError when the store
  // cannot be reached in time or refuses us, Interrupted when a stop signal came first;
  // in the background, the first use throws that instead.
  explicit JobLink(JobLinkOptions options);
  // Gives the exit records queued a short while to go out, stops the heartbeat and
  // closes without GOODBYE (a will fires): JobLink::close() first to leave cleanly.
  ~JobLink();
  JobLink(const JobLink&) = delete;
  JobLink& operator=(const JobLink&) = delete;

  rdzv::TcpStore& store() const { return *client(); }
  const std::shared_ptr<rdzv::TcpStore>& client() const { return client_.get(); }
  const JobLinkOptions& options() const { return options_; }

  // Pings the store every `every` from the link thread from now on, so a will's
  // silence limit tells a live node from a frozen or lost one.
  void keep_alive(std::chrono::milliseconds every);

  // Records a worker's exit for every rank to see, in the background (exit_publisher.hpp).
  // Never blocks on the store nor throws: without a link, records are dropped (warned once).
  void publish_exit(int attempt, const ddp::contract::ExitRecord& record);

 private:
  struct Heartbeat;

  JobLinkOptions options_;
  std::shared_future<std::shared_ptr<rdzv::TcpStore>> client_;
  std::mutex exits_mu_;                    // publish_exit() may come from any thread
  std::unique_ptr<ExitPublisher> exits_;   // made on first use
  bool exits_failed_ = false;              // no link for them: warned
  std::shared_ptr<Heartbeat> heartbeat_;
};

}  // namespace ddprun
