// Helpers for forming groups (backend.hpp): the all-ranks exchange through the
// store, and narrowing a group's store to a key prefix.
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
  } catch (const rdzv::StoreTimeout&) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!store.check({keys[static_cast<size_t>(r)]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
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
