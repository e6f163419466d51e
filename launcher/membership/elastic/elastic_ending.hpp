// How a running elastic attempt ends, as facts in the store that every node reads
// alike (store_keys.hpp has the keys). Any node may write them, on any connection:
//
//   - The attempt's closing key is the one arbiter of "did a node finish before the
//     attempt failed?": the first node to read it after a failure fixes it ("failed"
//     when still free), so a later claim_finish cannot change the answer.
//   - A grow, once started (closing = "grow <id>"), is finished by whoever sees it: the
//     newcomer may die between its two compare_sets, and the attempt must still end.
//   - A member marked lost (elastic/lost/<id>) before its failure will was set ends the
//     attempt all the same: the watcher looks for that mark.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/failure_notice.hpp"
#include "rdzv/store.hpp"

namespace ddprun::elastic {

// The closing key's value when a failure came first (no finish, no grow any more).
inline constexpr const char* kClosingFailed = "failed";

// The notice a grow publishes: `host` is the newcomer's.
FailureNotice grow_notice(const std::string& host);

// `notice` ended `attempt` (it is in the failure key). A worker failure or lost node
// after a node of the attempt finished ends the job (kStop) instead of re-forming it;
// the answer is fixed in the store first, so every node gets the same. Other kinds
// come back as they are. Throws rdzv::StoreError.
FailureNotice settle_failure(rdzv::Store& store, int attempt, FailureNotice notice);

// When a grow of `attempt` was started (closing = "grow <id>"): ends the attempt with
// its notice unless something else ended it first. Returns the attempt's first failure
// as agreed, or nothing when no grow was started. Throws rdzv::StoreError.
std::optional<FailureNotice> finish_grow(rdzv::Store& store, int attempt);

// When a member of `attempt` (`members`, group-rank order) is marked lost without
// having finished: ends the attempt with kNodeLost for it unless something else ended
// it first. Returns the first failure as agreed, or nothing when no member is lost.
// Throws rdzv::StoreError.
std::optional<FailureNotice> report_lost_member(rdzv::Store& store, int attempt, const std::vector<int64_t>& members);

}  // namespace ddprun::elastic
