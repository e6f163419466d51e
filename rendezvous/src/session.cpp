// Session: its lifetime (start, the one close path, the exception boundary) and its
// I/O — frames read from the socket, replies queued to it — with every buffer charged
// to the server's memory budget before it is allocated.
#include "session.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "auth.hpp"

namespace rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Type;

namespace {
// A connection must authenticate within this, and may not send more than a HELLO
// needs before it does: an unauthenticated peer can hold neither memory nor a slot long.
constexpr Millis kAuthTimeout(10000);
// Where no torch client is admitted, a connection is greeted once its first bytes say
// it speaks ddprun's protocol, or when none came within this: a torch client (which
// speaks first) is then refused before it could read a greeting as a reply.
constexpr Millis kGreetGrace(200);
// Queued reply bytes past which a send buffer is freed once written, so an idle
// session keeps no big buffer (smaller ones are reused: the hot path allocates nothing).
constexpr size_t kKeepSendBuffer = 64u << 10;
}  // namespace

Session::Session(tcp::socket socket, std::shared_ptr<ServerCore> server)
    : socket_(std::move(socket)), server_(std::move(server)), timer_(server_->io_) {}

Session::~Session() = default;

void Session::start(const std::string& torch_ns) {
  // A connection is greeted only once its first bytes say it speaks ddprun's protocol:
  // torch's clients speak first and read no greeting. Where torch clients are not
  // admitted, a silent one is greeted after a short grace (an older ddprun client,
  // which waits for the greeting before it sends anything).
  torch_ns_ = torch_ns;
  if (torch_ns_.empty()) {
    timer_.expires_after(kGreetGrace);
    timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_ || self->ns_ != nullptr) return;
      self->guarded([&] {
        if (!self->greeted_) self->greet();
        self->arm_auth_timer(kAuthTimeout - kGreetGrace);
      });
    });
  }
  // Where torch clients are admitted, a silent connection is left open (it holds its
  // budget charge and a connection slot): torch 1.13 opens a second connection that
  // sends nothing unless watch_key() is used, and its request connection sends nothing
  // before the first call; closing either makes 1.13's watch thread spin. The deadline
  // starts with the first bytes (detect_dialect).
  read_more();
}

void Session::arm_auth_timer(Millis after) {
  timer_.expires_after(after);
  timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (!ec && self && self->ns_ == nullptr) self->close(false);  // never authenticated
  });
}

void Session::greet() {
  greeted_ = true;
  nonce_ = auth::random_bytes(wire::kNonceSize);
  wire::BodyWriter w;
  w.bytes(nonce_).u32(server_->auth_.required() ? 1 : 0);
  send(Type::kChallenge, 0, w.take());
}

// Tells the dialect from the bytes in inbuf_. True to go on reading ddprun's frames;
// false when more bytes are needed (a read is under way), the connection is closing,
// or it speaks torch's protocol (handled from here on by torch_session.cpp).
bool Session::detect_dialect() {
  if (!torch_ns_.empty() && !auth_deadline_armed_) {  // bytes came: authenticate within the deadline
    auth_deadline_armed_ = true;
    arm_auth_timer(kAuthTimeout);
  }
  torch_wire::Detection d;
  try {
    d = torch_wire::detect(std::string_view(inbuf_.data(), filled_));
  } catch (const wire::ProtocolError&) {
    if (torch_ns_.empty()) {  // the frame parser says what is wrong, after the greeting
      dialect_known_ = true;
      if (!greeted_) greet();
      return true;
    }
    ++server_->counters_.protocol_errors;
    close(false);
    return false;
  }
  if (!d.known) {
    read_more();
    return false;
  }
  dialect_known_ = true;
  if (d.dialect == Dialect::kDdprun) {
    if (!greeted_) greet();
    return true;
  }
  if (torch_ns_.empty()) {
    torch_refuse();
    return false;
  }
  torch_begin(d.dialect);
  return false;
}

void Session::close(bool clean) noexcept {
  if (closed_) return;
  closed_ = true;
  auto keep = weak_from_this().lock();  // the registry lets go below; this outlives close()
  server_->sessions_.erase(this);
  // What this closing gives back counts toward a trim (wills it publishes may queue
  // replies for others meanwhile: then a little less is counted).
  const size_t held_before = server_->budget_.held();
  if (ns_ != nullptr) {
    std::vector<std::shared_ptr<Waiter>> mine = std::move(waiters_);
    waiters_.clear();
    for (auto& w : mine) {
      try {
        server_->finish_waiter(*ns_, w);
      } catch (...) {  // a timer that would not cancel: the waiter is done and forgotten anyway
      }
    }
    publish_will(clean);
    --server_->counters_.connections_open[static_cast<size_t>(dialect_)];  // counted once it joined ns_
    server_->leave(ns_name_);
    ns_ = nullptr;
    server_->budget_.release(name_charged_);
    name_charged_ = 0;
  }
  waited_keys_ = 0;
  release_body();
  tin_.reset();
  server_->budget_.release(tin_capacity_);
  tin_capacity_ = 0;
  give_back_output();
  server_->budget_.release(kSessionBytes);  // taken by ServerCore::admit()
  const size_t held_after = server_->budget_.held();
  server_->budget_.torn_down(held_before > held_after ? held_before - held_after : 0);
  server_->give_back_soon();
  boost::system::error_code ignored;
  try {
    timer_.cancel();
  } catch (...) {
  }
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void Session::crashed(const char* what) noexcept {
  // Tell the client why, when no write is under way to interleave with; then close.
  if (!closed_ && !writing_) {
    try {
      std::string frame = wire::make_frame(Type::kError, 0, wire::BodyWriter().bytes(std::string("server error: ") + what).take());
      boost::system::error_code ignored;
      socket_.non_blocking(true, ignored);
      socket_.write_some(asio::buffer(frame), ignored);
    } catch (...) {
    }
  }
  close(false);
}

void Session::close_soon() noexcept {
  if (closed_ || doomed_) return;
  try {
    asio::post(server_->io_, [self = shared_from_this()] { self->close(false); });
    doomed_ = true;  // only once the close is on its way: a doomed session always closes
  } catch (...) {    // no memory even to post it: close now (wake() keeps its namespace)
    close(false);
  }
}

// ---- writing ----

size_t Session::output_cap() const {
  return server_->limits_.max_body + wire::kHeaderSize + (size_t{1} << 20);
}

// Makes room in pending_ for `frame` more bytes, charging the budget for any growth
// first. False (nothing allocated) when the budget cannot take it.
bool Session::reserve_output(size_t frame) {
  size_t need = pending_.size() + frame;
  if (need <= pending_.capacity()) return true;
  size_t grown = std::max(need, 2 * pending_.capacity());
  if (!server_->budget_.try_hold(grown - pending_.capacity())) return false;
  output_charged_ += grown - pending_.capacity();
  pending_.reserve(grown);
  size_t actual = pending_.capacity() + sending_.capacity();  // the allocator may round up
  if (actual > output_charged_) server_->budget_.hold_anyway(actual - output_charged_);
  output_charged_ = std::max(output_charged_, actual);
  return true;
}

void Session::give_back_output() noexcept {
  if (!writing_) std::string().swap(sending_);
  std::string().swap(pending_);
  server_->budget_.release(output_charged_);
  output_charged_ = 0;
}

// Queues bytes to send; false (nothing queued) when the budget cannot hold them. A
// connection over its output cap is closed instead.
bool Session::enqueue(std::string_view head, std::string_view body) {
  if (closed_ || doomed_) return true;
  size_t n = head.size() + body.size();
  if (pending_.size() + sending_.size() + n > output_cap()) {
    // A client that does not read its answers: it goes. Closed from the event loop,
    // not here, since the caller may be walking this session's namespace.
    close_soon();
    return true;
  }
  if (!reserve_output(n)) return false;
  pending_.append(head);
  pending_.append(body);
  if (!writing_) flush();
  return true;
}

void Session::send(Type type, uint32_t request_id, std::string_view body) {
  auto header = wire::encode_header({type, request_id, static_cast<uint32_t>(body.size())});
  const std::string_view head(header.data(), header.size());
  if (enqueue(head, body)) return;
  if (type == Type::kError) {  // a few bytes saying so go out anyway
    pending_.reserve(pending_.size() + head.size() + body.size());
    size_t actual = pending_.capacity() + sending_.capacity();
    if (actual > output_charged_) server_->budget_.hold_anyway(actual - output_charged_);
    output_charged_ = std::max(output_charged_, actual);
    pending_.append(head);
    pending_.append(body);
    if (!writing_) flush();
    return;
  }
  ++server_->counters_.refused_memory;
  std::string message = "store memory limit reached: a reply of " + std::to_string(head.size() + body.size()) +
                        " bytes cannot be queued";
  send(Type::kError, request_id, wire::BodyWriter().bytes(message).take());
}

void Session::flush() {
  writing_ = true;
  sending_.swap(pending_);
  pending_.clear();
  asio::async_write(socket_, asio::buffer(sending_),
                    [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                      self->guarded([&] {
                        self->writing_ = false;
                        if (ec || self->closed_) return self->close(false);
                        self->after_write();
                      });
                    });
}

void Session::after_write() {
  sending_.clear();
  if (sending_.capacity() > kKeepSendBuffer) {
    server_->budget_.release(sending_.capacity());
    output_charged_ -= sending_.capacity();
    std::string().swap(sending_);
  }
  if (closing_after_write_ && pending_.empty()) return close(clean_close_);
  if (!pending_.empty()) flush();
  if (reading_paused_ && !output_backlogged()) {
    reading_paused_ = false;
    process_input();
  }
}

// ---- reading ----
// Small frames (nearly all of them) arrive whole in one read into the session's
// inline buffer, often several at once. A frame too big for it is read into a heap
// buffer that starts small and doubles only when the bytes already there fill it, so a
// client that declares a big body and sends little holds little.

void Session::read_more() {
  socket_.async_read_some(asio::buffer(inbuf_.data() + filled_, inbuf_.size() - filled_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
                            self->guarded([&] {
                              if (ec) return self->close(false);
                              self->filled_ += n;
                              self->process_input();
                            });
                          });
}

void Session::process_input() {
  if (!dialect_known_ && !detect_dialect()) return;
  if (dialect_ != Dialect::kDdprun) return torch_input();
  size_t used = 0;
  if (skipping_ > 0) {  // the rest of a frame refused for want of memory
    used = std::min(skipping_, filled_);
    skipping_ -= used;
    if (skipping_ == 0) {
      send(Type::kError, body_header_.request_id,
           wire::BodyWriter().bytes("store memory limit reached: a request of " +
                                    std::to_string(body_header_.body_size) + " bytes was not read").take());
    }
  }
  while (!closed_ && !doomed_ && !closing_after_write_ && skipping_ == 0 && !output_backlogged() &&
         filled_ - used >= wire::kHeaderSize) {
    wire::Header h;
    try {
      h = wire::decode_header(inbuf_.data() + used, ns_ ? server_->limits_ : server_->hello_limits_);
    } catch (const wire::ProtocolError& e) {
      return ++server_->counters_.protocol_errors, fail(0, e.what());
    }
    size_t frame = wire::kHeaderSize + h.body_size;
    if (filled_ - used >= frame) {
      on_frame(h, std::string_view(inbuf_.data() + used + wire::kHeaderSize, h.body_size));
      used += frame;
      continue;
    }
    if (frame > inbuf_.size()) {  // a big frame: read its body into a buffer of its own
      size_t have = filled_ - used - wire::kHeaderSize;
      body_header_ = h;
      filled_ = 0;
      if (!grow_body()) {  // no memory for it: discard it as it arrives, then answer ERROR
        skipping_ = h.body_size - have;
        used = 0;
        break;
      }
      std::memcpy(body_.get(), inbuf_.data() + used + wire::kHeaderSize, have);
      body_have_ = have;
      return read_body();
    }
    break;  // the rest of a small frame is still on its way
  }
  if (closed_ || doomed_ || closing_after_write_) return;
  if (filled_ > used) std::memmove(inbuf_.data(), inbuf_.data() + used, filled_ - used);
  filled_ -= used;
  // Backpressure: a client that sends requests but does not read the answers is not
  // read from either until its answers drain.
  if (output_backlogged()) {
    reading_paused_ = true;
    return;
  }
  read_more();
}

// Doubles the body buffer (the first one: kFirstBodyChunk), never past the declared
// size, charging the budget first. False (buffer unchanged) when the budget is full.
bool Session::grow_body() {
  size_t size = std::min<size_t>(body_header_.body_size, std::max(kFirstBodyChunk, 2 * body_capacity_));
  if (grow_buffer(body_, body_capacity_, body_have_, size)) return true;
  ++server_->counters_.refused_memory;
  return false;
}

// Replaces `buffer` (`capacity` bytes, `have` of them used) with one of `size` bytes,
// charging the budget first. False (buffer unchanged) when the budget is full.
bool Session::grow_buffer(std::unique_ptr<char[]>& buffer, size_t& capacity, size_t have, size_t size) {
  if (!server_->budget_.try_hold(size)) return false;
  std::unique_ptr<char[]> bigger;
  try {
    bigger.reset(new char[size]);
  } catch (...) {
    server_->budget_.release(size);
    throw;
  }
  if (have > 0) std::memcpy(bigger.get(), buffer.get(), have);
  server_->budget_.release(capacity);
  buffer = std::move(bigger);
  capacity = size;
  return true;
}

void Session::release_body() noexcept {
  body_.reset();
  server_->budget_.release(body_capacity_);
  body_capacity_ = 0;
  body_have_ = 0;
}

void Session::read_body() {
  socket_.async_read_some(asio::buffer(body_.get() + body_have_, body_capacity_ - body_have_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
                            self->guarded([&] {
                              if (ec) return self->close(false);
                              self->on_body_bytes(n);
                            });
                          });
}

void Session::on_body_bytes(size_t n) {
  body_have_ += n;
  if (body_have_ < body_header_.body_size) {
    if (body_have_ == body_capacity_ && !grow_body()) {
      skipping_ = body_header_.body_size - body_have_;
      release_body();
      return process_input();  // discards the rest as it arrives, then answers ERROR
    }
    return read_body();
  }
  on_frame(body_header_, std::string_view(body_.get(), body_header_.body_size));  // frees the buffer
  release_body();
  process_input();
}

}  // namespace rdzv
