// An elastic job's closing rule and round records (elastic_round.hpp).
#include "membership/elastic/elastic_round.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "ddp/contract/parse.hpp"

namespace ddprun::elastic {

namespace {

int64_t integer(std::string_view text, const char* what) {
  auto v = ddp::contract::parse_integer(text);
  if (!v) throw std::invalid_argument(std::string("bad ") + what + " '" + std::string(text.substr(0, 40)) + "'");
  return *v;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// At most `max` of `present`: stayers first (they keep the job's state), then the
// earliest newcomers; returned in group-rank order.
std::vector<Candidate> choose(const std::vector<Candidate>& present, const std::set<int64_t>& stayers, int max) {
  std::vector<Candidate> ordered = present;
  std::stable_sort(ordered.begin(), ordered.end(), [&](const Candidate& a, const Candidate& b) {
    bool sa = stayers.count(a.id) > 0, sb = stayers.count(b.id) > 0;
    if (sa != sb) return sa;
    return sa ? a < b : a.id < b.id;
  });
  if (static_cast<int>(ordered.size()) > max) ordered.resize(static_cast<size_t>(max));
  std::sort(ordered.begin(), ordered.end());
  return ordered;
}

}  // namespace

RoundDecision decide_round(const RoundView& v, RoundTimers& t, Clock::time_point now) {
  RoundDecision d;
  std::vector<Candidate> present;
  std::set<int64_t> seen;
  for (const Candidate& c : v.joined) {
    if (!v.lost.count(c.id) && seen.insert(c.id).second) present.push_back(c);
  }
  d.present = static_cast<int>(present.size());
  if (v.previous_running) {
    // Nothing to decide until the running attempt ends; the clocks start then.
    t.min_reached.reset();
    t.below_min_since = now;
    return d;
  }
  if (d.present >= v.min_nodes) {
    if (!t.min_reached) t.min_reached = now;
  } else if (t.min_reached) {
    t.min_reached.reset();
    t.below_min_since = now;
  }

  std::set<int64_t> stayers;
  if (v.previous) {
    for (int64_t id : *v.previous) {
      if (!v.lost.count(id)) stayers.insert(id);
    }
  }
  if (d.present < v.min_nodes) {
    if (now - t.below_min_since >= v.join_timeout) d.action = RoundAction::kGiveUp;
    return d;
  }
  const auto enough_for = now - *t.min_reached;
  // A re-forming attempt keeps the stayers' places, even at MAX: newcomers queued for
  // it must not take the place of a healthy stayer still on its way back.
  const bool stayers_back =
      std::all_of(stayers.begin(), stayers.end(), [&](int64_t id) { return seen.count(id) > 0; }) ||
      enough_for >= v.join_timeout;  // a stayer that is neither back nor lost
  bool close = false;
  if (!v.previous) {
    close = d.present >= v.max_nodes || enough_for >= v.last_call;
  } else {
    close = stayers_back;
  }
  if (close) {
    d.action = RoundAction::kClose;
    d.members = choose(present, stayers, v.max_nodes);
  }
  return d;
}

std::string Registration::encode() const {
  return host + "\n" + address + "\n" + std::to_string(nproc) + "\n" + std::to_string(hint) + "\n" +
         std::to_string(port);
}

Registration Registration::decode(const std::string& text) {
  auto l = lines(text);
  if (l.size() != 5) throw std::invalid_argument("a node registration needs 5 lines, got " + std::to_string(l.size()));
  Registration r;
  r.host = l[0];
  r.address = l[1];
  int64_t nproc = integer(l[2], "worker count");
  r.hint = integer(l[3], "order hint");
  int64_t port = integer(l[4], "port");
  if (nproc < 1 || nproc > (1 << 20)) throw std::invalid_argument("bad worker count " + l[2]);
  if (port < 1 || port > 65535) throw std::invalid_argument("bad port " + l[4]);
  r.nproc = static_cast<int>(nproc);
  r.port = static_cast<int>(port);
  return r;
}

std::string MemberList::encode() const {
  std::string out = std::to_string(restart_count) + "\n";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

MemberList MemberList::decode(const std::string& text) {
  auto l = lines(text);
  if (l.size() != 2) throw std::invalid_argument("a member list needs 2 lines");
  MemberList m;
  int64_t restarts = integer(l[0], "restart count");
  if (restarts < 0 || restarts > (1 << 30)) throw std::invalid_argument("bad restart count " + l[0]);
  m.restart_count = static_cast<int>(restarts);
  std::istringstream in(l[1]);
  for (std::string id; in >> id;) m.ids.push_back(integer(id, "node id"));
  if (m.ids.empty()) throw std::invalid_argument("an empty member list");
  return m;
}

int MemberList::rank_of(int64_t id) const {
  auto it = std::find(ids.begin(), ids.end(), id);
  return it == ids.end() ? -1 : static_cast<int>(it - ids.begin());
}

std::vector<int64_t> decode_joined(const std::string& text) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (const auto& line : lines(text)) {
    int64_t id = integer(line, "node id");
    if (seen.insert(id).second) out.push_back(id);
  }
  return out;
}

std::string JobEnd::encode() const { return std::to_string(status) + "\n" + why; }

JobEnd JobEnd::decode(const std::string& text) {
  auto nl = text.find('\n');
  JobEnd e;
  int64_t status = integer(std::string_view(text).substr(0, nl), "exit status");
  if (status < 0 || status > 255) throw std::invalid_argument("bad exit status " + std::to_string(status));
  e.status = static_cast<int>(status);
  e.why = nl == std::string::npos ? "" : text.substr(nl + 1);
  return e;
}

}  // namespace ddprun::elastic
