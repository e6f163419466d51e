#include "rdzv/prefix_store.hpp"

namespace rdzv {
namespace {

// Runs a blocking call on the base store; a timeout reports the missing keys as this
// view's caller named them (its message, for people, keeps the full keys).
template <typename Fn>
auto unprefixed_timeout(const std::string& prefix, Fn&& fn) {
  try {
    return fn();
  } catch (const StoreTimeout& e) {
    std::vector<std::string> keys = e.missing_keys();
    const std::string head = prefix + "/";
    for (auto& k : keys) {
      if (k.compare(0, head.size(), head) == 0) k.erase(0, head.size());
    }
    throw StoreTimeout(e.what(), std::move(keys));
  }
}

}  // namespace

PrefixStore::PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix)), base_(base) {}

std::vector<std::string> PrefixStore::full_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full_key(k));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) { base_.set(full_key(key), value); }
std::string PrefixStore::get(const std::string& key, Millis timeout) {
  return unprefixed_timeout(prefix_, [&] { return base_.get(full_key(key), timeout); });
}
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_.add(full_key(key), delta); }
std::string PrefixStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return base_.compare_set(full_key(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  unprefixed_timeout(prefix_, [&] { base_.wait(full_keys(keys), timeout); });
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return base_.check(full_keys(keys)); }
bool PrefixStore::delete_key(const std::string& key) { return base_.delete_key(full_key(key)); }
int64_t PrefixStore::num_keys() { return base_.num_keys(); }
std::vector<std::string> PrefixStore::multi_get(const std::vector<std::string>& keys, Millis timeout) {
  return unprefixed_timeout(prefix_, [&] { return base_.multi_get(full_keys(keys), timeout); });
}
void PrefixStore::multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  base_.multi_set(full_keys(keys), values);
}
void PrefixStore::append(const std::string& key, const std::string& value) { base_.append(full_key(key), value); }

}  // namespace rdzv
