#include "membership/rendezvous_agent.hpp"

#include <spdlog/spdlog.h>

#include <string.h>

#include <algorithm>
#include <sstream>

#include "ddp/contract/store_keys.hpp"
#include "membership/elastic/elastic_ending.hpp"
#include "errors.hpp"
#include "plan/ports.hpp"
#include "store/exit_records.hpp"

namespace ddprun {

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// RendezvousAgent
// ---------------------------------------------------------------------------

RendezvousAgent::RendezvousAgent(const LaunchPlan& plan, std::string store_host, int store_port, std::string token,
                                 std::string ns, std::function<int()> stop_signal)
    : plan_(plan), store_host_(std::move(store_host)), store_port_(store_port), token_(std::move(token)),
      ns_(std::move(ns)), stop_signal_(std::move(stop_signal)) {
  try {
    store_ = std::make_unique<rdzv::TcpStore>(store_options(to_ms(plan_.options.join_timeout)));
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
  if (plan_.options.elastic()) {
    try {
      elastic_ = std::make_unique<ElasticRendezvous>(*store_, plan_, stop_signal_,
                                                     silence_limit(to_ms(plan_.options.heartbeat_timeout)));
    } catch (const rdzv::StoreError& e) {
      throw LaunchError(std::string("rendezvous: ") + e.what());
    }
  }
  layout_.node_rank = plan_.options.node_rank;
  layout_.nnodes = plan_.options.nnodes;
  heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
  exits_ = std::make_unique<ExitPublisher>(store_options(to_ms(plan_.options.join_timeout)));
}

RendezvousAgent::~RendezvousAgent() {
  stop_watch();
  {
    std::lock_guard lock(heartbeat_mutex_);
    heartbeat_done_ = true;
  }
  heartbeat_stop_.notify_all();
  heartbeat_thread_.join();
}

// The promise to users is end to end: the job has stopped within --heartbeat_timeout of a
// node going silent. So the store declares a node dead a little sooner, keeping a reserve for
// the will to reach the other nodes and for them to stop their workers. Pings come every
// timeout/4, so at least three in a row must be missed before a node counts as dead.
Millis RendezvousAgent::silence_limit(Millis heartbeat_timeout) {
  return heartbeat_timeout - std::min(heartbeat_timeout / 10, Millis(500));
}

void RendezvousAgent::heartbeat_loop() {
  const Millis every = std::max(Millis(250), to_ms(plan_.options.heartbeat_timeout) / 4);
  std::unique_lock lock(heartbeat_mutex_);
  while (!heartbeat_stop_.wait_for(lock, every, [this] { return heartbeat_done_; })) {
    try {
      store_->ping();
    } catch (const rdzv::StoreError&) {
      return;  // the store is gone or we left; the watcher reports what matters
    }
  }
}

std::vector<std::string> RendezvousAgent::patient_multi_get(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    if (int sig = stop_signal_ ? stop_signal_() : 0; sig != 0) throw Interrupted{sig};
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    try {
      return store_->multi_get(keys, std::clamp(left, Millis(0), Millis(500)));
    } catch (const rdzv::StoreTimeout&) {
      if (Clock::now() >= deadline) throw;
    }
  }
}

rdzv::TcpStoreOptions RendezvousAgent::store_options(Millis connect_timeout) const {
  rdzv::TcpStoreOptions o;
  o.host = store_host_;
  o.port = static_cast<uint16_t>(store_port_);
  o.token = token_;
  o.ns = ns_;
  o.connect_timeout = connect_timeout;
  o.io_timeout = to_ms(plan_.options.heartbeat_timeout);
  o.heartbeat_timeout = to_ms(plan_.options.heartbeat_timeout);
  return o;
}

std::string RendezvousAgent::agree_run_id(const std::string& mine) {
  try {
    // An elastic job may have no node 0 (a daemon hosts the store): the first comes first.
    std::string agreed = plan_.options.node_rank == 0 || elastic_ ? store_->compare_set(contract::JobKeys::run_id(), "", mine)
                                                       : patient_multi_get({contract::JobKeys::run_id()}, to_ms(plan_.options.join_timeout))[0];
    if (!plan_.options.run_id.empty() && agreed != plan_.options.run_id) {
      spdlog::warn("--rdzv_id {} differs from node 0's {}; using node 0's", plan_.options.run_id, agreed);
    }
    return agreed;
  } catch (const rdzv::StoreTimeout&) {
    throw LaunchError("rendezvous: timed out after " + std::to_string(static_cast<int>(plan_.options.join_timeout)) +
                      " s waiting for node rank(s) 0 to join at " + store_host_ + ":" + std::to_string(store_port_));
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
  layout.store.addr = store_host_;
  layout.store.port = store_port_;
  layout.store.token = token_;
  layout.store.ns = ns_;
  layout_ = layout;
  joined_attempt_ = layout.attempt;
  return layout;
}

std::string RendezvousAgent::store_lost_message(const std::string& what) const {
  std::string text = "the rendezvous store at " + store_host_ + ":" + std::to_string(store_port_) +
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
    FailureNotice will{me, -1, 1, plan_.hostname,
                       "ddprun was lost (killed, crashed or cut off from the store) while the job ran",
                       NoticeKind::kNodeLost};
    store_->set_will(contract::JobKeys(attempt).failure(), will.encode(), silence_limit(to_ms(o.heartbeat_timeout)));

    // What the other nodes (and as MASTER_ADDR the workers) reach this node at:
    // --local_addr, else the address this node reaches the store from.
    std::string address = o.local_addr.value_or(store_->local_address());
    store_->set(contract::JobKeys(attempt).node(me),
                plan_.hostname + "\n" + address + "\n" + std::to_string(plan_.nproc));
    if (me == 0) store_->set(contract::JobKeys(attempt).master_port(), std::to_string(pick_free_port()));

    std::vector<std::string> keys;
    for (int r = 0; r < o.nnodes; ++r) keys.push_back(contract::JobKeys(attempt).node(r));
    keys.push_back(contract::JobKeys(attempt).master_port());
    std::vector<std::string> values;
    try {
      values = patient_multi_get(keys, to_ms(o.join_timeout));
    } catch (const rdzv::StoreTimeout& e) {
      // The timeout names the keys still missing: take the node ranks from it rather than
      // asking again (node 0 may already be gone with its store).
      std::string missing;
      for (const auto& key : e.missing_keys()) {
        if (int r = contract::JobKeys(attempt).node_rank_of(key); r >= 0) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      if (missing.empty()) missing = "?";
      // Let the nodes that did join read their own timeout before node 0 takes the store away.
      try {
        store_->set(contract::JobKeys(attempt).left(me), "1");
        if (me == 0 && !o.rdzv_host) {
          std::vector<std::string> joined;
          for (int r = 1; r < o.nnodes; ++r) {
            if (store_->check({keys[r]})) joined.push_back(contract::JobKeys(attempt).left(r));
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
                        " to join at " + store_host_ + ":" + std::to_string(store_port_));
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
    return layout;
  } catch (const rdzv::StoreConnectionError& e) {
    throw LaunchError("rendezvous: the store at " + store_host_ + ":" + std::to_string(store_port_) +
                      " went away while this node waited for the others (node 0 gave up or died): " + e.what());
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
}

void RendezvousAgent::start_watch(int attempt, std::function<void(const FailureNotice&)> on_failure) {
  stop_watch();
  stopping_ = false;
  failure_seen_ = false;
  try {
    watcher_ = std::make_unique<rdzv::TcpStore>(store_options(to_ms(plan_.options.heartbeat_timeout)));
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
  // An elastic attempt may lose a member in a gap its failure will does not cover
  // (between the closing and the will, or a newcomer dying mid-grow): the watcher looks
  // for that every quarter heartbeat timeout and ends the attempt for it.
  std::vector<int64_t> members;
  if (elastic_ && layout_.attempt == attempt) members = elastic_->members();
  const Millis slice =
      elastic_ ? std::max(Millis(100), to_ms(plan_.options.heartbeat_timeout) / 4) : Millis(3600 * 1000);
  watch_thread_ = std::thread([this, attempt, members, slice, on_failure = std::move(on_failure)] {
    const std::string failure_key = contract::JobKeys(attempt).failure();
    while (!stopping_) {
      try {
        if (elastic_) {
          elastic::report_lost_member(*watcher_, attempt, members);
          elastic::finish_grow(*watcher_, attempt);
        }
        std::string text = watcher_->get(failure_key, slice);
        failure_seen_ = true;
        on_failure(after_finish(*watcher_, attempt, FailureNotice::decode(text)));
        return;
      } catch (const rdzv::StoreTimeout&) {
        continue;  // no news: look again
      } catch (const rdzv::StoreError& e) {
        if (stopping_) return;
        failure_seen_ = true;
        FailureNotice lost{0, -1, 1, "", store_lost_message(e.what()), NoticeKind::kStoreLost};
        on_failure(lost);
        return;
      }
    }
  });
}

void RendezvousAgent::stop_watch() {
  if (!watch_thread_.joinable()) return;
  stopping_ = true;
  watcher_->abort();
  watch_thread_.join();
  watcher_.reset();
}

FailureNotice RendezvousAgent::publish_failure(int attempt, const FailureNotice& notice) {
  try {
    return after_finish(*store_, attempt,
                        FailureNotice::decode(store_->compare_set(contract::JobKeys(attempt).failure(), "", notice.encode())));
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
  auto deadline = Clock::now() + to_ms(o.exit_barrier_timeout);
  try {
    if (elastic_) {
      // A finishing job is never re-formed: take the closing key before a newcomer does.
      // If one was first, its grow notice ends this attempt and the policy re-forms.
      // The newcomer may have died between its two compare_sets: the grow notice is
      // then written here, in the store, so every node re-forms (none waits for it).
      if (elastic_->claim_finish(attempt) != "finished") {
        if (auto grow = elastic::finish_grow(*store_, attempt)) return grow;
      }
    }
    store_->set(done[me], "1");
    // Done: this node's part of the job is over, so losing it now (frozen or killed
    // while it waits here) must not fail the others. Withdrawn after the done key, so a
    // loss in between is still a failure rather than a wait for a node that never finishes.
    if (elastic_) {
      elastic_->withdraw_failure_will();
    } else {
      store_->set_wills({}, silence_limit(to_ms(o.heartbeat_timeout)));
    }
    // Short waits, so a failure published meanwhile (the watcher sees it) ends the wait.
    while (true) {
      if (failure_seen_ || store_->check({contract::JobKeys(attempt).failure()})) {
        FailureNotice notice = FailureNotice::decode(store_->get(contract::JobKeys(attempt).failure(), Millis(1000)));
        // A node lost after every worker of the attempt had exited with status 0 (frozen or
        // killed in its own exit barrier) took nothing from the job: it succeeded. Every
        // node reads the same published exits, so all come to the same verdict.
        if (notice.kind == NoticeKind::kNodeLost && every_worker_succeeded(*store_, attempt, layout_.world_size)) {
          spdlog::info("{}, after every worker of the job had finished with status 0: the job succeeded",
                       notice.describe());
          return std::nullopt;
        }
        return after_finish(*store_, attempt, notice);
      }
      if (int sig = stop_signal_ ? stop_signal_() : 0; sig != 0) {
        return publish_failure(attempt, {me, -1, 128 + sig, plan_.hostname,
                                         std::string("ddprun received SIG") + sigabbrev_np(sig) +
                                             " while waiting for the other nodes to finish"});
      }
      try {
        store_->wait(done, Millis(500));
        return std::nullopt;
      } catch (const rdzv::StoreTimeout&) {
        if (Clock::now() >= deadline) {
          std::string missing;
          for (int r = 0; r < layout_.nnodes; ++r) {
            if (!store_->check({done[r]})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          }
          // Published, so the nodes still running learn the job is over.
          return publish_failure(attempt, {me, -1, 1, plan_.hostname,
                                           "exit barrier: node rank(s) " + missing + " did not finish within " +
                                               std::to_string(static_cast<int>(o.exit_barrier_timeout)) + " s"});
        }
      }
    }
  } catch (const rdzv::StoreError& e) {
    return FailureNotice{0, -1, 1, "", "exit barrier: " + store_lost_message(e.what()), NoticeKind::kStoreLost};
  }
}

void RendezvousAgent::leave(int attempt, Millis linger) {
  try {
    std::vector<std::string> left;
    if (elastic_) elastic_->mark_lost();
    if (!elastic_ || joined_attempt_ == attempt) {
      store_->set(contract::JobKeys(attempt).left(layout_.node_rank), "1");
      for (int r = 0; r < layout_.nnodes; ++r) left.push_back(contract::JobKeys(attempt).left(r));
    } else {
      // Never a member of `attempt` (its join ended early): no group rank there to
      // leave under. The nodes that waited beside it mark themselves lost as they go.
      left = elastic_->others_waiting_lost_keys();
    }
    if (linger.count() > 0 && !left.empty()) {
      try {
        patient_multi_get(left, linger);  // short slices: the heartbeat keeps going meanwhile
      } catch (const rdzv::StoreTimeout&) {
        // Someone is slow to leave; their answers were sent already.
      }
    }
    store_->close();
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
