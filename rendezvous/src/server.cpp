#include "rdzv/server.hpp"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "auth.hpp"
#include "kv_table.hpp"
#include "protocol.hpp"
#include "socket_options.hpp"

namespace rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Type;

namespace {
constexpr int64_t kMaxWaitMs = int64_t{365} * 24 * 3600 * 1000;  // clamp absurd timeouts
// A connection must authenticate within this, and may not send more than a HELLO
// needs before it does: an unauthenticated peer can hold neither memory nor a slot long.
constexpr Millis kAuthTimeout(10000);
constexpr uint32_t kMaxBodyBeforeHello = 1024;
// Blocked GET/WAIT/MULTI_GET requests one connection may have outstanding.
constexpr size_t kMaxWaitsPerConnection = 1024;
}

class Session;

// A blocked GET / WAIT / MULTI_GET.
struct Waiter {
  Waiter(asio::io_context& io, std::shared_ptr<Session> s, uint32_t id, Type t, std::vector<std::string> k)
      : session(std::move(s)), request_id(id), type(t), keys(std::move(k)), timer(io) {}
  std::shared_ptr<Session> session;
  uint32_t request_id;
  Type type;
  std::vector<std::string> keys;
  asio::steady_timer timer;
  bool done = false;
};

struct Namespace {
  KvTable table;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters;  // by key
  size_t sessions = 0;
};

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  ServerCore(asio::io_context& io, ServerOptions options);
  void start_accept();
  void admit(tcp::socket socket);
  void stop();

  asio::io_context& io_;
  ServerOptions options_;
  auth::Authenticator auth_{options_.token, options_.secret};
  wire::Limits limits_;
  wire::Limits hello_limits_;  // before authentication: only what a HELLO needs
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  std::unordered_set<Session*> sessions_;
  std::unordered_map<std::string, Namespace> namespaces_;
  size_t bytes_ = 0;     // keys + values across namespaces
  size_t waiters_ = 0;
  bool stopped_ = false;

  Namespace& join(const std::string& name) {
    Namespace& ns = namespaces_[name];
    ++ns.sessions;
    return ns;
  }
  void leave(const std::string& name) {
    auto it = namespaces_.find(name);
    if (it == namespaces_.end() || --it->second.sessions > 0) return;
    bytes_ -= it->second.table.bytes();
    namespaces_.erase(it);  // the job is over: its keys go
  }
  // Completes every waiter on `key` whose keys now all exist.
  void wake(Namespace& ns, const std::string& key);
  void finish_waiter(Namespace& ns, const std::shared_ptr<Waiter>& w);
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<ServerCore> server)
      : socket_(std::move(socket)), server_(std::move(server)), timer_(server_->io_) {}

  void start() {
    server_->sessions_.insert(this);
    nonce_ = auth::random_bytes(wire::kNonceSize);
    wire::BodyWriter w;
    w.bytes(nonce_).u32(server_->auth_.required() ? 1 : 0);
    send(Type::kChallenge, 0, w.take());
    timer_.expires_after(kAuthTimeout);
    timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (!ec && self && self->ns_ == nullptr) self->close(false);  // never authenticated
    });
    read_more();
  }

  // Ends the session; `clean` (GOODBYE) discards the will.
  void close(bool clean) {
    if (closed_) return;
    closed_ = true;
    server_->sessions_.erase(this);
    if (ns_ != nullptr) {
      std::vector<std::shared_ptr<Waiter>> mine = waiters_;  // finish_waiter() edits waiters_
      for (auto& w : mine) server_->finish_waiter(*ns_, w);
      // The will: compare_set(key, "", value), i.e. only if nobody set the key yet.
      if (will_) {
        server_->bytes_ -= will_->first.size() + will_->second.size();  // was held in reserve
        if (!clean && ns_->table.find(will_->first) == nullptr) set_key(will_->first, will_->second);
        will_.reset();
      }
      server_->leave(ns_name_);
      ns_ = nullptr;
    }
    waiters_.clear();
    timer_.cancel();
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // Queues a frame; frames go out in order, one write at a time.
  void send(Type type, uint32_t request_id, const std::string& body) {
    if (closed_) return;
    pending_ += wire::make_frame(type, request_id, body);
    if (!writing_) flush();
  }

  // Answers a GET / WAIT / MULTI_GET: the values once all keys exist, or TIMEOUT.
  void reply_wait(uint32_t request_id, Type type, const std::vector<std::string>& keys, bool timed_out) {
    if (timed_out) {
      wire::TimeoutReply t;
      t.missing_keys = ns_->table.missing(keys);
      t.message = "timed out waiting for " + quoted_keys(t.missing_keys);
      send(Type::kTimeout, request_id, wire::encode_timeout(t));
      return;
    }
    size_t reply = 4;
    for (const auto& k : keys) reply += 4 + ns_->table.find(k)->size();
    if (reply > server_->limits_.max_body) {  // e.g. one big key asked for many times
      send(Type::kError, request_id,
           wire::BodyWriter().bytes("reply of " + std::to_string(reply) + " bytes exceeds the frame limit").take());
      return;
    }
    wire::BodyWriter out;
    if (type == Type::kGet) {
      out.bytes(*ns_->table.find(keys[0]));
    } else if (type == Type::kMultiGet) {
      out.u32(static_cast<uint32_t>(keys.size()));
      for (const auto& k : keys) out.bytes(*ns_->table.find(k));
    }
    send(Type::kOk, request_id, out.take());
  }

  void forget_waiter(const Waiter* w) {
    for (size_t i = 0; i < waiters_.size(); ++i) {
      if (waiters_[i].get() == w) {
        waiters_[i] = std::move(waiters_.back());
        waiters_.pop_back();
        return;
      }
    }
  }

 private:
  void flush() {
    writing_ = true;
    sending_.swap(pending_);
    pending_.clear();
    asio::async_write(socket_, asio::buffer(sending_),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->writing_ = false;
                        self->sending_.clear();
                        if (ec) return self->close(false);
                        if (self->closing_after_write_ && self->pending_.empty()) {
                          return self->close(self->clean_close_);
                        }
                        if (!self->pending_.empty()) self->flush();
                        if (self->reading_paused_ && !self->output_backlogged()) {
                          self->reading_paused_ = false;
                          self->process_input();
                        }
                      });
  }

  // Reading: small frames (nearly all of them) arrive whole in one read into the
  // session's inline buffer, often several at once; a frame too big for it is read
  // into a heap buffer sized from its (already limit-checked) header.
  void read_more() {
    socket_.async_read_some(asio::buffer(inbuf_.data() + filled_, inbuf_.size() - filled_),
                            [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
                              if (ec) return self->close(false);
                              self->filled_ += n;
                              self->process_input();
                            });
  }

  void process_input() {
    size_t used = 0;
    while (!closed_ && !closing_after_write_ && filled_ - used >= wire::kHeaderSize) {
      wire::Header h;
      try {
        h = wire::decode_header(inbuf_.data() + used, ns_ ? server_->limits_ : server_->hello_limits_);
      } catch (const wire::ProtocolError& e) {
        return fail(0, e.what());
      }
      size_t frame = wire::kHeaderSize + h.body_size;
      if (filled_ - used >= frame) {
        on_frame(h, std::string_view(inbuf_.data() + used + wire::kHeaderSize, h.body_size));
        used += frame;
        continue;
      }
      if (frame > inbuf_.size()) {  // a big frame: read the rest of its body straight into place
        size_t have = filled_ - used - wire::kHeaderSize;
        big_.assign(inbuf_.data() + used + wire::kHeaderSize, have);
        big_.resize(h.body_size);
        filled_ = 0;
        asio::async_read(socket_, asio::buffer(big_.data() + have, h.body_size - have),
                         [self = shared_from_this(), h](const boost::system::error_code& ec, size_t) {
                           if (ec) return self->close(false);
                           std::string body = std::move(self->big_);
                           self->big_ = std::string();  // idle sessions hold no big buffers
                           self->on_frame(h, body);
                           self->process_input();
                         });
        return;
      }
      break;  // the rest of a small frame is still on its way
    }
    if (closed_ || closing_after_write_) return;
    std::memmove(inbuf_.data(), inbuf_.data() + used, filled_ - used);
    filled_ -= used;
    // Backpressure: a client that sends requests but does not read the answers is not
    // read from either until its answers drain.
    if (output_backlogged()) {
      reading_paused_ = true;
      return;
    }
    read_more();
  }

  bool output_backlogged() const {
    return pending_.size() + sending_.size() > 2 * static_cast<size_t>(server_->options_.max_value) + (1u << 20);
  }

  void on_frame(const wire::Header& h, std::string_view body) {
    wire::Request q;
    try {
      q = wire::decode_request(h.type, body, server_->limits_);
    } catch (const wire::ProtocolError& e) {
      return fail(h.request_id, e.what());
    }
    if (ns_ == nullptr && q.type != Type::kHello) return fail(h.request_id, "not authenticated: HELLO first");
    if (ns_ != nullptr && q.type == Type::kHello) return fail(h.request_id, "HELLO twice");
    last_heard_ = std::chrono::steady_clock::now();
    try {
      handle(h.request_id, q);
    } catch (const StoreError& e) {  // e.g. add() on a non-integer: the connection stays
      send(Type::kError, h.request_id, wire::BodyWriter().bytes(e.what()).take());
    } catch (const std::exception& e) {  // out of memory and the like: this client goes, the server stays
      fail(h.request_id, std::string("server error: ") + e.what());
    }
  }

  // A protocol violation: one error frame, then the connection closes.
  void fail(uint32_t request_id, const std::string& message) {
    send(Type::kError, request_id, wire::BodyWriter().bytes(message).take());
    closing_after_write_ = true;  // the write's completion closes (not cleanly: the will fires)
  }

  bool fits(int64_t growth) const {
    return growth <= 0 || server_->bytes_ + static_cast<size_t>(growth) <= server_->options_.max_memory;
  }
  void require_fits(int64_t growth) const {
    if (!fits(growth)) throw StoreError("store memory limit reached");
  }
  void check_value(const std::string& v) const {
    if (v.size() > server_->options_.max_value) {
      throw StoreError("value of " + std::to_string(v.size()) + " bytes exceeds the limit of " +
                       std::to_string(server_->options_.max_value));
    }
  }
  // Applies a change to one key, keeping the server's byte count and waking waiters.
  template <typename Fn>
  auto change(const std::string& key, Fn&& fn) {
    size_t before = ns_->table.bytes();
    auto result = fn(ns_->table);
    server_->bytes_ = server_->bytes_ - before + ns_->table.bytes();
    server_->wake(*ns_, key);
    return result;
  }
  void set_key(const std::string& key, const std::string& value) {
    change(key, [&](KvTable& t) {
      t.set(key, value);
      return 0;
    });
  }

  void handle(uint32_t id, wire::Request& q) {
    KvTable& table = ns_ ? ns_->table : dummy_;
    wire::BodyWriter out;
    switch (q.type) {
      case Type::kHello: return hello(id, q);
      case Type::kSet:
        check_value(q.values[0]);
        require_fits(table.growth_if_set(q.keys[0], q.values[0].size()));
        set_key(q.keys[0], q.values[0]);
        break;
      case Type::kAppend:
        require_fits(static_cast<int64_t>(q.keys[0].size() + q.values[0].size()));
        if (const std::string* v = table.find(q.keys[0]); v && v->size() + q.values[0].size() > server_->options_.max_value) {
          throw StoreError("append would make '" + q.keys[0] + "' larger than the value limit");
        }
        change(q.keys[0], [&](KvTable& t) {
          t.append(q.keys[0], q.values[0]);
          return 0;
        });
        break;
      case Type::kAdd:
        require_fits(static_cast<int64_t>(q.keys[0].size() + 24));
        out.i64(change(q.keys[0], [&](KvTable& t) { return t.add(q.keys[0], q.number); }));
        break;
      case Type::kCompareSet:
        check_value(q.values[1]);
        require_fits(table.growth_if_set(q.keys[0], q.values[1].size()));
        out.bytes(change(q.keys[0], [&](KvTable& t) { return t.compare_set(q.keys[0], q.values[0], q.values[1]); }));
        break;
      case Type::kCheck:
        out.u32(table.contains_all(q.keys) ? 1 : 0);
        break;
      case Type::kDelete: {
        size_t before = table.bytes();
        out.u32(table.erase(q.keys[0]) ? 1 : 0);
        server_->bytes_ -= before - table.bytes();
        break;
      }
      case Type::kNumKeys:
        out.i64(table.size());
        break;
      case Type::kMultiSet: {
        int64_t growth = 0;
        for (size_t i = 0; i < q.keys.size(); ++i) {
          check_value(q.values[i]);
          growth += static_cast<int64_t>(q.keys[i].size() + q.values[i].size());
        }
        require_fits(growth);
        size_t before = table.bytes();
        for (size_t i = 0; i < q.keys.size(); ++i) table.set(q.keys[i], std::move(q.values[i]));
        server_->bytes_ = server_->bytes_ - before + table.bytes();
        for (const auto& k : q.keys) server_->wake(*ns_, k);  // after all are set: nobody sees half
        break;
      }
      case Type::kGet:
      case Type::kWait:
      case Type::kMultiGet:
        return start_wait(id, q);
      case Type::kSetWill: {
        check_value(q.values[0]);
        size_t old = will_ ? will_->first.size() + will_->second.size() : 0;
        require_fits(static_cast<int64_t>(q.keys[0].size() + q.values[0].size()) - static_cast<int64_t>(old));
        server_->bytes_ = server_->bytes_ - old + q.keys[0].size() + q.values[0].size();  // held in reserve
        will_.emplace(q.keys[0], q.values[0]);
        if (q.number > 0) watch_silence(Millis(std::min(q.number, kMaxWaitMs)));
        break;
      }
      case Type::kGoodbye:
        if (will_) server_->bytes_ -= will_->first.size() + will_->second.size();
        will_.reset();
        send(Type::kOk, id, {});
        closing_after_write_ = true;
        clean_close_ = true;
        return;
      case Type::kPing:
        break;
      default:
        break;  // decode_request() refused everything else
    }
    send(Type::kOk, id, out.take());
  }

  void hello(uint32_t id, const wire::Request& q) {
    const std::string& ns = q.values[0];
    auth::Admission admission = server_->auth_.admit(ns, nonce_, q.values[1], q.values[2]);
    if (!admission.admitted) return fail(id, admission.error);
    nonce_.clear();
    nonce_.shrink_to_fit();
    timer_.cancel();  // authenticated in time
    ns_name_ = ns;
    ns_ = &server_->join(ns);
    send(Type::kOk, id, wire::BodyWriter().bytes(admission.server_proof).take());
  }

  // A client with a will must be heard from (any request, PING included) at least every
  // `limit`, or it counts as dead: how a frozen or hung ddprun is told from a slow one.
  void watch_silence(Millis limit) {
    silence_limit_ = limit;
    arm_silence_timer(limit);
  }
  void arm_silence_timer(Millis after) {
    timer_.expires_after(after);
    timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_) return;
      auto quiet = std::chrono::steady_clock::now() - self->last_heard_;
      if (quiet >= self->silence_limit_) return self->close(false);  // the will fires
      self->arm_silence_timer(std::chrono::duration_cast<Millis>(self->silence_limit_ - quiet) + Millis(1));
    });
  }

  void start_wait(uint32_t id, wire::Request& q) {
    if (ns_->table.contains_all(q.keys)) return reply_wait(id, q.type, q.keys, false);
    if (waiters_.size() >= kMaxWaitsPerConnection) {
      throw StoreError("too many blocked requests on one connection (limit " +
                       std::to_string(kMaxWaitsPerConnection) + ")");
    }
    auto w = std::make_shared<Waiter>(server_->io_, shared_from_this(), id, q.type, std::move(q.keys));
    for (const auto& k : w->keys) ns_->waiters[k].push_back(w);
    waiters_.push_back(w);
    ++server_->waiters_;
    w->timer.expires_after(Millis(std::min(q.number, kMaxWaitMs)));
    w->timer.async_wait([weak = std::weak_ptr<Waiter>(w), server = server_](const boost::system::error_code& ec) {
      auto waiter = weak.lock();
      if (ec || !waiter || waiter->done) return;
      Session& s = *waiter->session;
      if (s.ns_ == nullptr) return;
      s.reply_wait(waiter->request_id, waiter->type, waiter->keys, true);
      server->finish_waiter(*s.ns_, waiter);
    });
  }

  friend class ServerCore;

  tcp::socket socket_;
  std::shared_ptr<ServerCore> server_;
  std::array<char, 192> inbuf_{};     // small frames, read whole
  size_t filled_ = 0;
  std::string big_;                   // the body of a frame larger than inbuf_
  std::string nonce_;                 // until HELLO
  std::string ns_name_;
  Namespace* ns_ = nullptr;           // set by HELLO
  std::string pending_, sending_;     // outgoing frames
  bool writing_ = false;
  bool reading_paused_ = false;       // answers are piling up: stop reading until they drain
  asio::steady_timer timer_;          // authentication deadline, then the will's silence limit
  Millis silence_limit_{0};
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
  bool closing_after_write_ = false;  // close once the queued frames are out
  bool clean_close_ = false;          // ...after GOODBYE: the will is discarded
  bool closed_ = false;
  std::vector<std::shared_ptr<Waiter>> waiters_;
  std::optional<std::pair<std::string, std::string>> will_;
  KvTable dummy_;                     // never used: handle() runs only after HELLO
};

void ServerCore::wake(Namespace& ns, const std::string& key) {
  auto it = ns.waiters.find(key);
  if (it == ns.waiters.end()) return;
  // Detach the key's list, so finishing thousands of waiters (everyone blocked on the
  // NCCL id) does not erase them one by one from it; put back those still waiting.
  std::vector<std::shared_ptr<Waiter>> list = std::move(it->second);
  ns.waiters.erase(it);
  std::vector<std::shared_ptr<Waiter>> still_waiting;
  for (auto& w : list) {
    if (w->done) continue;
    if (!ns.table.contains_all(w->keys)) {
      still_waiting.push_back(std::move(w));
      continue;
    }
    w->session->reply_wait(w->request_id, w->type, w->keys, false);
    finish_waiter(ns, w);
  }
  if (!still_waiting.empty()) {
    auto& slot = ns.waiters[key];
    slot.insert(slot.end(), std::make_move_iterator(still_waiting.begin()), std::make_move_iterator(still_waiting.end()));
  }
}

void ServerCore::finish_waiter(Namespace& ns, const std::shared_ptr<Waiter>& w) {
  if (w->done) return;
  w->done = true;
  w->timer.cancel();
  --waiters_;
  for (const auto& k : w->keys) {
    auto it = ns.waiters.find(k);
    if (it == ns.waiters.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
    if (list.empty()) ns.waiters.erase(it);
  }
  auto session = w->session;  // keep it alive while it forgets the waiter
  session->forget_waiter(w.get());
  w->session.reset();
}

ServerCore::ServerCore(asio::io_context& io, ServerOptions options)
    : io_(io), options_(std::move(options)), acceptor_(io), retry_timer_(io) {
  limits_.max_body = options_.max_value + 2 * limits_.max_key + 64;
  hello_limits_.max_body = kMaxBodyBeforeHello;
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.host, ec);
  if (ec) throw StoreError("store: bad listen address '" + options_.host + "': " + ec.message());
  tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor_.non_blocking(true, ec);
  // Accepted sockets inherit these (Linux copies the listener's TCP options).
  if (!ec) set_liveness_options(acceptor_.native_handle(), options_.heartbeat_timeout);
  if (ec) {
    throw StoreError("store: cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " +
                     ec.message());
  }
}

// Waits until the listening socket is readable, then accepts every pending connection
// without going back to the reactor in between (thousands arrive at once at job start).
void ServerCore::start_accept() {
  acceptor_.async_wait(tcp::acceptor::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
    if (self->stopped_ || ec == asio::error::operation_aborted) return;
    boost::system::error_code accept_ec = ec;
    while (!accept_ec) {
      tcp::socket socket(self->io_);
      self->acceptor_.accept(socket, accept_ec);
      if (!accept_ec) self->admit(std::move(socket));
    }
    if (accept_ec != asio::error::would_block && accept_ec != asio::error::try_again) {
      // EMFILE and friends: the backlog holds the rest; try again shortly instead of spinning.
      self->retry_timer_.expires_after(Millis(50));
      self->retry_timer_.async_wait([self](const boost::system::error_code& e) {
        if (!e && !self->stopped_) self->start_accept();
      });
      return;
    }
    self->start_accept();
  });
}

void ServerCore::admit(tcp::socket socket) {
  if (sessions_.size() >= options_.max_connections) {
    // Refused politely: one error frame, written without waiting, then close.
    std::string frame = wire::make_frame(Type::kError, 0, wire::BodyWriter().bytes("server full").take());
    boost::system::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(frame), ignored);
    return;
  }
  std::make_shared<Session>(std::move(socket), shared_from_this())->start();
}

void ServerCore::stop() {
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  std::vector<Session*> all(sessions_.begin(), sessions_.end());
  for (Session* s : all) s->close(true);
}

StoreServer::StoreServer(asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<ServerCore>(io, std::move(options))) {
  impl_->start_accept();
}

StoreServer::~StoreServer() { impl_->stop(); }

uint16_t StoreServer::port() const { return impl_->acceptor_.local_endpoint().port(); }

ServerStats StoreServer::stats() const {
  return {impl_->sessions_.size(), impl_->namespaces_.size(), impl_->waiters_, impl_->bytes_};
}

void StoreServer::stop() { impl_->stop(); }

void StoreServer::set_credentials(std::string token, std::string secret) {
  impl_->auth_.set_keys(std::move(token), std::move(secret));
}

}  // namespace rdzv
