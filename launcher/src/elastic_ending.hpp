// How a running elastic attempt ends, as facts in the store that every node reads
// alike (store_keys.hpp has the keys). Any node may write them, on any connection:
//
//   - A grow, once started (closing = "grow <id>"), is finished by whoever sees it: the
//     newcomer may die between its two compare_sets, and the attempt must still end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "failure_notice.hpp"
#include "rdzv/store.hpp"

namespace ddprun::elastic {

// The notice a grow publishes: `host` is the newcomer's.
FailureNotice grow_notice(const std::string& host);

// When a grow of `attempt` was started (closing = "grow <id>"): ends the attempt with
// its notice unless something else ended it first. Returns the attempt's first failure
// as agreed, or nothing when no grow was started. Throws rdzv::StoreError.
std::optional<FailureNotice> finish_grow(rdzv::Store& store, int attempt);

}  // namespace ddprun::elastic
