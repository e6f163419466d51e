// Exits as ddprun's agents publish them, for tests of the worker runtime's exit
// watch: an ExitWatch on a test store server, and an agent's publishing step.
#pragma once

#include <memory>

#include "ddp/contract/store_keys.hpp"
#include "exit_watch.hpp"
#include "server_fixture.hpp"

namespace testing {

// What an agent does when it reaps a worker (the slot protocol of store_keys.hpp).
inline void publish_exit(rdzv::Store& store, int attempt, const ddp::contract::ExitRecord& r) {
  const ddp::contract::JobKeys keys(attempt);
  store.set(keys.exit_slot(store.add(keys.exit_count(), 1) - 1), r.encode());
}

// A watch of `world` ranks' exits of `attempt` on `server`'s store.
inline std::shared_ptr<const ddp::detail::ExitWatch> watch_exits(const ServerThread& server, int attempt, int world) {
  return std::make_shared<const ddp::detail::ExitWatch>(std::shared_ptr<rdzv::TcpStore>(server.client()),
                                                        ddp::detail::ExitWatch::Options{attempt, world});
}

}  // namespace testing
