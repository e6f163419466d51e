// Session: the requests themselves — decoding a frame, running it on the namespace's
// table, blocked requests and their wake-ups, the will — with stored bytes and blocked
// requests charged to the server's memory budget before they are allocated.
#include <algorithm>

#include "auth.hpp"
#include "heap_blocks.hpp"
#include "session.hpp"

namespace rdzv {

namespace asio = boost::asio;
using wire::Type;

namespace {
constexpr int64_t kMaxWaitMs = int64_t{365} * 24 * 3600 * 1000;  // clamp absurd timeouts
// What a blocked request costs beyond its keys' bytes: the waiter with its timer, and
// per key its string in the waiter, its entry in the namespace's index (a hash node, a
// vector, a bucket) and, for a key too long for the string's inline buffer, two copies.
// Measured in the daemon's RSS: 562 bytes per one-key wait (9-byte keys), 155 bytes a
// key in 65,536-key waits (283 with 40-byte keys).
constexpr size_t kWaiterBytes = 512;
constexpr size_t kWaitedKeyBytes = 160;

size_t wait_charge(const std::vector<std::string>& keys) {
  size_t bytes = kWaiterBytes;
  for (const auto& k : keys) bytes += kWaitedKeyBytes + (k.size() > 15 ? 2 * (k.size() + 32) : 0);
  return bytes;
}
}  // namespace

void Session::on_frame(const wire::Header& h, std::string_view body) {
  wire::Request q;
  try {
    q = wire::decode_request(h.type, body, server_->limits_);
  } catch (const wire::ProtocolError& e) {
    return fail(h.request_id, e.what());
  }
  release_body();  // decoded: what the request needs is in `q` now
  if (ns_ == nullptr && q.type != Type::kHello) return fail(h.request_id, "not authenticated: HELLO first");
  if (ns_ != nullptr && q.type == Type::kHello) return fail(h.request_id, "HELLO twice");
  last_heard_ = std::chrono::steady_clock::now();
  try {
    handle(h.request_id, q);
  } catch (const StoreError& e) {  // e.g. add() on a non-integer, the memory limit: the connection stays
    send(Type::kError, h.request_id, wire::BodyWriter().bytes(e.what()).take());
  } catch (const std::exception& e) {  // out of memory and the like: this client goes, the server stays
    fail(h.request_id, std::string("server error: ") + e.what());
  }
}

// A protocol violation: one error frame, then the connection closes.
void Session::fail(uint32_t request_id, const std::string& message) {
  send(Type::kError, request_id, wire::BodyWriter().bytes(message).take());
  closing_after_write_ = true;  // the write's completion closes (not cleanly: the will fires)
}

void Session::require_fits(int64_t growth) const {
  if (growth > 0 && !server_->budget_.fits(static_cast<size_t>(growth))) {
    throw StoreError("store memory limit reached");
  }
}

void Session::check_value(size_t size) const {
  if (size > server_->options_.max_value) {
    throw StoreError("value of " + std::to_string(size) + " bytes exceeds the limit of " +
                     std::to_string(server_->options_.max_value));
  }
}

// Charges (or gives back) what the namespace's table grew (or shrank) by since `before`.
void Session::count_stored(size_t before) {
  size_t now = ns_->table.bytes();
  server_->budget_.store(static_cast<int64_t>(now) - static_cast<int64_t>(before));
  if (now < before) server_->give_back_soon();  // counts only a real fall below the peak
}

void Session::set_key(const std::string& key, const std::string& value) {
  change(key, [&](KvTable& t) {
    t.set(key, value);
    return 0;
  });
}

// SET, APPEND and MULTI_SET, for both dialects: limits and the budget checked first,
// then the change, then the wake-ups. Values are moved in: no second copy of a big one.
void Session::store_set(const std::string& key, std::string& value) {
  check_value(value.size());
  require_fits(ns_->table.growth_if_set(key, value.size()));
  change(key, [&](KvTable& t) {
    t.set(key, std::move(value));
    return 0;
  });
}

void Session::store_append(const std::string& key, const std::string& value) {
  const std::string* v = ns_->table.find(key);  // the value afterwards obeys SET's limit, a new key's included
  check_value((v ? v->size() : 0) + value.size());
  require_fits(ns_->table.growth_if_append(key, value.size()));
  change(key, [&](KvTable& t) {
    t.append(key, value);
    return 0;
  });
}

void Session::store_multi_set(const std::vector<std::string>& keys, std::vector<std::string>& values) {
  KvTable& table = ns_->table;
  for (const auto& v : values) check_value(v.size());
  require_fits(table.growth_if_set(keys, values));
  size_t before = table.bytes();
  try {
    for (size_t i = 0; i < keys.size(); ++i) table.set(keys[i], std::move(values[i]));
  } catch (...) {
    count_stored(before);
    throw;
  }
  count_stored(before);
  for (const auto& k : keys) {  // after all are set: nobody sees half
    if (ns_ == nullptr) break;  // this session closed while waking (it stays open: defence)
    server_->wake(*ns_, k);
  }
}

void Session::handle(uint32_t id, wire::Request& q) {
  if (q.type == Type::kHello) return hello(id, q);
  KvTable& table = ns_->table;
  wire::BodyWriter out;
  switch (q.type) {
    case Type::kSet:
      store_set(q.keys[0], q.values[0]);
      break;
    case Type::kAppend:
      store_append(q.keys[0], q.values[0]);
      break;
    case Type::kAdd:
      require_fits(table.growth_if_set(q.keys[0], 20));  // at most 20 digits
      out.i64(change(q.keys[0], [&](KvTable& t) { return t.add(q.keys[0], q.number); }));
      break;
    case Type::kCompareSet:
      check_value(q.values[1].size());
      require_fits(table.growth_if_set(q.keys[0], q.values[1].size()));
      out.bytes(change(q.keys[0], [&](KvTable& t) { return t.compare_set(q.keys[0], q.values[0], q.values[1]); }));
      break;
    case Type::kCheck:
      out.u32(table.contains_all(q.keys) ? 1 : 0);
      break;
    case Type::kDelete:
      out.u32(change(q.keys[0], [&](KvTable& t) { return t.erase(q.keys[0]) ? 1 : 0; }));
      break;
    case Type::kNumKeys:
      out.i64(table.size());
      break;
    case Type::kMultiSet:
      store_multi_set(q.keys, q.values);
      break;
    case Type::kGet:
    case Type::kWait:
    case Type::kMultiGet:
      return start_wait(id, q);
    case Type::kSetWill:
    case Type::kSetWills: {
      // The wills are the request's own strings, moved: their blocks are known before.
      size_t expected = heap::predicted_bytes(q.keys.size() * sizeof(Wills::value_type));
      for (size_t i = 0; i < q.keys.size(); ++i) {
        check_value(q.values[i].size());
        expected += heap::string_bytes(q.keys[i]) + heap::string_bytes(q.values[i]);
      }
      size_t old = will_bytes();
      require_fits(static_cast<int64_t>(expected) - static_cast<int64_t>(old));
      Wills next;
      next.reserve(q.keys.size());
      for (size_t i = 0; i < q.keys.size(); ++i) next.emplace_back(std::move(q.keys[i]), std::move(q.values[i]));
      wills_.swap(next);
      server_->budget_.store(static_cast<int64_t>(will_bytes()) - static_cast<int64_t>(old));  // held in reserve
      if (q.number > 0) watch_silence(Millis(std::min(q.number, kMaxWaitMs)));
      break;
    }
    case Type::kGoodbye:
      server_->budget_.store(-static_cast<int64_t>(will_bytes()));
      Wills().swap(wills_);
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

void Session::hello(uint32_t id, const wire::Request& q) {
  const std::string& ns = q.values[0];
  auth::Admission admission = server_->auth_.admit(ns, nonce_, q.values[1], q.values[2]);
  if (!admission.admitted) return fail(id, admission.error);
  std::string refused = enter(ns);
  if (!refused.empty()) return fail(id, refused);  // no room: refused like a full server
  nonce_.clear();
  nonce_.shrink_to_fit();
  send(Type::kOk, id, wire::BodyWriter().bytes(admission.server_proof).take());
}

// Joins namespace `ns`; returns why not (empty when it did).
std::string Session::enter(const std::string& ns) {
  // The session's copy of a name too long to sit inside it is charged with the session.
  size_t name_bytes = heap::predicted_string_bytes(ns.size());
  if (!server_->budget_.try_hold(name_bytes)) return "store memory limit reached: no room for a connection";
  try {
    ns_ = &server_->join(ns);
  } catch (const StoreError& e) {  // no room for a new namespace
    server_->budget_.release(name_bytes);
    return e.what();
  }
  ns_name_ = ns;
  name_charged_ = name_bytes;
  timer_.cancel();  // admitted in time
  return {};
}

// The heap blocks of the wills: the list's and those of its strings.
size_t Session::will_bytes() const {
  size_t n = wills_.capacity() == 0 ? 0 : heap::block_bytes(wills_.data());
  for (const auto& [key, value] : wills_) n += heap::string_bytes(key) + heap::string_bytes(value);
  return n;
}

// The wills: compare_set(key, "", value) each, i.e. only where nobody set the key yet.
void Session::publish_will(bool clean) noexcept {
  if (wills_.empty()) return;
  server_->budget_.store(-static_cast<int64_t>(will_bytes()));  // was held in reserve
  Wills wills;
  wills.swap(wills_);
  for (auto& [key, value] : wills) {
    try {
      if (!clean && ns_->table.find(key) == nullptr) set_key(key, value);
    } catch (...) {  // out of memory even for this: nothing more can be done for it
    }
  }
}

// A client with a will must be heard from (any request, PING included) at least every
// `limit`, or it counts as dead: how a frozen or hung ddprun is told from a slow one.
void Session::watch_silence(Millis limit) {
  silence_limit_ = limit;
  arm_silence_timer(limit);
}

void Session::arm_silence_timer(Millis after) {
  timer_.expires_after(after);
  timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->closed_) return;
    self->guarded([&] {
      auto quiet = std::chrono::steady_clock::now() - self->last_heard_;
      if (quiet >= self->silence_limit_) return self->close(false);  // the will fires
      self->arm_silence_timer(std::chrono::duration_cast<Millis>(self->silence_limit_ - quiet) + Millis(1));
    });
  });
}

// A blocked request. A torch client's (its caller saw its keys missing) has no timeout:
// torch's client gives up by itself and sends CANCEL_WAIT.
void Session::start_wait(uint32_t id, wire::Request& q) {
  const bool torch = dialect_ != Dialect::kDdprun;
  if (!torch && ns_->table.contains_all(q.keys)) return reply_wait(id, q.type, q.keys, false);
  if (waiters_.size() >= kMaxWaitsPerConnection) {
    throw StoreError("too many blocked requests on one connection (limit " + std::to_string(kMaxWaitsPerConnection) +
                     ")");
  }
  if (waited_keys_ + q.keys.size() > kMaxWaitedKeysPerConnection) {
    throw StoreError("too many keys waited for on one connection (limit " +
                     std::to_string(kMaxWaitedKeysPerConnection) + ")");
  }
  size_t charge = wait_charge(q.keys);
  if (!server_->budget_.try_hold(charge)) throw StoreError("store memory limit reached: cannot hold this wait");
  std::shared_ptr<Waiter> w;
  try {
    w = std::make_shared<Waiter>(server_->io_, shared_from_this(), id, q.type, std::move(q.keys), charge);
    waiters_.push_back(w);
  } catch (...) {
    server_->budget_.release(charge);
    throw;
  }
  w->torch = torch;
  ++server_->waiters_;
  waited_keys_ += w->keys.size();
  try {
    for (const auto& k : w->keys) ns_->waiters[k].push_back(w);
  } catch (...) {  // out of memory half-way: undo what was indexed (finish_waiter gives the charge back)
    server_->finish_waiter(*ns_, w);
    throw;
  }
  if (torch) return;
  w->timer.expires_after(Millis(std::min(q.number, kMaxWaitMs)));
  w->timer.async_wait([weak = std::weak_ptr<Waiter>(w), server = server_](const boost::system::error_code& ec) {
    auto waiter = weak.lock();
    if (ec || !waiter || waiter->done) return;
    auto s = waiter->session;
    s->guarded([&] {
      if (s->ns() == nullptr) return;
      s->reply_wait(waiter->request_id, waiter->type, waiter->keys, true);
      if (s->ns() != nullptr) server->finish_waiter(*s->ns(), waiter);
    });
  });
}

void Session::reply_wait(uint32_t request_id, Type type, const std::vector<std::string>& keys, bool timed_out) {
  if (closed_ || doomed_ || ns_ == nullptr) return;
  if (dialect_ != Dialect::kDdprun) {  // torch's WAIT / BARRIER / a blocking QUEUE_POP's wait
    const char stop = static_cast<char>(torch_wire::kStopWaiting);
    return torch_reply(std::string_view(&stop, 1));
  }
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
  if (!server_->budget_.fits(2 * reply)) {  // the reply's body, then its copy in the queue
    send(Type::kError, request_id,
         wire::BodyWriter().bytes("store memory limit reached: a reply of " + std::to_string(reply) +
                                  " bytes cannot be queued").take());
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

void Session::forget_waiter(const Waiter* w) {
  for (size_t i = 0; i < waiters_.size(); ++i) {
    if (waiters_[i].get() == w) {
      waited_keys_ -= w->keys.size();
      waiters_[i] = std::move(waiters_.back());
      waiters_.pop_back();
      return;
    }
  }
}

}  // namespace rdzv
