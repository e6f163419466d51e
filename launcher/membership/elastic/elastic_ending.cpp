// How a running elastic attempt ends, as store facts (elastic_ending.hpp).
#include "membership/elastic/elastic_ending.hpp"

#include <chrono>
#include <stdexcept>

#include "ddp/contract/parse.hpp"
#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"
#include "membership/elastic/elastic_round.hpp"

namespace ddprun::elastic {

using ddp::contract::JobKeys;

namespace {

constexpr std::chrono::milliseconds kReadTimeout{5000};

// A node's host from its registration for `attempt`, for messages; its id when the
// record is missing or unreadable (bytes from another node: never fatal here).
std::string host_of(rdzv::Store& store, int attempt, int64_t id) {
  const std::string key = JobKeys(attempt).member(id);
  try {
    if (store.check({key})) return printable_text(Registration::decode(store.get(key, kReadTimeout)).host);
  } catch (const std::invalid_argument&) {
    // Named by its id below.
  }
  return "node id " + std::to_string(id);
}

// Publishes `notice` for `attempt` unless a failure is there first; returns the winner.
FailureNotice first_failure(rdzv::Store& store, int attempt, const FailureNotice& notice) {
  return FailureNotice::decode(store.compare_set(JobKeys(attempt).failure(), "", notice.encode()));
}

}  // namespace

FailureNotice grow_notice(const std::string& host) {
  return {-1, -1, 0, host, "node " + host + " joins: the job re-forms with more nodes", NoticeKind::kGrow};
}

FailureNotice settle_failure(rdzv::Store& store, int attempt, FailureNotice notice) {
  if (notice.kind != NoticeKind::kNodeLost && notice.kind != NoticeKind::kWorker) return notice;
  // Read by compare_set: when nobody finished yet, nobody can any more.
  if (store.compare_set(JobKeys(attempt).closing(), "", kClosingFailed) == "finished") notice.kind = NoticeKind::kStop;
  return notice;
}

std::optional<FailureNotice> finish_grow(rdzv::Store& store, int attempt) {
  const std::string key = JobKeys(attempt).closing();
  if (!store.check({key})) return std::nullopt;
  const std::string closing = store.get(key, kReadTimeout);
  if (closing.rfind("grow ", 0) != 0) return std::nullopt;
  auto id = ddp::contract::parse_integer(closing.substr(5));
  // The newcomer registered for the next attempt before it asked.
  const std::string host = id ? host_of(store, attempt + 1, *id) : printable_text(closing.substr(5));
  return first_failure(store, attempt, grow_notice(host));
}

std::optional<FailureNotice> report_lost_member(rdzv::Store& store, int attempt, const std::vector<int64_t>& members) {
  const JobKeys keys(attempt);
  for (size_t r = 0; r < members.size(); ++r) {
    // A member that finished leaves (and is marked lost) once every member finished.
    if (!store.check({JobKeys::elastic_lost(members[r])}) || store.check({keys.done(static_cast<int>(r))})) continue;
    FailureNotice lost{static_cast<int>(r), -1, kExitNodeLost, host_of(store, attempt, members[r]),
                       "ddprun was lost (killed, crashed, cut off from the store or stopped) before it could "
                       "report it",
                       NoticeKind::kNodeLost};
    return first_failure(store, attempt, lost);
  }
  return std::nullopt;
}

}  // namespace ddprun::elastic
