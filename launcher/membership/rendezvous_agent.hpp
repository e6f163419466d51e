// The agent's side of a multi-node launch: every node's ddprun registers in the
// store, waits for the others, agrees on ranks, watches for failures elsewhere,
// and passes an exit barrier. Keys live under "attempt/<k>/" so a restarted
// group rendezvouses afresh:
//
//   node/<r>       "<host>\n<address>\n<nproc>"   each node, at join
//   master_port    MASTER_PORT, offered by node 0 (store/worker_store.hpp)
//   failure        the first failure anywhere (FailureNotice); also the will every
//                  agent leaves, so a node that dies or is cut off fails the job
//   done/<r>       node r's workers all succeeded (exit barrier)
//   left/<r>       node r passed the barrier (node 0 keeps the store up until all left)
//
// An elastic job (--nnodes MIN:MAX) forms each attempt differently (elastic_join.hpp):
// nodes are known by an id, an attempt's member list is agreed in the store, and <r>
// above is then the node's group rank in the attempt it joined. A grow (a newcomer)
// ends an attempt through its failure key; "finished" in its closing key forbids that.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "ddp/contract/job_records.hpp"
#include "membership/elastic/elastic_join.hpp"
#include "store/job_link.hpp"
#include "store/worker_store.hpp"
#include "job/failure_notice.hpp"
#include "job/job_layout.hpp"
#include "plan/launch_plan.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddprun {

class RendezvousAgent {
 public:
  // Works through `link`, this node's one link to the job's store (connected, and
  // outliving the agent). `stop_signal` is asked between short waits: a non-zero
  // signal number ends the wait (join throws Interrupted, the exit barrier returns a
  // notice). Throws LaunchError.
  // `worker_store` (outliving the agent) offers MASTER_PORT when this node is group
  // rank 0 and serves each joined attempt's torch clients.
  RendezvousAgent(const LaunchPlan& plan, JobLink& link, WorkerStore& worker_store, std::function<int()> stop_signal);
  ~RendezvousAgent();

  // Node 0's run id (TORCHELASTIC_RUN_ID, log folders) becomes everyone's; in an
  // elastic job, the first node's. Then checks this launch's shape against the job's
  // (job_shape.hpp: UsageError when another job runs under this id).
  std::string agree_run_id(const std::string& mine);

  // Registers this node for `attempt` and waits for all nodes. Throws LaunchError
  // naming the nodes that did not join in time. An elastic job may join a later
  // attempt (layout.attempt) and throws JobOver when the job ended without this node
  // (Membership::join has the whole contract).
  JobLayout join(int attempt);

  // Runs `on_failure` (on the watch's thread) when a failure is published for
  // `attempt`, or when the store cannot be reached any more. stop_watch() ends the
  // watch at once.
  void start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure);
  void stop_watch();

  // Publishes a local worker failure; the first one anywhere wins. Returns the winner.
  FailureNotice publish_failure(int attempt, const FailureNotice& notice);

  // Records a worker's exit for every rank to see (in the background: never blocks).
  void publish_exit(int attempt, const ddp::contract::ExitRecord& record) { link_.publish_exit(attempt, record); }

  // After this node's workers succeeded: waits for every node to finish. Returns the
  // failure that ended the job instead, if any.
  std::optional<FailureNotice> exit_barrier(int attempt);

  // Says goodbye (no will fires). The node hosting the store first waits up to
  // `linger` for the others to leave, so their last answers get out. An elastic node
  // first marks itself lost, so no forming attempt waits for it.
  void leave(int attempt, std::chrono::milliseconds linger);

  // Elastic jobs: the job is over (no attempt follows); nodes waiting to be admitted
  // end with `status`. Does nothing in a fixed job.
  void end_job(int status, const std::string& why);

 private:
  struct Watch;
  // multi_get of `keys` in short slices until `timeout`: a stop signal ends it
  // (Interrupted); when `missing` is given, every DDP_WAIT_NOTICE_SEC a line says what
  // it makes of the keys still missing. Throws the last slice's StoreTimeout when time is up.
  std::vector<std::string> patient_multi_get(
      const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
      const std::function<std::string(const std::vector<std::string>& missing)>& missing = {});
  // The watch's thread: waits for a failure of `attempt` in slices (elastic: looking
  // for lost members between them) until one comes or stop_watch().
  void watch(const std::shared_ptr<Watch>& w, int attempt, const std::vector<int64_t>& members,
             const std::function<void(const FailureNotice&)>& on_failure);
  // Waits up to `budget` for the failure key's get parked in the store (parking one
  // first), cut short by stop_watch(): the value, or nothing (still missing, stopping).
  std::optional<std::string> watched_get(const std::shared_ptr<Watch>& w, const std::string& key,
                                         std::chrono::milliseconds budget);
  std::string store_address() const;
  static std::chrono::milliseconds silence_limit(std::chrono::milliseconds heartbeat_timeout);
  JobLayout fixed_join(int attempt);
  // Elastic: once a node of `attempt` finished, a lost node or failed worker ends the
  // job (kStop) instead of re-forming it, as the store's closing key says for every
  // node alike (elastic::settle_failure). Fixed jobs: `notice` as it is.
  FailureNotice after_finish(rdzv::Store& store, int attempt, FailureNotice notice) const;
  // What a node that lost the store is told.
  std::string store_lost_message(const std::string& what) const;

  const LaunchPlan& plan_;
  JobLink& link_;
  WorkerStore& worker_store_;
  rdzv::TcpStore& store_;  // the link's client: registration, barrier, wills, the watch
  std::shared_ptr<Watch> watch_;  // the running watch: its stop flag, its requests' answers
  std::thread watch_thread_;
  std::atomic<bool> failure_seen_{false};
  std::function<int()> stop_signal_;
  std::unique_ptr<ElasticRendezvous> elastic_;  // elastic jobs only
  // The attempt this node joined last (group rank, node count): done/<r>, left/<r>.
  JobLayout layout_;
  int joined_attempt_ = -1;  // layout_.attempt once a join succeeded
};

}  // namespace ddprun
