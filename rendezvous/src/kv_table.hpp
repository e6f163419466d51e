// KvTable: the key-value operations themselves, with no locking or waiting. The
// MemoryStore wraps it in a mutex; the server runs it on its single thread and
// wakes waiters after each change.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace rdzv {

class KvTable {
 public:
  void set(const std::string& key, std::string value);
  const std::string* find(const std::string& key) const;
  int64_t add(const std::string& key, int64_t delta);  // throws StoreError for non-integers
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool erase(const std::string& key);
  void append(const std::string& key, const std::string& value);
  bool contains_all(const std::vector<std::string>& keys) const;
  // The keys of `keys` that do not exist, in their order (what a timeout reports).
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  int64_t size() const { return static_cast<int64_t>(map_.size()); }

  // Bytes held by keys and values; the server's memory limit applies to it.
  size_t bytes() const { return bytes_; }
  // What set(key, value) would change bytes() by.
  int64_t growth_if_set(const std::string& key, size_t value_size) const;

 private:
  std::unordered_map<std::string, std::string> map_;
  size_t bytes_ = 0;
};

// "'a', 'b'": keys as a timeout's message names them (the first 16, then how many more).
std::string quoted_keys(const std::vector<std::string>& keys);

}  // namespace rdzv
