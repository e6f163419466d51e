// The job policy's view of the job's other nodes (the RendezvousAgent, or a node on
// its own; bound in job_adapters.hpp at the launcher's root; fakes in tests).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "ddp/contract/job_records.hpp"
#include "job/failure_notice.hpp"
#include "job/job_layout.hpp"
#include "job/job_over.hpp"

namespace ddprun {

// The job's nodes, as this node takes part in them.
class Membership {
 public:
  virtual ~Membership() = default;
  // Joins `attempt` with every node and returns this node's view of it. An elastic
  // membership may join a later attempt than asked (a node that arrives while the job
  // runs): layout.attempt says which. Throws Interrupted when a stop signal arrives
  // meanwhile, LaunchError when nodes do not come (an elastic job: fewer than MIN
  // within the join timeout, named in the message), JobOver when the job ended first.
  virtual JobLayout join(int attempt) = 0;
  // Until stop_watch(): calls `on_failure` (from any thread) once a failure anywhere
  // else ends `attempt`.
  virtual void start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure) = 0;
  virtual void stop_watch() = 0;
  // Publishes this node's failure. Returns the job's first failure as every node sees
  // it (maybe another node's), or nothing when no other node takes part in the job.
  virtual std::optional<FailureNotice> publish_failure(int attempt, const FailureNotice& notice) = 0;
  // Tells every rank of `attempt` that one of this node's workers has exited (any
  // status). Returns at once: the record is written in the background.
  virtual void publish_exit(int attempt, const ddp::contract::ExitRecord& record) = 0;
  // After this node's workers all succeeded: waits for every node's. Returns the
  // failure that ended the job instead, if any.
  virtual std::optional<FailureNotice> exit_barrier(int attempt) = 0;
  // Leaves the job; first waits up to `linger` for the others to leave too. An elastic
  // membership also marks this node as gone, so the others re-form without waiting for it.
  virtual void leave(int attempt, std::chrono::milliseconds linger) = 0;
  // The job is over for every node (no restart follows `attempt`; it ends with
  // `status`): nodes still waiting to be admitted hear of it and end too. Before leave().
  virtual void end_job(int attempt, int status, const std::string& why) {
    (void)attempt, (void)status, (void)why;
  }
};

}  // namespace ddprun
