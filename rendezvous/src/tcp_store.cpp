#include "rdzv/tcp_store.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "auth.hpp"
#include "protocol.hpp"
#include "socket_options.hpp"

namespace rdzv {

using Clock = std::chrono::steady_clock;
using wire::Type;

namespace {

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, INT32_MAX));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw StoreConnectionError(std::string("poll failed: ") + std::strerror(errno));
  }
}

void send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_fd(fd, POLLOUT, deadline)) throw StoreTimeout("timed out sending to the store");
    } else {
      throw StoreConnectionError(std::string("lost the connection to the store: ") + std::strerror(errno));
    }
  }
}

void recv_all(int fd, char* out, size_t size, Clock::time_point deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, out + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0) {
      throw StoreConnectionError("the store closed the connection");
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!wait_fd(fd, POLLIN, deadline)) throw StoreTimeout("timed out waiting for the store to answer");
    } else {
      throw StoreConnectionError(std::string("lost the connection to the store: ") + std::strerror(errno));
    }
  }
}

struct Frame {
  wire::Header header;
  std::string body;
};

Frame recv_frame(int fd, Clock::time_point deadline) {
  static const wire::Limits kClientLimits{};  // answers are bounded by the server's value limit
  char raw[wire::kHeaderSize];
  recv_all(fd, raw, sizeof(raw), deadline);
  Frame f;
  f.header = wire::decode_header(raw, kClientLimits);
  f.body.resize(f.header.body_size);
  if (!f.body.empty()) recv_all(fd, f.body.data(), f.body.size(), deadline);
  return f;
}

// One attempt at a TCP connection to host:port, bounded by the deadline. -1 when refused/unreachable.
int try_connect(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    why = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      err = ETIMEDOUT;
      if (wait_fd(fd, POLLOUT, deadline)) {
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      why = std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options) : options_(std::move(options)) {
  try {
    connect_and_authenticate();
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    throw;
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::connect_and_authenticate() {
  const auto deadline = Clock::now() + options_.connect_timeout;
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  std::string why = "no answer";
  // The server may not be up yet (nodes start in any order): back off and retry until the deadline.
  for (auto backoff = Millis(20);; backoff = std::min(backoff * 2, Millis(500))) {
    fd_ = try_connect(options_.host, options_.port, deadline, why);
    if (fd_ >= 0 || Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
  }
  if (fd_ < 0) {
    throw StoreConnectionError("cannot reach the store at " + where + " within " +
                               std::to_string(options_.connect_timeout.count()) + " ms (" + why + ")");
  }
  set_liveness_options(fd_, options_.heartbeat_timeout);

  Frame challenge = recv_frame(fd_, deadline);
  if (challenge.header.type == Type::kError) {
    wire::BodyReader r(challenge.body, wire::Limits{});
    throw StoreConnectionError("the store at " + where + " refused the connection: " + r.bytes());
  }
  if (challenge.header.type != Type::kChallenge) throw wire::ProtocolError("the store did not open with a challenge");
  wire::BodyReader r(challenge.body, wire::Limits{});
  std::string server_nonce = r.bytes();
  bool token_required = r.u32() != 0;
  if (token_required && options_.token.empty()) {
    throw StoreAuthError("the store at " + where + " requires a token (DDPRUN_TOKEN or --rdzv_token_file)");
  }
  std::string client_nonce = auth::random_bytes(wire::kNonceSize);
  wire::Request hello;
  hello.type = Type::kHello;
  hello.values = {options_.ns, client_nonce,
                  options_.token.empty() ? "" : auth::client_proof(options_.token, server_nonce, client_nonce, options_.ns)};
  send_all(fd_, wire::make_frame(Type::kHello, 0, wire::encode_request(hello)), deadline);
  Frame reply = recv_frame(fd_, deadline);
  wire::BodyReader rr(reply.body, wire::Limits{});
  if (reply.header.type == Type::kError) throw StoreAuthError("the store at " + where + " refused us: " + rr.bytes());
  std::string proof = rr.bytes();
  if (!options_.token.empty() &&
      !auth::proofs_equal(proof, auth::server_proof(options_.token, client_nonce, server_nonce))) {
    throw StoreAuthError("the store at " + where + " could not prove it knows the token");
  }
}

std::string TcpStore::call(const wire::Request& q, Millis server_wait) {
  std::lock_guard lock(mutex_);
  if (broken_) throw StoreConnectionError("the store connection is closed");
  const auto deadline = Clock::now() + server_wait + options_.io_timeout;
  uint32_t id = next_id_++;
  Frame f;
  try {
    send_all(fd_, wire::make_frame(q.type, id, wire::encode_request(q)), deadline);
    f = recv_frame(fd_, deadline);
    if (f.header.request_id != id) throw wire::ProtocolError("the store answered a different request");
  } catch (const StoreTimeout&) {
    broken_ = true;  // a frame may be half sent or its answer still coming: out of step for good
    throw StoreConnectionError("the store at " + options_.host + ":" + std::to_string(options_.port) +
                               " did not answer within the I/O timeout");
  } catch (const wire::ProtocolError&) {
    broken_ = true;  // out of step with the server: nothing after this could be trusted
    throw;
  } catch (const StoreConnectionError&) {
    broken_ = true;
    throw;
  }
  if (f.header.type == Type::kOk) return std::move(f.body);
  if (f.header.type == Type::kTimeout) {
    wire::TimeoutReply t;
    try {
      t = wire::decode_timeout(f.body, wire::Limits{});
    } catch (const wire::ProtocolError&) {
      broken_ = true;
      throw;
    }
    throw StoreTimeout(t.message, std::move(t.missing_keys));
  }
  wire::BodyReader r(f.body, wire::Limits{});
  throw StoreError("store: " + r.bytes());
}

namespace {
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
}  // namespace

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
  std::string body = call(request(Type::kMultiGet, keys, {}, timeout.count()), timeout);
  auto r = reader(body);
  uint32_t n = r.u32();
  if (n != keys.size()) throw wire::ProtocolError("multi_get: the store answered with the wrong count");
  std::vector<std::string> values;
  for (uint32_t i = 0; i < n; ++i) values.push_back(r.bytes());
  return values;
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
  try {
    call(request(Type::kGoodbye), Millis(0));
  } catch (const StoreError&) {
    // Closing anyway; a lost connection has nothing to say goodbye to.
  }
  std::lock_guard lock(mutex_);
  broken_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

void TcpStore::abort() {
  // No lock: the call being interrupted holds it. fd_ stays open until the destructor.
  ::shutdown(fd_, SHUT_RDWR);
}

std::string TcpStore::local_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char text[INET6_ADDRSTRLEN] = {};
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace rdzv
