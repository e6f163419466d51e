// StoreServer and its shared core: listening, admitting connections into the session
// registry, namespaces, waking blocked requests, stopping. The sessions themselves
// (reading, requests, replies) are in session.cpp and session_requests.cpp.
#include "rdzv/server.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>

#include "heap_blocks.hpp"
#include "server_core.hpp"
#include "session.hpp"
#include "socket_options.hpp"

namespace rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Type;

namespace {
constexpr uint32_t kMaxBodyBeforeHello = 1024;
// torch's libuv server takes keys of up to 8 KiB on the wire (MAX_STRING_LEN) and closes
// the connection beyond; its clients may rely on that much.
constexpr uint32_t kTorchMaxKey = 8u << 10;

// Refused politely: one error frame, written without waiting, then the socket closes.
void refuse(tcp::socket& socket, const char* why) {
  try {
    std::string frame = wire::make_frame(Type::kError, 0, wire::BodyWriter().bytes(why).take());
    boost::system::error_code ignored;
    socket.non_blocking(true, ignored);
    socket.write_some(asio::buffer(frame), ignored);
  } catch (const std::exception&) {  // no memory even for that: it just closes
  }
}

// What a namespace's going gives back: its keys and its own entry.
int64_t namespace_bytes(const Namespace& ns) {
  return static_cast<int64_t>(ns.table.bytes() + ns.charged + ns.queue_bytes);
}
}  // namespace

Namespace& ServerCore::join(const std::string& name) {
  auto found = namespaces_.find(name);
  if (found != namespaces_.end()) {
    ++found->second.sessions;
    return found->second;
  }
  // Its hash node (name, table, wait index, link, cached hash) and the name's block.
  size_t charge = heap::predicted_bytes(sizeof(std::pair<const std::string, Namespace>) + 2 * sizeof(void*)) +
                  heap::predicted_string_bytes(name.size());
  if (!budget_.fits(charge)) throw StoreError("store memory limit reached: no room for a namespace");
  Namespace& ns = namespaces_[name];
  budget_.store(static_cast<int64_t>(charge));
  ns.charged = charge;
  ++ns.sessions;
  return ns;
}

void ServerCore::leave(const std::string& name) {
  auto it = namespaces_.find(name);
  if (it == namespaces_.end() || --it->second.sessions > 0) return;
  if (walks_ > 0) {  // a wake() is walking a namespace, maybe this one: erased when it ends
    orphans_ = true;
    return;
  }
  budget_.store(-namespace_bytes(it->second));
  namespaces_.erase(it);  // the job is over: its keys go
  give_back_soon();
}

void ServerCore::erase_orphans() noexcept {
  orphans_ = false;
  for (auto it = namespaces_.begin(); it != namespaces_.end();) {
    if (it->second.sessions > 0) {
      ++it;
      continue;
    }
    budget_.store(-namespace_bytes(it->second));
    it = namespaces_.erase(it);
  }
  give_back_soon();
}

void ServerCore::give_back_soon() noexcept {
  constexpr size_t kGiveBackAfter = size_t{1} << 20;
  constexpr auto kBurst = Millis(20);       // frees come in bursts: trim once, after
  constexpr auto kAtMostEvery = Millis(1000);  // a trim walks the whole heap on the one thread
  if (give_back_armed_ || stopped_ || budget_.freed() < kGiveBackAfter) return;
  auto trim = [this] {
    budget_.forget_freed();
    last_give_back_ = std::chrono::steady_clock::now();
    ++give_backs_;
    heap::give_back();
  };
  try {
    auto at = std::max(std::chrono::steady_clock::now() + kBurst, last_give_back_ + kAtMostEvery);
    give_back_timer_.expires_at(at);
    give_back_timer_.async_wait([self = shared_from_this(), trim](const boost::system::error_code& ec) {
      self->give_back_armed_ = false;
      if (ec || self->stopped_) return;
      trim();
    });
    give_back_armed_ = true;
  } catch (const std::exception&) {  // no memory to arm a timer: trim now
    trim();
  }
}

namespace {
std::atomic<uint64_t> g_waiter_key_checks{0};
}  // namespace

uint64_t waiter_key_checks() { return g_waiter_key_checks.load(std::memory_order_relaxed); }
void count_waiter_key_checks(uint64_t n) { g_waiter_key_checks.fetch_add(n, std::memory_order_relaxed); }

void ServerCore::wake(Namespace& ns, const std::string& key) {
  auto it = ns.waiters.find(key);
  if (it == ns.waiters.end()) return;
  // Sessions may close during the walk (the will of one that could not be answered):
  // `ns` stays until the outermost walk ends.
  struct Walk {
    ServerCore& core;
    explicit Walk(ServerCore& c) : core(c) { ++core.walks_; }
    ~Walk() {
      if (--core.walks_ == 0 && core.orphans_) core.erase_orphans();
    }
  } walk(*this);
  // Detach the key's list, so finishing thousands of waiters (everyone blocked on the
  // NCCL id) does not erase them one by one from it; put back those still waiting.
  std::vector<std::shared_ptr<Waiter>> list = std::move(it->second);
  ns.waiters.erase(it);
  std::vector<std::shared_ptr<Waiter>> still_waiting;
  for (auto& w : list) {
    if (w->done) continue;
    if (!ns.ready(*w)) {
      still_waiting.push_back(std::move(w));
      continue;
    }
    try {
      w->session->reply_wait(w->request_id, w->type, w->keys, false);
    } catch (const std::exception&) {
      // Out of memory for its reply: that client goes, not the setter. Closed from the
      // event loop: it may be the setter's own session, in the middle of its request.
      w->session->close_soon();
    }
    finish_waiter(ns, w);
  }
  // Those of a session that closed during the walk are done and stay out.
  std::erase_if(still_waiting, [](const std::shared_ptr<Waiter>& w) { return w->done; });
  if (!still_waiting.empty()) {
    auto& slot = ns.waiters[key];
    slot.insert(slot.end(), std::make_move_iterator(still_waiting.begin()), std::make_move_iterator(still_waiting.end()));
  }
}

void ServerCore::wake_one(Namespace& ns, const std::string& key) {
  auto it = ns.waiters.find(key);
  if (it == ns.waiters.end()) return;
  std::shared_ptr<Waiter> first;
  for (const auto& w : it->second) {
    if (!w->done && w->torch && ns.ready(*w)) {
      first = w;
      break;
    }
  }
  if (!first) return;
  first->session->reply_wait(first->request_id, first->type, first->keys, false);  // only queues a byte
  finish_waiter(ns, first);
}

void ServerCore::finish_waiter(Namespace& ns, const std::shared_ptr<Waiter>& w) {
  if (w->done) return;
  w->done = true;
  --waiters_;
  budget_.release(w->charged);
  for (const auto& k : w->keys) {
    auto it = ns.waiters.find(k);
    if (it == ns.waiters.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), w), list.end());
    if (list.empty()) ns.waiters.erase(it);
  }
  // A map never shrinks its bucket array: drop a big one (charged per waited key) once
  // the waits that grew it are over.
  constexpr size_t kKeepBuckets = 1024;
  if (ns.waiters.empty() && ns.waiters.bucket_count() > kKeepBuckets) {
    decltype(ns.waiters)().swap(ns.waiters);
  }
  auto session = w->session;  // keep it alive while it forgets the waiter
  session->forget_waiter(w.get());
  w->session.reset();
  w->timer.cancel();
}

ServerCore::ServerCore(asio::io_context& io, ServerOptions options)
    : io_(io),
      options_(std::move(options)),
      acceptor_(io),
      retry_timer_(io),
      give_back_timer_(io),
      budget_(options_.max_memory) {
  limits_.max_body = options_.max_value + 2 * limits_.max_key + 64;
  torch_limits_.max_key = kTorchMaxKey;
  torch_limits_.max_body = options_.max_value + 2 * torch_limits_.max_key + 64;
  hello_limits_.max_body = kMaxBodyBeforeHello;
  open_listener(acceptor_, options_.host, options_.port);
  if (options_.hold_torch_namespace) hold_torch_namespace();
}

void ServerCore::hold_torch_namespace() {
  const std::string& want = options_.torch_namespace;
  if (want == held_torch_ns_) return;
  bool joined = false;
  if (!want.empty()) {
    try {
      join(want);
      joined = true;
    } catch (const StoreError&) {  // no room for it now: its connections join it as they come
    }
  }
  if (!held_torch_ns_.empty()) leave(held_torch_ns_);
  held_torch_ns_ = joined ? want : std::string();
}

// Binds and listens on host:port, non-blocking; throws StoreError when it cannot.
void ServerCore::open_listener(tcp::acceptor& acceptor, const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) throw StoreError("store: bad listen address '" + host + "': " + ec.message());
  tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor.non_blocking(true, ec);
  // Accepted sockets inherit these (Linux copies the listener's TCP options).
  if (!ec) set_liveness_options(acceptor.native_handle(), options_.heartbeat_timeout);
  if (ec) throw StoreError("store: cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
}

uint16_t ServerCore::add_torch_listener(uint16_t port, std::string ns) {
  auto listener = std::make_unique<TorchListener>(io_, std::move(ns));
  open_listener(listener->acceptor, options_.host, port);
  TorchListener& l = *listener;
  torch_listeners_.push_back(std::move(listener));
  start_accept(l.acceptor, l.retry, &l.torch_namespace);
  return l.acceptor.local_endpoint().port();
}

// Waits until the listening socket is readable, then accepts every pending connection
// without going back to the reactor in between (thousands arrive at once at job start).
// `torch_ns`: the namespace torch clients of this listener join (null: the server's own,
// ServerOptions::torch_namespace as it is when each connection arrives).
void ServerCore::start_accept(tcp::acceptor& acceptor, asio::steady_timer& retry, const std::string* torch_ns) {
  acceptor.async_wait(tcp::acceptor::wait_read, [self = shared_from_this(), &acceptor, &retry,
                                                 torch_ns](const boost::system::error_code& ec) {
    if (self->stopped_ || ec == asio::error::operation_aborted) return;
    boost::system::error_code accept_ec = ec;
    while (!accept_ec) {
      tcp::socket socket(self->io_);
      acceptor.accept(socket, accept_ec);
      if (!accept_ec) self->admit(std::move(socket), torch_ns ? *torch_ns : self->options_.torch_namespace);
    }
    if (accept_ec != asio::error::would_block && accept_ec != asio::error::try_again) {
      // EMFILE and friends: the backlog holds the rest; try again shortly instead of spinning.
      retry.expires_after(Millis(50));
      retry.async_wait([self, &acceptor, &retry, torch_ns](const boost::system::error_code& e) {
        if (!e && !self->stopped_) self->start_accept(acceptor, retry, torch_ns);
      });
      return;
    }
    self->start_accept(acceptor, retry, torch_ns);
  });
}

void ServerCore::admit(tcp::socket socket, const std::string& torch_ns) {
  if (sessions_.size() >= options_.max_connections) return ++counters_.refused_full, refuse(socket, "server full");
  // The session's own memory is charged like everything else it holds; close() gives it back.
  if (!budget_.try_hold(kSessionBytes)) return ++counters_.refused_memory,
      refuse(socket, "store memory limit reached: no room for a connection");
  std::shared_ptr<Session> session;
  try {
    session = std::make_shared<Session>(std::move(socket), shared_from_this());
    sessions_.emplace(session.get(), session);
  } catch (const std::exception&) {  // out of memory: this connection is dropped, the server stays
    budget_.release(kSessionBytes);  // never registered, so never closed
    return;
  }
  try {
    session->start(torch_ns);
  } catch (const std::exception&) {
    session->close(false);
  }
}

void ServerCore::stop() {
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  for (auto& l : torch_listeners_) {
    l->acceptor.close(ignored);
    l->retry.cancel();
  }
  give_back_timer_.cancel();
  std::vector<std::shared_ptr<Session>> all;
  all.reserve(sessions_.size());
  for (auto& [ptr, session] : sessions_) all.push_back(session);
  for (auto& s : all) s->close(true);
  if (!held_torch_ns_.empty()) leave(held_torch_ns_);
  held_torch_ns_.clear();
}

StoreServer::StoreServer(asio::io_context& io, ServerOptions options)
    : impl_(std::make_shared<ServerCore>(io, std::move(options))) {
  impl_->start_accept(impl_->acceptor_, impl_->retry_timer_, nullptr);
}

StoreServer::~StoreServer() { impl_->stop(); }

uint16_t StoreServer::port() const { return impl_->acceptor_.local_endpoint().port(); }

ServerStats StoreServer::stats() const {
  ServerStats s;
  s.connections = impl_->sessions_.size();
  s.namespaces = impl_->namespaces_.size();
  s.waiters = impl_->waiters_;
  s.bytes = impl_->budget_.stored();
  s.held = impl_->budget_.held();
  s.trims = impl_->give_backs_;
  for (const auto& [name, ns] : impl_->namespaces_) s.keys += static_cast<size_t>(ns.table.size());
  s.max_memory = impl_->options_.max_memory;
  s.counters = impl_->counters_;
  return s;
}

void StoreServer::stop() { impl_->stop(); }

void StoreServer::set_credentials(std::string token, std::string secret) {
  impl_->auth_.set_keys(std::move(token), std::move(secret));
}

uint16_t StoreServer::add_torch_listener(uint16_t port, std::string ns) {
  return impl_->add_torch_listener(port, std::move(ns));
}

void StoreServer::set_torch_namespace(std::string ns) {
  asio::post(impl_->io_, [core = impl_, ns = std::move(ns)]() mutable {
    core->options_.torch_namespace = std::move(ns);
    if (core->options_.hold_torch_namespace && !core->stopped_) core->hold_torch_namespace();
  });
}

}  // namespace rdzv
