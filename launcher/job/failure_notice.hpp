// How a failure travels between the nodes of a job: the notice the first failing
// node publishes (and every agent leaves as its will), and the stop signal that
// ends a wait on the other nodes.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace ddprun {

// What ended an attempt, which decides what comes next (job_policy.hpp):
enum class NoticeKind {
  kWorker,     // a worker failed: a restart may help (one of --max_restarts)
  kNodeLost,   // a node's ddprun died, froze, was cut off, or left on a stop signal:
               // an elastic job re-forms without it (one of --max_restarts); a fixed one ends
  kStop,       // the job was ended on purpose (a stop signal on a fixed job, --stall_action=stop,
               // the exit barrier's timeout): every node ends, no restart
  kGrow,       // a new node asks to join an elastic job below MAX: the nodes re-form with it,
               // and no restart is counted
  kStoreLost,  // this node lost the store (its host died, or this node is cut off): seen
               // locally only, never published; this node can take no further part
};
const char* notice_kind_name(NoticeKind kind);  // "worker", "lost", "stop", "grow", "store-lost"

// Whether an attempt ended by `kind` uses up one of --max_restarts (torchrun's rule:
// failures do, membership changes do not).
inline bool consumes_restart(NoticeKind kind) { return kind != NoticeKind::kGrow; }

// Who failed and how, as published in the store.
struct FailureNotice {
  int node = -1;         // node rank that reported (or that was lost)
  int rank = -1;         // global rank of the failed worker; -1 when a whole node was lost
  int status = 1;        // the exit status every ddprun then exits with
  std::string host;
  std::string what;      // one line: "exited with code 3", "ddprun ... was lost"
  NoticeKind kind = NoticeKind::kStop;

  std::string encode() const;
  // Another node's bytes: host and what come back as printable_text().
  static FailureNotice decode(const std::string& text);
  std::string describe() const;  // "rank 3 on node 1 (host): exited with code 3"
};

// Bytes from another node made safe to print: valid UTF-8 stays as it is; control
// characters (C0, DEL, C1) and bytes that are not UTF-8 become \xNN, one per byte.
std::string printable_text(std::string_view bytes);

// Thrown when a stop signal arrives while the agent waits on the other nodes.
struct Interrupted {
  int signal;
};

// How a stop signal (INT, TERM, HUP, QUIT) ends a wait, in every phase alike: ddprun
// takes signals in one place (the Supervisor's signal set; a launching ddprun's loop
// its signalfd), and every wait of the launcher on the store or on other nodes (the
// store's connect, joining, the nodes of an attempt, the exit barrier, leaving) waits
// in slices of at most this long, asking for a stop signal before each
// (Supervisor::poll_stop_signal); one that came ends the wait with Interrupted.
inline constexpr std::chrono::milliseconds kStopCheckEvery{100};

}  // namespace ddprun
