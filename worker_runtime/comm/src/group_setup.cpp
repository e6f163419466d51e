// Helpers for forming groups (backend.hpp): the all-ranks exchange through the
// store, and narrowing a group's store to a key prefix.
#include <unordered_set>

#include "backend.hpp"
#include "rdzv/prefix_store.hpp"

namespace ddp::detail {

std::vector<std::string> exchange_all(rdzv::Store& store, const std::string& prefix, int rank, int size,
                                      const std::string& mine, Millis timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  store.set(keys[static_cast<size_t>(rank)], mine);
  try {
    return store.multi_get(keys, timeout);
  } catch (const rdzv::StoreTimeout& e) {
    // The timeout names the keys still missing (a store server older than that list
    // names none: then ask the store).
    const std::unordered_set<std::string> absent(e.missing_keys().begin(), e.missing_keys().end());
    std::string missing;
    for (int r = 0; r < size; ++r) {
      const std::string& key = keys[static_cast<size_t>(r)];
      if (absent.empty() ? !store.check({key}) : absent.count(key) != 0)
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw Timeout("process group: ranks " + missing + " did not join within " + std::to_string(timeout.count()) + " ms");
  }
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
