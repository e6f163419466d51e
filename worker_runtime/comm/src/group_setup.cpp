// Helpers for forming groups (group_setup.hpp): waiting for the ranks' keys (watching
// for exits, saying who is missing), the all-ranks exchange through the store, and
// narrowing a group's store to a key prefix.
#include <algorithm>
#include <unordered_set>

#include "group_setup.hpp"
#include "rdzv/waiting.hpp"
#include "rdzv/prefix_store.hpp"

namespace ddp::detail {
namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// The global ranks among `keys` that a timed-out wait still missed.
std::vector<int> missing_ranks(rdzv::Store& store, const std::vector<RankKey>& keys, const rdzv::StoreTimeout& e) {
  // The timeout names the keys still missing (a store server older than that list
  // names none: then ask the store).
  const std::unordered_set<std::string> absent(e.missing_keys().begin(), e.missing_keys().end());
  std::vector<int> missing;
  for (const RankKey& k : keys)
    if (absent.empty() ? !store.check({k.key}) : absent.count(k.key) != 0) missing.push_back(k.rank);
  return missing;
}

}  // namespace

std::vector<std::string> await_ranks(rdzv::Store& store, const std::vector<RankKey>& keys, Millis timeout,
                                     const GroupPeers& peers) {
  std::vector<std::string> values(keys.size());
  std::vector<size_t> waiting(keys.size());  // indexes into keys of those not read yet
  for (size_t i = 0; i < keys.size(); ++i) waiting[i] = i;
  std::vector<int> missing;  // after a slice: the global ranks still missing
  rdzv::Waiting w;
  w.timeout = timeout;
  // With an exit watch, its news is looked at between short slices; without, only
  // the notices cut the wait.
  if (peers.exits) w.slice = kFormSlice;
  w.notice_every = peers.notice_every;
  w.describe = [&] {
    return "ddp: rank " + std::to_string(peers.me) + " still waiting for rank" + (missing.size() == 1 ? "" : "s") +
           " " + rank_list(missing) + " to join the process group";
  };
  const auto end = rdzv::wait_in_slices(w, [&](Millis budget) {
    std::vector<RankKey> pending;
    std::vector<std::string> names;
    for (size_t i : waiting) {
      pending.push_back(keys[i]);
      names.push_back(keys[i].key);
    }
    try {
      const auto got = store.multi_get(names, std::max(budget, Millis(1)));
      for (size_t j = 0; j < waiting.size(); ++j) values[waiting[j]] = got[j];
      return true;
    } catch (const rdzv::StoreTimeout& e) {
      missing = missing_ranks(store, pending, e);
    }
    peers.throw_if_exited(missing);
    // Keep what arrived: the next slice fetches only the keys still missing.
    if (peers.exits && missing.size() < pending.size()) {
      const std::unordered_set<int> absent(missing.begin(), missing.end());
      std::vector<size_t> still, present;
      std::vector<std::string> present_names;
      for (size_t j = 0; j < pending.size(); ++j) {
        if (absent.count(pending[j].rank) != 0) {
          still.push_back(waiting[j]);
        } else {
          present.push_back(waiting[j]);
          present_names.push_back(pending[j].key);
        }
      }
      const auto got = store.multi_get(present_names, Millis(1000));  // all there already
      for (size_t j = 0; j < present.size(); ++j) values[present[j]] = got[j];
      waiting = std::move(still);
    }
    return false;
  });
  if (end != rdzv::WaitEnd::kArrived) {
    throw Timeout("process group: ranks " + rank_list(missing) + " did not join within " +
                  std::to_string(timeout.count()) + " ms");
  }
  return values;
}

std::vector<std::string> exchange_all(rdzv::Store& store, const std::string& prefix, int rank, int size,
                                      const std::string& mine, Millis timeout, const GroupPeers& peers) {
  std::vector<RankKey> keys;
  for (int r = 0; r < size; ++r) keys.push_back({r, prefix + std::to_string(r)});
  store.set(keys[static_cast<size_t>(rank)].key, mine);
  return await_ranks(store, keys, timeout, peers);
}

GroupSetup with_store_prefix(const GroupSetup& setup, const std::string& prefix) {
  GroupSetup narrowed = setup;
  // The view captures the parent store's shared_ptr, so the parent lives as long as it.
  auto parent = setup.store;
  narrowed.store = std::shared_ptr<rdzv::Store>(new rdzv::PrefixStore(prefix, *parent),
                                                [parent](rdzv::Store* s) { delete s; });
  return narrowed;
}

}  // namespace ddp::detail
