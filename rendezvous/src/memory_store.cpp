#include "rdzv/memory_store.hpp"

#include "kv_table.hpp"

namespace rdzv {
namespace {

void check_same_length(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) throw StoreError("multi_set: " + std::to_string(keys.size()) + " keys but " +
                                                     std::to_string(values.size()) + " values");
}

}  // namespace

MemoryStore::MemoryStore() : table_(std::make_unique<KvTable>()) {}
MemoryStore::~MemoryStore() = default;

void MemoryStore::set(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  table_->set(key, value);
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Millis timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, {key}, timeout);
  return *table_->find(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  std::lock_guard lock(mutex_);
  int64_t result = table_->add(key, delta);
  changed_.notify_all();
  return result;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard lock(mutex_);
  std::string result = table_->compare_set(key, expected, desired);
  changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout);
}

void MemoryStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                              Millis timeout) {
  bool ok = changed_.wait_for(lock, timeout, [&] { return table_->contains_all(keys); });
  if (!ok) {
    std::vector<std::string> missing = table_->missing(keys);
    std::string message =
        "timed out after " + std::to_string(timeout.count()) + " ms waiting for " + quoted_keys(missing);
    throw StoreTimeout(message, std::move(missing));
  }
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return table_->contains_all(keys);
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return table_->erase(key);
}

int64_t MemoryStore::num_keys() {
  std::lock_guard lock(mutex_);
  return table_->size();
}

std::vector<std::string> MemoryStore::multi_get(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(*table_->find(k));
  return values;
}

void MemoryStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  check_same_length(keys, values);
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < keys.size(); ++i) table_->set(keys[i], values[i]);
  changed_.notify_all();
}

void MemoryStore::append(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  table_->append(key, value);
  changed_.notify_all();
}

}  // namespace rdzv
