// Opening a store connection (connect.hpp): connect with retries, then the handshake.
#include "connect.hpp"

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
#include "rdzv/resolve.hpp"
#include "socket_options.hpp"

namespace rdzv::detail {

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
  const Resolved found = resolve(host, deadline);
  if (!found.addresses) {
    why = found.why;
    return -1;
  }
  int fd = -1;
  for (const addrinfo* a = found.addresses.get(); a != nullptr && fd < 0; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    sockaddr_storage target{};
    std::memcpy(&target, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof(target)));
    if (a->ai_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&target)->sin_port = htons(port);
    } else {
      reinterpret_cast<sockaddr_in6*>(&target)->sin6_port = htons(port);
    }
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int err = ::connect(fd, reinterpret_cast<sockaddr*>(&target), a->ai_addrlen) == 0 ? 0 : errno;
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
  return fd;
}

// Why the listener at `where` is taken for something else than a ddprun store.
std::string not_a_store(const std::string& where, const std::string& why) {
  return "something listens at " + where + " but is not a ddprun store (a torchrun TCPStore?): " + why;
}

// Connects (retrying: the server may not be up yet) and runs the handshake on `fd`,
// which the caller closes if this throws.
void open_connection(const TcpStoreOptions& options, int& fd) {
  const auto deadline = Clock::now() + options.connect_timeout;
  const std::string where = options.host + ":" + std::to_string(options.port);
  std::string why = "no answer";
  for (auto backoff = Millis(20);; backoff = std::min(backoff * 2, Millis(500))) {
    fd = try_connect(options.host, options.port, deadline, why);
    if (fd >= 0 || Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
  }
  if (fd < 0) {
    throw StoreConnectionError("cannot reach the store at " + where + " within " +
                               std::to_string(options.connect_timeout.count()) + " ms (" + why + ")");
  }
  set_liveness_options(fd, options.heartbeat_timeout);

  // The HELLO frame's first four bytes (the frame magic) go out before the greeting is
  // read: a store that also admits torch's clients greets only a connection whose first
  // bytes say it speaks ddprun's protocol. The byte stream is the same as ever, so a
  // store that greets at once reads it as before.
  const std::string magic = wire::make_frame(Type::kHello, 0, {}).substr(0, 4);
  send_all(fd, magic, Clock::now() + options.handshake_timeout);

  // A ddprun store greets at once, but a loaded one or a long round trip can take longer
  // than a short connect slice: the handshake has its own bound.
  const auto greeted_by = std::max(deadline, Clock::now() + options.handshake_timeout);
  Frame challenge;
  try {
    challenge = recv_frame(fd, greeted_by);
  } catch (const StoreTimeout&) {
    throw StoreError(not_a_store(where, "no greeting within " + std::to_string(options.handshake_timeout.count()) +
                                            " ms"));
  } catch (const wire::ProtocolError& e) {
    throw StoreError(not_a_store(where, e.what()));
  }
  if (challenge.header.type == Type::kError) {
    wire::BodyReader r(challenge.body, wire::Limits{});
    throw StoreConnectionError("the store at " + where + " refused the connection: " + r.bytes());
  }
  if (challenge.header.type != Type::kChallenge) throw wire::ProtocolError("the store did not open with a challenge");
  wire::BodyReader r(challenge.body, wire::Limits{});
  std::string server_nonce = r.bytes();
  bool token_required = r.u32() != 0;
  if (token_required && options.token.empty()) {
    throw StoreAuthError("the store at " + where + " requires a token (DDPRUN_TOKEN or --rdzv_token_file)");
  }
  std::string client_nonce = auth::random_bytes(wire::kNonceSize);
  wire::Request hello;
  hello.type = Type::kHello;
  hello.values = {options.ns, client_nonce,
                  options.token.empty() ? "" : auth::client_proof(options.token, server_nonce, client_nonce, options.ns)};
  send_all(fd, wire::make_frame(Type::kHello, 0, wire::encode_request(hello)).substr(magic.size()), greeted_by);
  Frame reply = recv_frame(fd, greeted_by);
  wire::BodyReader rr(reply.body, wire::Limits{});
  if (reply.header.type == Type::kError) throw StoreAuthError("the store at " + where + " refused us: " + rr.bytes());
  std::string proof = rr.bytes();
  if (!options.token.empty() &&
      !auth::proofs_equal(proof, auth::server_proof(options.token, client_nonce, server_nonce))) {
    throw StoreAuthError("the store at " + where + " could not prove it knows the token");
  }
}

}  // namespace

int connect_and_authenticate(const TcpStoreOptions& options) {
  int fd = -1;
  try {
    open_connection(options, fd);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  return fd;
}

}  // namespace rdzv::detail
