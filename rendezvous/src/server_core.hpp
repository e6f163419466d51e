// The server's shared state, seen by every session on its one thread: the session
// registry (which owns the sessions), the namespaces with their keys and blocked
// requests, and the one memory budget that everything held for clients is charged to.
#pragma once

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "auth.hpp"
#include "kv_table.hpp"
#include "protocol.hpp"
#include "rdzv/server.hpp"

namespace rdzv {

class Session;

// A blocked GET / WAIT / MULTI_GET.
struct Waiter {
  Waiter(boost::asio::io_context& io, std::shared_ptr<Session> s, uint32_t id, wire::Type t,
         std::vector<std::string> k, size_t charge)
      : session(std::move(s)), request_id(id), type(t), keys(std::move(k)), charged(charge), timer(io) {}
  std::shared_ptr<Session> session;
  uint32_t request_id;
  wire::Type type;
  std::vector<std::string> keys;
  size_t charged;  // bytes of the budget it holds (its key list and index entries)
  boost::asio::steady_timer timer;
  bool done = false;
  bool torch = false;  // a torch client's: a key is also there as a non-empty queue; no timeout
  size_t cursor = 0;   // keys before it were there when last looked at (Namespace::ready)
};

// Keys looked at by Namespace::ready() in this process so far, all threads together
// (tests bound the work of waking a waiter on many keys).
uint64_t waiter_key_checks();
void count_waiter_key_checks(uint64_t n);

struct Namespace {
  KvTable table;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;  // by key
  // torch's QUEUE_PUSH / QUEUE_POP: named queues beside the keys (torch clients only).
  std::unordered_map<std::string, std::deque<std::string>> queues;
  size_t queue_bytes = 0;  // charged as stored bytes
  size_t sessions = 0;
  size_t charged = 0;  // its entry in the server's map of namespaces, charged as stored bytes

  // Whether `key` exists: in torch's view also a queue with something in it.
  bool present(const std::string& key, bool torch) const {
    if (table.find(key) != nullptr) return true;
    if (!torch) return false;
    auto q = queues.find(key);
    return q != queues.end() && !q->second.empty();
  }
  bool torch_ready(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return present(k, true); });
  }
  // Whether all of a waiter's keys exist, going on from its cursor (the key found
  // missing last time) so that waking it once per key set costs each key once. Past
  // the last key, all are looked at once more (one before the cursor may have been
  // deleted meanwhile): the cursor then stops at the first missing one.
  bool ready(Waiter& w) const {
    const size_t from = w.cursor;
    while (w.cursor < w.keys.size() && present(w.keys[w.cursor], w.torch)) ++w.cursor;
    size_t checked = w.cursor - from + 1;
    bool all = w.cursor == w.keys.size();
    if (all) {
      w.cursor = 0;
      while (w.cursor < w.keys.size() && present(w.keys[w.cursor], w.torch)) ++w.cursor;
      checked += w.cursor + 1;
      all = w.cursor == w.keys.size();
    }
    count_waiter_key_checks(checked);
    return all;
  }
};

// Everything the server holds for clients counts against options.max_memory: stored
// keys and values (with wills and namespaces) as `stored`, and what sessions hold
// while they work (connections, partly read frames, blocked requests, queued replies)
// as `held`. Charges are checked before the memory is allocated and given back when it
// is freed; what stored keys take is measured (KvTable::bytes()), the rest is sized
// from measurements (README.md, "The memory budget").
class MemoryBudget {
 public:
  explicit MemoryBudget(size_t limit) : limit_(limit) {}
  bool fits(size_t more) const { return stored_ + held_ <= limit_ && more <= limit_ - stored_ - held_; }
  // Takes `n` bytes for a session's working memory; false (nothing taken) when they do not fit.
  bool try_hold(size_t n) {
    if (!fits(n)) return false;
    held_ += n;
    return true;
  }
  // For a few bytes that must go out even at the limit (an ERROR frame saying so).
  void hold_anyway(size_t n) { held_ += n; }
  // Gives back a charge. Not counted toward a trim by itself: request bodies, replies
  // and finished waits come and go with normal traffic, and their blocks are reused.
  void release(size_t n) { held_ -= n; }
  void store(int64_t delta) {
    stored_ = static_cast<size_t>(static_cast<int64_t>(stored_) + delta);
    if (stored_ > stored_peak_) stored_peak_ = stored_;
  }
  // Bytes a closing connection gave back (its session, name, waits and buffers).
  void torn_down(size_t n) { torn_down_ += n; }
  size_t stored() const { return stored_; }
  size_t held() const { return held_; }
  // Bytes really freed since forget_freed(), when to return free memory to the system:
  // how far stored bytes fell below their peak since then (values rewritten a little
  // shorter and longer again count nothing) plus what closed connections gave back.
  size_t freed() const { return stored_peak_ - stored_ + torn_down_; }
  void forget_freed() {
    stored_peak_ = stored_;
    torn_down_ = 0;
  }

 private:
  size_t limit_;
  size_t stored_ = 0;
  size_t held_ = 0;
  size_t stored_peak_ = 0;
  size_t torn_down_ = 0;
};

// A further port whose torch clients join a namespace of their own (StoreServer::add_torch_listener).
struct TorchListener {
  TorchListener(boost::asio::io_context& io, std::string ns) : acceptor(io), retry(io), torch_namespace(std::move(ns)) {}
  boost::asio::ip::tcp::acceptor acceptor;
  boost::asio::steady_timer retry;
  std::string torch_namespace;
};

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  ServerCore(boost::asio::io_context& io, ServerOptions options);
  void open_listener(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port);
  uint16_t add_torch_listener(uint16_t port, std::string ns);
  void start_accept(boost::asio::ip::tcp::acceptor& acceptor, boost::asio::steady_timer& retry,
                    const std::string* torch_ns);
  void admit(boost::asio::ip::tcp::socket socket, const std::string& torch_ns);
  void stop();
  // ServerOptions::hold_torch_namespace: holds options_.torch_namespace (joins it as a
  // connection would) and lets go of the one held before.
  void hold_torch_namespace();

  Namespace& join(const std::string& name);
  void leave(const std::string& name);
  // Completes every waiter on `key` whose keys now all exist.
  void wake(Namespace& ns, const std::string& key);
  // Completes the first torch waiter on `key` whose keys now all exist (QUEUE_PUSH).
  void wake_one(Namespace& ns, const std::string& key);
  void finish_waiter(Namespace& ns, const std::shared_ptr<Waiter>& w);
  // Erases the namespaces left while a wake() was walking (leave() defers them).
  void erase_orphans() noexcept;
  // Once a megabyte or more was freed (MemoryBudget::freed()), returns free heap memory
  // to the system when the burst of frees is over (a job's namespace, a crowd of
  // connections), at most once a second. Never throws.
  void give_back_soon() noexcept;

  boost::asio::io_context& io_;
  ServerOptions options_;
  auth::Authenticator auth_{options_.token, options_.secret};
  wire::Limits limits_;
  wire::Limits hello_limits_;  // before authentication: only what a HELLO needs
  wire::Limits torch_limits_;  // torch connections: libuv's key limit
  std::string held_torch_ns_;  // joined by hold_torch_namespace(); empty: none
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;
  std::vector<std::unique_ptr<TorchListener>> torch_listeners_;
  boost::asio::steady_timer give_back_timer_;
  bool give_back_armed_ = false;
  std::chrono::steady_clock::time_point last_give_back_{};  // the last trim
  size_t give_backs_ = 0;                                   // trims so far (ServerStats::trims)
  // The one owner of every open session; Session::close() takes it out, exactly once.
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
  std::unordered_map<std::string, Namespace> namespaces_;
  MemoryBudget budget_;
  size_t waiters_ = 0;
  ServerCounters counters_;  // what happened since start (ServerStats::counters)
  size_t walks_ = 0;      // wake() calls under way (they nest: a will set during one)
  bool orphans_ = false;  // a namespace was left during one: erase it when they end
  bool stopped_ = false;
};

}  // namespace rdzv
