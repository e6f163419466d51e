// Who waits for whom in a stalled job, from every rank's ProgressRecord: each call a
// rank is blocked in (a collective not completed, a send or recv not completed) and
// the ranks it waits for. A send or recv waits for its peer; a collective waits for
// the members of its group that have not arrived at it. A cycle in that graph is a
// deadlock ("rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0").
// Pure functions of the records, so every node computes the same answer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/contract/job_records.hpp"

namespace ddprun {

// Every rank's latest record by global rank; nothing for a rank that published none.
using ProgressRecords = std::vector<std::optional<ddp::contract::ProgressRecord>>;

// "all_reduce #57 of group 0": how reports name a call.
std::string call_name(const std::string& group, const ddp::contract::OpSummary& op);

// One call of a rank not completed. A rank is blocked in one call at a time: the one
// it entered last, or, when that one is queued, the started call of its group it is
// queued behind (a group runs its calls in order). Only that call waits for anyone;
// the others (async ones issued before) are pending but nobody waits in them.
struct BlockedCall {
  int rank = 0;                // global rank of the caller
  std::string name;            // "recv #1 from rank 1", "barrier #2 of group 0"
  std::string group;           // "0", "0.1"
  const ddp::contract::OpSummary* op = nullptr;  // in the records given
  bool p2p = false;            // a send or recv
  bool send = false;           // a send (p2p only)
  int peer = -1;               // global rank of the peer (p2p only; -1: unknown)
  bool blocking = false;       // the call the rank is blocked in
  // A send or recv whose peer has the matching recv or send (same number) pending
  // too: the transfer is in flight, so it waits for no rank (a hung link if it stays).
  bool in_transfer = false;
  std::vector<int> waits_for;  // global ranks: the peer, or the members not arrived (blocking calls only)
};

// Every pending call of every rank, by rank, a rank's collectives before its sends
// and recvs. Points into `records`, which must outlive the result.
std::vector<BlockedCall> blocked_calls(const ProgressRecords& records);

// The call of `rank` to show as in flight (the one it is blocked in), if it waits in one.
std::optional<BlockedCall> in_flight_call(const ProgressRecords& records, int rank);

struct WaitAnalysis {
  // The deadlock, or else the first send/recv whose peer is in no call (or published
  // no record), or else the first transfer in flight, or else the first send/recv;
  // "" when no rank waits in a send or recv and there is no cycle.
  std::string headline;
  std::string text;           // the pending sends and recvs, transfers in flight, and collectives that wait for ranks blocked in one
  std::vector<int> culprits;  // the ranks of the cycle, or the peers in no call, or the two ends of the transfer (else none)
};

// The send/recv and wait-for part of the stall report as of `now_ms` (unix ms).
WaitAnalysis analyse_waits(const ProgressRecords& records, int64_t now_ms);

}  // namespace ddprun
