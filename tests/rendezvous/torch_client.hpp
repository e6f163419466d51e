// A raw torch TCPStore client for the server's tests: sends requests as torch's client
// encodes them (torch_wire::encode, either dialect) and reads the bare replies back,
// every read bounded by a timeout.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "raw_client.hpp"
#include "torch_wire.hpp"

namespace testing {

struct TorchClient {
  using Query = rdzv::torch_wire::Query;
  int fd = -1;
  rdzv::Dialect dialect;

  // Connects; a 2.x client then validates and pings, as torch's does.
  TorchClient(uint16_t port, rdzv::Dialect d = rdzv::Dialect::kTorch) : fd(connect_loopback(port)), dialect(d) {
    if (d == rdzv::Dialect::kTorch) {
      send(q(Query::kValidate, {}, {}, rdzv::torch_wire::kValidateMagic));
      send(q(Query::kPing, {}, {}, 0x1234));
      REQUIRE(u32() == 0x1234);
    }
  }
  ~TorchClient() { close(fd); }
  TorchClient(const TorchClient&) = delete;
  TorchClient& operator=(const TorchClient&) = delete;

  static rdzv::torch_wire::Request q(Query query, std::vector<std::string> keys = {},
                                      std::vector<std::string> values = {}, int64_t number = 0) {
    rdzv::torch_wire::Request r;
    r.query = query;
    r.keys = std::move(keys);
    r.values = std::move(values);
    r.number = number;
    return r;
  }
  void send(const rdzv::torch_wire::Request& r) { send_raw(rdzv::torch_wire::encode(r, dialect)); }
  void send_raw(const std::string& bytes) { REQUIRE(try_send_raw(bytes)); }
  // For a server that may close the connection while the bytes are still going out (a request
  // over a limit): false instead of a failed assertion when the peer reset it.
  bool try_send(const rdzv::torch_wire::Request& r) { return try_send_raw(rdzv::torch_wire::encode(r, dialect)); }
  bool try_send_raw(const std::string& bytes) {
    for (size_t at = 0; at < bytes.size();) {
      ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }

  // Exactly `n` bytes, or nothing when they do not arrive within `timeout` (or the server closed).
  std::optional<std::string> read(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[65536];
      ssize_t got = recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) return std::nullopt;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }
  template <typename T>
  T value() {
    auto raw = read(sizeof(T));
    REQUIRE(raw.has_value());
    T v;
    std::memcpy(&v, raw->data(), sizeof(T));
    return v;
  }
  uint8_t u8() { return value<uint8_t>(); }
  uint32_t u32() { return value<uint32_t>(); }
  int64_t i64() { return value<int64_t>(); }
  std::string bytes() {
    auto n = value<uint64_t>();
    REQUIRE(n < (1u << 26));
    auto raw = read(n);
    REQUIRE(raw.has_value());
    return *raw;
  }
  // True when the server closes the connection within `timeout` (what it sends first is dropped).
  bool closed(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      if (recv(fd, buf, sizeof(buf), 0) <= 0) return true;
    }
  }
  // Nothing arrives within `quiet`.
  bool silent(std::chrono::milliseconds quiet = std::chrono::milliseconds(200)) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, static_cast<int>(quiet.count())) == 0;
  }

  // torch's calls, as its client makes them.
  void set(const std::string& k, const std::string& v) { send(q(Query::kSet, {k}, {v})); }
  std::string get(const std::string& k) {
    send(q(Query::kGet, {k}));
    return bytes();
  }
  int64_t add(const std::string& k, int64_t by) {
    send(q(Query::kAdd, {k}, {}, by));
    return i64();
  }
  std::string compare_set(const std::string& k, const std::string& expected, const std::string& desired) {
    send(q(Query::kCompareSet, {k}, {expected, desired}));
    return bytes();
  }
  bool check(std::vector<std::string> keys) {
    send(q(Query::kCheck, std::move(keys)));
    return u8() == rdzv::torch_wire::kReady;
  }
  int64_t num_keys() {
    send(q(Query::kGetNumKeys));
    return i64();
  }
};

}  // namespace testing
