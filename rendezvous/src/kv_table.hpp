// KvTable: the key-value operations themselves, with no locking or waiting. The
// MemoryStore wraps it in a mutex; the server runs it on its single thread and
// wakes waiters after each change.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "heap_blocks.hpp"

namespace rdzv {

class KvTable {
 public:
  KvTable() = default;
  KvTable(const KvTable&) = delete;  // its map's allocator points into it
  KvTable& operator=(const KvTable&) = delete;

  void set(const std::string& key, std::string value);
  const std::string* find(const std::string& key) const;
  // How add() reads the value it adds to: kWhole, the whole value as a decimal integer
  // (ddprun's rule); kLeadingNumber, as std::stoll does (torch's servers): leading
  // whitespace, a sign, digits, stopping at the first non-digit ("8x" is 8, "0x10" is 0).
  enum class Parse { kWhole, kLeadingNumber };
  // Throws StoreError for a value that does not parse, or a result past int64.
  int64_t add(const std::string& key, int64_t delta, Parse parse = Parse::kWhole);
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool erase(const std::string& key);
  void append(const std::string& key, const std::string& value);
  bool contains_all(const std::vector<std::string>& keys) const;
  // The keys of `keys` that do not exist, in their order (what a timeout reports).
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  int64_t size() const { return static_cast<int64_t>(map_.size()); }
  // Calls fn(key) for every key, in no particular order; copies nothing.
  template <typename Fn>
  void for_each_key(Fn&& fn) const {
    for (const auto& entry : map_) fn(entry.first);
  }

  // Bytes of memory the table holds, as the allocator counts them: its hash nodes and
  // bucket array, and the heap blocks of keys and values too long to sit inside their
  // string. The server's memory limit applies to it.
  size_t bytes() const { return blocks_ + strings_; }
  // What set(key, value) with a value of `value_size` bytes is expected to change
  // bytes() by (an upper estimate when it rehashes), to refuse it before it allocates.
  int64_t growth_if_set(const std::string& key, size_t value_size) const;
  // The same for setting all of `keys` to `values` (MULTI_SET), the replaced values not subtracted.
  int64_t growth_if_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) const;
  // The same for appending `more` bytes to the value of `key`.
  int64_t growth_if_append(const std::string& key, size_t more) const;

 private:
  using Entry = std::pair<const std::string, std::string>;
  using Map = std::unordered_map<std::string, std::string, std::hash<std::string>, std::equal_to<std::string>,
                                 heap::CountingAllocator<Entry>>;
  // What `new_keys` more keys cost in nodes and bucket array, their strings aside.
  size_t growth_of_index(size_t new_keys) const;

  size_t blocks_ = 0;   // nodes and buckets: counted by the map's allocator (declared before it)
  size_t strings_ = 0;  // heap blocks of keys and values
  Map map_{Map::allocator_type(&blocks_)};
};

// "'a', 'b'": keys as a timeout's message names them (the first 16, then how many more).
std::string quoted_keys(const std::vector<std::string>& keys);

}  // namespace rdzv
