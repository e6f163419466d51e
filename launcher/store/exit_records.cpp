// Reading an attempt's worker exit records (exit_records.hpp).
#include "store/exit_records.hpp"

#include "ddp/contract/store_keys.hpp"

namespace ddprun {

std::map<int, ddp::contract::ExitRecord> read_exits(rdzv::Store& store, int attempt) {
  const ddp::contract::JobKeys keys(attempt);
  std::map<int, ddp::contract::ExitRecord> exits;
  const int64_t count = store.add(keys.exit_count(), 0);
  for (int64_t n = 0; n < count && n < 100000; ++n) {
    if (!store.check({keys.exit_slot(n)})) continue;  // taken, not written yet
    if (auto e = ddp::contract::ExitRecord::decode(store.get(keys.exit_slot(n), std::chrono::milliseconds(500)))) {
      exits[e->rank] = *e;
    }
  }
  return exits;
}

}  // namespace ddprun
