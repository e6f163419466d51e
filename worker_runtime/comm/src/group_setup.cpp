// Helpers for forming groups (group_setup.hpp): waiting for the ranks' keys (watching
// for exits, saying who is missing), the all-ranks exchange through the store, and
// narrowing a group's store to a key prefix.
#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "group_setup.hpp"
#include "rdzv/prefix_store.hpp"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

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

long long whole_seconds(Clock::duration d) {
  return std::chrono::round<std::chrono::seconds>(d).count();
}

}  // namespace

std::vector<std::string> await_ranks(rdzv::Store& store, const std::vector<RankKey>& keys, Millis timeout,
                                     const GroupPeers& peers) {
  std::vector<std::string> values(keys.size());
  std::vector<size_t> waiting(keys.size());  // indexes into keys of those not read yet
  for (size_t i = 0; i < keys.size(); ++i) waiting[i] = i;
  // Without an exit watch there is nothing to look at between slices but the notice.
  const Millis slice = peers.exits ? kFormSlice
                                   : (peers.notice_every.count() > 0 ? peers.notice_every : timeout);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto next_notice = start + peers.notice_every;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    std::vector<RankKey> pending;
    std::vector<std::string> names;
    for (size_t i : waiting) {
      pending.push_back(keys[i]);
      names.push_back(keys[i].key);
    }
    try {
      const auto got = store.multi_get(names, std::clamp(left, Millis(1), slice));
      for (size_t j = 0; j < waiting.size(); ++j) values[waiting[j]] = got[j];
      return values;
    } catch (const rdzv::StoreTimeout& e) {
      const std::vector<int> missing = missing_ranks(store, pending, e);
      peers.throw_if_exited(missing);
      // Keep what arrived: the next slice fetches only the keys still missing.
      if (peers.exits && missing.size() < pending.size()) {
        const std::unordered_set<int> absent(missing.begin(), missing.end());
        std::vector<size_t> still;
        std::vector<std::string> present_names;
        std::vector<size_t> present;
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
      const auto now = Clock::now();
      if (now >= deadline) {
        throw Timeout("process group: ranks " + rank_list(missing) + " did not join within " +
                      std::to_string(timeout.count()) + " ms");
      }
      if (peers.notice_every.count() > 0 && now >= next_notice) {
        std::fprintf(stderr, "ddp: rank %d still waiting for rank%s %s to join the process group (%lld s of %lld s)\n",
                     peers.me, missing.size() == 1 ? "" : "s", rank_list(missing).c_str(), whole_seconds(now - start),
                     whole_seconds(timeout));
        next_notice += peers.notice_every;
      }
    }
  }
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
