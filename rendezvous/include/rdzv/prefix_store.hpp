// A view of another store with every key put under a prefix ("<prefix>/<key>"),
// so separate runs, attempts or subsystems share one store without clashing.
// A StoreTimeout from it names the missing keys without the prefix, as they were asked.
#pragma once

#include "rdzv/store.hpp"

namespace rdzv {

class PrefixStore : public Store {
 public:
  // `base` must outlive this view.
  PrefixStore(std::string prefix, Store& base);

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

  const std::string& prefix() const { return prefix_; }
  std::string full_key(const std::string& key) const { return prefix_ + "/" + key; }

 private:
  std::vector<std::string> full_keys(const std::vector<std::string>& keys) const;

  std::string prefix_;
  Store& base_;
};

}  // namespace rdzv
