// The stall report (stall_report.hpp): the cross-rank analysis of the progress
// records, and the process-level part with native stacks from gdb or py-spy.
#include "diagnose/stall_report.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>

#include "supervise/process_state.hpp"

extern char** environ;

namespace ddprun {

using ddp::contract::GroupProgress;
using ddp::contract::OpSummary;
using ddp::contract::ProgressRecord;

namespace {

bool waiting(const GroupProgress& g) {
  return g.current && g.current->state != "completed" && g.issued > g.completed;
}

std::string seconds_text(int64_t ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", static_cast<double>(std::max<int64_t>(ms, 0)) / 1000.0);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

// Ranks that wait in different calls at the same position of a group (a mismatch:
// NCCL hangs on it rather than detecting it): "mismatched calls at #2 of group 0: rank 0
// waits in broadcast (broadcast 256×f32 root 1), rank 1 in scatter (scatter 256×f32 root
// 0)". Empty when they all wait in the same call. `calls`: each waiting rank's call.
std::string mismatch_headline(const std::string& group, uint64_t seq,
                              const std::vector<std::pair<int, const OpSummary*>>& calls) {
  // Calls that differ in kind or shape. Only a scatter's count may differ between ranks (the
  // root names its whole input, the others their part: "scatter 1024×f32 root 0" and
  // "scatter 256×f32 root 0" match); its dtype and root must not. A gather records its input
  // count, the same on every rank, so it is compared in full like every other call.
  auto same_call = [](const std::string& a, const std::string& b) {
    const std::string kind = a.substr(0, a.find(' '));
    if (kind != b.substr(0, b.find(' '))) return false;
    if (kind != "scatter") return a == b;
    auto after_count = [](const std::string& s) {
      const size_t x = s.find("×");
      return x == std::string::npos ? s : s.substr(x);
    };
    return after_count(a) == after_count(b);
  };
  std::vector<std::pair<std::string, std::vector<int>>> kinds;  // each distinct call, its ranks
  for (const auto& [rank, op] : calls) {
    if (op->seq != seq) continue;
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return same_call(k.first, op->what); });
    if (it == kinds.end()) kinds.push_back({op->what, {rank}});
    else it->second.push_back(rank);
  }
  if (kinds.size() < 2) return "";
  std::string out = "mismatched calls at #" + std::to_string(seq) + " of group " + group + ": ";
  for (size_t i = 0; i < kinds.size(); ++i) {
    const auto& [what, ranks] = kinds[i];
    out += (i == 0 ? "" : ", ") + std::string(ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks) +
           (i == 0 ? (ranks.size() == 1 ? " waits in " : " wait in ") : " in ") + what.substr(0, what.find(' ')) +
           " (" + what + ")";
  }
  return out;
}

}  // namespace

uint64_t progress_signature(const ProgressRecords& records) {
  uint64_t sum = 0;
  for (const auto& r : records) {
    if (!r) continue;
    for (const auto& g : r->groups) sum += g.completed + g.p2p_completed;
  }
  return sum;
}

bool any_rank_waiting(const ProgressRecords& records) {
  for (const auto& r : records) {
    if (!r) continue;
    for (const auto& g : r->groups) {
      if (waiting(g) || !g.p2p_pending.empty()) return true;
    }
  }
  return false;
}

bool any_call_failed(const ProgressRecords& records) {
  for (const auto& r : records) {
    if (!r) continue;
    for (const auto& g : r->groups) {
      if (g.current && g.current->state == "failed") return true;
    }
  }
  return false;
}

std::optional<int64_t> last_completion_ms(const ProgressRecords& records) {
  std::optional<int64_t> latest;
  for (const auto& r : records) {
    if (!r) continue;
    for (const auto& g : r->groups) {
      if (g.last_completed && (!latest || g.last_completed->since_ms > *latest)) latest = g.last_completed->since_ms;
      if (g.p2p_done_ms > 0 && (!latest || g.p2p_done_ms > *latest)) latest = g.p2p_done_ms;
    }
  }
  return latest;
}

StallAnalysis analyse_stall(const ProgressRecords& records, int64_t now_ms) {
  struct Member {
    int rank;
    const GroupProgress* group;
  };
  std::map<std::string, std::vector<Member>> groups;
  std::vector<int> no_record;
  std::vector<int> all_waiting;  // in a collective or a send/recv
  for (size_t r = 0; r < records.size(); ++r) {
    if (!records[r]) {
      no_record.push_back(static_cast<int>(r));
      continue;
    }
    for (const auto& g : records[r]->groups) {
      groups[g.group].push_back({static_cast<int>(r), &g});
      if (!g.p2p_pending.empty()) all_waiting.push_back(static_cast<int>(r));
    }
  }

  StallAnalysis out;
  std::ostringstream os;
  for (const auto& [name, members] : groups) {
    const GroupProgress* first_waiter = nullptr;
    uint64_t target = 0;  // the call the waiting ranks are in (the highest of them)
    for (const Member& m : members) {
      if (!waiting(*m.group)) continue;
      if (!first_waiter || m.group->current->seq > target) {
        first_waiter = m.group;
        target = m.group->current->seq;
      }
    }
    if (!first_waiter) continue;
    OpSummary target_op = *first_waiter->current;
    target_op.seq = target;
    os << "  group " << name << " (" << first_waiter->size << " ranks), stuck at " << call_name(name, target_op) << ":\n";
    std::vector<int> missing, waiters;
    std::vector<std::pair<int, const OpSummary*>> calls;
    for (const Member& m : members) {
      const GroupProgress& g = *m.group;
      if (waiting(g)) {
        waiters.push_back(m.rank);
        calls.push_back({m.rank, &*g.current});
        all_waiting.push_back(m.rank);
        os << "    rank " << m.rank << " waits in " << call_name(name, *g.current) << " (" << g.current->what << ", "
           << g.current->state << ") since " << ddp::contract::clock_time(g.current->since_ms) << ", "
           << seconds_text(now_ms - g.current->since_ms) << "\n";
      } else if (g.issued < target) {
        missing.push_back(m.rank);
        os << "    rank " << m.rank << " never arrived; last completed ";
        if (g.last_completed) {
          os << call_name(name, *g.last_completed) << " (" << g.last_completed->what << ") at "
             << ddp::contract::clock_time(g.last_completed->since_ms) << "\n";
        } else {
          os << "nothing in this group\n";
        }
      }
    }
    if (static_cast<int>(members.size()) < first_waiter->size) {
      if (name == "0") {
        for (int r : no_record) missing.push_back(r);
      }
      os << "    " << first_waiter->size - static_cast<int>(members.size())
         << " member(s) published no progress record"
         << (name == "0" && !no_record.empty() ? " (ranks " + rank_list(no_record) + ")" : "") << "\n";
    }
    const std::string mismatch = mismatch_headline(name, target, calls);
    if (!mismatch.empty()) os << "    " << mismatch << "\n";
    if (out.headline.empty()) {
      if (!mismatch.empty()) {
        out.headline = mismatch;
        out.stalled = waiters;
      } else if (!missing.empty()) {
        out.headline = std::string(missing.size() == 1 ? "rank " : "ranks ") + rank_list(missing) +
                       " never arrived at " + call_name(name, target_op) + ", which " +
                       (waiters.size() == 1 ? "rank " : "ranks ") + rank_list(waiters) + " wait" +
                       (waiters.size() == 1 ? "s" : "") + " in";
        out.stalled = missing;
      } else {
        out.headline = std::string(waiters.size() == 1 ? "rank " : "ranks ") + rank_list(waiters) + " wait" +
                       (waiters.size() == 1 ? "s" : "") + " in " + call_name(name, target_op) +
                       (target_op.state == "failed" ? ", which failed" : " and it does not complete");
      }
    }
  }
  // Sends and recvs, and who waits for whom: a deadlock, or a peer in no call, is the
  // better headline (a collective's missing ranks may be the ones blocked).
  const WaitAnalysis waits = analyse_waits(records, now_ms);
  os << waits.text;
  if (!waits.headline.empty() && (!waits.culprits.empty() || out.headline.empty())) {
    out.headline = waits.headline;
    out.stalled = waits.culprits;
  }
  if (out.headline.empty()) out.headline = "no rank completed a call, and none waits in one";
  if (out.stalled.empty()) {
    std::sort(all_waiting.begin(), all_waiting.end());
    all_waiting.erase(std::unique(all_waiting.begin(), all_waiting.end()), all_waiting.end());
    out.stalled = all_waiting;
  }
  if (groups.empty()) os << "  no rank published a progress record (workers that do not use the ddprun runtime)\n";
  out.text = os.str();
  return out;
}

std::string stopped_headline(const ProgressRecords& records, const std::vector<StoppedWorker>& stopped) {
  std::string names;
  size_t traced = 0;
  std::vector<int> ranks;
  for (const StoppedWorker& s : stopped) {
    names += (names.empty() ? "" : ", ") + std::to_string(s.process.rank) + " (pid " + std::to_string(s.process.pid) + ")";
    traced += s.traced ? 1 : 0;
    ranks.push_back(s.process.rank);
  }
  const bool one = stopped.size() == 1;
  const std::string how = traced == 0                ? "stopped (SIGSTOP)"
                          : traced == stopped.size() ? "stopped by a tracer"
                                                     : "stopped (SIGSTOP or a tracer)";
  std::string out = (one ? "rank " : "ranks ") + names + (one ? " is " : " are ") + how;
  // The call another rank waits in: what the stopped ones hold up.
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) continue;
    if (const auto call = in_flight_call(records, r)) {
      return out + ": the others wait for " + (one ? "it" : "them") + " in " + call->name;
    }
  }
  return out + ": the job waits for " + (one ? "it" : "them");
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string state_meaning(char c) {
  switch (c) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "uninterruptible wait";
    case 'T': return "stopped";
    case 't': return "traced";
    case 'Z': return "zombie";
    case 'X': return "dead";
    case 'I': return "idle";
    default: return "unknown";
  }
}

// Where an executable lies on PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// How long a debugger that ran out of time gets to detach, and a killed one to go.
constexpr std::chrono::milliseconds kDetachGrace{1000};

// Waits until the process behind `pidfd` exits, for at most `timeout`; true when it did.
// The exit status is collected if the supervisor (which reaps every child of ddprun,
// the subreaper) has not collected it first: then waitid says ECHILD, which is fine.
bool wait_exit(int pidfd, std::chrono::milliseconds timeout) {
  pollfd p{pidfd, POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, static_cast<int>(timeout.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) return false;
  siginfo_t info{};
  waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
  return true;
}

// Runs argv with stdout and stderr captured, for at most `timeout`; returns what it wrote.
// The child is only ever addressed through a pidfd taken before it can exit, never by
// its bare pid: the supervisor may reap it at any time and the pid be reused (by a
// restarted worker, say). On timeout the debugger is asked to end (and detach) first,
// then killed, and `target` is continued so that it is never left stopped.
std::string capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout, int target) {
  int out_pipe[2], go_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return "(cannot create a pipe)\n";
  if (pipe2(go_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return "(cannot create a pipe)\n";
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Signals stay blocked across fork: ddprun's handlers must never run in the child.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls here. The child waits for "go": until then it
    // cannot exit, so the pidfd the parent takes is surely this child's.
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction current {};
      if (sigaction(sig, nullptr, &current) == 0 && current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN) {
        signal(sig, SIG_DFL);
      }
    }
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    char go;
    close(go_pipe[1]);
    if (read(go_pipe[0], &go, 1) != 1) _exit(127);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(out_pipe[1], 1) < 0 || dup2(out_pipe[1], 2) < 0) _exit(127);
    execv(argv[0].c_str(), args.data());
    _exit(127);
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  close(out_pipe[1]);
  close(go_pipe[0]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(go_pipe[1]);
    return "(cannot run " + argv[0] + ")\n";
  }
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  bool started = pidfd >= 0 && write(go_pipe[1], "g", 1) == 1;
  close(go_pipe[1]);  // without "go" the child exits at once
  if (!started) {
    if (pidfd >= 0) close(pidfd);
    close(out_pipe[0]);
    return "(cannot run " + argv[0] + ": " + std::strerror(errno) + ")\n";
  }
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buf[8192];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out_pipe[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = read(out_pipe[0], buf, sizeof(buf));
    if (n <= 0) break;
    if (out.size() < (1u << 20)) out.append(buf, static_cast<size_t>(n));
  }
  close(out_pipe[0]);
  if (timed_out) {
    // A debugger that ends on SIGTERM detaches; one that does not is killed, and the
    // kernel then detaches it, possibly leaving the target stopped: continue it.
    syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0);
    if (!wait_exit(pidfd, kDetachGrace)) {
      syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      wait_exit(pidfd, kDetachGrace);
    }
    if (target >= 0) syscall(SYS_pidfd_send_signal, target, SIGCONT, nullptr, 0);
    out += "(gave up after " + seconds_text(timeout.count()) + ")\n";
  } else {
    // The output ended: the child ends too (bounded: a child that closed its output
    // early but goes on is treated like one that ran out of time).
    if (!wait_exit(pidfd, kDetachGrace)) {
      syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      wait_exit(pidfd, kDetachGrace);
      if (target >= 0) syscall(SYS_pidfd_send_signal, target, SIGCONT, nullptr, 0);
    }
  }
  close(pidfd);
  return out;
}

// gdb prints much besides the stacks: keep the thread headers and frames.
std::string stack_lines(const std::string& text) {
  std::ostringstream os;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("#", 0) == 0 || line.rfind("(", 0) == 0) os << "      " << line << "\n";
  }
  return os.str();
}

std::string stacks_with(pid_t pid, std::chrono::milliseconds timeout, int target) {
  std::string exe;
  std::error_code ec;
  exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).filename().string();
  if (exe.rfind("python", 0) == 0) {
    std::string py_spy = on_path("py-spy");
    if (!py_spy.empty()) {
      std::string text = capture({py_spy, "dump", "--pid", std::to_string(pid)}, timeout, target);
      std::string indented;
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) indented += "      " + line + "\n";
      return "    Python stacks (py-spy dump):\n" + indented;
    }
  }
  std::string gdb = on_path("gdb");
  if (gdb.empty()) return "    no stacks: gdb is not installed (Debian package gdb; scripts/setup installs it)\n";
  // No debuginfod: a report must not wait on (or reach) the network for symbols.
  std::string text = capture({gdb, "-p", std::to_string(pid), "-batch", "-nx", "-iex", "set debuginfod enabled off",
                              "-iex", "set auto-load off", "-ex", "set pagination off", "-ex", "thread apply all bt"},
                             timeout, target);
  std::string frames = stack_lines(text);
  if (frames.empty()) {
    // gdb's last line says why (its output ends in a newline, which must not split the report's line).
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
    const std::string last = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
    const std::string why = last.empty() ? std::string("no output") : last.substr(0, 200);
    const std::string state = process_state(pid);
    if (state.empty() || state[0] == 'Z' || state[0] == 'X') return "    no stacks: the worker exited before gdb read them (" + why + ")\n";
    return "    no stacks from gdb (" + why + "); gdb needs ptrace rights over the worker (root or kernel.yama.ptrace_scope=0)\n";
  }
  return "    native stacks (gdb):\n" + frames;
}

std::string stacks_of(pid_t pid, std::chrono::milliseconds timeout) {
  // The worker, held by a pidfd: continued after a debugger that ran out of time.
  int target = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  std::string text = stacks_with(pid, timeout, target);
  if (target >= 0) close(target);
  return text;
}

}  // namespace

std::string process_state(pid_t pid) {
  const char c = process_state_letter(pid);
  if (c == 0) return "";
  return std::string(1, c) + " (" + state_meaning(c) + ")";
}

std::optional<uint64_t> process_tree_cpu_ticks(pid_t pid) {
  constexpr size_t kMostProcesses = 4096;  // a bound on the walk, should the tree churn
  std::vector<pid_t> todo{pid};
  uint64_t total = 0;
  for (size_t seen = 0; !todo.empty() && seen < kMostProcesses; ++seen) {
    pid_t p = todo.back();
    todo.pop_back();
    const std::string dir = "/proc/" + std::to_string(p);
    std::string stat = read_text(dir + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) {
      if (p == pid) return std::nullopt;
      continue;  // a descendant that just ended
    }
    if (p == pid && (stat[close + 2] == 'Z' || stat[close + 2] == 'X')) return std::nullopt;
    // After the name: state (field 3) ... utime stime cutime cstime (fields 14 to 17).
    std::istringstream fields(stat.substr(close + 2));
    std::string skip;
    for (int field = 3; field <= 13; ++field) fields >> skip;
    uint64_t ticks[4] = {0, 0, 0, 0};
    for (uint64_t& t : ticks) fields >> t;
    total += ticks[0] + ticks[1] + ticks[2] + ticks[3];
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(dir + "/task", ec);
         !ec && it != std::filesystem::directory_iterator(); ++it) {
      std::istringstream children(read_text(it->path().string() + "/children"));
      for (pid_t child; children >> child;) todo.push_back(child);
    }
  }
  return total;
}

int64_t process_rss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

std::string describe_processes(const std::string& host, const std::vector<WorkerProcess>& workers,
                               const ProcessReportOptions& options) {
  // Every state first: a debugger attached to one worker must not show in another's.
  std::vector<std::string> states(workers.size()), wchans(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    states[i] = process_state(workers[i].pid);
    wchans[i] = read_text("/proc/" + std::to_string(workers[i].pid) + "/wchan");
  }
  std::vector<std::future<std::string>> stacks(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    bool alive = !states[i].empty() && states[i][0] != 'Z' && states[i][0] != 'X';
    if (alive && options.stacks) {
      stacks[i] = std::async(std::launch::async, stacks_of, workers[i].pid, options.stack_timeout);
    }
  }
  std::ostringstream os;
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerProcess& w = workers[i];
    os << "  rank " << w.rank << " on " << host << ", pid " << w.pid << ": ";
    if (states[i].empty()) {
      os << "gone\n";
      continue;
    }
    const std::string& wchan = wchans[i];
    os << "alive, state " << states[i] << (wchan.empty() || wchan == "0" ? "" : ", wchan " + wchan);
    int threads = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(w.pid) + "/task", ec);
         !ec && it != std::filesystem::directory_iterator(); ++it) {
      ++threads;
    }
    os << ", " << threads << " thread(s)\n";
    if (stacks[i].valid()) os << stacks[i].get();
  }
  return os.str();
}

}  // namespace ddprun
