// An elastic job's rendezvous over the store (elastic_join.hpp).
#include "membership/elastic/elastic_join.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "ddp/contract/store_keys.hpp"
#include "rdzv/waiting.hpp"
#include "membership/elastic/elastic_ending.hpp"
#include "errors.hpp"
#include "job/failure_notice.hpp"
#include "job/job_over.hpp"
#include "membership/job_shape.hpp"
#include "plan/ports.hpp"

namespace ddprun {

using elastic::Clock;
using Millis = std::chrono::milliseconds;
using contract::JobKeys;

namespace {

// How long one wait for an attempt to close lasts before the node looks again (stop
// signal, the job's end, the members present).
constexpr Millis kPollSlice = kStopCheckEvery;

// A non-blocking read's answer must come within this.
constexpr Millis kReadTimeout{5000};

// Bytes from another node that do not parse: one clear error, never a crash.
[[noreturn]] void bad_record(const std::string& key, const std::exception& e) {
  throw LaunchError("rendezvous: unreadable record '" + key + "' in the store: " + printable_text(e.what()));
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(rdzv::TcpStore& store, const LaunchPlan& plan, std::function<int()> stop_signal,
                                     Millis silence_limit, std::string where,
                                     std::function<int(const std::string&, int)> offer_port)
    : store_(store),
      plan_(plan),
      stop_signal_(std::move(stop_signal)),
      silence_limit_(silence_limit),
      where_(std::move(where)),
      offer_port_(std::move(offer_port)) {
  id_ = store_.add(JobKeys::elastic_ticket(), 1);
}

std::optional<std::string> ElasticRendezvous::peek(const std::string& key) {
  if (!store_.check({key})) return std::nullopt;
  return store_.get(key, kReadTimeout);  // keys here are never deleted
}

std::optional<elastic::MemberList> ElasticRendezvous::read_members(int attempt) {
  const std::string key = JobKeys(attempt).members();
  auto text = peek(key);
  if (!text) return std::nullopt;
  try {
    return elastic::MemberList::decode(*text);
  } catch (const std::invalid_argument& e) {
    bad_record(key, e);
  }
}

elastic::Registration ElasticRendezvous::registration(int attempt, int64_t id) {
  const std::string key = JobKeys(attempt).member(id);
  std::string text = store_.get(key, kReadTimeout);  // set before the id was appended to joined
  try {
    return elastic::Registration::decode(text);
  } catch (const std::invalid_argument& e) {
    bad_record(key, e);
  }
}

void ElasticRendezvous::check_stop_and_end() {
  if (int sig = stop_signal_ ? stop_signal_() : 0; sig != 0) throw Interrupted{sig};
  if (auto text = peek(JobKeys::elastic_end())) {
    try {
      auto end = elastic::JobEnd::decode(*text);
      throw JobOver{end.status, "the job ended before this node was admitted: " + printable_text(end.why)};
    } catch (const std::invalid_argument&) {
      throw JobOver{1, "the job ended before this node was admitted"};
    }
  }
}

void ElasticRendezvous::register_for(int attempt) {
  if (registered_ == attempt) return;
  const JobKeys keys(attempt);
  // Not a member yet: dying now must not end a running attempt, only take this node
  // out of the forming one.
  store_.set_wills({{JobKeys::elastic_lost(id_), "1"}}, silence_limit_);
  elastic::Registration me;
  me.host = plan_.hostname;
  me.address = plan_.options.local_addr.value_or(store_.local_address());  // --local_addr wins
  me.nproc = plan_.nproc;
  me.hint = plan_.options.node_rank_given ? plan_.options.node_rank : elastic::kNoHint;
  me.port = offer_port_ ? offer_port_(me.address, attempt) : pick_free_port();
  store_.set(keys.member(id_), me.encode());
  store_.append(keys.joined(), std::to_string(id_) + "\n");
  // elastic/round only grows: compare_set from what was read, until it holds >= attempt.
  for (int tries = 0; tries < 100; ++tries) {
    std::string now = peek(JobKeys::elastic_round()).value_or("");
    auto seen = now.empty() ? std::optional<long long>(-1) : ddp::contract::parse_integer(now);
    if (seen && *seen >= attempt) break;
    store_.compare_set(JobKeys::elastic_round(), now, std::to_string(attempt));
  }
  registered_ = attempt;
}

void ElasticRendezvous::request_grow(int attempt) {
  const JobKeys keys(attempt);
  if (store_.check({keys.failure()})) return;  // already ending: it re-forms anyway
  const std::string mine = "grow " + std::to_string(id_);
  // The closing key first: a node whose workers all succeeded may have taken it.
  const std::string closing = store_.compare_set(keys.closing(), "", mine);
  if (closing == mine) {
    store_.compare_set(keys.failure(), "", elastic::grow_notice(plan_.hostname).encode());
    spdlog::info("attempt {} runs below --nnodes max; asked it to re-form with this node", attempt);
  } else {
    // Another newcomer's grow: it may have died before ending the attempt; finish it.
    elastic::finish_grow(store_, attempt);
  }
}

int ElasticRendezvous::restart_count_after(int attempt, const std::optional<elastic::MemberList>& previous) {
  if (attempt == 0 || !previous) return 0;
  const std::string key = JobKeys(attempt - 1).failure();
  auto text = peek(key);
  bool consumed = text && consumes_restart(FailureNotice::decode(*text).kind);
  return previous->restart_count + (consumed ? 1 : 0);
}

elastic::RoundView ElasticRendezvous::view_of(int attempt, const std::optional<elastic::MemberList>& previous) {
  const LaunchOptions& o = plan_.options;
  const JobKeys keys(attempt);
  elastic::RoundView v;
  v.min_nodes = o.min_nodes;
  v.max_nodes = o.nnodes;
  v.last_call = to_ms(o.last_call_timeout);
  v.join_timeout = to_ms(o.join_timeout);
  std::vector<int64_t> ids;
  try {
    ids = elastic::decode_joined(peek(keys.joined()).value_or(""));
  } catch (const std::invalid_argument& e) {
    bad_record(keys.joined(), e);
  }
  for (int64_t id : ids) v.joined.push_back({id, registration(attempt, id).hint});
  if (previous) {
    v.previous = previous->ids;
    v.previous_running = !store_.check({JobKeys(attempt - 1).failure()});
    ids.insert(ids.end(), previous->ids.begin(), previous->ids.end());
  }
  for (int64_t id : ids) {
    if (store_.check({JobKeys::elastic_lost(id)})) v.lost.insert(id);
  }
  return v;
}

void ElasticRendezvous::check_previous_ended(int attempt, const elastic::MemberList& previous) {
  const std::string key = JobKeys(attempt - 1).failure();
  // The kind as every member's policy reads it (a failure after a node finished: kStop).
  FailureNotice ended = elastic::settle_failure(store_, attempt - 1, FailureNotice::decode(store_.get(key, kReadTimeout)));
  const bool no_restart_left = consumes_restart(ended.kind) && previous.restart_count >= plan_.options.max_restarts;
  if (ended.kind != NoticeKind::kStop && !no_restart_left) return;
  const std::string why = "the job ended in attempt " + std::to_string(attempt - 1) + " (" + ended.describe() + ")" +
                          (ended.kind == NoticeKind::kStop ? "" : ", no restart left");
  end_job(ended.status, why);  // the members' policy records it too; the first wins
  check_stop_and_end();        // throws JobOver with the end as recorded
}

elastic::MemberList ElasticRendezvous::wait_round(int attempt, Clock::time_point start) {
  const LaunchOptions& o = plan_.options;
  const JobKeys keys(attempt);
  register_for(attempt);
  elastic::RoundTimers timers(Clock::now());
  std::optional<elastic::MemberList> agreed;
  int present = 0;
  rdzv::Waiting w;
  w.slice = kPollSlice;
  w.notice_every = o.wait_notice_every;
  w.describe = [&] {
    return "still waiting for attempt " + std::to_string(attempt) + " to form: " + std::to_string(present) +
           " node(s) present, " + std::to_string(o.min_nodes) + " to " + std::to_string(o.nnodes) + " wanted";
  };
  w.say = [](const std::string& line) { spdlog::info("{}", line); };
  rdzv::wait_in_slices(w, [&](Millis budget) {
    check_stop_and_end();
    if ((agreed = read_members(attempt))) return true;
    std::optional<elastic::MemberList> previous = attempt > 0 ? read_members(attempt - 1) : std::nullopt;
    elastic::RoundView view = view_of(attempt, previous);
    const auto now = Clock::now();
    elastic::RoundDecision d = elastic::decide_round(view, timers, now);
    present = d.present;
    if (previous && !view.previous_running) check_previous_ended(attempt, *previous);
    // A job of MIN = MAX nodes admits a newcomer only in place of a lost node, and a
    // loss is known within the silence limit: a newcomer still left out after twice
    // that, every member alive, belongs to another launch under this run id.
    if (view.previous_running && o.min_nodes == o.nnodes && static_cast<int>(previous->ids.size()) >= o.nnodes &&
        now - start >= 2 * silence_limit_) {
      mark_lost();
      throw UsageError(shared_job_id_message(plan_.run_id, where_));
    }
    if (view.previous_running && now - start >= to_ms(o.join_timeout)) {
      throw LaunchError("rendezvous: not admitted within " + std::to_string(static_cast<int>(o.join_timeout)) +
                        " s: the job runs with " + std::to_string(previous->ids.size()) + " of at most " +
                        std::to_string(o.nnodes) + " nodes and has not re-formed since");
    }
    if (d.action == elastic::RoundAction::kClose) {
      elastic::MemberList list;
      list.restart_count = restart_count_after(attempt, previous);
      for (const auto& c : d.members) list.ids.push_back(c.id);
      std::string text = store_.compare_set(keys.members(), "", list.encode());
      try {
        agreed = elastic::MemberList::decode(text);
      } catch (const std::invalid_argument& e) {
        bad_record(keys.members(), e);
      }
      return true;
    }
    if (d.action == elastic::RoundAction::kGiveUp) {
      std::string hosts;
      for (const auto& c : view.joined) {
        if (view.lost.count(c.id)) continue;
        std::string h = printable_text(registration(attempt, c.id).host);
        if (hosts.find(h) == std::string::npos) hosts += (hosts.empty() ? "" : ", ") + h;
      }
      std::string why = "rendezvous: the job needs at least " + std::to_string(o.min_nodes) + " nodes; " +
                        std::to_string(d.present) + " present after " +
                        std::to_string(static_cast<int>(o.join_timeout)) + " s (node hosts: " +
                        (hosts.empty() ? "none" : hosts) + ")";
      end_job(1, why);
      throw LaunchError(why);
    }
    try {
      store_.wait({keys.members()}, budget);  // wakes at once when someone closes it
    } catch (const rdzv::StoreTimeout&) {
      // Look again.
    }
    return false;
  });
  return *agreed;
}

JobLayout ElasticRendezvous::layout_of(int attempt, const elastic::MemberList& members) {
  const JobKeys keys(attempt);
  JobLayout layout;
  layout.attempt = attempt;
  layout.node_rank = members.rank_of(id_);
  layout.nnodes = static_cast<int>(members.ids.size());
  layout.restart_count = members.restart_count;
  layout.world_size = 0;
  std::vector<elastic::Registration> regs;
  for (int64_t id : members.ids) regs.push_back(registration(attempt, id));
  for (size_t r = 0; r < regs.size(); ++r) {
    if (static_cast<int>(r) < layout.node_rank) layout.rank_offset += regs[r].nproc;
    layout.world_size += regs[r].nproc;
  }
  // Member 0 serves (or its rank 0 binds) MASTER_ADDR:MASTER_PORT, at the address the store saw it on.
  layout.master_addr = regs[0].address;
  layout.master_port = regs[0].port;
  layout.store.prefix = keys.process_groups();
  layout.store.attempt = keys.attempt();

  // A member now: this node's loss ends the attempt. Then a member lost between the
  // closing and its own will being set is reported here, so nobody waits for it.
  FailureNotice will{layout.node_rank, -1, kExitNodeLost, plan_.hostname,
                     "ddprun was lost (killed, crashed or cut off from the store) while the job ran",
                     NoticeKind::kNodeLost};
  store_.set_wills({{keys.failure(), will.encode()}, {JobKeys::elastic_lost(id_), "1"}}, silence_limit_);
  for (size_t r = 0; r < members.ids.size(); ++r) {
    if (store_.check({JobKeys::elastic_lost(members.ids[r])})) {
      FailureNotice lost{static_cast<int>(r), -1, kExitNodeLost, printable_text(regs[r].host),
                         "ddprun was lost before the attempt started", NoticeKind::kNodeLost};
      store_.compare_set(keys.failure(), "", lost.encode());
      break;
    }
  }
  return layout;
}

JobLayout ElasticRendezvous::join(int attempt) {
  const auto start = Clock::now();
  int k = attempt;
  if (auto round = peek(JobKeys::elastic_round())) {
    auto seen = ddp::contract::parse_integer(*round);
    if (seen && *seen > k && *seen < (1 << 30)) k = static_cast<int>(*seen);
  }
  try {
    while (true) {
      check_stop_and_end();
      std::optional<elastic::MemberList> closed = read_members(k);
      if (!closed) closed = wait_round(k, start);
      if (closed->rank_of(id_) >= 0) {
        JobLayout layout = layout_of(k, *closed);
        members_ = closed->ids;
        return layout;
      }
      // Attempt k runs (or ran) without this node: wait at the next one, and ask k to
      // re-form when it has room.
      register_for(k + 1);
      if (static_cast<int>(closed->ids.size()) < plan_.options.nnodes) request_grow(k);
      ++k;
    }
  } catch (...) {
    abandon(k);
    throw;
  }
}

void ElasticRendezvous::abandon(int attempt) noexcept {
  try {
    auto members = read_members(attempt);
    const int rank = members ? members->rank_of(id_) : -1;
    if (rank < 0) return;
    FailureNotice gone{rank, -1, kExitNodeLost, plan_.hostname, "ddprun left the job while the attempt formed",
                       NoticeKind::kNodeLost};
    store_.compare_set(JobKeys(attempt).failure(), "", gone.encode());
  } catch (...) {
    // The store is gone or holds bad bytes: this node's lost mark (will) is all there is.
  }
}

std::string ElasticRendezvous::claim_finish(int attempt) {
  return store_.compare_set(JobKeys(attempt).closing(), "", "finished");
}

void ElasticRendezvous::mark_lost() { store_.set(JobKeys::elastic_lost(id_), "1"); }

void ElasticRendezvous::withdraw_failure_will() {
  store_.set_wills({{JobKeys::elastic_lost(id_), "1"}}, silence_limit_);
}

std::vector<std::string> ElasticRendezvous::others_waiting_lost_keys() {
  std::vector<std::string> keys;
  if (registered_ < 0) return keys;
  try {
    for (int64_t id : elastic::decode_joined(peek(JobKeys(registered_).joined()).value_or(""))) {
      if (id != id_) keys.push_back(JobKeys::elastic_lost(id));
    }
  } catch (const std::invalid_argument&) {
    // Bad bytes: nobody to wait for.
  }
  return keys;
}

void ElasticRendezvous::end_job(int status, const std::string& why) {
  store_.compare_set(JobKeys::elastic_end(), "", elastic::JobEnd{status, why}.encode());
}

}  // namespace ddprun
