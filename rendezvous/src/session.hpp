// One client connection of the store server: reads frames, runs requests on its
// namespace, queues replies. Owned by the server's registry; close() is the one way
// out (every error and exception ends there), runs once, and unregisters the session,
// gives back its memory charges, drops its blocked requests and fires its will.
//
// Memory: a frame too big for the inline buffer is read into a heap buffer that grows
// as its bytes arrive; buffers, blocked requests and queued replies are charged to the
// server's budget before they are allocated (session.cpp, session_requests.cpp).
#pragma once

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server_core.hpp"
#include "torch_wire.hpp"

namespace rdzv {

// Per-connection caps (PROTOCOL.md, "Limits").
inline constexpr size_t kMaxWaitsPerConnection = 1024;         // blocked requests
inline constexpr size_t kMaxWaitedKeysPerConnection = 1u << 16;  // keys across them
inline constexpr size_t kPauseReadingAt = 64u << 10;           // queued reply bytes: stop reading requests
inline constexpr size_t kFirstBodyChunk = 16u << 10;           // a big frame's buffer before more bytes arrive

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerCore> server);
  ~Session();

  // `torch_ns`: the namespace torch clients of this connection join (empty: refused).
  void start(const std::string& torch_ns);
  // Ends the session; `clean` (GOODBYE) discards the will. Idempotent, never throws.
  void close(bool clean) noexcept;

  // Queues a frame; frames go out in order, one write at a time. A reply the budget
  // cannot hold becomes an ERROR saying so; a connection over its output cap is closed.
  void send(wire::Type type, uint32_t request_id, std::string_view body);
  // Answers a GET / WAIT / MULTI_GET: the values once all keys exist, or TIMEOUT.
  void reply_wait(uint32_t request_id, wire::Type type, const std::vector<std::string>& keys, bool timed_out);
  void forget_waiter(const Waiter* w);
  Namespace* ns() const { return ns_; }
  // An exception escaped work done for this session: tells the client (best effort)
  // and closes.
  void crashed(const char* what) noexcept;
  // Closes from the event loop, for a caller that may be walking this session's
  // namespace or running its request; sends nothing more meanwhile.
  void close_soon() noexcept;

 private:
  // Runs a completion handler's body; an exception escaping it (std::bad_alloc
  // included) ends this session, never the server.
  template <typename Fn>
  void guarded(Fn&& fn) noexcept {
    try {
      fn();
    } catch (const std::exception& e) {
      crashed(e.what());
    } catch (...) {
      crashed("unknown error");
    }
  }

  // session.cpp: reading and writing.
  void greet();
  void arm_auth_timer(Millis after);
  bool detect_dialect();
  bool enqueue(std::string_view head, std::string_view body);
  void flush();
  void after_write();
  void read_more();
  void process_input();
  void read_body();
  void on_body_bytes(size_t n);
  bool grow_body();
  bool grow_buffer(std::unique_ptr<char[]>& buffer, size_t& capacity, size_t have, size_t size);
  void refuse_body();
  void release_body() noexcept;
  bool output_backlogged() const { return pending_.size() + sending_.size() > kPauseReadingAt; }
  size_t output_cap() const;
  bool reserve_output(size_t frame);
  void give_back_output() noexcept;
  void count_stored(size_t before);

  // session_requests.cpp: the requests themselves.
  void on_frame(const wire::Header& h, std::string_view body);
  void fail(uint32_t request_id, const std::string& message);
  void handle(uint32_t id, wire::Request& q);
  void hello(uint32_t id, const wire::Request& q);
  void require_fits(int64_t growth) const;
  void check_value(size_t size) const;
  template <typename Fn>
  auto change(const std::string& key, Fn&& fn);
  void set_key(const std::string& key, const std::string& value);
  void store_set(const std::string& key, std::string& value);
  void store_append(const std::string& key, const std::string& value);
  void store_multi_set(const std::vector<std::string>& keys, std::vector<std::string>& values);
  void publish_will(bool clean) noexcept;
  void watch_silence(Millis limit);
  void arm_silence_timer(Millis after);
  void start_wait(uint32_t id, wire::Request& q);
  std::string enter(const std::string& ns);

  // torch_session.cpp: torch's dialects (PROTOCOL.md, "torch's dialects").
  void torch_begin(Dialect dialect);
  void torch_refuse();
  void torch_read();
  void torch_input();
  bool torch_buffer(size_t at_least);
  void torch_handle(torch_wire::Request& q);
  void torch_reply(std::string_view bytes);
  void torch_room(size_t reply);
  void torch_wait(std::vector<std::string> keys);
  void torch_cancel_waits();
  void torch_queue_push(const std::string& key, std::string value);
  void torch_queue_pop(const std::string& key, std::string& out);
  void torch_barrier(const std::string& key, int64_t world_size);
  void torch_compare_set(torch_wire::Request& q, std::string& out);
  void torch_list_keys(std::string& out);
  void torch_gone(bool protocol_error) noexcept;

  boost::asio::ip::tcp::socket socket_;
  std::shared_ptr<ServerCore> server_;
  std::array<char, 192> inbuf_{};     // small frames, read whole
  size_t filled_ = 0;
  // A frame larger than inbuf_: its body, read as it arrives into a buffer grown on demand.
  std::unique_ptr<char[]> body_;
  size_t body_capacity_ = 0;          // charged to the budget
  size_t body_have_ = 0;
  wire::Header body_header_;
  size_t skipping_ = 0;               // bytes of a refused frame still to discard
  std::string nonce_;                 // until HELLO
  std::string ns_name_;
  size_t name_charged_ = 0;           // its heap block, charged to the budget
  Namespace* ns_ = nullptr;           // set by HELLO
  std::string pending_, sending_;     // outgoing frames
  size_t output_charged_ = 0;         // their capacity, charged to the budget
  bool writing_ = false;
  bool reading_paused_ = false;       // answers are piling up: stop reading until they drain
  boost::asio::steady_timer timer_;   // authentication deadline, then the will's silence limit
  Millis silence_limit_{0};
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  bool closing_after_write_ = false;  // close once the queued frames are out
  bool clean_close_ = false;          // ...after GOODBYE: the will is discarded
  bool closed_ = false;
  bool doomed_ = false;               // over its output cap: closes from the event loop, sends nothing more
  std::vector<std::shared_ptr<Waiter>> waiters_;
  size_t waited_keys_ = 0;            // keys across waiters_
  // compare_set(key, "", value) for each when the connection ends without GOODBYE.
  using Wills = std::vector<std::pair<std::string, std::string>>;
  Wills wills_;
  size_t will_bytes() const;
  // torch's dialects: the namespace a torch connection joins, as it was when it arrived
  // (empty: torch connections are refused), and its input, buffered until a request is whole.
  Dialect dialect_ = Dialect::kDdprun;
  bool dialect_known_ = false;        // until the first bytes arrive
  bool auth_deadline_armed_ = false;  // where torch clients are admitted: once the first bytes came
  bool greeted_ = false;              // the CHALLENGE is sent
  std::string torch_ns_;
  std::unique_ptr<char[]> tin_;       // charged to the budget
  size_t tin_capacity_ = 0;
  size_t tin_have_ = 0;
  size_t tin_needed_ = 0;             // bytes a whole request needs at least (the decoder's word)
  torch_wire::ScanState tin_scan_;    // how far the scan of the request at tin_'s start got
  bool torch_validated_ = false;
};

// Applies a change to one key, counting its stored bytes exactly once (also when the
// change throws half-way), then wakes waiters.
template <typename Fn>
inline auto Session::change(const std::string& key, Fn&& fn) {
  size_t before = ns_->table.bytes();
  decltype(fn(ns_->table)) result;
  try {
    result = fn(ns_->table);
  } catch (...) {
    count_stored(before);
    throw;
  }
  count_stored(before);
  server_->wake(*ns_, key);
  return result;
}

// What one connection costs the memory budget from admission to close(): the Session
// itself plus what comes with it outside it — the registry's hash node, Asio's
// per-socket reactor state and the handler memory it keeps for reads, writes, timers.
inline constexpr size_t kSessionOverheadBytes = 1024;
inline constexpr size_t kSessionBytes = sizeof(Session) + kSessionOverheadBytes;

}  // namespace rdzv
