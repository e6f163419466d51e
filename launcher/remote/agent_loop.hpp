// The launching ddprun's one loop over its agents (remote_launch.hpp): starts them,
// relays their output, forwards stop signals as stop lines, and tells how the job
// ended.
//
// How ONE failure summary comes about: the agents are one job (they rendezvous through
// the launcher's store), so a failure anywhere ends every node by itself. Each agent
// started with --agent_stdin prints its full failure summary only when the root cause
// is one of its own workers (or a stop signal that did not come from the launcher), so
// exactly one node's summary, naming host and rank, reaches this console. When every
// agent has exited, if one failed, the launcher reads the failure of the attempt the
// job ended in from its store (store_reader.hpp; a job that restarted past a failure and
// then succeeded exits 0) and adds one line naming the host (as the host list wrote
// it), node and rank, and exits with that failure's status: a node lost (its agent killed, its ssh cut) is named that way
// too, by the notice the other nodes published. With --master_addr (node 0 hosts the
// store) the agents' exit statuses decide instead.
//
// An agent that fails before the job failed anywhere fails the launch: ssh exits 255
// before the agent said it runs (agent_handoff.hpp: unreachable host, refused key), or
// the agent exits before it joined the job (it cannot start). Its host and its last
// stderr line are named, every other agent is told to stop, and the launcher exits 1
// (ssh) or with that agent's status. An ssh exit 255 after the agent ran (connection
// dropped, remote command killed, a worker's own 255) is an ordinary failure.
//
// While no agent has failed, the launcher also looks at its store about once a second:
// a failure there that ends no agent (every remote node cut off, their ssh connections
// hanging until ssh's server alive probes give up) gets the same deadline as an
// agent's failure; a restart past that failure lifts it.
//
// Stop: SIGINT/SIGTERM/SIGHUP/SIGQUIT → "stop <sig>" to every agent (they stop their
// workers: SIGTERM, grace period, SIGKILL); an agent that has not started yet (ssh
// still connecting) cannot read it and has no workers: its ssh gets SIGTERM at once. A
// second one is forwarded too, and the agents then kill their workers at once. Agents
// still running grace period + 10 s later are SIGKILLed (their workers die with them).
// The launcher exits 128+signal.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remote/agent_process.hpp"
#include "store/store_reader.hpp"

namespace ddprun {

struct AgentLoopOptions {
  double grace_period_s = 30;       // the agents' --grace_period
  double heartbeat_timeout_s = 10;  // the agents' --heartbeat_timeout
  std::string run_id;
  StoreReader reader;
  // While an agent has not said it runs (ssh connecting): a line this often naming its
  // host (0: none).
  std::chrono::milliseconds notice_every{30000};
};

class AgentLoop {
 public:
  // Blocks the signals the loop takes through its signalfd, in the calling thread and
  // so in every thread it starts later. Call before any thread starts.
  static void block_signals();

  AgentLoop(std::vector<AgentLaunch> launches, AgentLoopOptions options);
  ~AgentLoop();

  // Starts every agent and runs until all have exited; returns the launcher's status.
  int run();

 private:
  using Clock = std::chrono::steady_clock;
  void start_agents();
  void poll_once();
  void on_signal(int sig);
  void reap_all();
  void on_exit(size_t index);
  void on_timers();
  void watch_store(Clock::time_point now);
  void say_who_is_starting(Clock::time_point now);
  Clock::duration failure_deadline() const;  // after a failure: how long the nodes get to end
  void stop_all(int sig, Clock::duration within);
  void fail_launch(size_t index, const std::string& why, int status);
  int outcome();

  std::vector<AgentLaunch> launches_;
  AgentLoopOptions options_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
  int signal_fd_ = -1;
  int stop_signal_ = 0;
  std::optional<size_t> first_failed_;      // the first agent to exit non-zero
  std::optional<Clock::time_point> settle_at_;  // then: did the job fail, or only that agent?
  std::optional<Clock::time_point> kill_at_;    // then: SIGKILL whatever agent is left
  std::optional<Clock::time_point> give_up_at_; // then: stop waiting for output or exits
  Clock::time_point started_at_{};               // start_agents() ran
  Clock::time_point next_notice_{};              // say_who_is_starting(): the next line
  Clock::time_point next_store_read_{};          // watch_store(): the next look at the store
  std::optional<int> kill_for_attempt_;          // kill_at_ was set for this attempt's failure
  bool killed_ = false;
  std::optional<std::string> launch_failure_;
  int launch_failure_status_ = 1;
};

}  // namespace ddprun
