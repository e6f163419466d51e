// The store's key layout for one job: every key the launcher's agents and the
// worker runtime write or read is built here.
//
// A job owns one namespace of the store (on the ddp-rendezvous daemon its --rdzv_id;
// ddprun's own store serves one job). Inside it:
//
//   run_id                        node 0's run id, which every node adopts (an elastic
//                                 job: the first node's, by compare_set)
//   shape                         the job's shape as its first node gave it (compare_set):
//                                 "<--nnodes: N or MIN:MAX>\n<that node's workers>"
//   shape/node/<r>                a fixed job's node r's worker count (compare_set): a
//                                 second launch claiming node rank r with another is refused
//   elastic/ticket                counter (add): each elastic ddprun's node id
//   elastic/lost/<id>             node <id> is gone for good: its will, or leave()
//   elastic/round                 the newest attempt any node opened (where a newcomer
//                                 starts looking), decimal
//   elastic/end                   the job is over: "<status>\n<why>"; waiters end too
//   attempt/<k>/                  one membership of the job (restarts count up)
//     node/<r>                    node r's registration: "<host>\n<address>\n<nproc>"
//     master_port                 the free port on node 0 that becomes MASTER_PORT
//     failure                     the first failure anywhere; also each agent's will
//     done/<r>                    node r's workers all succeeded (exit barrier)
//     left/<r>                    node r passed the barrier
//     exits                       how many workers have exited (a counter: add)
//     exit/<n>                    the n-th worker exit (n from 0), as its agent reaped it
//                                 (ExitRecord): watchers block on the next n
//     progress/<rank>             a rank's progress record (ProgressRecord)
//     stall/<r>                   node r's part of a stall report (its workers' stacks)
//     pg/                         the worker runtime's process groups (DDPRUN_STORE_PREFIX)
//   and, for an elastic job's attempt (node ids from elastic/ticket, group ranks from
//   the closed member list; done/<r> and left/<r> then take group ranks):
//     joined                      ids that joined the attempt: "<id>\n" each (append)
//     member/<id>                 a node's registration:
//                                 "<host>\n<address>\n<nproc>\n<order hint>\n<free port>"
//     members                     the closed member list, set once (compare_set):
//                                 "<restart_count>\n<id> <id> ..." in group-rank order
//     closing                     "finished" (a node's workers all succeeded: no grow) or
//                                 "grow <id>" (a newcomer ends the attempt), compare_set
//
// A process group's keys live under its own prefix (GroupKeys), so groups never
// collide and a restarted attempt starts clean.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::contract {

class JobKeys {
 public:
  // The job's run id, which node 0 sets and the others read.
  static std::string run_id() { return "run_id"; }
  // What the job asks for, so that an unrelated launch reusing its id is told apart.
  static std::string shape() { return "shape"; }
  static std::string node_shape(int node_rank) { return "shape/node/" + std::to_string(node_rank); }

  // An elastic job's keys outside the attempts.
  static std::string elastic_ticket() { return "elastic/ticket"; }
  static std::string elastic_lost(int64_t id);
  static std::string elastic_round() { return "elastic/round"; }
  static std::string elastic_end() { return "elastic/end"; }

  explicit JobKeys(int attempt);
  int attempt() const { return attempt_; }

  std::string node(int node_rank) const;        // a node's registration
  std::string master_port() const;              // MASTER_PORT, chosen by node 0
  std::string failure() const;                  // the job's first failure
  std::string done(int node_rank) const;        // exit barrier: a node's workers succeeded
  std::string left(int node_rank) const;        // a node passed the barrier and left
  // Worker exits, in the order agents reaped them: an agent takes the next slot with
  // add(exit_count(), 1) and sets exit_slot(slot - 1) to the ExitRecord. A watcher
  // blocks in get(exit_slot(n)) for the next one it has not seen.
  std::string exit_count() const;
  std::string exit_slot(int64_t n) const;
  std::string progress(int rank) const;         // a rank's progress record
  std::string stall_report(int node_rank) const;  // a node's part of a stall report
  std::string process_groups() const;           // prefix of the worker runtime's groups
  // An elastic attempt's forming (see the layout above).
  std::string joined() const;
  std::string member(int64_t id) const;
  std::string members() const;
  std::string closing() const;

  // Workers started without ddprun (torchrun, srun, mpirun) use rank 0's own store:
  // their groups' prefix, per run and restart.
  static std::string standalone_process_groups(std::string_view run_id, int restart_count);

  // The node rank in a node(r) key, or -1 when `key` is not one.
  int node_rank_of(std::string_view key) const;

 private:
  std::string at(std::string_view name) const;
  int attempt_;
  std::string prefix_;  // "attempt/<k>/"
};

// Keys inside one process group's prefix. Each exchange is "<topic>/<rank>": every
// rank publishes its record and reads the others'.
namespace group_keys {

// A record of `rank` in exchange `topic` ("info", "watch", ...).
std::string record(std::string_view topic, int rank);
// The prefix of exchange `topic`: record(topic, r) == exchange(topic) + r.
std::string exchange(std::string_view topic);
// A backend's own prefix inside the group ("cpu/", "nccl/").
std::string backend(std::string_view name);
// Subgroup `id` (the id-th new_group call of the group).
std::string subgroup(int id);
// The group's first failure, which every rank then reports alike.
std::string failure();
// The NCCL unique id of the group's communicator.
std::string nccl_unique_id();

// Exchange topics.
inline constexpr std::string_view kAutoNccl = "auto/nccl";  // backend auto: can every rank use NCCL?
inline constexpr std::string_view kInfo = "info";           // CPU transport: host, address, pid
inline constexpr std::string_view kShmReady = "shm_ready";  // shared-memory rings created
inline constexpr std::string_view kShmMapped = "shm_mapped";// and mapped by every local peer
inline constexpr std::string_view kCma = "cma";             // cross-process memory access works
inline constexpr std::string_view kWatch = "watch";         // peer watch: pidfd records

}  // namespace group_keys

}  // namespace ddp::contract
