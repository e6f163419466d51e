// A worker's one link to its store (DESIGN.md: each process keeps one link to the
// store). Under ddprun it is the job's store: one client per process, connected by
// the first init(), that every group's requests, the exit watch's standing get and
// the progress records share, driven by the client's one link thread. Elsewhere
// (rank 0 hosts the store) each init() connects its own client.
#pragma once

#include <chrono>
#include <memory>

#include "ddp/contract/worker_env.hpp"
#include "exit_watch.hpp"
#include "progress_publisher.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

// Connects to the store `so` names, trying until `deadline` and saying every
// `notice_every` on stderr that rank `rank` still waits for it, and why. Throws
// Error when the deadline passes or the store refuses us.
std::shared_ptr<rdzv::TcpStore> connect_store(rdzv::TcpStoreOptions so, int rank, Clock::time_point deadline,
                                              Millis notice_every);

// The job's store and what rides on its link. Destroyed in reverse: the riders stop
// before the client goes.
struct JobLink {
  std::shared_ptr<rdzv::TcpStore> store;          // unprefixed: the job's keys
  std::shared_ptr<const ExitWatch> exits;         // the exits of this attempt's ranks
  std::unique_ptr<ProgressPublisher> publisher;   // this rank's progress record
};

// This process's link under ddprun (env.store set): connected on first use, as
// connect_store does, with its exit watch and progress publisher started; later
// calls return the same link. It lasts until the process exits.
std::shared_ptr<const JobLink> job_link(const contract::WorkerEnv& env, Clock::time_point deadline,
                                        Millis notice_every);

}  // namespace ddp::detail
