// The wait-for graph of a stalled job (wait_graph.hpp).
#include "diagnose/wait_graph.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>

namespace ddprun {

using ddp::contract::GroupProgress;
using ddp::contract::OpSummary;

namespace {

// Each group's members: global rank by group rank, from the records that name the
// group (the world group "0" is the identity).
class Members {
 public:
  explicit Members(const ProgressRecords& records) : world_(static_cast<int>(records.size())) {
    for (size_t r = 0; r < records.size(); ++r) {
      if (!records[r]) continue;
      for (const GroupProgress& g : records[r]->groups) {
        auto& by_rank = groups_[g.group];
        if (by_rank.size() < static_cast<size_t>(g.size)) by_rank.resize(static_cast<size_t>(g.size), -1);
        if (g.rank >= 0 && g.rank < g.size) by_rank[static_cast<size_t>(g.rank)] = static_cast<int>(r);
      }
    }
  }
  // The global rank of group rank `rank` of `group`, or -1 where no record tells.
  int global(const std::string& group, int rank) const {
    if (group == "0") return rank >= 0 && rank < world_ ? rank : -1;
    auto it = groups_.find(group);
    if (it == groups_.end() || rank < 0 || rank >= static_cast<int>(it->second.size())) return -1;
    return it->second[static_cast<size_t>(rank)];
  }

 private:
  int world_;
  std::map<std::string, std::vector<int>> groups_;
};

bool in_flight(const OpSummary& op) { return op.state == "queued" || op.state == "started"; }

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::string ranks_word(const std::vector<int>& ranks) {
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

std::string seconds_text(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(std::max<int64_t>(ms, 0)) / 1000.0);
  return text;
}

// "recv #1 from rank 1" (" of group 0.1" outside the world group).
std::string p2p_name(const std::string& group, const ddp::contract::PeerCall& p, int peer_global) {
  std::string name = std::string(p.send() ? "send" : "recv") + " #" + std::to_string(p.op.seq) +
                     (p.send() ? " to " : " from ");
  name += peer_global >= 0 ? "rank " + std::to_string(peer_global)
                           : "group rank " + std::to_string(p.peer) + " (no record names its global rank)";
  return group == "0" ? name : name + " of group " + group;
}

// Whether `peer` has the send or recv that matches `p` of `rank` (in `group`) pending:
// numbers count per peer and direction, so recv #n from A matches A's send #n.
bool matched(const ProgressRecords& records, const Members& members, const std::string& group, int rank,
             const ddp::contract::PeerCall& p, int peer) {
  if (!records[static_cast<size_t>(peer)]) return false;
  for (const GroupProgress& g : records[static_cast<size_t>(peer)]->groups) {
    if (g.group != group) continue;
    for (const auto& q : g.p2p_pending) {
      if (q.send() != p.send() && q.op.seq == p.op.seq && members.global(group, q.peer) == rank) return true;
    }
  }
  return false;
}

// The call `calls` (one rank's) is blocked in: the one entered last, or the started
// call of its group it is queued behind.
size_t blocking_index(const std::vector<BlockedCall>& calls) {
  size_t last = 0;
  for (size_t i = 1; i < calls.size(); ++i) {
    if (calls[i].op->since_ms > calls[last].op->since_ms) last = i;
  }
  if (calls[last].op->state != "queued") return last;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].group == calls[last].group && calls[i].op->state == "started") return i;
  }
  return last;
}

// The calls of one rank.
void add_rank(const ProgressRecords& records, const Members& members, int rank, std::vector<BlockedCall>& out) {
  const auto& rec = records[static_cast<size_t>(rank)];
  if (!rec) return;
  std::vector<BlockedCall> mine;
  for (const GroupProgress& g : rec->groups) {
    if (!g.current || !in_flight(*g.current) || g.issued <= g.completed) continue;
    BlockedCall c;
    c.rank = rank;
    c.name = call_name(g.group, *g.current);
    c.group = g.group;
    c.op = &*g.current;
    for (int m = 0; m < g.size; ++m) {
      const int global = members.global(g.group, m);
      if (global < 0 || global == rank || !records[static_cast<size_t>(global)]) continue;
      for (const GroupProgress& theirs : records[static_cast<size_t>(global)]->groups) {
        if (theirs.group == g.group && theirs.issued < g.current->seq) c.waits_for.push_back(global);
      }
    }
    mine.push_back(std::move(c));
  }
  for (const GroupProgress& g : rec->groups) {
    for (const auto& p : g.p2p_pending) {
      BlockedCall c;
      c.rank = rank;
      c.peer = members.global(g.group, p.peer);
      c.name = p2p_name(g.group, p, c.peer);
      c.group = g.group;
      c.op = &p.op;
      c.p2p = true;
      c.send = p.send();
      c.in_transfer = c.peer >= 0 && matched(records, members, g.group, rank, p, c.peer);
      if (c.peer >= 0 && !c.in_transfer) c.waits_for.push_back(c.peer);
      mine.push_back(std::move(c));
    }
  }
  if (mine.empty()) return;
  const size_t blocking = blocking_index(mine);
  for (size_t i = 0; i < mine.size(); ++i) {
    mine[i].blocking = i == blocking;
    if (!mine[i].blocking) mine[i].waits_for.clear();  // pending, but the rank waits elsewhere
    out.push_back(std::move(mine[i]));
  }
}

// The first cycle of the graph (from the lowest rank on), as the calls along it.
std::vector<const BlockedCall*> find_cycle(const std::vector<BlockedCall>& calls, size_t world) {
  std::vector<std::vector<const BlockedCall*>> of(world);
  for (const BlockedCall& c : calls) of[static_cast<size_t>(c.rank)].push_back(&c);
  enum Colour { kNew, kOnPath, kDone };
  std::vector<Colour> colour(world, kNew);
  std::vector<const BlockedCall*> path;  // path[i]: the call rank i of the path waits in toward the next
  std::vector<int> path_ranks;
  std::vector<const BlockedCall*> cycle;
  std::function<bool(int)> visit = [&](int r) {
    colour[static_cast<size_t>(r)] = kOnPath;
    path_ranks.push_back(r);
    for (const BlockedCall* c : of[static_cast<size_t>(r)]) {
      for (int next : c->waits_for) {
        if (next < 0 || static_cast<size_t>(next) >= world) continue;
        path.push_back(c);
        if (colour[static_cast<size_t>(next)] == kOnPath) {
          const auto at = std::find(path_ranks.begin(), path_ranks.end(), next) - path_ranks.begin();
          cycle.assign(path.begin() + at, path.end());
          return true;
        }
        if (colour[static_cast<size_t>(next)] == kNew && visit(next)) return true;
        path.pop_back();
      }
    }
    colour[static_cast<size_t>(r)] = kDone;
    path_ranks.pop_back();
    return false;
  };
  for (size_t r = 0; r < world; ++r) {
    if (colour[r] == kNew && visit(static_cast<int>(r))) return cycle;
  }
  return {};
}

// "rank 0 waits in recv #1 from rank 1, which waits in recv #1 from rank 0: a deadlock";
// a collective on the way says for whom it waits ("... in barrier #2 of group 0 for rank 1").
std::string describe_cycle(const std::vector<const BlockedCall*>& cycle) {
  std::string out;
  for (size_t i = 0; i < cycle.size(); ++i) {
    const BlockedCall* c = cycle[i];
    const int next = cycle[(i + 1) % cycle.size()]->rank;
    out += i == 0 ? "rank " + std::to_string(c->rank) + " waits in " : ", which waits in ";
    out += c->name;
    if (!c->p2p) out += " for rank " + std::to_string(next);
  }
  return out + ": a deadlock";
}

// "the transfer between rank 0 (send #1) and rank 1 (recv #1) is in flight and does
// not complete", of a send whose peer has the matching recv pending.
std::string transfer_line(const BlockedCall& send) {
  const std::string n = " #" + std::to_string(send.op->seq);
  std::string line = "the transfer between rank " + std::to_string(send.rank) + " (send" + n + ") and rank " +
                     std::to_string(send.peer) + " (recv" + n + ")";
  if (send.group != "0") line += " of group " + send.group;
  return line + " is in flight and does not complete";
}

}  // namespace

std::string call_name(const std::string& group, const OpSummary& op) {
  std::string name = op.what.substr(0, op.what.find(' '));
  return name + " #" + std::to_string(op.seq) + " of group " + group;
}

std::vector<BlockedCall> blocked_calls(const ProgressRecords& records) {
  const Members members(records);
  std::vector<BlockedCall> out;
  for (size_t r = 0; r < records.size(); ++r) add_rank(records, members, static_cast<int>(r), out);
  return out;
}

std::optional<BlockedCall> in_flight_call(const ProgressRecords& records, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= records.size()) return std::nullopt;
  std::vector<BlockedCall> calls;
  add_rank(records, Members(records), rank, calls);
  for (BlockedCall& c : calls) {
    if (c.blocking) return std::move(c);
  }
  return std::nullopt;
}

WaitAnalysis analyse_waits(const ProgressRecords& records, int64_t now_ms) {
  const std::vector<BlockedCall> calls = blocked_calls(records);
  std::vector<std::vector<const BlockedCall*>> of(records.size());
  for (const BlockedCall& c : calls) of[static_cast<size_t>(c.rank)].push_back(&c);
  auto blocked_p2p = [&](int r) {
    std::vector<const BlockedCall*> out;
    for (const BlockedCall* c : of[static_cast<size_t>(r)]) {
      if (c->p2p && c->blocking) out.push_back(c);
    }
    return out;
  };

  WaitAnalysis out;
  std::ostringstream os;
  bool any_p2p = false;
  for (const BlockedCall& c : calls) {
    if (!c.p2p) continue;
    if (!any_p2p) os << "  sends and recvs not completed:\n";
    any_p2p = true;
    os << "    rank " << c.rank << (c.blocking ? " waits in " : " has pending ") << c.name << " (" << c.op->what
       << ", " << c.op->state << ") since " << ddp::contract::clock_time(c.op->since_ms) << ", "
       << seconds_text(now_ms - c.op->since_ms) << "\n";
  }
  // Sends whose recv is posted (and so recvs whose send is): the data should be moving.
  std::string transfer;  // the first one
  std::vector<int> transfer_ranks;
  for (const BlockedCall& c : calls) {
    if (!c.p2p || !c.send || !c.in_transfer) continue;
    const std::string line = transfer_line(c);
    os << "    " << line << "\n";
    if (transfer.empty()) {
      transfer = line;
      transfer_ranks = {std::min(c.rank, c.peer), std::max(c.rank, c.peer)};
    }
  }
  // Collectives that wait for ranks blocked in a send or recv.
  for (const BlockedCall& c : calls) {
    if (c.p2p) continue;
    std::string blocked;
    for (int r : c.waits_for) {
      const auto theirs = blocked_p2p(r);
      if (theirs.empty()) continue;
      blocked += (blocked.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " is blocked in ";
      for (size_t i = 0; i < theirs.size(); ++i) blocked += (i ? ", " : "") + theirs[i]->name;
    }
    if (blocked.empty()) continue;
    os << "    rank " << c.rank << " waits in " << c.name << " for " << ranks_word(c.waits_for) << ": " << blocked
       << "\n";
  }

  const auto cycle = find_cycle(calls, records.size());
  if (!cycle.empty()) {
    out.headline = describe_cycle(cycle);
    os << "  wait-for cycle: " << out.headline << "\n";
    for (const BlockedCall* c : cycle) out.culprits.push_back(c->rank);
    std::sort(out.culprits.begin(), out.culprits.end());
  } else {
    // A send or recv whose peer is in no call at all.
    for (const BlockedCall& c : calls) {
      if (!c.p2p || c.waits_for.empty()) continue;
      const int peer = c.waits_for.front();
      if (!of[static_cast<size_t>(peer)].empty()) continue;
      if (out.headline.empty()) {
        out.headline = "rank " + std::to_string(c.rank) + " waits in " + c.name + ", and rank " +
                       std::to_string(peer) +
                       (records[static_cast<size_t>(peer)] ? " waits in no call" : " has published no progress record");
      }
      if (std::find(out.culprits.begin(), out.culprits.end(), peer) == out.culprits.end()) out.culprits.push_back(peer);
    }
  }
  if (out.headline.empty() && !transfer.empty()) {  // a hung link rather than a deadlock
    out.headline = transfer;
    out.culprits = transfer_ranks;
  }
  if (out.headline.empty() && any_p2p) {  // peers blocked elsewhere, or unknown
    auto first = std::find_if(calls.begin(), calls.end(), [](const BlockedCall& c) { return c.p2p && c.blocking; });
    if (first == calls.end()) first = std::find_if(calls.begin(), calls.end(), [](const BlockedCall& c) { return c.p2p; });
    out.headline = "rank " + std::to_string(first->rank) + (first->blocking ? " waits in " : " has pending ") +
                   first->name + " and it does not complete";
  }
  out.text = os.str();
  return out;
}

}  // namespace ddprun
