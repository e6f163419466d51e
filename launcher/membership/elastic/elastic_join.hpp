// An elastic job's rendezvous over the store (--nnodes MIN:MAX): how one node finds
// the attempt to join, registers, closes it or learns who closed it, asks a running
// attempt to re-form when it arrives (grow), and marks the job's end. The closing
// rule itself is elastic_round.hpp; the keys are contract::JobKeys (store_keys.hpp).
//
// A node's wills: while it waits to be admitted, only elastic/lost/<id> (a node that
// dies before it is a member ends nothing); once a member of attempt k, also
// attempt/<k>/failure (kNodeLost), so its loss ends the attempt and the others
// re-form without it at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "job/job_layout.hpp"
#include "membership/elastic/elastic_round.hpp"
#include "plan/launch_plan.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddprun {

class ElasticRendezvous {
 public:
  // Takes this node's id (elastic/ticket). `store` and `plan` must outlive this.
  // `where`: the store's HOST:PORT, for messages. Throws rdzv::StoreError.
  // `offer_port(address, attempt)`: the port this node registers for `attempt`, MASTER_PORT when it becomes
  // member 0 (WorkerStore::offer_port); unset: a free port.
  ElasticRendezvous(rdzv::TcpStore& store, const LaunchPlan& plan, std::function<int()> stop_signal,
                    std::chrono::milliseconds silence_limit, std::string where,
                    std::function<int(const std::string&, int)> offer_port = {});

  int64_t id() const { return id_; }
  // The member ids (group-rank order) of the attempt join() returned last.
  const std::vector<int64_t>& members() const { return members_; }

  // Joins `attempt` or, when that one is closed without this node, a later one (asking
  // a running attempt below MAX to re-form). Fills the layout but for the store's
  // address, port, token and namespace. Throws Interrupted (stop signal), JobOver
  // (elastic/end seen), LaunchError (fewer than MIN for join_timeout: the job ends;
  // not admitted within join_timeout; bad bytes in the store), rdzv::StoreError;
  // UsageError when MIN = MAX and the job runs with MAX nodes, all alive, for two
  // silence limits after this node came: another job uses the same --rdzv_id.
  JobLayout join(int attempt);

  // This node's workers all succeeded in `attempt`: no grow may end it any more.
  // Returns the attempt's closing record as agreed ("finished"; "grow <id>" when a
  // newcomer asked first; "failed" when a failure came first: elastic_ending.hpp).
  std::string claim_finish(int attempt);
  // Marks this node gone for good, so forming attempts do not wait for it.
  void mark_lost();
  // This node's workers all finished (its done key is set): its loss can no longer end
  // the attempt, so only the "lost" mark stays as its will (a later round, after a failure
  // elsewhere, must not wait for it).
  void withdraw_failure_will();
  // The lost marks (elastic/lost/<id>) of the other nodes that registered for the
  // attempt this node registered for last: a node leaving from its join waits on them.
  std::vector<std::string> others_waiting_lost_keys();
  // Records the job's end for nodes still waiting to be admitted (the first end wins).
  void end_job(int status, const std::string& why);

 private:
  std::optional<std::string> peek(const std::string& key);
  std::optional<elastic::MemberList> read_members(int attempt);
  // Registers for `attempt` (once): wills, member record, joined list, elastic/round.
  void register_for(int attempt);
  // Waits until `attempt` is closed (closing it when the rule says so). `start`: when join began.
  elastic::MemberList wait_round(int attempt, elastic::Clock::time_point start);
  elastic::RoundView view_of(int attempt, const std::optional<elastic::MemberList>& previous);
  int restart_count_after(int attempt, const std::optional<elastic::MemberList>& previous);
  void request_grow(int attempt);
  // The attempt before `attempt` ended the job (a stop, or a failure with no restart
  // left: the members' policy ends there, so nobody re-forms it): throws JobOver.
  void check_previous_ended(int attempt, const elastic::MemberList& previous);
  void check_stop_and_end();
  JobLayout layout_of(int attempt, const elastic::MemberList& members);
  elastic::Registration registration(int attempt, int64_t id);
  // Leaving join() early (stop signal, the job's end, giving up) while `attempt` is
  // closed with this node in it: ends the attempt (kNodeLost), so the other members do
  // not start workers sized for this node. Never throws: this node is leaving anyway.
  void abandon(int attempt) noexcept;

  rdzv::TcpStore& store_;
  const LaunchPlan& plan_;
  std::function<int()> stop_signal_;
  std::chrono::milliseconds silence_limit_;
  std::string where_;
  std::function<int(const std::string&, int)> offer_port_;
  int64_t id_ = -1;
  int registered_ = -1;  // the attempt this node registered for last
  std::vector<int64_t> members_;
};

}  // namespace ddprun
