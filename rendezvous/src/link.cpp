// The link thread and the table of requests in flight (link.hpp).
#include "link.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace rdzv::detail {
namespace {

constexpr size_t kReadChunk = 64u << 10;
constexpr int kReadsPerWake = 16;             // then the other work gets a turn
constexpr size_t kKeepOutBuffer = 1u << 20;   // a bigger send buffer is freed once empty
const wire::Limits kClientLimits{};           // answers are bounded by the server's value limit

// Milliseconds from `now` until `when`, rounded up, as poll() takes them; -1: never.
int poll_timeout(Clock::time_point when, Clock::time_point now) {
  if (when == Clock::time_point::max()) return -1;
  if (when <= now) return 0;
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(when - now).count();
  return static_cast<int>(std::min<int64_t>((us + 999) / 1000, INT32_MAX));
}

// Runs a completion or a task. Their contract is not to throw; what escapes is dropped
// rather than ending the thread every user of the link depends on.
template <typename Fn>
void run_guarded(Fn&& fn) noexcept {
  try {
    fn();
  } catch (...) {
  }
}

Answer failed(std::exception_ptr error) {
  Answer a;
  a.error = std::move(error);
  return a;
}

}  // namespace

Link::Link(int fd, std::string where, Millis io_timeout)
    : fd_(fd), where_(std::move(where)), io_timeout_(io_timeout), owner_pid_(::getpid()), last_heard_(Clock::now()) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw StoreError(std::string("cannot make an eventfd: ") + std::strerror(errno));
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ::close(wake_fd_);
    throw;
  }
}

Link::~Link() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake();
  thread_.join();
  ::close(wake_fd_);
  ::close(fd_);
}

void Link::wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

RequestId Link::submit(wire::Type type, const std::string& body, Millis server_wait, Completion done) {
  const auto now = Clock::now();
  const auto deadline = now + server_wait + io_timeout_;
  std::unique_lock lock(mu_);
  RequestId id = ++next_id_;
  if (broken_) {  // fails as every request does now, on the link thread like any completion
    timers_.emplace(now, [done = std::move(done), error = broken_]() { done(failed(error)); });
    lock.unlock();
    wake();
    return id;
  }
  // The wire carries the low 32 bits: skip 0 (the handshake's) and any still in flight.
  while (static_cast<uint32_t>(id) == 0 || pending_.count(static_cast<uint32_t>(id)) != 0) id = ++next_id_;
  const auto wire_id = static_cast<uint32_t>(id);
  auto entry = deadlines_.emplace(deadline, wire_id);
  pending_.emplace(wire_id, Pending{id, now, entry, std::move(done)});
  const bool was_idle = out_.empty();
  const auto header = wire::encode_header({type, wire_id, static_cast<uint32_t>(body.size())});
  out_.append(header.data(), header.size());
  out_.append(body);
  if (was_idle) write_queued();  // most often all of it goes out here, with no hand-over
  const bool tell = (was_idle && !out_.empty()) || deadline < poll_until_;
  lock.unlock();
  if (tell) wake();
  return id;
}

bool Link::cancel(RequestId id) {
  Completion dropped;  // destroyed after the lock is let go
  std::lock_guard lock(mu_);
  auto it = pending_.find(static_cast<uint32_t>(id));
  if (it == pending_.end() || it->second.id != id) return false;
  dropped = std::move(it->second.done);
  deadlines_.erase(it->second.deadline);
  pending_.erase(it);
  return true;
}

void Link::post_after(Millis delay, Task task) {
  const auto due = Clock::now() + std::max(delay, Millis(0));
  bool tell = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    timers_.emplace(due, std::move(task));
    tell = due < poll_until_;
  }
  if (tell) wake();
}

void Link::drop(const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (broken_ || !drop_reason_.empty()) return;
    drop_reason_ = why;
  }
  ::shutdown(fd_, SHUT_RDWR);  // the link thread reads the end and fails what is in flight
}

void Link::write_queued() {
  size_t sent = 0;
  while (sent < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // full: the link thread waits for room; an error: its poll() sees it
    }
  }
  out_.erase(0, sent);
  if (out_.empty() && out_.capacity() > kKeepOutBuffer) std::string().swap(out_);
}

void Link::run() {
  thread_id_.store(std::this_thread::get_id());
  pthread_setname_np(pthread_self(), "ddp-store");
  std::vector<Task> due;
  for (;;) {
    short events = POLLIN;
    int timeout = 0;
    bool watching = false;
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
      const auto now = Clock::now();
      while (!timers_.empty() && timers_.begin()->first <= now) {
        due.push_back(std::move(timers_.begin()->second));
        timers_.erase(timers_.begin());
      }
      if (!out_.empty()) events |= POLLOUT;
      if (due.empty()) {  // else only look at the socket: the tasks may have queued more
        // Waking at least every I/O timeout means a new request, due no sooner than
        // that, never has to wake this thread for its deadline.
        auto next = now + io_timeout_;
        if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
        if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
        poll_until_ = next;
        timeout = poll_timeout(next, now);
      }
      watching = !broken_;
    }
    for (auto& task : due) run_guarded(task);
    due.clear();
    pollfd fds[2] = {{watching ? fd_ : -1, events, 0}, {wake_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, timeout);
    {
      std::lock_guard lock(mu_);
      poll_until_ = Clock::time_point::min();  // awake: whatever comes is seen next round
    }
    if (ready < 0) continue;  // EINTR
    if (fds[1].revents & POLLIN) {
      uint64_t count = 0;
      (void)!::read(wake_fd_, &count, sizeof(count));
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) read_available();
    if (fds[0].revents & POLLOUT) {
      std::lock_guard lock(mu_);
      if (!broken_) write_queued();
    }
    expire(Clock::now());
  }
}

void Link::read_available() {
  for (int reads = 0; reads < kReadsPerWake; ++reads) {
    const size_t have = in_.size();
    in_.resize(have + kReadChunk);
    const ssize_t n = ::recv(fd_, in_.data() + have, kReadChunk, MSG_DONTWAIT);
    in_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) {
      last_heard_ = Clock::now();
      if (static_cast<size_t>(n) < kReadChunk) break;
    } else if (n == 0) {
      return lose(server_said_.empty() ? "the store closed the connection"
                                       : "the store closed the connection: " + server_said_);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      break;
    } else {
      return lose(std::strerror(errno));
    }
  }
  size_t at = 0;
  while (in_.size() - at >= wire::kHeaderSize) {
    wire::Header h;
    try {
      h = wire::decode_header(in_.data() + at, kClientLimits);
    } catch (const wire::ProtocolError& e) {
      return lose(std::string("the store sent a malformed frame: ") + e.what());
    }
    if (in_.size() - at - wire::kHeaderSize < h.body_size) break;  // the rest is on its way
    std::string body(in_.data() + at + wire::kHeaderSize, h.body_size);
    at += wire::kHeaderSize + h.body_size;
    deliver(h, std::move(body));
  }
  in_.erase(0, at);
  if (in_.empty() && in_.capacity() > kKeepOutBuffer) std::string().swap(in_);
}

void Link::deliver(const wire::Header& h, std::string body) {
  Completion done;
  {
    std::lock_guard lock(mu_);
    auto it = pending_.find(h.request_id);
    if (it == pending_.end()) {
      // The answer to a request given up (deadline, cancel): nobody waits for it. Or,
      // with id 0, the server's last word before it closes the connection.
      if (h.request_id == 0 && h.type == wire::Type::kError) {
        try {
          server_said_ = wire::BodyReader(body, kClientLimits).bytes();
        } catch (const wire::ProtocolError&) {
        }
      }
      return;
    }
    done = std::move(it->second.done);
    deadlines_.erase(it->second.deadline);
    pending_.erase(it);
  }
  Answer a;
  a.type = h.type;
  a.body = std::move(body);
  run_guarded([&] { done(std::move(a)); });
}

void Link::expire(Clock::time_point now) {
  std::vector<Completion> late;
  bool silent = false;  // a request is overdue and the server has said nothing since it was sent
  {
    std::lock_guard lock(mu_);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto it = pending_.find(deadlines_.begin()->second);
      if (it->second.queued >= last_heard_) {
        silent = true;
        break;
      }
      late.push_back(std::move(it->second.done));
      pending_.erase(it);
      deadlines_.erase(deadlines_.begin());
    }
  }
  for (auto& done : late) {
    auto error = std::make_exception_ptr(
        StoreTimeout("the store at " + where_ + " did not answer a request in time (it answers others)"));
    run_guarded([&] { done(failed(error)); });
  }
  if (silent) lose("no answer within the I/O timeout of " + std::to_string(io_timeout_.count()) + " ms");
}

void Link::lose(const std::string& why) {
  std::unordered_map<uint32_t, Pending> in_flight;
  std::exception_ptr error;
  {
    std::lock_guard lock(mu_);
    if (broken_) return;
    const std::string message =
        drop_reason_.empty() ? "lost the connection to the store at " + where_ + ": " + why : drop_reason_;
    error = broken_ = std::make_exception_ptr(StoreConnectionError(message));
    in_flight.swap(pending_);
    deadlines_.clear();
    out_.clear();
  }
  ::shutdown(fd_, SHUT_RDWR);  // the socket itself stays open until the link goes (local_address)
  for (auto& [wire_id, p] : in_flight) run_guarded([&] { p.done(failed(error)); });
}

}  // namespace rdzv::detail
