// Test helpers for the store server: a raw TCP connection that sends bytes no
// well-behaved client would and reads frames back with a timeout, and a bounded poll
// of a condition.
#pragma once

#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "protocol.hpp"

namespace testing {

// Polls `pred` every 5 ms until it holds or `limit` passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A TCP connection to `port` on loopback (the caller closes it).
inline int connect_loopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

struct Frame {
  rdzv::wire::Header header;
  std::string body;
  // The text of an ERROR or TIMEOUT frame.
  std::string message() const { return rdzv::wire::BodyReader(body, {}).bytes(); }
};

// A raw TCP connection to a server on loopback.
struct RawConnection {
  int fd = -1;
  std::string buffered;  // bytes read but not yet returned as a frame

  explicit RawConnection(uint16_t port) : fd(connect_loopback(port)) {}
  // Takes over a connection accepted elsewhere (a test that plays the server).
  struct Adopt {};
  RawConnection(Adopt, int accepted) : fd(accepted) {}
  ~RawConnection() { close(fd); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  void send_bytes(const std::string& bytes) { REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) >= 0); }

  // A HELLO into namespace `ns` without a token, as request 1.
  static std::string hello(const std::string& ns) {
    rdzv::wire::Request h;
    h.type = rdzv::wire::Type::kHello;
    h.values = {ns, std::string(rdzv::wire::kNonceSize, 'n'), ""};
    return rdzv::wire::make_frame(h.type, 1, rdzv::wire::encode_request(h));
  }
  static std::string request(const rdzv::wire::Request& q, uint32_t id) {
    return rdzv::wire::make_frame(q.type, id, rdzv::wire::encode_request(q));
  }

  // The next whole frame, or nothing when none arrives within `timeout` or the server closed.
  std::optional<Frame> read_frame(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (buffered.size() >= rdzv::wire::kHeaderSize) {
        rdzv::wire::Limits any;
        any.max_body = UINT32_MAX;
        auto h = rdzv::wire::decode_header(buffered.data(), any);
        if (buffered.size() >= rdzv::wire::kHeaderSize + h.body_size) {
          Frame f{h, buffered.substr(rdzv::wire::kHeaderSize, h.body_size)};
          buffered.erase(0, rdzv::wire::kHeaderSize + h.body_size);
          return f;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[65536];
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      buffered.append(buf, static_cast<size_t>(n));
    }
  }
  // Frames until the reply to request `id` (returned), skipping others; nothing on timeout.
  std::optional<Frame> reply_to(uint32_t id, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (auto f = read_frame(std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now()))) {
      if (f->header.request_id == id && f->header.type != rdzv::wire::Type::kChallenge) return f;
    }
    return std::nullopt;
  }
  // Everything the server sends until it closes the connection (or 5 s pass).
  std::string read_until_closed() {
    std::string all = std::move(buffered);
    buffered.clear();
    char buf[4096];
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) return all + "<no close>";
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return all;
      all.append(buf, static_cast<size_t>(n));
    }
  }
};

}  // namespace testing
