#include "forked.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <utility>

namespace testing {

ForkedChild::ForkedChild(const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ < 0) {
    close(fds[0]);
    close(fds[1]);
    throw std::runtime_error("fork failed");
  }
  if (pid_ == 0) {
    close(fds[0]);
    char ok = 1;
    std::string payload;
    try {
      payload = body();
    } catch (const std::exception& e) {
      ok = 0;
      payload = e.what();
    }
    const std::string message = std::string(1, ok) + payload;
    for (size_t done = 0; done < message.size();) {
      const ssize_t n = write(fds[1], message.data() + done, message.size() - done);
      if (n <= 0) _exit(2);
      done += static_cast<size_t>(n);
    }
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  fd_ = fds[0];
}

ForkedChild::ForkedChild(ForkedChild&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), fd_(std::exchange(other.fd_, -1)), reaped_(other.reaped_) {}

ForkedChild::~ForkedChild() {
  if (fd_ >= 0) close(fd_);
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

ForkedChild::Result ForkedChild::wait(std::chrono::milliseconds timeout) {
  if (reaped_) throw std::logic_error("ForkedChild::wait called twice");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string message;
  char chunk[512];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid_, SIGKILL);
      throw std::runtime_error("forked child " + std::to_string(pid_) + " did not finish within " +
                               std::to_string(timeout.count()) + " ms");
    }
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(fd_, chunk, sizeof chunk);
    if (n < 0) throw std::runtime_error("read from a forked child failed");
    if (n == 0) break;
    message.append(chunk, static_cast<size_t>(n));
  }
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) throw std::runtime_error("waitpid failed");
  reaped_ = true;
  Result r;
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.ok = !message.empty() && message[0] == 1 && r.status == 0;
  if (!message.empty()) r.payload = message.substr(1);
  return r;
}

ForkedChild idle_child() {
  return ForkedChild([]() -> std::string {
    for (;;) pause();
  });
}

}  // namespace testing
