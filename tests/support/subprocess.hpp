// Running real processes from tests: start a command with its stdout/stderr
// captured to files, wait for it with a timeout (pidfd + poll, no sleeping), send
// it signals, and read what it printed so far.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace testing {

using namespace std::chrono_literals;

// A fresh directory under /tmp, removed with its contents when this goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct ProcessOptions {
  std::map<std::string, std::string> set_env;  // added to (or replacing in) the test's environment
  std::vector<std::string> unset_env;
};

class Process {
 public:
  Process(const std::vector<std::string>& argv, const ProcessOptions& options = {});
  ~Process();  // SIGKILLs and reaps the process if it is still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void send_signal(int sig) const;

  // Waits up to `timeout` for the process to end; returns its status (exit code,
  // or 128+signal) or nothing on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

  // What it wrote so far.
  std::string out() const;
  std::string err() const;

  // Polls the captured stdout until `ready` accepts it or the timeout passes.
  bool wait_for_stdout(const std::function<bool(const std::string&)>& ready, std::chrono::milliseconds timeout) const;

  double seconds_since_start() const;

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<int> status_;
  std::chrono::steady_clock::time_point started_;
};

struct RunResult {
  int status = -1;  // exit code, or 128+signal
  std::string out;
  std::string err;
  double seconds = 0;
};

// Runs to completion; FAILs the current test (via exception) if it takes longer than `timeout`.
RunResult run(const std::vector<std::string>& argv, const ProcessOptions& options = {},
              std::chrono::milliseconds timeout = 60s);

// Splits text into lines (without the '\n').
std::vector<std::string> lines_of(const std::string& text);

// True while /proc/<pid> exists and is not a zombie.
bool process_alive(pid_t pid);

// The children of `pid` right now (from /proc/<pid>/task/<pid>/children).
std::vector<pid_t> child_pids(pid_t pid);

// The process's command name (/proc/<pid>/comm without the newline; empty once gone).
std::string command_name(pid_t pid);

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& text, bool executable = false);

}  // namespace testing
