// Who a group's ranks are in the job, for the waits that depend on them: their
// global ranks, the job's exit watch (under ddprun), and how often a rank that
// waits for its peers says so.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/contract/job_records.hpp"
#include "ddp/types.hpp"
#include "ddp/work.hpp"
#include "exit_watch.hpp"

namespace ddp::detail {

// Forming a group with an exit watch: how long one wait lasts before the exits of
// the ranks still missing are looked at again.
inline constexpr Millis kFormSlice{200};

struct GroupPeers {
  std::shared_ptr<const ExitWatch> exits;  // null: exits are not published (no ddprun)
  std::vector<int> global_ranks;           // group rank -> global rank; empty: the same
  int me = 0;                              // this rank's global rank (for notices)
  Millis notice_every{30000};              // "still waiting" notices on stderr while forming

  int global(int group_rank) const {
    return global_ranks.empty() ? group_rank : global_ranks[static_cast<size_t>(group_rank)];
  }
  // The peers of a subgroup whose rank i is this group's ranks[i].
  GroupPeers narrow(const std::vector<int>& ranks) const {
    GroupPeers sub = *this;
    sub.global_ranks.clear();
    for (int r : ranks) sub.global_ranks.push_back(global(r));
    return sub;
  }
  // The exit of group rank `r`, once published. Lock-free while nobody has exited.
  std::optional<contract::ExitRecord> exit_of(int group_rank) const {
    if (!exits || exits->generation() == 0) return std::nullopt;
    return exits->record(global(group_rank));
  }
  // Throws PeerError for the first of `group_ranks` (ranks a forming group still
  // waits for) whose exit is published.
  void throw_if_exited(const std::vector<int>& group_ranks) const {
    for (int r : group_ranks) {
      if (const auto exit = exit_of(r))
        throw PeerError(r, "process group: " + exit->describe() + ", before joining the process group");
    }
  }
};

}  // namespace ddp::detail
