// The exit publisher (exit_publisher.hpp): a queue and a thread that writes each
// record into the next exit slot of its attempt.
#include "store/exit_publisher.hpp"

#include <spdlog/spdlog.h>

#include "ddp/contract/store_keys.hpp"

namespace ddprun {

using Millis = std::chrono::milliseconds;

namespace {
// How long one record may take to reach the store (connecting included).
constexpr Millis kStoreLimit{3000};
// Tries per record, each on a fresh connection after a failure (a stale connection
// after a store hiccup costs the first).
constexpr int kTries = 2;
}  // namespace

ExitPublisher::ExitPublisher(rdzv::TcpStoreOptions store) : options_(std::move(store)) {
  options_.connect_timeout = std::min(options_.connect_timeout, kStoreLimit);
  options_.io_timeout = std::min(options_.io_timeout, kStoreLimit);
  thread_ = std::thread([this] { loop(); });
}

ExitPublisher::~ExitPublisher() {
  flush(Millis(2000));
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard lock(mu_);
    if (busy_) {  // a write still stuck: give up on it now, and on its retries
      busy_aborted_ = true;
      if (store_) store_->abort();
    }
  }
  thread_.join();
}

void ExitPublisher::publish(int attempt, ddp::contract::ExitRecord record) {
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(attempt, std::move(record));
  }
  cv_.notify_all();
}

bool ExitPublisher::flush(Millis timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return queue_.empty() && !busy_; });
}

void ExitPublisher::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    auto [attempt, record] = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    write(attempt, record);
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void ExitPublisher::write(int attempt, const ddp::contract::ExitRecord& record) {
  const ddp::contract::JobKeys keys(attempt);
  int64_t slot = -1;  // reserved once: a retry fills the same slot
  for (int tries = 0;; ++tries) {
    try {
      if (!store_) {
        auto store = std::make_unique<rdzv::TcpStore>(options_);
        std::lock_guard lock(mu_);
        if (busy_aborted_) throw rdzv::StoreError("stopping");
        store_ = std::move(store);
      }
      if (slot < 0) slot = store_->add(keys.exit_count(), 1) - 1;
      store_->set(keys.exit_slot(slot), record.encode());
      failing_ = false;
      return;
    } catch (const rdzv::StoreError& e) {
      bool again = false;
      {
        // The connection is spent: the next try (and the next record) makes a fresh one.
        std::lock_guard lock(mu_);
        store_.reset();
        again = tries + 1 < kTries && !busy_aborted_;
      }
      if (again) continue;
      if (!failing_) {
        spdlog::warn("cannot publish a worker exit to the store ({}); other ranks will not hear of it at once",
                     e.what());
      }
      failing_ = true;  // warned; later records still try, each with a fresh connection
      return;
    }
  }
}

}  // namespace ddprun
