// The pipelined connection under a TcpStore (its contract is in rdzv/tcp_store.hpp):
// one connected, authenticated socket and one thread, the link thread, that does all
// of its I/O. Requests are queued with an id and a deadline; the thread writes them,
// reads the answers and hands each to its request's completion by id, gives up the
// requests whose deadline passed, and runs posted tasks when they are due.
//
// Whoever takes a request out of the table of requests in flight (under the mutex)
// owns its completion: the answer, the deadline, a cancel or the loss of the
// connection, whichever comes first. So every completion runs at most once, and
// answers with no request in the table (given up, cancelled) are thrown away.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "protocol.hpp"
#include "rdzv/tcp_store.hpp"

namespace rdzv::detail {

using Clock = std::chrono::steady_clock;

// What a request ended with: the server's answer, or an error in place of one.
struct Answer {
  wire::Type type = wire::Type::kOk;
  std::string body;
  std::exception_ptr error;  // no answer: the deadline passed or the connection was lost
};
using Completion = std::function<void(Answer)>;
using Task = std::function<void()>;

class Link {
 public:
  // Takes over `fd` (connected, authenticated, non-blocking) and starts the link
  // thread. `where` ("host:port") names the server in errors.
  Link(int fd, std::string where, Millis io_timeout);
  // Stops the thread and closes the socket; completions still pending are dropped.
  // Never called in a forked child (TcpStore leaks the link there).
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Queues a request whose answer may take `server_wait` + the I/O timeout; `done`
  // runs on the link thread once (unless cancelled first).
  RequestId submit(wire::Type type, const std::string& body, Millis server_wait, Completion done);
  // Takes the request out of the table; its completion is dropped, not run.
  bool cancel(RequestId id);
  // Runs `task` on the link thread once `delay` has passed.
  void post_after(Millis delay, Task task);
  // Shuts the socket down; the link thread then fails everything in flight with
  // StoreConnectionError saying `why`, and later requests fail the same way.
  void drop(const std::string& why);

  bool on_link_thread() const { return std::this_thread::get_id() == thread_id_.load(); }
  bool forked() const { return ::getpid() != owner_pid_; }
  int fd() const { return fd_; }
  const std::string& where() const { return where_; }

 private:
  struct Pending {
    RequestId id;
    Clock::time_point queued;                              // when it was handed to the link
    std::multimap<Clock::time_point, uint32_t>::iterator deadline;  // its entry in deadlines_
    Completion done;
  };

  void run();
  void wake();
  void read_available();
  void deliver(const wire::Header& h, std::string body);
  void write_queued();  // under mu_
  void expire(Clock::time_point now);
  void lose(const std::string& why);
  std::exception_ptr lost_error(const std::string& why) const;

  const int fd_;
  const std::string where_;
  const Millis io_timeout_;
  const pid_t owner_pid_;
  int wake_fd_ = -1;  // an eventfd: something for the link thread to do

  std::mutex mu_;                    // guards everything below but in_ and last_heard_
  std::string out_;                  // frames not yet written (the head may be half sent)
  std::unordered_map<uint32_t, Pending> pending_;  // by wire request id
  std::multimap<Clock::time_point, uint32_t> deadlines_;
  std::multimap<Clock::time_point, Task> timers_;  // posted tasks, by when they are due
  Clock::time_point poll_until_ = Clock::time_point::max();  // when the link thread wakes up on its own
  RequestId next_id_ = 0;
  std::exception_ptr broken_;        // set once the connection is lost: what every request gets
  std::string drop_reason_;          // why drop() shut the socket
  bool stopping_ = false;

  // The link thread's own.
  std::string in_;                   // bytes read, not yet a whole frame
  Clock::time_point last_heard_;     // the last time the server sent anything
  std::string server_said_;          // an ERROR the server sent before closing (request id 0)

  std::atomic<std::thread::id> thread_id_{};  // the link thread's, once it runs
  std::thread thread_;               // last: starts once everything above is ready
};

}  // namespace rdzv::detail
