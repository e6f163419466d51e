// A Store backed by a StoreServer over TCP (one connection, safe to share between
// threads: requests are serialised). Connecting retries until connect_timeout, so
// nodes may start in any order; authentication happens before the constructor returns.
#pragma once

#include <memory>
#include <mutex>

#include "rdzv/store.hpp"

namespace rdzv {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string token;                     // empty: the server must not require one
  std::string ns;                        // namespace (a job id on a shared daemon)
  Millis connect_timeout{30000};         // keep trying to connect (and authenticate) until then
  Millis io_timeout{30000};              // a non-blocking request must be answered within this
  Millis heartbeat_timeout{10000};       // an unreachable server is detected after about this (0: never)
};

namespace wire { struct Request; }

class TcpStore : public Store {
 public:
  // Connects and authenticates. Throws StoreConnectionError (no server within
  // connect_timeout), StoreAuthError (token refused, or the server could not prove it).
  explicit TcpStore(TcpStoreOptions options);
  ~TcpStore() override;  // closes without GOODBYE: a will set with set_will() fires

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys, Millis timeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  void append(const std::string& key, const std::string& value) override;

  // The server will compare_set(key, "", value) if this connection ends without close():
  // how other nodes learn that this one died or was cut off. With a `silence_limit`,
  // the server also ends the connection (and publishes the will) when it hears nothing
  // from this client for that long: keep it alive with ping().
  void set_will(const std::string& key, const std::string& value, Millis silence_limit = Millis(0));
  // Several wills at once (at most 16), replacing those held: each key is compare_set
  // on its own when the connection drops (an elastic node's failure notice and its
  // "lost" mark).
  void set_wills(const std::vector<std::pair<std::string, std::string>>& wills, Millis silence_limit = Millis(0));

  // A no-op round trip (keeps a will's silence limit from expiring).
  void ping();
  // Clean close (GOODBYE): the will is discarded. Further calls throw.
  void close();

  // Unblocks a call in progress on another thread (it throws StoreConnectionError)
  // and leaves the connection unusable. Safe to call from any thread.
  void abort();

  // The local address of this connection (the interface that reaches the server).
  std::string local_address() const;

  const TcpStoreOptions& options() const { return options_; }

 private:
  std::string call(const wire::Request& q, Millis server_wait);
  void connect_and_authenticate();

  TcpStoreOptions options_;
  std::mutex mutex_;
  int fd_ = -1;         // valid from construction to destruction
  bool broken_ = false; // a connection error or abort(): every call throws
  uint32_t next_id_ = 1;
};

}  // namespace rdzv
