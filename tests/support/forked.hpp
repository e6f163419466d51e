// A function run in a forked child of the test process, for tests that need a real
// second process (a peer that dies, a rank with its own store connection) without a
// program to exec. The child never returns into the test framework: it leaves with
// _exit(), after sending back what the function returned (or the error it threw).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

namespace testing {

class ForkedChild {
 public:
  struct Result {
    bool ok = false;      // the function returned (false: it threw; payload is what())
    std::string payload;  // what it returned, or the error's message
    int status = -1;      // exit code, or 128+signal
  };

  explicit ForkedChild(const std::function<std::string()>& body);
  ~ForkedChild();  // SIGKILLs and reaps the child if it is still running
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;
  ForkedChild(ForkedChild&& other) noexcept;
  ForkedChild& operator=(ForkedChild&&) = delete;

  pid_t pid() const { return pid_; }

  // Reads what the child sends until it closes the pipe, then reaps it. Throws
  // std::runtime_error (after killing the child) when that takes longer than
  // `timeout`.
  Result wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  int fd_ = -1;  // read end of the child's pipe
  bool reaped_ = false;
};

// A child that only waits to be killed.
ForkedChild idle_child();

}  // namespace testing
