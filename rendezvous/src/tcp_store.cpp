// TcpStore (rdzv/tcp_store.hpp): the typed requests over the link (link.hpp), each
// synchronous one a request queued on the link plus a wait for its answer.
#include "rdzv/tcp_store.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>

#include "connect.hpp"
#include "link.hpp"
#include "protocol.hpp"

namespace rdzv {

using detail::Answer;
using detail::Clock;
using wire::Type;

namespace {

// How long a synchronous caller waits past its request's deadline before giving it up
// itself: only a link thread held up by a task that blocks gets that far.
constexpr Millis kCallerGrace{1000};

// Blocking timeouts go to the server as milliseconds in [0, a year].
Millis clamp_wait(Millis timeout) { return std::clamp(timeout, Millis(0), Millis(int64_t{365} * 24 * 3600 * 1000)); }

wire::Request request(Type t, std::vector<std::string> keys = {}, std::vector<std::string> values = {},
                      int64_t number = 0) {
  wire::Request q;
  q.type = t;
  q.keys = std::move(keys);
  q.values = std::move(values);
  q.number = number;
  return q;
}

wire::BodyReader reader(const std::string& body) {
  static const wire::Limits kLimits{};
  return wire::BodyReader(body, kLimits);
}

// The body of an OK answer; throws what any other answer (or no answer) means.
std::string unpack(Answer a) {
  if (a.error) std::rethrow_exception(a.error);
  if (a.type == Type::kOk) return std::move(a.body);
  if (a.type == Type::kTimeout) {
    wire::TimeoutReply t = wire::decode_timeout(a.body, wire::Limits{});
    throw StoreTimeout(t.message, std::move(t.missing_keys));
  }
  if (a.type == Type::kError) throw StoreError("store: " + reader(a.body).bytes());
  throw wire::ProtocolError(std::string("the store answered with a ") + wire::type_name(a.type) + " frame");
}

std::vector<std::string> read_values(const std::string& body, size_t expected) {
  auto r = reader(body);
  const uint32_t n = r.u32();
  if (n != expected) throw wire::ProtocolError("multi_get: the store answered with the wrong count");
  std::vector<std::string> values;
  values.reserve(n);
  for (uint32_t i = 0; i < n; ++i) values.push_back(r.bytes());
  return values;
}

// A completion that hands `then` the answer's body parsed by `parse`, or the error.
template <typename T, typename Parse>
std::function<void(std::string, std::exception_ptr)> parsed(std::function<void(Outcome<T>)> then, Parse parse) {
  return [then = std::move(then), parse](std::string body, std::exception_ptr error) {
    Outcome<T> out;
    out.error = std::move(error);
    if (!out.error) {
      try {
        out.value = parse(body);
      } catch (...) {
        out.error = std::current_exception();
      }
    }
    then(std::move(out));
  };
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  const int fd = detail::connect_and_authenticate(options_);
  try {
    link_ = std::make_unique<detail::Link>(fd, options_.host + ":" + std::to_string(options_.port),
                                           options_.io_timeout);
  } catch (...) {
    ::close(fd);
    throw;
  }
}

TcpStore::~TcpStore() {
  // The fork rule: a child's copy leaves the parent's thread, locks and socket alone.
  if (link_ && link_->forked()) (void)link_.release();
}

bool TcpStore::forked() const { return link_->forked(); }

void TcpStore::check_usable() const {
  if (link_->forked()) {
    throw StoreConnectionError("this store client belongs to the process that forked this one; a child connects its own");
  }
}

RequestId TcpStore::start(const wire::Request& q, Millis server_wait,
                          std::function<void(std::string body, std::exception_ptr error)> then) {
  check_usable();
  return link_->submit(q.type, wire::encode_request(q), server_wait, [then = std::move(then)](Answer a) {
    std::string body;
    std::exception_ptr error;
    try {
      body = unpack(std::move(a));
    } catch (...) {
      error = std::current_exception();
    }
    then(std::move(body), std::move(error));
  });
}

std::string TcpStore::call(const wire::Request& q, Millis server_wait) {
  check_usable();
  if (link_->on_link_thread()) {
    throw StoreError("a synchronous store request on the store's own link thread would wait for itself");
  }
  auto answer = std::make_shared<std::promise<Answer>>();
  std::future<Answer> ready = answer->get_future();
  const RequestId id = link_->submit(q.type, wire::encode_request(q), server_wait,
                                     [answer](Answer a) { answer->set_value(std::move(a)); });
  // The link thread ends the request by its deadline; this bound is for a link thread
  // held up by a task that blocks (against the contract).
  const auto bound = Clock::now() + server_wait + options_.io_timeout + kCallerGrace;
  if (ready.wait_until(bound) != std::future_status::ready && link_->cancel(id)) {
    throw StoreTimeout("the store at " + link_->where() + " did not answer in time");
  }
  return unpack(ready.get());  // (not cancelled: its completion is running or has run)
}

void TcpStore::set(const std::string& key, const std::string& value) {
  call(request(Type::kSet, {key}, {value}), Millis(0));
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  timeout = clamp_wait(timeout);
  std::string body = call(request(Type::kGet, {key}, {}, timeout.count()), timeout);
  return reader(body).bytes();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string body = call(request(Type::kAdd, {key}, {}, delta), Millis(0));
  return reader(body).i64();
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::string body = call(request(Type::kCompareSet, {key}, {expected, desired}), Millis(0));
  return reader(body).bytes();
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  timeout = clamp_wait(timeout);
  call(request(Type::kWait, keys, {}, timeout.count()), timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string body = call(request(Type::kCheck, keys), Millis(0));
  return reader(body).u32() != 0;
}

bool TcpStore::delete_key(const std::string& key) {
  std::string body = call(request(Type::kDelete, {key}), Millis(0));
  return reader(body).u32() != 0;
}

int64_t TcpStore::num_keys() {
  std::string body = call(request(Type::kNumKeys), Millis(0));
  return reader(body).i64();
}

std::vector<std::string> TcpStore::multi_get(const std::vector<std::string>& keys, Millis timeout) {
  timeout = clamp_wait(timeout);
  return read_values(call(request(Type::kMultiGet, keys, {}, timeout.count()), timeout), keys.size());
}

void TcpStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("multi_set: keys and values differ in number");
  call(request(Type::kMultiSet, keys, values), Millis(0));
}

void TcpStore::append(const std::string& key, const std::string& value) {
  call(request(Type::kAppend, {key}, {value}), Millis(0));
}

void TcpStore::set_will(const std::string& key, const std::string& value, Millis silence_limit) {
  call(request(Type::kSetWill, {key}, {value}, std::max<int64_t>(0, silence_limit.count())), Millis(0));
}

void TcpStore::set_wills(const std::vector<std::pair<std::string, std::string>>& wills, Millis silence_limit) {
  if (wills.size() > wire::kMaxWills) throw StoreError("set_wills: more than " + std::to_string(wire::kMaxWills) + " wills");
  std::vector<std::string> keys, values;
  for (const auto& [key, value] : wills) {
    keys.push_back(key);
    values.push_back(value);
  }
  call(request(Type::kSetWills, keys, values, std::max<int64_t>(0, silence_limit.count())), Millis(0));
}

void TcpStore::ping() { call(request(Type::kPing), Millis(0)); }

void TcpStore::close() {
  if (link_->forked()) return;
  try {
    call(request(Type::kGoodbye), Millis(0));
  } catch (const StoreError&) {
    // Closing anyway; a lost connection has nothing to say goodbye to.
  }
  link_->drop("the store connection is closed");
}

void TcpStore::abort() {
  if (link_->forked()) return;
  link_->drop("the connection to the store at " + link_->where() + " was aborted");
}

// ---- asynchronous requests ----

RequestId TcpStore::get_async(const std::string& key, Millis timeout, std::function<void(Outcome<std::string>)> then) {
  timeout = clamp_wait(timeout);
  return start(request(Type::kGet, {key}, {}, timeout.count()), timeout,
               parsed<std::string>(std::move(then), [](const std::string& body) { return reader(body).bytes(); }));
}

RequestId TcpStore::add_async(const std::string& key, int64_t delta, std::function<void(Outcome<int64_t>)> then) {
  return start(request(Type::kAdd, {key}, {}, delta), Millis(0),
               parsed<int64_t>(std::move(then), [](const std::string& body) { return reader(body).i64(); }));
}

RequestId TcpStore::set_async(const std::string& key, const std::string& value, std::function<void(Done)> then) {
  return start(request(Type::kSet, {key}, {value}), Millis(0),
               [then = std::move(then)](std::string, std::exception_ptr error) { then(Done{error}); });
}

RequestId TcpStore::ping_async(std::function<void(Done)> then) {
  return start(request(Type::kPing), Millis(0),
               [then = std::move(then)](std::string, std::exception_ptr error) { then(Done{error}); });
}

bool TcpStore::cancel(RequestId id) { return !link_->forked() && link_->cancel(id); }

void TcpStore::post(std::function<void()> task) { post_after(Millis(0), std::move(task)); }

void TcpStore::post_after(Millis delay, std::function<void()> task) {
  if (!link_->forked()) link_->post_after(delay, std::move(task));
}

namespace {
// Why a connection failed, from a StoreConnectionError's text: "Connection refused".
std::string reason_of(const StoreError& e) {
  const std::string what = e.what();
  const auto open = what.rfind('(');
  if (open == std::string::npos || what.back() != ')') return what;
  return what.substr(open + 1, what.size() - open - 2);
}
}  // namespace

Connecting connect_waiting(TcpStoreOptions options, Waiting w,
                           const std::function<std::string(const std::string& reason)>& describe) {
  Connecting c;
  w.describe = [&] { return describe(c.reason); };
  const auto start = Clock::now();
  const Millis greeting = options.handshake_timeout;
  c.end = wait_in_slices(w, [&](Millis budget) {
    options.connect_timeout = std::max(Millis(1), budget);  // the client retries within it
    const Millis left = w.timeout - std::chrono::duration_cast<Millis>(Clock::now() - start);
    options.handshake_timeout = std::clamp(left, Millis(1), std::max(Millis(1), greeting));
    try {
      c.store = std::make_shared<TcpStore>(options);
      return true;
    } catch (const StoreAuthError&) {
      throw;
    } catch (const StoreConnectionError& e) {
      c.reason = reason_of(e);
      return false;
    }
  });
  return c;
}

std::string TcpStore::local_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char text[INET6_ADDRSTRLEN] = {};
  if (getsockname(link_->fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace rdzv
