// The progress publisher (internal): a thread that writes this rank's ProgressRecord
// (contract/job_records.hpp) to the job's store, so ddprun can tell a stall from slow
// work, explain it across ranks and answer `ddprun status`.
//
// It writes about once a second (a heartbeat: the record's time says how fresh it
// is, changed or not) and at once when a recorded call of any group fails. It has
// its own store connection and never touches the training thread's: a failing call
// only wakes it. A store that went away costs a reconnect attempt per tick, bounded;
// stopping (at exit) aborts a call in flight and joins.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ddp/contract/job_records.hpp"
#include "ddp/contract/worker_env.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp::detail {

struct PublisherOptions {
  rdzv::TcpStoreOptions store;  // the job's store, unprefixed (job keys)
  std::string key;              // where the record goes: JobKeys(attempt).progress(rank)
  int rank = 0;                 // global rank
  std::chrono::milliseconds interval{1000};  // between heartbeats
};

class ProgressPublisher {
 public:
  explicit ProgressPublisher(PublisherOptions options);
  ~ProgressPublisher();  // stops and joins (bounded by the store's timeouts)
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // This process's progress as rank `rank`, now.
  static contract::ProgressRecord snapshot(int rank);

 private:
  void loop();
  void publish();

  PublisherOptions options_;
  int listener_ = -1;  // the failure listener's handle
  int owner_pid_;      // a forked child must not join a thread it does not have

  // What the thread shares; on the heap so that a forked child can leave it alone.
  struct State {
    std::mutex mu;  // guards the fields below; never held during store I/O
    std::condition_variable cv;
    bool stopping = false;
    bool failed = false;  // a call failed since the last publish
    std::shared_ptr<rdzv::TcpStore> client;
  };
  std::unique_ptr<State> state_;
  std::thread thread_;
};

// Starts this process's publisher for a worker started by ddprun (env.store set),
// once: later calls (another init()) do nothing. It stops at exit.
void start_progress_publisher(const contract::WorkerEnv& env);

}  // namespace ddp::detail
