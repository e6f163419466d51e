#include "ddp/contract/job_records.hpp"

#include <string.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <map>

#include "ddp/contract/parse.hpp"

namespace ddp::contract {
namespace {

// A value as a record may hold it: no tab, no newline.
std::string clean(std::string_view v) {
  std::string out(v);
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

class Line {
 public:
  explicit Line(std::string head) : text_(std::move(head)) {}
  Line& add(std::string_view name, std::string_view value) {
    text_ += '\t';
    text_ += name;
    text_ += '=';
    text_ += clean(value);
    return *this;
  }
  template <class N>
  Line& num(std::string_view name, N value) {
    return add(name, std::to_string(value));
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

// The fields of one line after its head word, name -> value.
struct Fields {
  std::string head;
  std::map<std::string, std::string, std::less<>> values;

  static Fields parse(std::string_view line) {
    Fields f;
    size_t pos = 0;
    bool first = true;
    while (pos <= line.size()) {
      size_t end = line.find('\t', pos);
      if (end == std::string_view::npos) end = line.size();
      std::string_view part = line.substr(pos, end - pos);
      if (first) {
        f.head = std::string(part);
        first = false;
      } else if (const auto eq = part.find('='); eq != std::string_view::npos) {
        f.values.emplace(std::string(part.substr(0, eq)), std::string(part.substr(eq + 1)));
      }
      pos = end + 1;
    }
    return f;
  }
  const std::string* text(std::string_view name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  }
  // The field as an integer in [lo, hi]; false when missing or malformed.
  template <class N>
  bool integer(std::string_view name, N& out, long long lo, long long hi) const {
    const std::string* t = text(name);
    if (!t) return false;
    auto v = parse_integer(*t);
    if (!v || *v < lo || *v > hi) return false;
    out = static_cast<N>(*v);
    return true;
  }
};

constexpr long long kMaxRank = 1 << 24;
constexpr long long kMaxI64 = INT64_MAX;

void put_op(Line& line, std::string_view prefix, const std::optional<OpSummary>& op) {
  if (!op) return;
  const std::string p(prefix);
  line.num(p + "seq", op->seq).add(p + "op", op->what).add(p + "state", op->state).num(p + "since_ms", op->since_ms);
}

std::optional<OpSummary> get_op(const Fields& f, std::string_view prefix) {
  const std::string p(prefix);
  OpSummary op;
  if (!f.integer(p + "seq", op.seq, 0, kMaxI64) || !f.integer(p + "since_ms", op.since_ms, 0, kMaxI64)) return std::nullopt;
  const std::string* what = f.text(p + "op");
  const std::string* state = f.text(p + "state");
  if (!what || !state) return std::nullopt;
  op.what = *what;
  op.state = *state;
  return op;
}

}  // namespace

int64_t unix_millis_now() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string clock_time(int64_t unix_ms) {
  const time_t secs = static_cast<time_t>(unix_ms / 1000);
  tm local{};
  localtime_r(&secs, &local);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d", local.tm_hour, local.tm_min, local.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return buf;
}

// ---- ExitRecord ----------------------------------------------------------------

std::string ExitRecord::how() const {
  if (signal == 0) return "exited with code " + std::to_string(exit_code);
  const char* abbrev = sigabbrev_np(signal);
  return "was killed by signal " + std::to_string(signal) + (abbrev ? std::string(" (SIG") + abbrev + ")" : "");
}

std::string ExitRecord::describe() const {
  return "rank " + std::to_string(rank) + " " + how() + " at " + clock_time(time_ms) + " on node " +
         std::to_string(node_rank) + " (" + host + ")";
}

std::string ExitRecord::encode() const {
  return Line("exit")
      .num("rank", rank)
      .num("node", node_rank)
      .add("host", host)
      .num("pid", pid)
      .num("code", exit_code)
      .num("signal", signal)
      .num("time_ms", time_ms)
      .str();
}

std::optional<ExitRecord> ExitRecord::decode(std::string_view text) {
  const Fields f = Fields::parse(text);
  ExitRecord r;
  const std::string* host = f.text("host");
  if (f.head != "exit" || !host || !f.integer("rank", r.rank, 0, kMaxRank) ||
      !f.integer("node", r.node_rank, 0, kMaxRank) || !f.integer("pid", r.pid, 0, INT32_MAX) ||
      !f.integer("code", r.exit_code, 0, 255) || !f.integer("signal", r.signal, 0, 128) ||
      !f.integer("time_ms", r.time_ms, 0, kMaxI64)) {
    return std::nullopt;
  }
  r.host = *host;
  return r;
}

// ---- ProgressRecord ------------------------------------------------------------

std::string ProgressRecord::encode() const {
  std::string out = Line("progress")
                        .num("rank", rank)
                        .num("pid", pid)
                        .add("host", host)
                        .num("time_ms", time_ms)
                        .num("steps", steps)
                        .num("rss_kb", rss_kb)
                        .str();
  for (const auto& g : groups) {
    Line line("group");
    line.add("name", g.group).num("rank", g.rank).num("size", g.size).num("issued", g.issued).num("completed", g.completed);
    put_op(line, "cur_", g.current);
    put_op(line, "done_", g.last_completed);
    if (g.p2p_completed > 0) line.num("p2p_done", g.p2p_completed).num("p2p_done_ms", g.p2p_done_ms);
    out += '\n';
    out += line.str();
    for (const auto& p : g.p2p_pending) {  // "p2p" lines belong to the group line above
      Line call("p2p");
      call.num("peer", p.peer);
      put_op(call, "", p.op);
      out += '\n';
      out += call.str();
    }
  }
  return out;
}

std::optional<ProgressRecord> ProgressRecord::decode(std::string_view text) {
  ProgressRecord r;
  bool head_seen = false;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const Fields f = Fields::parse(text.substr(pos, end - pos));
    pos = end + 1;
    if (!head_seen) {
      const std::string* host = f.text("host");
      if (f.head != "progress" || !host || !f.integer("rank", r.rank, 0, kMaxRank) ||
          !f.integer("pid", r.pid, 0, INT32_MAX) || !f.integer("time_ms", r.time_ms, 0, kMaxI64) ||
          !f.integer("steps", r.steps, 0, kMaxI64) || !f.integer("rss_kb", r.rss_kb, 0, kMaxI64)) {
        return std::nullopt;
      }
      r.host = *host;
      head_seen = true;
      continue;
    }
    if (f.head == "p2p") {
      PeerCall p;
      auto op = get_op(f, "");
      if (r.groups.empty() || !op || !f.integer("peer", p.peer, 0, kMaxRank) || p.peer >= r.groups.back().size) {
        return std::nullopt;
      }
      p.op = std::move(*op);
      r.groups.back().p2p_pending.push_back(std::move(p));
      continue;
    }
    if (f.head != "group") continue;  // a line kind a newer writer added
    GroupProgress g;
    const std::string* name = f.text("name");
    if (!name || !f.integer("rank", g.rank, 0, kMaxRank) || !f.integer("size", g.size, 1, kMaxRank) ||
        !f.integer("issued", g.issued, 0, kMaxI64) || !f.integer("completed", g.completed, 0, kMaxI64) ||
        g.rank >= g.size || g.completed > g.issued) {
      return std::nullopt;
    }
    g.group = *name;
    g.current = get_op(f, "cur_");
    g.last_completed = get_op(f, "done_");
    if (f.text("p2p_done") && (!f.integer("p2p_done", g.p2p_completed, 0, kMaxI64) ||
                               !f.integer("p2p_done_ms", g.p2p_done_ms, 0, kMaxI64))) {
      return std::nullopt;
    }
    r.groups.push_back(std::move(g));
  }
  if (!head_seen) return std::nullopt;
  return r;
}

}  // namespace ddp::contract
