// A Store backed by a StoreServer over TCP: one connection that every thread of a
// process may share. Connecting retries until connect_timeout, so nodes may start in
// any order; authentication happens before the constructor returns.
//
// Pipelined. Every request carries an id, so any number of threads may have requests
// in flight on one client at once, blocking get/wait/multi_get included, and each is
// answered on its own as the server answers it: a get blocked on one thread does not
// hold up a set on another. The server parks at most 1,024 blocked requests per
// connection (PROTOCOL.md, "Limits"); past that a request fails with StoreError.
//
// The link thread. One thread per client does the socket I/O. It also runs what is
// handed to it: the completions of asynchronous requests (get_async, ...) and tasks
// (post, post_after). Those run one at a time, must not block and must not throw;
// they may start asynchronous requests, never a synchronous one (it would wait for
// the thread it runs on: it throws StoreError instead).
//
// Deadlines. Each request has its own: the time it may block on the server (the
// timeout of get, wait, multi_get; zero for the others) plus io_timeout for its
// answer to arrive. A request past its deadline is given up: it fails, its answer is
// thrown away when it comes, and the connection goes on for the other requests. How it
// fails depends on the server: if the server has sent anything since the request went
// out, that request alone ends with StoreTimeout (naming no keys); if it has sent
// nothing, the server counts as gone (frozen, or cut off). Then the connection is
// dropped, and every request in flight fails with StoreConnectionError.
//
// Reconnecting: never, once connected. A lost connection is final for its client:
// the requests in flight and every later one throw StoreConnectionError. The server
// has dropped that connection's blocked requests and published its wills, and a
// quiet reconnect would hide that. An owner that wants to go on makes a new client.
//
// Fork: a client belongs to the process that made it. In a forked child, every
// request on a parent's client throws StoreConnectionError, post(), post_after() and
// cancel() do nothing, and destroying the client touches nothing of the parent's:
// its thread, locks and socket are left alone and its memory is leaked on purpose (a
// parent thread may have held a lock at the fork, or wait on a condition variable that
// the child cannot destroy). Objects whose state the link thread shares follow the
// same rule: their destructors ask forked() first and leak likewise. A child that
// needs the store connects a client of its own.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>

#include "rdzv/store.hpp"
#include "rdzv/waiting.hpp"

namespace rdzv {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;                     // empty: the server must not require one
  std::string ns;                        // namespace (a job id on a shared daemon)
  Millis connect_timeout{30000};         // keep trying to connect (and authenticate) until then
  Millis handshake_timeout{5000};        // once connected, the greeting may take this long (at least
                                         // until connect_timeout)
  Millis io_timeout{30000};              // an answer may come this much later than the server's wait
  Millis heartbeat_timeout{10000};       // an unreachable server is detected after about this (0: never)
};

// What an asynchronous request ends with: its value, or the error the synchronous
// call would have thrown (StoreTimeout, StoreConnectionError, StoreError).
template <typename T>
struct Outcome {
  std::optional<T> value;    // set when error is null
  std::exception_ptr error;  // set when the request failed
  bool ok() const { return error == nullptr; }
  // The value, or the error rethrown.
  T& get() {
    if (error) std::rethrow_exception(error);
    return *value;
  }
};
// A request that answers nothing but success.
struct Done {
  std::exception_ptr error;
  bool ok() const { return error == nullptr; }
  void get() const {
    if (error) std::rethrow_exception(error);
  }
};

// Names a request in flight, for cancel(). Never 0.
using RequestId = uint64_t;

namespace detail { class Link; }
namespace wire { struct Request; }

class TcpStore : public Store {
 public:
  // Connects and authenticates. Throws StoreConnectionError (no server within
  // connect_timeout), StoreAuthError (token refused, or the server could not prove it),
  // StoreError (what listens there does not greet as a ddprun store within handshake_timeout).
  explicit TcpStore(TcpStoreOptions options);
  // Closes without GOODBYE (a will set with set_will() fires); the completions of
  // requests still in flight are dropped without running.
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, Millis timeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  // The server will compare_set(key, "", value) if this connection ends without close():
  // how other nodes learn that this one died or was cut off. With a `silence_limit`,
  // the server also ends the connection (and publishes the will) when it hears nothing
  // from this client for that long: keep it alive with ping().
  void set_will(const std::string& key, const std::string& value, Millis silence_limit = Millis(0));
  // Several wills at once (at most 16), replacing those held: each key is compare_set
  // on its own when the connection drops (an elastic node's failure notice and its
  // "lost" mark).
  void set_wills(const std::vector<std::pair<std::string, std::string>>& wills, Millis silence_limit = Millis(0));

  // A no-op round trip (keeps a will's silence limit from expiring).
  void ping();
  // Clean close (GOODBYE): the will is discarded. Further calls throw.
  void close();

  // Drops the connection: every request in flight, on any thread, fails at once with
  // StoreConnectionError, and so does every later one. Safe to call from any thread.
  // It ends the link for every user of this client: to give up one request, cancel it.
  void abort();

  // ---- Asynchronous requests ----
  // Each queues its request and returns at once; `then` runs on the link thread,
  // exactly once, with the outcome: the answer, the deadline passed, or the connection
  // lost. After a failure of the connection, `then` still runs, on the link thread.
  RequestId get_async(const std::string& key, Millis timeout, std::function<void(Outcome<std::string>)> then);
  RequestId add_async(const std::string& key, int64_t delta, std::function<void(Outcome<int64_t>)> then);
  RequestId set_async(const std::string& key, const std::string& value, std::function<void(Done)> then);
  RequestId ping_async(std::function<void(Done)> then);

  // Gives up a request in flight: its completion will not run (unless it is running
  // already) and its answer is thrown away. Returns whether it was still in flight.
  // The server keeps a given-up get/wait/multi_get parked until its own timeout, so
  // a long wait that may be given up is better made in slices.
  bool cancel(RequestId id);

  // Runs `task` on the link thread, soon / after `delay`. A task that should stop
  // repeating checks a flag of its owner's; tasks still queued when the client is
  // destroyed are dropped.
  void post(std::function<void()> task);
  void post_after(Millis delay, std::function<void()> task);

  // True in a forked child of the process that made this client (see "Fork" above).
  bool forked() const;

  // The local address of this connection (the interface that reaches the server).
  std::string local_address() const;

  const TcpStoreOptions& options() const { return options_; }

 private:
  // Runs a request and waits for its answer body (throws what the answer says).
  std::string call(const wire::Request& q, Millis server_wait);
  RequestId start(const wire::Request& q, Millis server_wait,
                  std::function<void(std::string body, std::exception_ptr error)> then);
  void check_usable() const;

  TcpStoreOptions options_;
  std::unique_ptr<detail::Link> link_;
};

// Connecting to a store that may not be up yet, in the one way to wait (waiting.hpp):
// a try per slice of `w` (the slice is its connect_timeout) until w.timeout, the
// notices saying describe(reason), the reason being why the last try failed
// ("Connection refused"). A store that refuses our token throws StoreAuthError at once;
// a listener that is not a ddprun store, StoreError, its greeting awaited for the
// client's handshake_timeout but no longer than what is left of w.timeout.
struct Connecting {
  std::shared_ptr<TcpStore> store;  // connected; null when the wait ended without
  WaitEnd end = WaitEnd::kArrived;  // how the wait ended
  std::string reason = "no answer";  // why the last try failed
};
Connecting connect_waiting(TcpStoreOptions options, Waiting w,
                           const std::function<std::string(const std::string& reason)>& describe);

}  // namespace rdzv
