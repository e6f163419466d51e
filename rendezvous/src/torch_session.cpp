// Session: torch's TCPStore dialects (PROTOCOL.md, "torch's dialects"). A torch
// connection joins the server's torch namespace as it was when the connection arrived
// and reaches nothing else. Its requests follow the semantics of torch's libuv server.
// torch's replies have no error value: whatever cannot be answered (a value over the
// limit, the memory budget, a non-integer ADD, a request over the caps) closes the
// connection, which torch's client reports as a lost store.
#include <boost/asio/ip/tcp.hpp>
#include <cstring>

#include "session.hpp"

namespace rdzv {

namespace asio = boost::asio;
using torch_wire::Query;

namespace {
constexpr size_t kFirstTorchBuffer = 512;          // most requests fit: one small block per connection
constexpr size_t kKeepTorchBuffer = 64u << 10;     // a bigger one is freed once empty
constexpr size_t kQueueEntryBytes = 64;            // a deque slot and its string, beyond the value
constexpr size_t kQueueBytes = 256;                // a queue's map node and deque, beyond its name

std::string peer_of(const asio::ip::tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  if (ec) return "unknown";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}
}  // namespace

void Session::torch_begin(Dialect dialect) {
  dialect_ = dialect;
  std::string refused = enter(torch_ns_);
  if (!refused.empty()) {
    ++server_->counters_.refused_memory;
    return close(false);
  }
  ++server_->counters_.connections_open[static_cast<size_t>(dialect)];
  ++server_->counters_.connections_total[static_cast<size_t>(dialect)];
  if (server_->options_.on_torch_client) {
    try {
      server_->options_.on_torch_client(peer_of(socket_), dialect, torch_ns_);
    } catch (...) {  // a logging hook must not cost the connection
    }
  }
  // The bytes read so far move to the torch buffer.
  if (!torch_buffer(std::max(kFirstTorchBuffer, filled_))) return;
  std::memcpy(tin_.get(), inbuf_.data(), filled_);
  tin_have_ = filled_;
  filled_ = 0;
  torch_input();
}

// A torch client where none is admitted: no greeting (it would read one as a reply),
// the server's hook told, and the connection closed.
void Session::torch_refuse() {
  ++server_->counters_.refused_torch;
  if (server_->options_.on_torch_refused) {
    try {
      server_->options_.on_torch_refused(peer_of(socket_));
    } catch (...) {  // a logging hook must not keep the connection
    }
  }
  close(false);
}

// Makes the input buffer hold at least `at_least` bytes, charging the budget first: it
// doubles, up to the request limit. (Not capped at the decoder's `needed`: that is the
// end of the next field, and a request of many small fields would then grow the
// buffer, and copy it, once per field.) False (closed) when the budget cannot take it.
bool Session::torch_buffer(size_t at_least) {
  if (tin_capacity_ >= at_least) return true;
  size_t size = std::max(at_least, std::min<size_t>(2 * tin_capacity_, server_->torch_limits_.max_body + 64));
  if (grow_buffer(tin_, tin_capacity_, tin_have_, size)) return true;
  ++server_->counters_.refused_memory;
  close(false);
  return false;
}

void Session::torch_read() {
  socket_.async_read_some(asio::buffer(tin_.get() + tin_have_, tin_capacity_ - tin_have_),
                          [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
                            self->guarded([&] {
                              if (ec) return self->close(false);
                              self->tin_have_ += n;
                              self->torch_input();
                            });
                          });
}

// Runs every whole request buffered, then reads more (unless answers are piling up).
void Session::torch_input() {
  size_t used = 0;
  while (!closed_ && !doomed_ && !output_backlogged() && tin_have_ - used >= std::max<size_t>(tin_needed_, 1)) {
    torch_wire::Decoded d;
    try {
      d = torch_wire::decode(std::string_view(tin_.get() + used, tin_have_ - used), dialect_, server_->torch_limits_,
                             tin_scan_);
    } catch (const wire::ProtocolError&) {
      return torch_gone(true);
    }
    if (d.consumed == 0) {
      tin_needed_ = d.needed;
      break;
    }
    tin_needed_ = 0;
    used += d.consumed;
    try {
      torch_handle(d.request);
    } catch (const wire::ProtocolError&) {
      return torch_gone(true);
    } catch (const std::exception&) {  // StoreError (limits, budget, ADD on text), out of memory
      return torch_gone(false);
    }
  }
  if (closed_ || doomed_) return;
  if (used > 0) std::memmove(tin_.get(), tin_.get() + used, tin_have_ - used);
  tin_have_ -= used;
  if (tin_have_ == 0 && tin_capacity_ > kKeepTorchBuffer) {  // a big request is done: back to a small buffer
    tin_.reset();
    server_->budget_.release(tin_capacity_);
    tin_capacity_ = 0;
    if (!torch_buffer(kFirstTorchBuffer)) return;
  }
  if (output_backlogged()) {
    reading_paused_ = true;
    return;
  }
  // Grown only once the bytes that came fill it: a request's declared size is no
  // reason to allocate, or else a few bytes could pin the largest request's worth.
  if (tin_have_ == tin_capacity_ && !torch_buffer(tin_have_ + 1)) return;
  torch_read();
}

void Session::torch_gone(bool protocol_error) noexcept {
  if (protocol_error) ++server_->counters_.protocol_errors;
  close(false);
}

// Queues a reply; a reply the budget cannot hold closes the connection.
void Session::torch_reply(std::string_view bytes) {
  if (!enqueue({}, bytes)) {
    ++server_->counters_.refused_memory;
    close_soon();
  }
}

// Throws unless a reply of `reply` bytes may be built and queued.
void Session::torch_room(size_t reply) {
  if (reply > server_->torch_limits_.max_body) throw StoreError("torch reply over the frame limit");
  if (!server_->budget_.fits(2 * reply)) {
    ++server_->counters_.refused_memory;
    throw StoreError("store memory limit reached");
  }
}

void Session::torch_handle(torch_wire::Request& q) {
  ++server_->counters_.torch_requests[static_cast<size_t>(q.query) % server_->counters_.torch_requests.size()];
  KvTable& table = ns_->table;
  std::string out;
  switch (q.query) {
    case Query::kValidate:  // once, first, and only in the 2.x dialect (detect() saw to the first)
      if (torch_validated_ || dialect_ != Dialect::kTorch) throw wire::ProtocolError("torch VALIDATE out of place");
      torch_validated_ = true;
      return;
    case Query::kPing: {
      auto nonce = static_cast<uint32_t>(q.number);
      out.append(reinterpret_cast<const char*>(&nonce), sizeof(nonce));
      break;
    }
    case Query::kSet:
      return store_set(q.keys[0], q.values[0]);  // SET, APPEND, MULTI_SET, QUEUE_PUSH: no reply
    case Query::kAppend:
      return store_append(q.keys[0], q.values[0]);
    case Query::kMultiSet:
      return store_multi_set(q.keys, q.values);
    case Query::kCompareSet:
      torch_compare_set(q, out);
      break;
    case Query::kGet: {  // no wait: torch's client WAITs first; a missing key reads as empty
      const std::string* v = table.find(q.keys[0]);
      torch_room(8 + (v ? v->size() : 0));
      torch_wire::put_bytes(out, v ? *v : std::string_view());
      break;
    }
    case Query::kMultiGet: {
      size_t reply = 0;
      for (const auto& k : q.keys) {
        const std::string* v = table.find(k);
        reply += 8 + (v ? v->size() : 0);
      }
      torch_room(reply);
      for (const auto& k : q.keys) {
        const std::string* v = table.find(k);
        torch_wire::put_bytes(out, v ? *v : std::string_view());
      }
      break;
    }
    case Query::kAdd:
      require_fits(table.growth_if_set(q.keys[0], 20));  // at most 20 digits
      torch_wire::put_i64(out, change(q.keys[0], [&](KvTable& t) { return t.add(q.keys[0], q.number, KvTable::Parse::kLeadingNumber); }));
      break;
    case Query::kCheck:
      out.push_back(static_cast<char>(ns_->torch_ready(q.keys) ? torch_wire::kReady : torch_wire::kNotReady));
      break;
    case Query::kWait:
      return torch_wait(std::move(q.keys));
    case Query::kCancelWait:
      torch_cancel_waits();
      out.push_back(static_cast<char>(torch_wire::kWaitCanceled));
      break;
    case Query::kGetNumKeys:
      torch_wire::put_i64(out, table.size());
      break;
    case Query::kDeleteKey:
      torch_wire::put_i64(out, change(q.keys[0], [&](KvTable& t) { return t.erase(q.keys[0]) ? 1 : 0; }));
      break;
    case Query::kQueuePush:
      return torch_queue_push(q.keys[0], std::move(q.values[0]));
    case Query::kQueuePop:
      torch_queue_pop(q.keys[0], out);
      break;
    case Query::kQueueLen: {
      auto it = ns_->queues.find(q.keys[0]);
      torch_wire::put_i64(out, it == ns_->queues.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case Query::kListKeys:
      torch_list_keys(out);
      break;
    case Query::kBarrier:
      return torch_barrier(q.keys[0], q.number);
    case Query::kLegacyWatchKey:  // 1.13's watch_key callbacks: not served (PROTOCOL.md)
      throw wire::ProtocolError("WATCH_KEY is not supported");
  }
  torch_reply(out);
}

// libuv's server: a missing key with an empty `expected` is set to `desired`; with any
// other `expected` nothing is set and `expected` comes back. Otherwise the value after
// the exchange comes back.
void Session::torch_compare_set(torch_wire::Request& q, std::string& out) {
  const std::string& key = q.keys[0];
  const std::string& expected = q.values[0];
  if (ns_->table.find(key) == nullptr && !expected.empty()) {
    torch_room(8 + expected.size());
    torch_wire::put_bytes(out, expected);
    return;
  }
  check_value(q.values[1].size());
  require_fits(ns_->table.growth_if_set(key, q.values[1].size()));
  torch_room(8 + std::max(q.values[1].size(), ns_->table.find(key) ? ns_->table.find(key)->size() : 0));
  torch_wire::put_bytes(out, change(key, [&](KvTable& t) { return t.compare_set(key, expected, q.values[1]); }));
}

void Session::torch_wait(std::vector<std::string> keys) {
  if (ns_->torch_ready(keys)) {
    const char stop = static_cast<char>(torch_wire::kStopWaiting);
    return torch_reply(std::string_view(&stop, 1));
  }
  wire::Request q;
  q.type = wire::Type::kWait;
  q.keys = std::move(keys);
  start_wait(0, q);
  ++server_->counters_.waits_started;
}

// Drops every wait of this connection. A STOP_WAITING already queued stays: torch's
// client reads it before the WAIT_CANCELED that follows.
void Session::torch_cancel_waits() {
  std::vector<std::shared_ptr<Waiter>> mine = waiters_;
  for (auto& w : mine) server_->finish_waiter(*ns_, w);
}

void Session::torch_queue_push(const std::string& key, std::string value) {
  check_value(value.size());
  auto it = ns_->queues.find(key);
  size_t charge = value.size() + kQueueEntryBytes + (it == ns_->queues.end() ? kQueueBytes + key.size() : 0);
  require_fits(static_cast<int64_t>(charge));
  if (it == ns_->queues.end()) it = ns_->queues.try_emplace(key).first;
  it->second.push_back(std::move(value));
  ns_->queue_bytes += charge;
  server_->budget_.store(static_cast<int64_t>(charge));
  server_->wake_one(*ns_, key);  // one popper per item, as torch's libuv server does
}

// The queue's length before the pop, then the item when there was one.
void Session::torch_queue_pop(const std::string& key, std::string& out) {
  auto it = ns_->queues.find(key);
  if (it == ns_->queues.end() || it->second.empty()) return torch_wire::put_i64(out, 0);
  torch_room(16 + it->second.front().size());
  torch_wire::put_i64(out, static_cast<int64_t>(it->second.size()));
  torch_wire::put_bytes(out, it->second.front());
  size_t freed = it->second.front().size() + kQueueEntryBytes;
  it->second.pop_front();
  if (it->second.empty()) {
    freed += kQueueBytes + key.size();
    ns_->queues.erase(it);
  }
  ns_->queue_bytes -= freed;
  server_->budget_.store(-static_cast<int64_t>(freed));
}

// The reply is sized and checked before anything is copied, then the keys are written
// straight into it: a namespace full of keys costs no uncharged copy of them.
void Session::torch_list_keys(std::string& out) {
  const KvTable& table = ns_->table;
  size_t reply = 8;
  table.for_each_key([&](const std::string& k) { reply += 8 + k.size(); });
  torch_room(reply);
  out.reserve(reply);
  torch_wire::put_i64(out, table.size());
  table.for_each_key([&](const std::string& k) { torch_wire::put_bytes(out, k); });
}

// torch's BARRIER (libuv): counts arrivals in `key` as decimal text; the arrival that
// reaches `world_size` wakes everyone waiting on the key and is answered at once; the
// others wait until the key next changes.
void Session::torch_barrier(const std::string& key, int64_t world_size) {
  KvTable& table = ns_->table;
  require_fits(table.growth_if_set(key, 20));
  size_t before = table.bytes();
  int64_t count = 0;
  try {
    count = table.add(key, 1, KvTable::Parse::kLeadingNumber);  // no wake-up yet: earlier arrivals wait for the last
  } catch (...) {
    count_stored(before);
    throw;
  }
  count_stored(before);
  if (count >= world_size) {
    server_->wake(*ns_, key);
    const char stop = static_cast<char>(torch_wire::kStopWaiting);
    return torch_reply(std::string_view(&stop, 1));
  }
  wire::Request q;
  q.type = wire::Type::kWait;
  q.keys = {key};
  start_wait(0, q);
  ++server_->counters_.waits_started;
}

}  // namespace rdzv
