// The records the launcher and the worker runtime leave in the job's store so that
// each side knows what the other's processes are doing (keys: store_keys.hpp).
//
//   ExitRecord      a worker's exit, written by its ddprun agent the moment it reaps
//                   the worker; the worker runtime watches them so no rank waits for
//                   a rank that is gone.
//   ProgressRecord  a rank's progress, written by the worker runtime about once a
//                   second: its process groups' collectives so far (from the flight
//                   recorder), optimizer steps, memory. ddprun reads them to tell a
//                   stall from slow work, to explain it, and to answer `ddprun status`.
//
// Both encode to one line of tab-separated name=value fields per record (a progress
// record adds one line per group). Values never hold a tab or a newline (encode
// replaces them). decode() ignores fields it does not know, so a newer writer's
// records still read, and returns nothing for a record it cannot use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::contract {

// Milliseconds since the Unix epoch, now.
int64_t unix_millis_now();
// "12:00:01.234", local time of day of a unix_millis value.
std::string clock_time(int64_t unix_ms);

struct ExitRecord {
  int rank = 0;         // global rank
  int node_rank = 0;    // the node whose agent reaped it
  std::string host;     // that node's host name
  int pid = 0;
  int exit_code = 0;    // when signal is 0
  int signal = 0;       // the signal that killed it, or 0
  int64_t time_ms = 0;  // unix ms when the agent reaped it

  bool succeeded() const { return signal == 0 && exit_code == 0; }
  // "exited with code 0", "was killed by signal 9 (SIGKILL)".
  std::string how() const;
  // "rank 1 exited with code 0 at 12:00:01.234 on node 1 (hostb)".
  std::string describe() const;

  std::string encode() const;
  static std::optional<ExitRecord> decode(std::string_view text);
};

// One collective of a process group, as its flight recorder holds it.
struct OpSummary {
  uint64_t seq = 0;        // the group's sequence number, from 1
  std::string what;        // "all_reduce 262144×f32 sum"
  std::string state;       // "queued", "started", "completed", "failed"
  int64_t since_ms = 0;    // unix ms when it entered that state
};

// A send or recv of a process group that has not completed yet (a rank blocked in it
// waits for `peer`): "recv #1 from rank 1".
struct PeerCall {
  OpSummary op;   // op.seq numbers this rank's sends to (recvs from) `peer`, from 1;
                  // op.what: "recv 4×f32 from 1"; op.state "queued" or "started"
  int peer = -1;  // the group rank it sends to or receives from
  bool send() const { return op.what.rfind("send", 0) == 0; }
};

// One process group of a rank.
struct GroupProgress {
  std::string group;       // "0": the world group; "0.2": its subgroup made by the 3rd new_group
  int rank = 0;            // this rank's rank in the group
  int size = 1;
  uint64_t issued = 0;     // collectives called so far
  uint64_t completed = 0;  // of those, finished (they finish in issue order)
  std::optional<OpSummary> current;         // the last one issued (maybe completed)
  std::optional<OpSummary> last_completed;  // the last one that finished
  uint64_t p2p_completed = 0;   // sends and recvs finished so far
  int64_t p2p_done_ms = 0;      // unix ms when the last of them finished (0: none yet)
  std::vector<PeerCall> p2p_pending;  // sends and recvs not completed, oldest first (a few at most)
};

struct ProgressRecord {
  int rank = 0;           // global rank
  int pid = 0;
  std::string host;
  int64_t time_ms = 0;    // unix ms when written
  uint64_t steps = 0;     // optimizer steps (DDP's own, or ddp::report_step())
  int64_t rss_kb = 0;     // resident memory
  std::vector<GroupProgress> groups;

  std::string encode() const;
  static std::optional<ProgressRecord> decode(std::string_view text);
};

}  // namespace ddp::contract
