// test_worker: the worker program the launcher tests run under ddprun. Each mode
// exercises one behaviour of the supervisor; all read RANK from the environment.
//
//   env KEY...                 print KEY=VALUE (or KEY unset) for each key
//   fail RANK CODE             rank RANK writes a line to stderr and exits CODE
//                              (CODE "sig:N" kills itself with signal N); others sleep
//   trap SIG...                print "ready", then print "got SIGxxx" for each listed
//                              signal received; exit 0 after SIGTERM/SIGINT/the last one
//   ignore-term                ignore SIGTERM and SIGINT, print "ready", sleep
//   term-slowly MS             print "ready"; on SIGTERM print "got SIGTERM", take MS ms
//                              to wind down, exit 0
//   tree DIR                   start a grandchild in the worker's group and one that
//                              leaves it (setsid), write all pids to DIR/pids.RANK, sleep
//   leave-behind DIR           start a setsid'd grandchild, write its pid, exit 0
//   flood LINES                write LINES numbered lines to stdout in ragged pieces
//   spill LINES CODE DIR       write LINES numbered lines to stdout and to stderr (a line
//                              to each in turn, in ragged pieces), then exit CODE; ignores
//                              SIGTERM, and exits only once every local rank has written
//                              all its lines (files in DIR; at most 20 s), so a rank
//                              failing first cuts no other rank short
//   bind-master-port           exit 0 when MASTER_PORT can be bound on all interfaces
//   fail-until-restart N       exit 5 while TORCHELASTIC_RESTART_COUNT < N, then 0
//   touch FILE                 create FILE (proves a worker started)
//   now                        print "started <wall-clock seconds>" (launch latency benchmarks)
//   store                      join the job's store from DDPRUN_STORE_*: rank 0 sets "hello",
//                              every rank gets it and adds to "count", then waits for all ranks
//   progress steady            publish ProgressRecords as the worker runtime does (contract,
//                              JobKeys(restart).progress(RANK), every 0.5 s): one all_reduce of
//                              group 0 and one step completed every 0.1 s, until stopped
//   progress stall R N         every rank completes all_reduce #1..#N, then rank R "computes"
//                              (sleeps) while the others wait in #N+1; until stopped
//   progress fail R N          as stall, but rank 0's #N+1 is in state "failed" (timed out)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <ctime>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>

#include "ddp/contract/job_records.hpp"
#include "ddp/contract/store_keys.hpp"
#include "ddp/contract/worker_env.hpp"
#include "rdzv/prefix_store.hpp"
#include "rdzv/tcp_store.hpp"

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

void say(const std::string& text) {
  std::string line = text + "\n";
  (void)!write(STDOUT_FILENO, line.data(), line.size());
}

[[noreturn]] void sleep_forever() {
  for (int i = 0; i < 600; ++i) sleep(1);
  _exit(99);  // nobody stopped us: the test fails on this status
}

volatile sig_atomic_t g_last_signal = 0;
void record_signal(int sig) { g_last_signal = sig; }

int mode_trap(int argc, char** argv) {
  // The signals stay blocked except inside sigsuspend(), so one that arrives right
  // after "ready" waits for us instead of being handled before we sleep.
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigset_t wanted, old;
  sigemptyset(&wanted);
  for (int i = 2; i < argc; ++i) {
    sigaction(std::atoi(argv[i]), &sa, nullptr);
    sigaddset(&wanted, std::atoi(argv[i]));
  }
  sigprocmask(SIG_BLOCK, &wanted, &old);
  say("ready");
  int remaining = argc - 2;
  while (remaining > 0) {
    sigsuspend(&old);
    int sig = g_last_signal;
    if (sig == 0) continue;
    g_last_signal = 0;
    say(std::string("got SIG") + sigabbrev_np(sig));
    --remaining;
    if (sig == SIGTERM || sig == SIGINT) return 0;
  }
  return 0;
}

pid_t start_sleeper(bool leave_group) {
  pid_t pid = fork();
  if (pid == 0) {
    if (leave_group) setsid();
    execl("/bin/sleep", "sleep", "300", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Lines of varying length, each written in up to three pieces, to each of `fds` in turn.
void write_numbered_lines(long lines, std::initializer_list<int> fds) {
  int rank = env_int("RANK");
  std::string payload(200, 'x');
  for (long i = 0; i < lines; ++i) {
    std::string line = "rank=" + std::to_string(rank) + " i=" + std::to_string(i) + " " +
                       payload.substr(0, static_cast<size_t>((i * 37) % 200)) + "|end\n";
    size_t a = line.size() / 3, b = 2 * line.size() / 3;
    for (int fd : fds) {
      (void)!write(fd, line.data(), a);
      (void)!write(fd, line.data() + a, b - a);
      (void)!write(fd, line.data() + b, line.size() - b);
    }
  }
}

int mode_bind_master_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(env_int("MASTER_PORT")));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) {
    std::fprintf(stderr, "cannot bind MASTER_PORT %d: %s\n", env_int("MASTER_PORT"), std::strerror(errno));
    return 1;
  }
  say("bound " + std::to_string(env_int("MASTER_PORT")));
  return 0;
}

// How to reach the job's store from DDPRUN_STORE_* (read through the contract).
rdzv::TcpStoreOptions job_store(const ddp::contract::StoreEndpoint& e) {
  rdzv::TcpStoreOptions o;
  o.host = e.addr;
  o.port = static_cast<uint16_t>(e.port);
  o.token = e.token;
  o.ns = e.ns;
  o.connect_timeout = std::chrono::seconds(10);
  return o;
}

// A process group "0" as the worker runtime's flight recorder would summarise it.
ddp::contract::OpSummary call(uint64_t seq, const char* state, int64_t since_ms) {
  return {seq, "all_reduce 1024×f32 sum", state, since_ms};
}

int mode_progress(int argc, char** argv) {
  using ddp::contract::unix_millis_now;
  const std::string scenario = argc > 2 ? argv[2] : "";
  const int victim = argc > 3 ? std::atoi(argv[3]) : -1;
  const uint64_t before = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 0;
  if (scenario != "steady" && !((scenario == "stall" || scenario == "fail") && argc == 5)) return -1;
  const auto env = ddp::contract::WorkerEnv::from_environment();
  if (!env.store) {
    std::fprintf(stderr, "progress: no DDPRUN_STORE_* variables\n");
    return 1;
  }
  rdzv::TcpStore store(job_store(*env.store));  // job keys are not under the groups' prefix
  const std::string key = ddp::contract::JobKeys(env.restart_count).progress(env.rank);
  ddp::contract::ProgressRecord rec;
  rec.rank = env.rank;
  rec.pid = getpid();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  rec.host = host;
  ddp::contract::GroupProgress g;
  g.group = "0";
  g.rank = env.rank;
  g.size = env.world_size;
  rec.groups.push_back(g);
  auto& group = rec.groups[0];
  auto complete = [&](uint64_t seq) {
    int64_t now = unix_millis_now();
    group.issued = group.completed = seq;
    group.current = group.last_completed = call(seq, "completed", now);
    rec.steps = seq;
  };
  auto publish = [&] {
    rec.time_ms = unix_millis_now();
    store.set(key, rec.encode());
  };
  if (scenario == "steady") {
    for (uint64_t seq = 1;; ++seq) {
      complete(seq);
      if (seq % 5 == 1) publish();
      usleep(100 * 1000);
    }
  }
  for (uint64_t seq = 1; seq <= before; ++seq) complete(seq);
  publish();
  say("progress: completed " + std::to_string(before));
  if (env.rank != victim) {
    group.issued = before + 1;
    const bool failed = scenario == "fail" && env.rank == 0;
    group.current = call(before + 1, failed ? "failed" : "started", unix_millis_now());
  }
  while (true) {
    publish();
    usleep(500 * 1000);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_worker MODE [ARGS...]\n");
    return 2;
  }
  std::string mode = argv[1];
  int rank = env_int("RANK");

  if (mode == "env") {
    for (int i = 2; i < argc; ++i) {
      const char* v = std::getenv(argv[i]);
      say(std::string(argv[i]) + (v ? std::string("=") + v : std::string(" unset")));
    }
    return 0;
  }
  if (mode == "fail" && argc == 4) {
    if (rank != std::atoi(argv[2])) sleep_forever();
    usleep(200 * 1000);  // let the others start sleeping
    std::fprintf(stderr, "rank %d failing on purpose\n", rank);
    std::fflush(stderr);
    std::string code = argv[3];
    if (code.rfind("sig:", 0) == 0) {
      signal(std::atoi(code.c_str() + 4), SIG_DFL);
      raise(std::atoi(code.c_str() + 4));
    }
    return std::atoi(code.c_str());
  }
  if (mode == "trap") return mode_trap(argc, argv);
  if (mode == "term-slowly" && argc == 3) {
    sigset_t term, old;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    struct sigaction sa {};
    sa.sa_handler = record_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigprocmask(SIG_BLOCK, &term, &old);
    say("ready");
    while (g_last_signal != SIGTERM) sigsuspend(&old);
    say("got SIGTERM");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[2])));
    return 0;
  }
  if (mode == "ignore-term") {
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    say("ready");
    sleep_forever();
  }
  if (mode == "tree" && argc == 3) {
    pid_t in_group = start_sleeper(false);
    pid_t escaped = start_sleeper(true);
    std::ofstream(std::string(argv[2]) + "/pids." + std::to_string(rank))
        << getpid() << " " << in_group << " " << escaped << "\n";
    say("ready");
    sleep_forever();
  }
  if (mode == "leave-behind" && argc == 3) {
    pid_t escaped = start_sleeper(true);
    std::ofstream(std::string(argv[2]) + "/pids." + std::to_string(rank)) << escaped << "\n";
    return 0;
  }
  if (mode == "flood" && argc == 3) {
    write_numbered_lines(std::atol(argv[2]), {STDOUT_FILENO});
    return 0;
  }
  if (mode == "spill" && argc == 5) {
    signal(SIGTERM, SIG_IGN);
    write_numbered_lines(std::atol(argv[2]), {STDOUT_FILENO, STDERR_FILENO});
    // A rank that exits first gets the others SIGTERMed, possibly before they reached
    // the line above: wait until every local rank has written all it had to.
    const std::string dir = argv[4];
    std::ofstream(dir + "/" + std::to_string(env_int("LOCAL_RANK")));
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int r = 0; r < env_int("LOCAL_WORLD_SIZE"); ++r) {
      while (!std::ifstream(dir + "/" + std::to_string(r)) && std::chrono::steady_clock::now() < give_up) {
        usleep(1000);
      }
    }
    return std::atoi(argv[3]);
  }
  if (mode == "bind-master-port") return mode_bind_master_port();
  if (mode == "fail-until-restart" && argc == 3) {
    int count = env_int("TORCHELASTIC_RESTART_COUNT");
    say("attempt " + std::to_string(count));
    return count < std::atoi(argv[2]) ? 5 : 0;
  }
  if (mode == "store") {
    try {
      // Read through the contract, as the worker runtime reads it (the env mode
      // checks the raw variables).
      const auto env = ddp::contract::WorkerEnv::from_environment();
      if (!env.store) throw std::runtime_error("no DDPRUN_STORE_* variables");
      rdzv::TcpStore base(job_store(*env.store));
      rdzv::PrefixStore store(env.store->prefix, base);
      if (rank == 0) store.set("hello", "from rank 0");
      std::string got = store.get("hello", std::chrono::seconds(10));
      int64_t arrived = store.add("count", 1);
      std::vector<std::string> all;
      for (int r = 0; r < env_int("WORLD_SIZE"); ++r) all.push_back("done/" + std::to_string(r));
      store.set("done/" + std::to_string(rank), "1");
      store.wait(all, std::chrono::seconds(10));
      say("got '" + got + "', arrival " + std::to_string(arrived));
      base.close();
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "store: %s\n", e.what());
      return 1;
    }
  }
  if (mode == "progress") {
    int status = mode_progress(argc, argv);
    if (status >= 0) return status;
  }
  if (mode == "now") {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    char text[64];
    std::snprintf(text, sizeof(text), "started %lld.%09ld", static_cast<long long>(ts.tv_sec), ts.tv_nsec);
    say(text);
    return 0;
  }
  if (mode == "touch" && argc == 3) {
    std::ofstream(argv[2]) << "started\n";
    return 0;
  }
  std::fprintf(stderr, "test_worker: bad mode or arguments: %s\n", mode.c_str());
  return 2;
}
