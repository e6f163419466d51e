#include "membership/rendezvous_agent.hpp"

#include <spdlog/spdlog.h>

#include <string.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <sstream>

#include "ddp/contract/store_keys.hpp"
#include "membership/elastic/elastic_ending.hpp"
#include "membership/job_shape.hpp"
#include "errors.hpp"
#include "store/exit_records.hpp"
#include "rdzv/waiting.hpp"

namespace ddprun {

using Millis = std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// RendezvousAgent
// ---------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

namespace {

// How long the watch's get of the failure key stays parked in the store. The store
// sends a node nothing it did not just ask for while that get is parked, so a node cut
// off meanwhile leaves the store no unacknowledged reply: the keep-alive probes of its
// connection (socket_options.cpp) find it gone, rather than the retransmission backoff
// of a reply, which takes a second or more longer. A get answered "missing" every
// slice sent such a reply every quarter heartbeat timeout.
constexpr Millis kParkFor{60000};

}  // namespace

// What the watch's thread shares with stop_watch() and with the completions of its
// requests (which run on the link thread): the stop flag, and a wake-up for either.
struct RendezvousAgent::Watch {
  std::mutex mu;
  std::condition_variable wake;
  bool stopping = false;
  // The failure key's get parked in the store, if any (the watch's thread alone changes
  // these): its id, its answer once it came (written under `mu`), and when the link is
  // due to have ended it (a guard: it ends it itself by then).
  rdzv::RequestId parked = 0;
  std::shared_ptr<std::optional<rdzv::Outcome<std::string>>> answer;
  Clock::time_point parked_until;
};

RendezvousAgent::RendezvousAgent(const LaunchPlan& plan, JobLink& link, WorkerStore& worker_store,
                                 std::function<int()> stop_signal)
    : plan_(plan), link_(link), worker_store_(worker_store), store_(link.store()), stop_signal_(std::move(stop_signal)) {
  if (plan_.options.elastic_rounds()) {
    try {
      elastic_ = std::make_unique<ElasticRendezvous>(store_, plan_, stop_signal_,
                                                     silence_limit(to_ms(plan_.options.heartbeat_timeout)),
                                                     store_address(),
                                                     [this](const std::string& address, int attempt) {
                                                       // Serving the attempt before the port is registered:
                                                       // no worker reaches the store before it does.
                                                       worker_store_.serve_attempt(link_.options().ns, attempt);
                                                       return worker_store_.offer_port(address);
                                                     });
    } catch (const rdzv::StoreError& e) {
      throw LaunchError(std::string("rendezvous: ") + e.what());
    }
  }
  layout_.node_rank = plan_.options.node_rank;
  layout_.nnodes = plan_.options.nnodes;
  // A few pings per heartbeat timeout, so the server can tell this ddprun is alive
  // (its will carries that silence limit).
  link_.keep_alive(std::max(Millis(250), to_ms(plan_.options.heartbeat_timeout) / 4));
}

RendezvousAgent::~RendezvousAgent() { stop_watch(); }

// The promise to users is end to end: the job has stopped within --heartbeat_timeout of a
// node going silent. So the store declares a node dead a little sooner, keeping a reserve for
// the will to reach the other nodes and for them to stop their workers. Pings come every
// timeout/4, so at least three in a row must be missed before a node counts as dead.
Millis RendezvousAgent::silence_limit(Millis heartbeat_timeout) {
  return heartbeat_timeout - std::min(heartbeat_timeout / 10, Millis(500));
}

std::string RendezvousAgent::store_address() const {
  return link_.options().host + ":" + std::to_string(link_.options().port);
}

std::vector<std::string> RendezvousAgent::patient_multi_get(
    const std::vector<std::string>& keys, Millis timeout,
    const std::function<std::string(const std::vector<std::string>& missing)>& missing) {
  std::vector<std::string> values;
  std::optional<rdzv::StoreTimeout> last;
  int signal = 0;
  rdzv::Waiting w;
  w.timeout = timeout;
  w.slice = kStopCheckEvery;
  w.notice_every = missing ? plan_.options.wait_notice_every : Millis(0);
  w.describe = [&] { return missing(last ? last->missing_keys() : keys); };
  w.say = [](const std::string& line) { spdlog::info("{}", line); };
  w.cancelled = [&] { return (signal = stop_signal_ ? stop_signal_() : 0) != 0; };
  const auto end = rdzv::wait_in_slices(w, [&](Millis budget) {
    try {
      values = store_.multi_get(keys, budget);
      return true;
    } catch (const rdzv::StoreTimeout& e) {
      last = e;
      return false;
    }
  });
  if (end == rdzv::WaitEnd::kCancelled) throw Interrupted{signal};
  if (end == rdzv::WaitEnd::kTimedOut) throw *last;
  return values;
}

std::string RendezvousAgent::agree_run_id(const std::string& mine) {
  try {
    // An elastic job may have no node 0 (a daemon hosts the store): the first comes first.
    // Whoever may set the run id records the job's shape before it: the nodes that wait
    // for the run id then always find the shape of the node they waited for, and a
    // misconfigured node that came early cannot claim the shape ahead of node 0.
    const bool founds = plan_.options.node_rank == 0 || elastic_;
    if (founds) check_job_shape(store_, mine, plan_, store_address());  // before this node registers anything
    std::string agreed = founds ? store_.compare_set(contract::JobKeys::run_id(), "", mine)
                                : patient_multi_get({contract::JobKeys::run_id()}, to_ms(plan_.options.join_timeout),
                                                    [&](const std::vector<std::string>&) {
                                                      return "still waiting for node 0 to join at " + store_address();
                                                    })[0];
    if (!plan_.options.run_id.empty() && agreed != plan_.options.run_id) {
      spdlog::warn("--rdzv_id {} differs from node 0's {}; using node 0's", plan_.options.run_id, agreed);
    }
    if (!founds) check_job_shape(store_, agreed, plan_, store_address());  // before this node registers anything
    return agreed;
  } catch (const rdzv::StoreTimeout&) {
    throw LaunchError("rendezvous: timed out after " + std::to_string(static_cast<int>(plan_.options.join_timeout)) +
                      " s waiting for node rank(s) 0 to join at " + store_address());
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
}

JobLayout RendezvousAgent::join(int attempt) {
  JobLayout layout;
  if (elastic_) {
    try {
      layout = elastic_->join(attempt);
    } catch (const rdzv::StoreConnectionError& e) {
      throw LaunchError("rendezvous: " + store_lost_message(e.what()));
    } catch (const rdzv::StoreError& e) {
      throw LaunchError(std::string("rendezvous: ") + e.what());
    }
  } else {
    layout = fixed_join(attempt);
  }
  layout.store.addr = link_.options().host;
  layout.store.port = link_.options().port;
  layout.store.token = link_.options().token;
  layout.store.ns = link_.options().ns;
  worker_store_.serve_attempt(layout.store.ns, layout.attempt);
  layout_ = layout;
  joined_attempt_ = layout.attempt;
  return layout;
}

std::string RendezvousAgent::store_lost_message(const std::string& what) const {
  std::string text = "the rendezvous store at " + store_address() +
                     " is gone (its host died or this node is cut off): " + what;
  if (elastic_ && !plan_.options.rdzv_host) {
    text += "; node 0 hosted the store, so the job cannot go on without it: to survive losing any node, run a "
            "ddp-rendezvous daemon and pass --rdzv_endpoint";
  }
  return text;
}

FailureNotice RendezvousAgent::after_finish(rdzv::Store& store, int attempt, FailureNotice notice) const {
  if (!elastic_) return notice;
  try {
    return elastic::settle_failure(store, attempt, notice);
  } catch (const rdzv::StoreError&) {
    // Cannot tell: the notice as published.
  }
  return notice;
}

JobLayout RendezvousAgent::fixed_join(int attempt) {
  const LaunchOptions& o = plan_.options;
  const int me = o.node_rank;
  try {
    // If this ddprun dies or is cut off from here on, the server publishes that for us.
    FailureNotice will{me, -1, kExitNodeLost, plan_.hostname,
                       "ddprun was lost (killed, crashed or cut off from the store) while the job ran",
                       NoticeKind::kNodeLost};
    store_.set_will(contract::JobKeys(attempt).failure(), will.encode(), silence_limit(to_ms(o.heartbeat_timeout)));

    // What the other nodes (and as MASTER_ADDR the workers) reach this node at:
    // --local_addr, else the address this node reaches the store from.
    std::string address = o.local_addr.value_or(store_.local_address());
    store_.set(contract::JobKeys(attempt).node(me),
                plan_.hostname + "\n" + address + "\n" + std::to_string(plan_.nproc));
    if (me == 0) {
      // The store serves this attempt's torch namespace before any worker can learn MASTER_PORT.
      worker_store_.serve_attempt(link_.options().ns, attempt);
      store_.set(contract::JobKeys(attempt).master_port(), std::to_string(worker_store_.offer_port(address)));
    }

    std::vector<std::string> keys;
    for (int r = 0; r < o.nnodes; ++r) keys.push_back(contract::JobKeys(attempt).node(r));
    keys.push_back(contract::JobKeys(attempt).master_port());
    std::vector<std::string> values;
    // The timeout names the keys still missing: take the node ranks from it rather than
    // asking again (node 0 may already be gone with its store).
    auto missing_nodes = [&](const std::vector<std::string>& missing_keys) {
      std::string missing;
      for (const auto& key : missing_keys) {
        if (int r = contract::JobKeys(attempt).node_rank_of(key); r >= 0) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      return missing.empty() ? std::string("?") : missing;
    };
    try {
      values = patient_multi_get(keys, to_ms(o.join_timeout), [&](const std::vector<std::string>& missing_keys) {
        return "still waiting for node rank(s) " + missing_nodes(missing_keys) + " of " + std::to_string(o.nnodes) +
               " to join at " + store_address();
      });
    } catch (const rdzv::StoreTimeout& e) {
      const std::string missing = missing_nodes(e.missing_keys());
      // Let the nodes that did join read their own timeout before node 0 takes the store away.
      try {
        store_.set(contract::JobKeys(attempt).left(me), "1");
        if (me == 0 && !o.rdzv_host) {
          std::vector<std::string> joined;
          for (int r = 1; r < o.nnodes; ++r) {
            if (store_.check({keys[r]})) joined.push_back(contract::JobKeys(attempt).left(r));
          }
          patient_multi_get(joined, std::min(to_ms(o.join_timeout), Millis(5000)));
        }
      } catch (const rdzv::StoreError&) {
        // Leaving anyway.
      } catch (const Interrupted&) {
        // Leaving anyway.
      }
      throw LaunchError("rendezvous: timed out after " + std::to_string(static_cast<int>(o.join_timeout)) +
                        " s waiting for node rank(s) " + missing + " of " + std::to_string(o.nnodes) +
                        " to join at " + store_address());
    }

    JobLayout layout;
    layout.attempt = attempt;
    layout.node_rank = me;
    layout.nnodes = o.nnodes;
    layout.restart_count = attempt;  // a fixed job re-forms only after a failure
    std::string node0_address;
    for (int r = 0; r < o.nnodes; ++r) {
      std::istringstream in(values[r]);
      std::string host, addr, nproc;
      std::getline(in, host);
      std::getline(in, addr);
      std::getline(in, nproc);
      int n = std::stoi(nproc);
      if (r < me) layout.rank_offset += n;
      layout.world_size += n;
      if (r == 0) node0_address = addr;
    }
    layout.world_size -= 1;  // started at 1
    // MASTER_ADDR: --master_addr names node 0 when it hosts the store; with a daemon,
    // node 0's own address as the daemon saw it.
    layout.master_addr = o.rdzv_host ? node0_address : o.master_addr;
    layout.master_port = std::stoi(values.back());
    layout.store.prefix = contract::JobKeys(attempt).process_groups();
    layout.store.attempt = attempt;
    return layout;
  } catch (const rdzv::StoreConnectionError& e) {
    throw LaunchError("rendezvous: the store at " + store_address() +
                      " went away while this node waited for the others (node 0 gave up or died): " + e.what());
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
}

void RendezvousAgent::start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure) {
  stop_watch();
  failure_seen_ = false;
  // An elastic attempt may lose a member in a gap its failure will does not cover
  // (between the closing and the will, or a newcomer dying mid-grow): the watch looks
  // for that every quarter heartbeat timeout and ends the attempt for it.
  std::vector<int64_t> members;
  if (elastic_ && layout_.attempt == attempt) members = elastic_->members();
  watch_ = std::make_shared<Watch>();
  watch_thread_ = std::thread([this, w = watch_, attempt, members, on_failure = std::move(on_failure)] {
    watch(w, attempt, members, on_failure);
  });
}

void RendezvousAgent::watch(const std::shared_ptr<Watch>& w, int attempt, const std::vector<int64_t>& members,
                            const std::function<void(const FailureNotice&)>& on_failure) {
  const std::string failure_key = contract::JobKeys(attempt).failure();
  rdzv::Waiting waiting;
  // A fixed job only waits for the failure key; in slices all the same, so a get given
  // up at stop_watch() stays parked in the store a minute at most.
  waiting.slice = elastic_ ? std::max(Millis(100), to_ms(plan_.options.heartbeat_timeout) / 4) : Millis(60000);
  waiting.cancelled = [&] {
    std::lock_guard lock(w->mu);
    return w->stopping;
  };
  std::optional<FailureNotice> news;
  try {
    rdzv::wait_in_slices(waiting, [&](Millis budget) {
      if (elastic_) {
        elastic::report_lost_member(store_, attempt, members);
        elastic::finish_grow(store_, attempt);
      }
      const auto text = watched_get(w, failure_key, budget);
      if (!text) return false;  // no news (or stopping: the next look ends the wait)
      failure_seen_ = true;
      news = after_finish(store_, attempt, FailureNotice::decode(*text));
      return true;
    });
  } catch (const rdzv::StoreError& e) {
    if (!waiting.cancelled()) {  // stopping: a store error is no news then
      failure_seen_ = true;
      news = FailureNotice{0, -1, kExitNodeLost, "", store_lost_message(e.what()), NoticeKind::kStoreLost};
    }
  }
  if (w->answer) store_.cancel(w->parked);  // the answer is no one's business now
  if (news) on_failure(*news);
}

std::optional<std::string> RendezvousAgent::watched_get(const std::shared_ptr<Watch>& w, const std::string& key,
                                                        Millis budget) {
  if (!w->answer) {  // park a get, which outlives this slice (kParkFor says why)
    auto answer = std::make_shared<std::optional<rdzv::Outcome<std::string>>>();
    w->answer = answer;
    w->parked_until = Clock::now() + kParkFor + to_ms(plan_.options.heartbeat_timeout) + Millis(1000);
    w->parked = store_.get_async(key, kParkFor, [w, answer](rdzv::Outcome<std::string> got) {
      std::lock_guard lock(w->mu);
      *answer = std::move(got);
      w->wake.notify_all();
    });
  }
  std::unique_lock lock(w->mu);
  w->wake.wait_until(lock, std::min(Clock::now() + budget, w->parked_until),
                     [&] { return w->answer->has_value() || w->stopping; });
  if (!w->answer->has_value()) {
    lock.unlock();
    if (Clock::now() >= w->parked_until) {  // the link never ended it: give it up, park anew
      store_.cancel(w->parked);
      w->answer.reset();
    }
    return std::nullopt;  // no news this slice (or stopping: the next look ends the wait)
  }
  rdzv::Outcome<std::string> got = std::move(**w->answer);
  lock.unlock();
  w->answer.reset();
  try {
    return got.get();
  } catch (const rdzv::StoreTimeout&) {
    return std::nullopt;  // the parked get ran out: the next slice parks another
  }
}

void RendezvousAgent::stop_watch() {
  if (!watch_thread_.joinable()) return;
  {
    std::lock_guard lock(watch_->mu);
    watch_->stopping = true;
  }
  watch_->wake.notify_all();
  watch_thread_.join();
  watch_.reset();
}

FailureNotice RendezvousAgent::publish_failure(int attempt, const FailureNotice& notice) {
  try {
    return after_finish(store_, attempt,
                        FailureNotice::decode(store_.compare_set(contract::JobKeys(attempt).failure(), "", notice.encode())));
  } catch (const rdzv::StoreError& e) {
    spdlog::error("could not publish the failure to the store: {}", e.what());
    return notice;
  }
}

namespace {

bool every_worker_succeeded(rdzv::Store& store, int attempt, int world_size) {
  const auto exits = read_exits(store, attempt);
  for (int r = 0; r < world_size; ++r) {
    auto it = exits.find(r);
    if (it == exits.end() || !it->second.succeeded()) return false;
  }
  return true;
}

}  // namespace

std::optional<FailureNotice> RendezvousAgent::exit_barrier(int attempt) {
  const LaunchOptions& o = plan_.options;
  const int me = layout_.node_rank;
  std::vector<std::string> done;
  for (int r = 0; r < layout_.nnodes; ++r) done.push_back(contract::JobKeys(attempt).done(r));
  try {
    if (elastic_) {
      // A finishing job is never re-formed: take the closing key before a newcomer does.
      // If one was first, its grow notice ends this attempt and the policy re-forms.
      // The newcomer may have died between its two compare_sets: the grow notice is
      // then written here, in the store, so every node re-forms (none waits for it).
      if (elastic_->claim_finish(attempt) != "finished") {
        if (auto grow = elastic::finish_grow(store_, attempt)) return grow;
      }
    }
    store_.set(done[me], "1");
    // Done: this node's part of the job is over, so losing it now (frozen or killed
    // while it waits here) must not fail the others. Withdrawn after the done key, so a
    // loss in between is still a failure rather than a wait for a node that never finishes.
    if (elastic_) {
      elastic_->withdraw_failure_will();
    } else {
      store_.set_wills({}, silence_limit(to_ms(o.heartbeat_timeout)));
    }
    // Short waits, so a failure published meanwhile (the watch sees it) ends the wait.
    auto missing_nodes = [&](const std::vector<std::string>& missing_keys) {
      std::string missing;
      for (int r = 0; r < layout_.nnodes; ++r) {
        if (std::find(missing_keys.begin(), missing_keys.end(), done[r]) != missing_keys.end()) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      return missing;
    };
    std::vector<std::string> missing_keys = done;
    std::optional<std::optional<FailureNotice>> outcome;  // set when the wait decided
    rdzv::Waiting w;
    w.timeout = to_ms(o.exit_barrier_timeout);
    w.slice = kStopCheckEvery;
    w.notice_every = o.wait_notice_every;
    w.describe = [&] { return "still waiting for node rank(s) " + missing_nodes(missing_keys) + " to finish"; };
    w.say = [](const std::string& line) { spdlog::info("{}", line); };
    const auto end = rdzv::wait_in_slices(w, [&](Millis budget) {
      if (failure_seen_ || store_.check({contract::JobKeys(attempt).failure()})) {
        FailureNotice notice = FailureNotice::decode(store_.get(contract::JobKeys(attempt).failure(), Millis(1000)));
        // A node lost after every worker of the attempt had exited with status 0 (frozen or
        // killed in its own exit barrier) took nothing from the job: it succeeded. Every
        // node reads the same published exits, so all come to the same verdict.
        if (notice.kind == NoticeKind::kNodeLost && every_worker_succeeded(store_, attempt, layout_.world_size)) {
          spdlog::info("{}, after every worker of the job had finished with status 0: the job succeeded",
                       notice.describe());
          outcome.emplace(std::nullopt);
        } else {
          outcome.emplace(after_finish(store_, attempt, notice));
        }
        return true;
      }
      if (int sig = stop_signal_ ? stop_signal_() : 0; sig != 0) {
        outcome.emplace(publish_failure(attempt, {me, -1, 128 + sig, plan_.hostname,
                                                  std::string("ddprun received SIG") + sigabbrev_np(sig) +
                                                      " while waiting for the other nodes to finish"}));
        return true;
      }
      try {
        store_.wait(done, budget);
        outcome.emplace(std::nullopt);
        return true;
      } catch (const rdzv::StoreTimeout& e) {
        if (!e.missing_keys().empty()) missing_keys = e.missing_keys();
        return false;
      }
    });
    if (end == rdzv::WaitEnd::kArrived) return *outcome;
    std::string missing;
    for (int r = 0; r < layout_.nnodes; ++r) {
      if (!store_.check({done[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    // Published, so the nodes still running learn the job is over.
    return publish_failure(attempt, {me, -1, 1, plan_.hostname,
                                     "exit barrier: node rank(s) " + missing + " did not finish within " +
                                         std::to_string(static_cast<int>(o.exit_barrier_timeout)) + " s"});
  } catch (const rdzv::StoreError& e) {
    return FailureNotice{0, -1, kExitNodeLost, "", "exit barrier: " + store_lost_message(e.what()),
                         NoticeKind::kStoreLost};
  }
}

void RendezvousAgent::leave(int attempt, Millis linger) {
  try {
    std::vector<std::string> left;
    if (elastic_) elastic_->mark_lost();
    if (!elastic_ || joined_attempt_ == attempt) {
      store_.set(contract::JobKeys(attempt).left(layout_.node_rank), "1");
      for (int r = 0; r < layout_.nnodes; ++r) left.push_back(contract::JobKeys(attempt).left(r));
    } else {
      // Never a member of `attempt` (its join ended early): no group rank there to
      // leave under. The nodes that waited beside it mark themselves lost as they go.
      left = elastic_->others_waiting_lost_keys();
    }
    if (linger.count() > 0 && !left.empty()) {
      try {
        patient_multi_get(left, linger);  // in slices: a stop signal ends it
      } catch (const rdzv::StoreTimeout&) {
        // Someone is slow to leave; their answers were sent already.
      }
    }
    store_.close();
  } catch (const rdzv::StoreError&) {
    // Leaving anyway.
  } catch (const Interrupted&) {
    // Leaving anyway.
  }
}

void RendezvousAgent::end_job(int status, const std::string& why) {
  if (!elastic_) return;
  try {
    elastic_->end_job(status, why);
  } catch (const rdzv::StoreError& e) {
    spdlog::warn("could not record the job's end in the store: {}", e.what());
  }
}

}  // namespace ddprun
