// Helpers for the end-to-end launcher tests: argv for the real ddprun binary and
// the test worker, and the per-rank view of ddprun's prefixed output.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ports.hpp"
#include "subprocess.hpp"

namespace e2e {

inline const std::string kDdprun = DDPRUN_BIN;
inline const std::string kWorker = TEST_WORKER_BIN;

// {ddprun, args...}
inline std::vector<std::string> ddprun(std::vector<std::string> args) {
  args.insert(args.begin(), kDdprun);
  return args;
}

// Lines of ddprun's output that came from workers, by global rank, prefix removed.
inline std::map<int, std::vector<std::string>> by_rank(const std::string& output) {
  std::map<int, std::vector<std::string>> out;
  for (const auto& line : testing::lines_of(output)) {
    if (line.rfind("[rank", 0) != 0) continue;
    auto close = line.find("]:");
    if (close == std::string::npos) continue;
    out[std::stoi(line.substr(5, close - 5))].push_back(line.substr(close + 2));
  }
  return out;
}

// True when each of ranks 0..n-1 printed the line `what`.
inline bool all_ranks_said(const std::string& output, int n, const std::string& what) {
  auto ranks = by_rank(output);
  for (int r = 0; r < n; ++r) {
    if (std::find(ranks[r].begin(), ranks[r].end(), what) == ranks[r].end()) return false;
  }
  return true;
}

// What became of a process sent a signal: its status (none when it did not end in
// time) and the seconds from the signal to its end.
struct Ended {
  std::optional<int> status;
  double seconds = 0;
};
inline Ended signal_and_wait(testing::Process& p, int sig, std::chrono::milliseconds limit) {
  p.send_signal(sig);
  const auto sent = std::chrono::steady_clock::now();
  Ended e;
  e.status = p.wait(limit);
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  return e;
}

// A port nothing listens on right now.
using testing::free_port;

// Lines ddprun printed itself ("ddprun: level: ...").
inline std::vector<std::string> own_lines(const std::string& output) {
  std::vector<std::string> out;
  for (const auto& line : testing::lines_of(output)) {
    if (line.rfind("ddprun: ", 0) == 0) out.push_back(line);
  }
  return out;
}

}  // namespace e2e
