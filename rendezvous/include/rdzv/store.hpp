// The rendezvous store: a key-value store that launchers and workers use to find
// each other (node info, rank offsets, NCCL unique ids, failure notices).
//
// Keys are text; values are bytes (a std::string may hold any bytes, NUL included).
// Every call that can block takes a timeout and throws StoreTimeout when it passes;
// the keys still missing then are a field of the exception, not only words in it.
// Implementations: MemoryStore (one process, for tests), TcpStore (client of a
// StoreServer), PrefixStore (a view of another store under a key prefix).
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rdzv {

using Millis = std::chrono::milliseconds;

// Base of every store error; what() is one line fit for a user.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A blocking call's timeout passed.
class StoreTimeout : public StoreError {
 public:
  explicit StoreTimeout(const std::string& what, std::vector<std::string> missing_keys = {})
      : StoreError(what), missing_keys_(std::move(missing_keys)) {}

  // The keys a get, wait or multi_get was still waiting for, in the order asked, as
  // the caller named them. Empty when the store itself did not answer in time.
  const std::vector<std::string>& missing_keys() const { return missing_keys_; }

 private:
  std::vector<std::string> missing_keys_;
};
// The connection to the server failed or dropped.
class StoreConnectionError : public StoreError {
 public:
  using StoreError::StoreError;
};
// The server refused our token, or we refused the server's proof.
class StoreAuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value, waking every waiter on key.
  virtual void set(const std::string& key, const std::string& value) = 0;

  // Returns key's value, waiting up to `timeout` for the key to be set.
  virtual std::string get(const std::string& key, Millis timeout) = 0;

  // Adds delta to the integer stored at key (a missing key counts as 0) and returns
  // the result. Throws StoreError if the value is not a decimal integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Sets key to desired if its current value equals expected (a missing key matches
  // only an empty expected). Returns the value key holds afterwards ("" if missing).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Waits until every key exists. Throws StoreTimeout naming the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;

  // True if every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Deletes key; returns whether it existed. It is not an error if it did not.
  virtual bool delete_key(const std::string& key) = 0;

  // Number of keys in this store (for a PrefixStore: in the whole namespace).
  virtual int64_t num_keys() = 0;

  // get() of several keys with one timeout for all; values in the order of keys.
  virtual std::vector<std::string> multi_get(const std::vector<std::string>& keys, Millis timeout) = 0;

  // set() of several keys at once (atomically: no waiter sees half of them).
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) = 0;

  // Appends value to key's value (a missing key starts empty).
  virtual void append(const std::string& key, const std::string& value) = 0;
};

}  // namespace rdzv
