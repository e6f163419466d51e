// `ddprun status` (status.hpp): find the job, read its records in a few store round
// trips, print a table or JSON.
#include "diagnose/status.hpp"

#include <algorithm>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "ddp/contract/job_records.hpp"
#include "ddp/contract/parse.hpp"
#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"
#include "cli/options.hpp"
#include "store/exit_records.hpp"
#include "rdzv/tcp_store.hpp"
#include "rdzv/token.hpp"
#include "diagnose/runtime_file.hpp"
#include "diagnose/stall_report.hpp"
#include "diagnose/wait_graph.hpp"
#include "membership/elastic/elastic_round.hpp"
#include "supervise/process_state.hpp"

namespace ddprun {

namespace {

using Millis = std::chrono::milliseconds;
namespace contract = ddp::contract;

constexpr const char* kHelp =
    "Usage: ddprun status [--run_id ID] [--rdzv_endpoint HOST:PORT --rdzv_id ID [--rdzv_token_file FILE]]\n"
    "                     [--json] [--watch [SECONDS]]\n"
    "One line per rank of a running job: host, pid, state (running, stopped, exited with its status, stalled),\n"
    "the call it waits in (a collective, send or recv with its number, and for how long) or its last\n"
    "collective, seconds since its last progress,\n"
    "steps/s (with --watch, from two readings), resident memory.\n"
    "Without flags: the job a ddprun of this user runs on this machine (several: name one with\n"
    "--run_id). With --rdzv_endpoint/--rdzv_id: a job served by a ddp-rendezvous daemon (token from\n"
    "DDPRUN_TOKEN or --rdzv_token_file). --json prints one JSON object; --watch refreshes.\n";

struct StatusFlags {
  std::string run_id;
  std::string endpoint;
  std::string token_file;
  bool json = false;
  double watch = 0;  // 0: once
  bool help = false; // --help: printed, nothing else to do
};

StatusFlags parse_flags(int argc, const char* const* argv) {
  StatusFlags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool inline_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    for (char& c : arg) c = c == '-' && &c != &arg[0] && &c != &arg[1] ? '_' : c;
    auto need = [&](const std::string& name) {
      if (inline_value) return value;
      if (i + 1 >= argc) throw UsageError(name + " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--help" || arg == "-h") {
      f.help = true;
    } else if (arg == "--json") {
      f.json = true;
    } else if (arg == "--run_id" || arg == "--rdzv_id") {
      f.run_id = need(arg);
    } else if (arg == "--rdzv_endpoint") {
      f.endpoint = need(arg);
    } else if (arg == "--rdzv_token_file") {
      f.token_file = need(arg);
    } else if (arg == "--watch") {
      f.watch = 2;
      std::string text = inline_value ? value : (i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "");
      if (!text.empty()) {
        auto v = contract::parse_decimal(text);
        if (!v || *v < 0.1 || *v > 3600) throw UsageError("invalid --watch '" + text + "': expected seconds in [0.1, 3600]");
        f.watch = *v;
      }
    } else {
      throw UsageError("unknown argument '" + std::string(argv[i]) + "' (ddprun status --help)");
    }
  }
  if (!f.endpoint.empty() && f.run_id.empty()) throw UsageError("--rdzv_endpoint needs --rdzv_id");
  if (!f.run_id.empty()) {
    if (auto error = rdzv::job_id_error("--run_id", f.run_id)) throw UsageError(*error);
  }
  return f;
}

// Where the job is: its store, the attempt and world (when known), this node's pids.
struct Target {
  RuntimeInfo info;
  bool local = false;
};

Target find_local(const std::string& run_id) {
  std::vector<FoundRuntimeFile> found = find_runtime_files();
  std::vector<FoundRuntimeFile> alive;
  for (auto& f : found) {
    if (!run_id.empty() && f.run_id != run_id) continue;
    if (f.stale()) {  // its own format, its ddprun gone: the only files status removes
      std::error_code ec;
      std::filesystem::remove(f.path, ec);
      std::cerr << "ddprun status: " << f.path.string() << " is stale: its ddprun (pid " << f.pid << ", job "
                << f.run_id << ") is gone; " << (ec ? "cannot remove it: " + ec.message() : "removed it") << "\n";
      continue;
    }
    if (!f.info) {
      if (f.temp && f.alive) continue;  // being written right now
      std::cerr << "ddprun status: " << f.path.string() << " " << f.problem << "; left it in place\n";
      continue;
    }
    if (!f.temp) alive.push_back(std::move(f));  // a live ddprun's file being written: its last one counts
  }
  if (alive.empty()) {
    throw LaunchError(run_id.empty() ? "no running ddprun job of this user on this machine (runtime files in " +
                                           runtime_dir(false).string() + "); for a daemon-served job give "
                                           "--rdzv_endpoint and --rdzv_id"
                                     : "no running ddprun job with run id " + run_id + " on this machine");
  }
  // Nodes of one job on one machine (network namespaces) share a run id: take node 0's.
  std::map<std::string, const FoundRuntimeFile*> jobs;
  for (const auto& f : alive) {
    auto& slot = jobs[f.info->run_id];
    if (!slot || f.info->node_rank < slot->info->node_rank) slot = &f;
  }
  if (jobs.size() > 1) {
    std::string names;
    for (const auto& [id, f] : jobs) names += "\n  " + id + " (ddprun pid " + std::to_string(f->info->pid) + ")";
    throw UsageError("several ddprun jobs run on this machine; choose one with --run_id:" + names);
  }
  return {*jobs.begin()->second->info, true};
}

std::unique_ptr<rdzv::TcpStore> connect(const contract::StoreEndpoint& e) {
  rdzv::TcpStoreOptions o;
  o.host = e.addr;
  o.port = static_cast<uint16_t>(e.port);
  o.token = e.token;
  o.ns = e.ns;
  o.connect_timeout = Millis(3000);
  o.io_timeout = Millis(5000);
  o.heartbeat_timeout = Millis(0);
  return std::make_unique<rdzv::TcpStore>(o);
}

// Bounds on what a node registration may claim: a store's bytes are not trusted
// with the size of what `ddprun status` allocates.
constexpr long long kMostWorkersPerNode = 65536;
// How many attempts, newest first, `ddprun status` looks through for a closed member list.
constexpr int kNewestAttemptsLooked = 16;

// An elastic job's newest attempt whose member list is closed (the one its workers
// run in, or ran in last), with its members' hosts and worker counts in group-rank
// order; false when the job is not elastic or no attempt closed yet.
bool discover_elastic(rdzv::Store& store, RuntimeInfo& info, std::vector<std::string>& node_hosts,
                      std::vector<int>& node_nproc) {
  if (!store.check({contract::JobKeys::elastic_round()})) return false;
  const std::string round_text = store.get(contract::JobKeys::elastic_round(), Millis(1000));
  auto round = contract::parse_integer(round_text);
  if (!round || *round < 0 || *round > (1 << 30)) {
    throw LaunchError("job " + info.run_id + ": its elastic round record is malformed: \"" +
                      round_text.substr(0, 40) + "\"");
  }
  // One round trip per attempt looked at: only the newest few, whatever the record says.
  const int newest = static_cast<int>(*round);
  const int oldest = std::max(0, newest - kNewestAttemptsLooked + 1);
  for (int attempt = newest; attempt >= oldest; --attempt) {
    const contract::JobKeys keys(attempt);
    if (!store.check({keys.members()})) continue;  // still forming
    std::string what = "member list";
    try {
      const elastic::MemberList members = elastic::MemberList::decode(store.get(keys.members(), Millis(1000)));
      info.attempt = attempt;
      info.world_size = 0;
      for (int64_t id : members.ids) {
        what = "registration of node id " + std::to_string(id);
        const elastic::Registration reg = elastic::Registration::decode(store.get(keys.member(id), Millis(1000)));
        if (info.world_size + reg.nproc > kMostRanks) {
          throw std::invalid_argument("the members add up to more than " + std::to_string(kMostRanks) + " workers");
        }
        node_hosts.push_back(reg.host);
        node_nproc.push_back(reg.nproc);
        info.world_size += reg.nproc;
      }
    } catch (const std::invalid_argument& e) {
      throw LaunchError("job " + info.run_id + ": the " + what + " of elastic attempt " + std::to_string(attempt) +
                        " is malformed: " + e.what());
    }
    info.nnodes = static_cast<int>(node_hosts.size());
    return true;
  }
  if (oldest > 0) {
    throw LaunchError("job " + info.run_id + " is an elastic job with no member list closed in its newest " +
                      std::to_string(kNewestAttemptsLooked) + " attempts (" + std::to_string(oldest) + " to " +
                      std::to_string(newest) + "; older ones not looked at)");
  }
  throw LaunchError("job " + info.run_id + " is an elastic job whose nodes are still forming their first round "
                    "(no member list closed yet)");
}

// A daemon-served job: the latest attempt with a node 0, and its nodes' worker counts.
void discover(rdzv::Store& store, RuntimeInfo& info, std::vector<std::string>& node_hosts,
              std::vector<int>& node_nproc) {
  if (discover_elastic(store, info, node_hosts, node_nproc)) return;
  int attempt = -1;
  while (store.check({contract::JobKeys(attempt + 1).node(0)})) ++attempt;
  if (attempt < 0) throw LaunchError("job " + info.run_id + " has no node registered with the rendezvous daemon");
  info.attempt = attempt;
  info.world_size = 0;
  for (int n = 0; store.check({contract::JobKeys(attempt).node(n)}); ++n) {
    std::istringstream reg(store.get(contract::JobKeys(attempt).node(n), Millis(1000)));
    std::string host, address, nproc;
    std::getline(reg, host);
    std::getline(reg, address);
    std::getline(reg, nproc);
    auto count = contract::parse_integer(nproc);
    if (!count || *count < 1 || *count > kMostWorkersPerNode) {
      throw LaunchError("job " + info.run_id + ": the registration of node " + std::to_string(n) + " (attempt " +
                        std::to_string(attempt) + ") is malformed: its worker count is \"" + nproc.substr(0, 40) +
                        "\", not a number from 1 to " + std::to_string(kMostWorkersPerNode));
    }
    if (info.world_size + *count > kMostRanks) {
      throw LaunchError("job " + info.run_id + ": its node registrations add up to more than " +
                        std::to_string(kMostRanks) + " workers (at node " + std::to_string(n) + "); they are malformed");
    }
    node_hosts.push_back(host);
    node_nproc.push_back(static_cast<int>(*count));
    info.world_size += node_nproc.back();
  }
  info.nnodes = static_cast<int>(node_hosts.size());
}

struct RankLine {
  int rank = 0;
  std::string host = "?";
  int pid = -1;
  std::string state = "unknown";
  std::string call;  // "all_reduce #57 of group 0"
  std::string op;    // "all_reduce 1024×f32 sum"
  std::string call_state;
  std::optional<double> waiting_s;  // how long it waits in `call`, while it is in flight
  std::optional<double> since_progress_s;
  std::optional<uint64_t> steps;
  std::optional<double> steps_per_s;
  int64_t rss_kb = -1;
};

struct Reading {
  RuntimeInfo info;
  std::vector<RankLine> ranks;
  int64_t time_ms = 0;
};

// A rank's record is fresh while younger than this (written about once a second).
constexpr int64_t kFreshRecordMs = 3000;

Reading read_job(rdzv::Store& store, const Target& target) {
  Reading out;
  out.info = target.info;
  RuntimeInfo& info = out.info;
  std::vector<std::string> node_hosts;
  std::vector<int> node_nproc;
  if (!target.local) discover(store, info, node_hosts, node_nproc);
  contract::JobKeys keys(info.attempt);
  const int world = info.world_size;
  out.time_ms = contract::unix_millis_now();

  std::vector<std::string> progress_keys;
  for (int r = 0; r < world; ++r) progress_keys.push_back(keys.progress(r));
  ProgressRecords records(static_cast<size_t>(world));
  std::vector<int> have;
  if (store.check(progress_keys)) {
    for (int r = 0; r < world; ++r) have.push_back(r);
  } else {
    for (int r = 0; r < world; ++r) {
      if (store.check({progress_keys[r]})) have.push_back(r);
    }
  }
  if (!have.empty()) {
    std::vector<std::string> wanted;
    for (int r : have) wanted.push_back(progress_keys[r]);
    auto values = store.multi_get(wanted, Millis(1000));
    for (size_t i = 0; i < have.size(); ++i) records[have[i]] = contract::ProgressRecord::decode(values[i]);
  }
  const std::map<int, contract::ExitRecord> exits = read_exits(store, info.attempt);
  // A stall ddprun reported that still lasts (no call completed since): the whole job
  // is stalled; the call column tells the waiting ranks from the ones that never arrived.
  std::vector<bool> stalled(static_cast<size_t>(world), false);
  const std::string episode = "episode " + std::to_string(progress_signature(records)) + "\n";
  for (int n = 0; n < std::max(info.nnodes, 1); ++n) {
    if (!store.check({keys.stall_report(n)})) continue;
    if (store.get(keys.stall_report(n), Millis(500)).rfind(episode, 0) == 0) {
      for (int r = 0; r < world; ++r) stalled[r] = records[r].has_value();
      break;
    }
  }

  for (int r = 0; r < world; ++r) {
    RankLine line;
    line.rank = r;
    if (!node_hosts.empty()) {
      int first = 0;
      for (size_t n = 0; n < node_nproc.size(); ++n) {
        if (r < first + node_nproc[n]) {
          line.host = node_hosts[n];
          break;
        }
        first += node_nproc[n];
      }
    }
    for (const WorkerProcess& w : info.workers) {
      if (w.rank == r) {
        line.pid = w.pid;
        line.host = info.hostname;
      }
    }
    const auto& rec = records[r];
    if (rec) {
      line.host = rec->host;
      line.pid = rec->pid;
      line.steps = rec->steps;
      line.rss_kb = rec->rss_kb;
      // The group whose call is the latest of this rank.
      const contract::GroupProgress* latest = nullptr;
      for (const auto& g : rec->groups) {
        if (g.current && (!latest || g.current->since_ms > latest->current->since_ms)) latest = &g;
      }
      if (latest) {
        line.call = call_name(latest->group, *latest->current);
        line.op = latest->current->what;
        line.call_state = latest->current->state;
      }
      // The call it waits in now, a send or recv too ("recv #1 from rank 1").
      if (const auto blocked = in_flight_call(records, r)) {
        line.call = blocked->name;
        line.op = blocked->op->what;
        line.call_state = blocked->op->state;
        line.waiting_s = static_cast<double>(std::max<int64_t>(0, out.time_ms - blocked->op->since_ms)) / 1000.0;
      }
      if (auto last = last_completion_ms(ProgressRecords{rec})) {
        // Counted to when the record was written (about every second), so a rank that
        // keeps completing calls shows about 0 s, not the record's age; a record that
        // stopped coming (its process hangs hard) counts to now.
        const int64_t known = out.time_ms - rec->time_ms > kFreshRecordMs ? out.time_ms : rec->time_ms;
        line.since_progress_s = static_cast<double>(std::max<int64_t>(0, known - *last)) / 1000.0;
      }
    }
    bool local_pid = target.local && line.host == info.hostname && line.pid > 0;
    if (local_pid) {
      int64_t rss = process_rss_kb(line.pid);
      if (rss >= 0) line.rss_kb = rss;
    }
    if (auto e = exits.find(r); e != exits.end()) {
      line.state = e->second.how();
      line.host = e->second.host;
      line.pid = e->second.pid;
    } else if (const std::string proc = local_pid ? process_state(line.pid) : ""; local_pid && proc.empty()) {
      line.state = "gone";
    } else if (!proc.empty() && is_stopped_state(proc[0])) {
      line.state = "stopped";  // SIGSTOP or a tracer: it runs no code until continued
    } else if (stalled[r]) {
      line.state = "stalled";
    } else if (rec || local_pid) {
      line.state = "running";
    }
    out.ranks.push_back(std::move(line));
  }
  return out;
}

void add_rates(Reading& now, const Reading* before) {
  if (!before) return;
  double dt = (now.time_ms - before->time_ms) / 1000.0;
  if (dt <= 0) return;
  for (size_t i = 0; i < now.ranks.size() && i < before->ranks.size(); ++i) {
    if (now.ranks[i].steps && before->ranks[i].steps && *now.ranks[i].steps >= *before->ranks[i].steps) {
      now.ranks[i].steps_per_s = static_cast<double>(*now.ranks[i].steps - *before->ranks[i].steps) / dt;
    }
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string format_json(const Reading& r) {
  std::ostringstream os;
  os << "{\"run_id\":" << json_string(r.info.run_id) << ",\"attempt\":" << r.info.attempt
     << ",\"world_size\":" << r.info.world_size << ",\"time_ms\":" << r.time_ms << ",\"ranks\":[";
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const RankLine& l = r.ranks[i];
    auto opt = [](const auto& v) { return v ? std::to_string(*v) : std::string("null"); };
    os << (i ? "," : "") << "{\"rank\":" << l.rank << ",\"host\":" << json_string(l.host) << ",\"pid\":" << l.pid
       << ",\"state\":" << json_string(l.state) << ",\"call\":" << (l.call.empty() ? "null" : json_string(l.call))
       << ",\"op\":" << (l.op.empty() ? "null" : json_string(l.op))
       << ",\"call_state\":" << (l.call_state.empty() ? "null" : json_string(l.call_state))
       << ",\"waiting_s\":" << opt(l.waiting_s)
       << ",\"since_progress_s\":" << opt(l.since_progress_s) << ",\"steps\":" << opt(l.steps)
       << ",\"steps_per_s\":" << opt(l.steps_per_s) << ",\"rss_kb\":" << (l.rss_kb >= 0 ? std::to_string(l.rss_kb) : "null")
       << "}";
  }
  os << "]}\n";
  return os.str();
}

std::string format_table(const Reading& r) {
  std::ostringstream os;
  os << "job " << r.info.run_id << ", attempt " << r.info.attempt << ", " << r.info.world_size << " rank(s), store "
     << r.info.store.addr << ":" << r.info.store.port << "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-5s %-16s %-8s %-22s %-40s %9s %8s %10s\n", "RANK", "HOST", "PID", "STATE",
                "CALL", "PROGRESS", "STEPS/S", "RSS");
  os << line;
  for (const RankLine& l : r.ranks) {
    std::string call = l.call.empty() ? "-" : l.call + (l.call_state.empty() ? "" : " (" + l.call_state + ")");
    if (l.waiting_s) {
      char waiting[48];
      std::snprintf(waiting, sizeof(waiting), " (waiting %.1f s)", *l.waiting_s);
      call = l.call + waiting;
    }
    char since[32] = "-", rate[32] = "-", rss[32] = "-";
    if (l.since_progress_s) std::snprintf(since, sizeof(since), "%.1f s ago", *l.since_progress_s);
    if (l.steps_per_s) std::snprintf(rate, sizeof(rate), "%.2f", *l.steps_per_s);
    if (l.rss_kb >= 0) std::snprintf(rss, sizeof(rss), "%.1f MiB", static_cast<double>(l.rss_kb) / 1024.0);
    std::snprintf(line, sizeof(line), "%-5d %-16s %-8s %-22s %-40s %9s %8s %10s\n", l.rank, l.host.c_str(),
                  l.pid > 0 ? std::to_string(l.pid).c_str() : "-", l.state.c_str(), call.c_str(), since, rate, rss);
    os << line;
  }
  return os.str();
}

}  // namespace

int run_status(int argc, const char* const* argv) {
  try {
    StatusFlags flags = parse_flags(argc, argv);
    if (flags.help) {
      std::cout << kHelp;
      return 0;
    }
    Target target;
    if (!flags.endpoint.empty()) {
      auto [host, port] = parse_endpoint(flags.endpoint);
      target.info.run_id = flags.run_id;
      target.info.store.addr = host;
      target.info.store.port = port;
      target.info.store.ns = flags.run_id;
      try {
        target.info.store.token = rdzv::configured_token(flags.token_file);
      } catch (const std::exception& e) {
        throw LaunchError(e.what());
      }
    } else {
      target = find_local(flags.run_id);
    }
    std::optional<Reading> previous;
    while (true) {
      if (target.local && previous) target = find_local(target.info.run_id);  // a restart moves the attempt
      std::unique_ptr<rdzv::TcpStore> store;
      try {
        store = connect(target.info.store);
      } catch (const std::exception& e) {
        throw LaunchError("cannot reach job " + target.info.run_id + "'s store at " + target.info.store.addr + ":" +
                          std::to_string(target.info.store.port) + ": " + e.what());
      }
      Reading reading = read_job(*store, target);
      store->close();
      add_rates(reading, previous ? &*previous : nullptr);
      std::cout << (flags.json ? format_json(reading) : format_table(reading)) << std::flush;
      if (flags.watch <= 0) return 0;
      previous = std::move(reading);
      std::this_thread::sleep_for(std::chrono::duration<double>(flags.watch));
      if (!flags.json) std::cout << "\n";
    }
  } catch (const UsageError& e) {
    std::cerr << "ddprun status: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "ddprun status: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ddprun
