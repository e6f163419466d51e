#include "kv_table.hpp"

#include <algorithm>
#include <charconv>

#include "rdzv/store.hpp"

namespace rdzv {

using heap::string_bytes;

void KvTable::set(const std::string& key, std::string value) {
  auto [it, inserted] = map_.try_emplace(key);
  if (inserted) strings_ += string_bytes(it->first);
  // Swapped, not assigned: a short value moved onto a long one would keep its block.
  strings_ -= string_bytes(it->second);
  it->second.swap(value);
  strings_ += string_bytes(it->second);
}

const std::string* KvTable::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

namespace {
// The decimal integer `v` holds, read by `parse`; false when there is none or it is past int64.
bool read_integer(const std::string& v, KvTable::Parse parse, int64_t& out) {
  const char* p = v.data();
  const char* end = p + v.size();
  if (parse == KvTable::Parse::kLeadingNumber) {
    // std::stoll's reading (strtoll in the C locale, base 10), without its exceptions.
    while (p != end && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) ++p;
    if (end - p > 1 && *p == '+' && p[1] >= '0' && p[1] <= '9') ++p;  // from_chars takes no '+'
  }
  auto [stop, ec] = std::from_chars(p, end, out);
  if (p == end || ec != std::errc()) return false;
  return parse == KvTable::Parse::kLeadingNumber || stop == end;
}
}  // namespace

int64_t KvTable::add(const std::string& key, int64_t delta, Parse parse) {
  int64_t current = 0;
  if (const std::string* v = find(key); v != nullptr && !read_integer(*v, parse, current)) {
    throw StoreError("add: the value of '" + key + "' is not an integer");
  }
  if ((delta > 0 && current > INT64_MAX - delta) || (delta < 0 && current < INT64_MIN - delta)) {
    throw StoreError("add: '" + key + "' would overflow");
  }
  current += delta;
  set(key, std::to_string(current));
  return current;
}

std::string KvTable::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  const std::string* v = find(key);
  if ((v == nullptr && expected.empty()) || (v != nullptr && *v == expected)) {
    set(key, desired);
    return desired;
  }
  return v == nullptr ? std::string() : *v;
}

bool KvTable::erase(const std::string& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  strings_ -= string_bytes(it->first) + string_bytes(it->second);
  map_.erase(it);
  return true;
}

void KvTable::append(const std::string& key, const std::string& value) {
  auto [it, inserted] = map_.try_emplace(key);
  if (inserted) strings_ += string_bytes(it->first);
  size_t before = string_bytes(it->second);
  it->second.append(value);  // when it throws, the value is as it was
  strings_ = strings_ - before + string_bytes(it->second);
}

bool KvTable::contains_all(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (map_.count(k) == 0) return false;
  }
  return true;
}

std::vector<std::string> KvTable::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (map_.count(k) == 0) out.push_back(k);
  }
  return out;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  constexpr size_t kNamed = 16;  // a message for people: a 65,536-key wait names a few
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kNamed; ++i) out += (out.empty() ? "'" : ", '") + keys[i] + "'";
  if (keys.size() > kNamed) out += " and " + std::to_string(keys.size() - kNamed) + " more";
  return out;
}

size_t KvTable::growth_of_index(size_t new_keys) const {
  // A hash node holds the pair, the link to the next node and the key's cached hash.
  size_t nodes = new_keys * heap::predicted_bytes(sizeof(Entry) + 2 * sizeof(void*));
  size_t after = map_.size() + new_keys;
  size_t room = static_cast<size_t>(static_cast<float>(map_.bucket_count()) * map_.max_load_factor());
  // An empty map's one bucket is inside it: the first key allocates an array (13 buckets).
  if (map_.bucket_count() > 1 && after <= room) return nodes;
  // A rehash: a new bucket array of at least twice the buckets, rounded up to a prime
  // (within a quarter above), while the old one is still there.
  size_t buckets = std::max({2 * map_.bucket_count(), after + 1, size_t{13}});
  return nodes + heap::predicted_bytes((buckets + buckets / 4 + 8) * sizeof(void*));
}

int64_t KvTable::growth_if_set(const std::string& key, size_t value_size) const {
  int64_t value = static_cast<int64_t>(heap::predicted_string_bytes(value_size));
  auto it = map_.find(key);
  if (it != map_.end()) return value - static_cast<int64_t>(string_bytes(it->second));
  return value + static_cast<int64_t>(heap::predicted_string_bytes(key.size()) + growth_of_index(1));
}

int64_t KvTable::growth_if_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) const {
  int64_t growth = 0;
  size_t new_keys = 0;
  // Values replaced are not subtracted: a key named twice would count its old value twice.
  for (size_t i = 0; i < keys.size(); ++i) {
    growth += static_cast<int64_t>(heap::predicted_string_bytes(values[i].size()));
    if (map_.count(keys[i]) == 0) {
      growth += static_cast<int64_t>(heap::predicted_string_bytes(keys[i].size()));
      ++new_keys;
    }
  }
  return growth + static_cast<int64_t>(growth_of_index(new_keys));
}

int64_t KvTable::growth_if_append(const std::string& key, size_t more) const {
  auto it = map_.find(key);
  if (it == map_.end()) return growth_if_set(key, more);
  const std::string& v = it->second;
  if (v.size() + more <= v.capacity()) return 0;
  // A string grows to at least twice its capacity.
  size_t grown = std::max(v.size() + more, 2 * v.capacity());
  return static_cast<int64_t>(heap::predicted_string_bytes(grown)) - static_cast<int64_t>(string_bytes(v));
}

}  // namespace rdzv
