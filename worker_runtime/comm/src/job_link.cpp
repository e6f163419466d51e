// The worker's store link (job_link.hpp): connecting, with notices, and the one link
// per process under ddprun.
#include "job_link.hpp"

#include <mutex>

#include "ddp/contract/store_keys.hpp"
#include "ddp/contract/waiting.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {
namespace {

long long seconds_of(Clock::duration d) { return std::chrono::round<std::chrono::seconds>(d).count(); }

// Why a connection failed, from a StoreConnectionError's text: "Connection refused".
std::string reason_of(const rdzv::StoreError& e) {
  const std::string what = e.what();
  const auto open = what.rfind('(');
  if (open == std::string::npos || what.back() != ')') return what;
  return what.substr(open + 1, what.size() - open - 2);
}

}  // namespace

std::shared_ptr<rdzv::TcpStore> connect_store(rdzv::TcpStoreOptions so, int rank, Clock::time_point deadline,
                                              Millis notice_every) {
  const auto start = Clock::now();
  const std::string where = so.host + ":" + std::to_string(so.port);
  std::shared_ptr<rdzv::TcpStore> store;
  std::string reason = "no answer";
  contract::Waiting w;
  w.timeout = std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - start));
  w.notice_every = notice_every;
  w.describe = [&] { return "ddp: rank " + std::to_string(rank) + " still waiting for the store at " + where + ": " + reason; };
  const auto end = contract::wait_in_slices(w, [&](Millis budget) {
    so.connect_timeout = std::max(Millis(1), budget);  // the client retries within it
    try {
      store = std::make_shared<rdzv::TcpStore>(so);
      return true;
    } catch (const rdzv::StoreConnectionError& e) {
      reason = reason_of(e);
      return false;
    } catch (const rdzv::StoreError& e) {
      throw Error("cannot reach the store at " + where + ": " + e.what());
    }
  });
  if (end != contract::WaitEnd::kArrived) {
    throw Error("cannot reach the store at " + where + " within " + std::to_string(seconds_of(Clock::now() - start)) +
                " s (" + reason + ")");
  }
  return store;
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
  made->exits = std::make_shared<const ExitWatch>(made->store, ExitWatch::Options{env.restart_count, env.world_size});
  // From now on this rank's progress goes to the job's store (a rank still forming its
  // group shows as alive, with no group yet).
  PublisherOptions p;
  p.key = contract::JobKeys(env.restart_count).progress(env.rank);
  p.rank = env.rank;
  made->publisher = std::make_unique<ProgressPublisher>(made->store, p);
  link = std::move(made);
  return link;
}

}  // namespace ddp::detail
