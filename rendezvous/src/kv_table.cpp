#include "kv_table.hpp"

#include <charconv>

#include "rdzv/store.hpp"

namespace rdzv {

void KvTable::set(const std::string& key, std::string value) {
  auto [it, inserted] = map_.try_emplace(key);
  if (inserted) {
    bytes_ += key.size();
  } else {
    bytes_ -= it->second.size();
  }
  bytes_ += value.size();
  it->second = std::move(value);
}

const std::string* KvTable::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

int64_t KvTable::add(const std::string& key, int64_t delta) {
  int64_t current = 0;
  if (const std::string* v = find(key)) {
    const char* end = v->data() + v->size();
    auto [ptr, ec] = std::from_chars(v->data(), end, current);
    if (v->empty() || ec != std::errc() || ptr != end) {
      throw StoreError("add: the value of '" + key + "' is not an integer");
    }
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
  bytes_ -= it->first.size() + it->second.size();
  map_.erase(it);
  return true;
}

void KvTable::append(const std::string& key, const std::string& value) {
  auto [it, inserted] = map_.try_emplace(key);
  if (inserted) bytes_ += key.size();
  it->second.append(value);
  bytes_ += value.size();
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

int64_t KvTable::growth_if_set(const std::string& key, size_t value_size) const {
  const std::string* v = find(key);
  return v == nullptr ? static_cast<int64_t>(key.size() + value_size)
                      : static_cast<int64_t>(value_size) - static_cast<int64_t>(v->size());
}

}  // namespace rdzv
