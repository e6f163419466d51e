// A Store in this process's memory, safe to share between threads. Tests run
// every rank as a thread over one MemoryStore.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "rdzv/store.hpp"

namespace rdzv {

class KvTable;

class MemoryStore : public Store {
 public:
  MemoryStore();
  ~MemoryStore() override;

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

 private:
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys, Millis timeout);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::unique_ptr<KvTable> table_;
};

}  // namespace rdzv
