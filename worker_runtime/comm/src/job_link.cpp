// The worker's store link (job_link.hpp): connecting, with notices, and the one link
// per process under ddprun.
#include "job_link.hpp"

#include <mutex>

#include "ddp/contract/store_keys.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {
std::shared_ptr<rdzv::TcpStore> connect_store(rdzv::TcpStoreOptions so, int rank, Clock::time_point deadline,
                                              Millis notice_every) {
  const auto start = Clock::now();
  const std::string where = so.host + ":" + std::to_string(so.port);
  rdzv::Waiting w;
  w.timeout = std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - start));
  w.notice_every = notice_every;
  rdzv::Connecting c;
  try {
    c = rdzv::connect_waiting(so, w, [&](const std::string& reason) {
      return "ddp: rank " + std::to_string(rank) + " still waiting for the store at " + where + ": " + reason;
    });
  } catch (const rdzv::StoreError& e) {
    throw Error("cannot reach the store at " + where + ": " + e.what());
  }
  if (!c.store) {
    const auto took = std::chrono::round<std::chrono::seconds>(Clock::now() - start).count();
    throw Error("cannot reach the store at " + where + " within " + std::to_string(took) + " s (" + c.reason + ")");
  }
  return c.store;
}

std::shared_ptr<const JobLink> job_link(const contract::WorkerEnv& env, Clock::time_point deadline,
                                        Millis notice_every) {
  static std::mutex mu;
  static std::shared_ptr<JobLink> link;  // let go at exit: the riders stop, then the client
  std::lock_guard lock(mu);
  if (link) return link;
  rdzv::TcpStoreOptions so;
  so.host = env.store->addr;
  so.port = static_cast<uint16_t>(env.store->port);
  so.token = env.store->token;
  so.ns = env.store->ns;
  auto made = std::make_shared<JobLink>();
  made->store = connect_store(so, env.rank, deadline, notice_every);
  // The launcher keys exits and progress by attempt (older launchers: the restart count).
  const int attempt = env.store->attempt >= 0 ? env.store->attempt : env.restart_count;
  made->exits = std::make_shared<const ExitWatch>(made->store, ExitWatch::Options{attempt, env.world_size});
  // From now on this rank's progress goes to the job's store (a rank still forming its
  // group shows as alive, with no group yet).
  PublisherOptions p;
  p.key = contract::JobKeys(attempt).progress(env.rank);
  p.rank = env.rank;
  made->publisher = std::make_unique<ProgressPublisher>(made->store, p);
  link = std::move(made);
  return link;
}

}  // namespace ddp::detail
