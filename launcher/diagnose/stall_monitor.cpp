// Stall detection and the multi-node report exchange (stall_monitor.hpp).
#include "diagnose/stall_monitor.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "ddp/contract/store_keys.hpp"
#include "errors.hpp"
#include "rdzv/tcp_store.hpp"
#include "supervise/process_state.hpp"

namespace ddprun {

namespace contract = ddp::contract;
using Millis = std::chrono::milliseconds;

namespace {

// Records are written about once a second, so a completion may show up that late:
// the stall clock starts at the last completion the records show, but never more
// than this before ddprun saw the counts change (clocks of other hosts may be off).
constexpr int64_t kRecordLagMs = 2000;

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", s);
  return text;
}

}  // namespace

StallMonitor::StallMonitor(StallMonitorOptions options) : options_(std::move(options)) {}

StallMonitor::~StallMonitor() { ended(attempt_); }

void StallMonitor::started(int attempt, const JobLayout& layout, const std::vector<WorkerOutcome>& workers,
                           std::function<void(const JobStop&)> stop_job) {
  ended(attempt_);  // a previous attempt's thread, if any
  if (options_.timeout_s <= 0) return;
  attempt_ = attempt;
  layout_ = layout;
  workers_.clear();
  for (const WorkerOutcome& w : workers) workers_.push_back({w.rank, w.pid});
  stop_job_ = std::move(stop_job);
  present_.assign(static_cast<size_t>(layout.world_size), false);
  job_stopping_ = false;
  {
    std::lock_guard lock(mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { run(); });
}

void StallMonitor::stopping(int) { job_stopping_ = true; }

void StallMonitor::ended(int) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();  // a store call in flight is short (nothing here blocks in the store)
  store_.reset();
}

bool StallMonitor::sleep_for(Millis d) {
  std::unique_lock lock(mutex_);
  wake_.wait_for(lock, d, [this] { return stopping_; });
  return !stopping_;
}

ProgressRecords StallMonitor::read_records() {
  rdzv::TcpStore* store = store_.get();
  contract::JobKeys keys(attempt_);
  std::vector<std::string> wanted;
  std::vector<int> ranks;
  for (int r = 0; r < layout_.world_size; ++r) {
    if (!present_[r] && store->check({keys.progress(r)})) present_[r] = true;
    if (present_[r]) {
      wanted.push_back(keys.progress(r));
      ranks.push_back(r);
    }
  }
  ProgressRecords records(static_cast<size_t>(layout_.world_size));
  if (wanted.empty()) return records;
  std::vector<std::string> values = store->multi_get(wanted, Millis(2000));
  for (size_t i = 0; i < values.size(); ++i) records[ranks[i]] = contract::ProgressRecord::decode(values[i]);
  return records;
}

bool StallMonitor::local_workers_alive() const {
  for (const WorkerProcess& w : workers_) {
    std::string state = process_state(w.pid);
    if (!state.empty() && state[0] != 'Z' && state[0] != 'X') return true;
  }
  return false;
}

std::optional<uint64_t> StallMonitor::local_workers_cpu_ticks() const {
  uint64_t total = 0;
  for (const WorkerProcess& w : workers_) {
    auto ticks = process_tree_cpu_ticks(w.pid);
    if (!ticks) return std::nullopt;
    total += *ticks;
  }
  return total;
}

// This node's workers; where a worker's record comes from another process of this
// host (the program under `sh -c`, say), that process is the one to look at.
std::vector<WorkerProcess> StallMonitor::local_workers(const ProgressRecords& records) const {
  std::vector<WorkerProcess> out = workers_;
  for (WorkerProcess& w : out) {
    const auto& rec = w.rank < static_cast<int>(records.size()) ? records[w.rank] : std::nullopt;
    if (rec && rec->host == options_.hostname && rec->pid > 0 && rec->pid != w.pid &&
        !process_state(rec->pid).empty()) {
      w.pid = rec->pid;
    }
  }
  return out;
}

void StallMonitor::run() {
  try {
    if (options_.store) store_ = options_.store();
  } catch (const std::exception& e) {
    spdlog::warn("stall detection is off for this attempt: cannot reach the job's store ({})", e.what());
    return;
  }
  if (!store_) {
    spdlog::warn("stall detection is off for this attempt: no store to read the workers' progress from");
    return;
  }
  const auto timeout_ms = static_cast<int64_t>(options_.timeout_s * 1000);
  bool have_signature = false;
  uint64_t signature = 0;
  int64_t seen_change_ms = 0;
  bool reported = false;
  // Without any record: the workers' CPU time, and since when it has not changed.
  std::optional<uint64_t> idle_ticks;
  int64_t idle_since_ms = 0;
  uint64_t idle_episode = 0;
  bool idle_reported = false;
  while (sleep_for(options_.poll_interval)) {
    ProgressRecords records;
    try {
      records = read_records();
    } catch (const std::exception& e) {
      bool stopping;
      {
        std::lock_guard lock(mutex_);
        stopping = stopping_;
      }
      if (!stopping) spdlog::warn("stall detection stopped: the job's store failed ({})", e.what());
      return;
    }
    int64_t now = contract::unix_millis_now();
    if (std::none_of(records.begin(), records.end(), [](const auto& r) { return r.has_value(); })) {
      auto ticks = local_workers_cpu_ticks();
      if (!ticks || !idle_ticks || *ticks != *idle_ticks) {
        idle_ticks = ticks;
        idle_since_ms = now;
        idle_reported = false;
        ++idle_episode;
      }
      if (!ticks || idle_reported || now - idle_since_ms < timeout_ms || job_stopping_) continue;
      idle_reported = true;
      // Episodes of this kind are tagged apart from those counted by progress.
      report(records,
             "no worker used CPU time for " + seconds_text((now - idle_since_ms) / 1000.0) + " s (--stall_timeout " +
                 seconds_text(options_.timeout_s) + ")",
             "no rank publishes progress records and every worker of node " + std::to_string(layout_.node_rank) +
                 " is idle",
             (uint64_t{1} << 63) | idle_episode);
      continue;
    }
    uint64_t sig = progress_signature(records);
    if (!have_signature || sig != signature) {
      have_signature = true;
      signature = sig;
      seen_change_ms = now;
      reported = false;
    }
    if (reported) continue;
    int64_t onset = seen_change_ms;
    if (auto last = last_completion_ms(records)) onset = std::clamp(*last, seen_change_ms - kRecordLagMs, seen_change_ms);
    bool failed = any_call_failed(records);
    bool stalled = any_rank_waiting(records) && now - onset >= timeout_ms;
    if (!failed && !stalled) continue;
    if (!local_workers_alive() || job_stopping_) continue;
    reported = true;
    report(records,
           failed ? "a call failed"
                  : "no rank completed a call for " + seconds_text((now - onset) / 1000.0) + " s (--stall_timeout " +
                        seconds_text(options_.timeout_s) + ")",
           "", signature);
  }
}

std::string StallMonitor::gather_other_nodes(uint64_t episode) {
  rdzv::TcpStore* store = store_.get();
  const std::string tag = "episode " + std::to_string(episode) + "\n";
  std::vector<std::string> parts(static_cast<size_t>(layout_.nnodes));
  auto deadline = std::chrono::steady_clock::now() + options_.process.stack_timeout + Millis(5000);
  int missing = layout_.nnodes - 1;
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    missing = 0;
    for (int n = 1; n < layout_.nnodes; ++n) {
      if (!parts[n].empty()) continue;
      std::string key = contract::JobKeys(attempt_).stall_report(n);
      if (store->check({key})) {
        std::string value = store->get(key, Millis(1000));
        if (value.rfind(tag, 0) == 0) {
          parts[n] = value.substr(tag.size());
          continue;
        }
      }
      ++missing;
    }
    if (missing > 0 && !sleep_for(Millis(100))) break;
  }
  std::string out;
  std::string silent;
  for (int n = 1; n < layout_.nnodes; ++n) {
    if (parts[n].empty()) {
      silent += (silent.empty() ? "" : ", ") + std::to_string(n);
    } else {
      out += parts[n];
    }
  }
  if (!silent.empty()) out += "  node(s) " + silent + " sent no process report in time (their workers are not shown)\n";
  return out;
}

void StallMonitor::report(const ProgressRecords& records, const std::string& what, const std::string& headline,
                          uint64_t episode) {
  StallAnalysis analysis = analyse_stall(records, contract::unix_millis_now());
  if (!headline.empty()) analysis.headline = headline;
  // Read before the stacks: a debugger that attaches changes the state it shows.
  std::vector<StoppedWorker> stopped;
  for (const WorkerProcess& w : local_workers(records)) {
    const char state = process_state_letter(w.pid);
    if (is_stopped_state(state)) stopped.push_back({w, state == 't'});
  }
  if (!stopped.empty()) {
    analysis.headline = stopped_headline(records, stopped);
    analysis.stalled.clear();
    for (const StoppedWorker& s : stopped) analysis.stalled.push_back(s.process.rank);
  }
  bool stop = options_.action == StallAction::Stop;
  // Said at once: the workers' stacks (below) may take seconds to read.
  if (layout_.node_rank != 0) {
    spdlog::warn("stall: {}; {}; node 0 prints the report{}", what, analysis.headline,
                 stop ? " and stops the job" : "");
  } else {
    spdlog::warn("stall: {}; {}; the report follows once the workers' stacks are read", what, analysis.headline);
  }
  std::string processes = describe_processes(options_.hostname, local_workers(records), options_.process);
  rdzv::TcpStore* store = store_.get();
  try {
    // Node 0 reads the other nodes' parts; `ddprun status` reads any to call ranks stalled.
    store->set(contract::JobKeys(attempt_).stall_report(layout_.node_rank),
               "episode " + std::to_string(episode) + "\n" + processes);
    if (layout_.node_rank != 0) return;
    if (layout_.nnodes > 1) processes += gather_other_nodes(episode);
  } catch (const std::exception& e) {
    if (layout_.node_rank != 0) return;
    processes += "  (the other nodes' parts could not be read: " + std::string(e.what()) + ")\n";
  }
  const std::string rule(72, '=');
  std::ostringstream os;
  if (!stop) os << rule << "\n";
  os << "ddprun: stall report for job " << options_.run_id << " (attempt " << attempt_ << "): " << what << "\n";
  os << "  " << analysis.headline << "\n";
  os << "Calls:\n" << analysis.text;
  os << "Worker processes:\n" << processes;
  if (stop) {
    std::string text = os.str();
    spdlog::error("stall: {}; stopping the job (--stall_action=stop); the report follows in the failure summary",
                  analysis.headline);
    stop_job_({kExitStalled, "stalled: " + analysis.headline, text});
    return;
  }
  os << "The job goes on (--stall_action=report); the next report comes when the job stalls again.\n" << rule << "\n";
  if (options_.print) options_.print(os.str());
}

}  // namespace ddprun
