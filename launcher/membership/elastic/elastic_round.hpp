// An elastic job's rounds, as data: the rule that decides when an attempt's member
// list is closed (and who is in it), and the bytes of the records the agents keep in
// the store for it (store_keys.hpp has the keys). No store here: the rendezvous
// (elastic_join.hpp) takes a snapshot of the store, asks decide_round(), and acts.
//
// Terms: a node's *id* is its ticket (elastic/ticket, taken when its ddprun starts);
// its *order key* is (its --node_rank hint, or kNoHint; its id). An attempt's members
// are sorted by order key: the position is the group rank, so nodes that stay keep
// their relative order. A *stayer* is a member of the previous attempt not marked lost.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace ddprun::elastic {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// The order hint of a node started without --node_rank: after every node that gave one.
inline constexpr int64_t kNoHint = int64_t{1} << 40;

struct Candidate {
  int64_t id = 0;
  int64_t hint = kNoHint;
  bool operator<(const Candidate& o) const { return hint != o.hint ? hint < o.hint : id < o.id; }
};

// What one node knows about an attempt that is still forming.
struct RoundView {
  int min_nodes = 1;
  int max_nodes = 1;
  std::vector<Candidate> joined;  // as registered (duplicates allowed; lost ones included)
  std::set<int64_t> lost;         // ids marked lost (elastic/lost/<id>)
  // The previous attempt, when there is one: its members, and whether it still runs
  // (closed, nothing has ended it yet): then this attempt only gathers newcomers.
  std::optional<std::vector<int64_t>> previous;
  bool previous_running = false;
  Millis last_call{30000};        // first attempt: how long to wait for more than MIN
  Millis join_timeout{600000};    // how long below MIN before giving up
};

// This node's clocks for one attempt (decide_round keeps them up to date).
struct RoundTimers {
  std::optional<Clock::time_point> min_reached;  // since when >= MIN were present
  Clock::time_point below_min_since;             // since when fewer than MIN (or since the start)
  explicit RoundTimers(Clock::time_point start) : below_min_since(start) {}
};

enum class RoundAction {
  kWait,    // ask again shortly
  kClose,   // propose `members` (compare_set: the first proposal wins)
  kGiveUp,  // fewer than MIN for join_timeout: the job ends
};

struct RoundDecision {
  RoundAction action = RoundAction::kWait;
  std::vector<Candidate> members;  // kClose: in group-rank order
  int present = 0;                 // joined and not lost (for messages)
};

// The closing rule. First attempt: close at once when MAX are present, else when
// >= MIN are present and last_call passed since this node saw the MIN-th. Later
// attempt: close as soon as every stayer has rejoined and >= MIN are present
// (newcomers that joined meanwhile included, at most MAX: stayers first, then the
// earliest newcomers); a stayer that neither rejoins nor is marked lost is waited for
// at most join_timeout, even with MAX present. Fewer than MIN for join_timeout: give
// up. While the previous attempt runs: wait.
RoundDecision decide_round(const RoundView& view, RoundTimers& timers, Clock::time_point now);

// A node's registration for one attempt (attempt/<k>/member/<id>).
struct Registration {
  std::string host;
  std::string address;  // where the store saw this node (MASTER_ADDR when it is member 0)
  int nproc = 1;
  int64_t hint = kNoHint;
  int port = 0;         // MASTER_PORT when it is member 0 (WorkerStore::offer_port)
  std::string encode() const;
  // Throws std::invalid_argument naming what is wrong (bytes from another node).
  static Registration decode(const std::string& text);
};

// The closed member list of an attempt (attempt/<k>/members).
struct MemberList {
  int restart_count = 0;
  std::vector<int64_t> ids;  // group-rank order
  std::string encode() const;
  static MemberList decode(const std::string& text);  // throws std::invalid_argument
  // The group rank of `id`, or -1 when it is not a member.
  int rank_of(int64_t id) const;
};

// The ids in an attempt's "joined" record ("<id>\n" each), in joining order, once each.
// Throws std::invalid_argument on anything else.
std::vector<int64_t> decode_joined(const std::string& text);

// elastic/end: "<status>\n<why>".
struct JobEnd {
  int status = 1;
  std::string why;
  std::string encode() const;
  static JobEnd decode(const std::string& text);  // throws std::invalid_argument
};

}  // namespace ddprun::elastic
