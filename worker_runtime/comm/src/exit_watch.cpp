// The exit watch (exit_watch.hpp): one thread reads exit slot after exit slot of
// its attempt, blocking in the store for the next one in short slices. A slot an
// agent reserved but never wrote (it died, or its store call failed in between)
// must not hide the exits after it: once the exit count says later slots exist
// and the slot has stayed empty for kSkipAfter, the watch reads on and looks at
// the skipped slot again between slices.
#include "exit_watch.hpp"

#include <unistd.h>

#include <algorithm>

#include "ddp/contract/store_keys.hpp"

namespace ddp::detail {

namespace {
using Clock = std::chrono::steady_clock;
constexpr Millis kSlice{1000};      // one blocking read; the stop flag is looked at in between
constexpr Millis kSkipAfter{2000};  // an empty slot with later ones filled is passed over
}  // namespace

ExitWatch::ExitWatch(Options options)
    : options_(std::move(options)),
      exited_(new std::atomic<bool>[static_cast<size_t>(std::max(options_.world_size, 1))]()),
      records_(static_cast<size_t>(std::max(options_.world_size, 1))) {
  store_ = std::make_unique<rdzv::TcpStore>(options_.store);
  owner_pid_ = static_cast<int>(::getpid());
  thread_ = std::thread([this] { loop(); });
}

ExitWatch::~ExitWatch() {
  if (static_cast<int>(::getpid()) != owner_pid_) {
    // A forked child: the thread and the connection are the parent's (the socket is
    // shared with it, so it is not aborted either). Leave both alone.
    // Nor is the condition variable destroyed: it may count a parent thread's wait,
    // and destroying it would wait for that thread forever (glibc).
    thread_.detach();
    (void)store_.release();
    (void)cv_.release();
    return;
  }
  stopping_.store(true);
  store_->abort();  // cuts the blocking read short
  thread_.join();
}

bool ExitWatch::exited(int rank) const {
  if (rank < 0 || rank >= options_.world_size) return false;
  return exited_[static_cast<size_t>(rank)].load(std::memory_order_acquire);
}

std::optional<contract::ExitRecord> ExitWatch::record(int rank) const {
  if (!exited(rank)) return std::nullopt;
  std::lock_guard lock(mu_);
  return records_[static_cast<size_t>(rank)];
}

std::optional<contract::ExitRecord> ExitWatch::wait_record(int rank, Millis timeout) const {
  if (rank < 0 || rank >= options_.world_size) return std::nullopt;
  std::unique_lock lock(mu_);
  cv_->wait_for(lock, timeout, [&] { return records_[static_cast<size_t>(rank)].has_value(); });
  return records_[static_cast<size_t>(rank)];
}

void ExitWatch::take(const std::string& text) {
  const auto record = contract::ExitRecord::decode(text);
  if (!record || record->rank < 0 || record->rank >= options_.world_size) return;
  {
    std::lock_guard lock(mu_);
    if (records_[static_cast<size_t>(record->rank)]) return;  // the first exit counts
    records_[static_cast<size_t>(record->rank)] = *record;
  }
  exited_[static_cast<size_t>(record->rank)].store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  cv_->notify_all();
}

void ExitWatch::loop() {
  const contract::JobKeys keys(options_.attempt);
  std::vector<int64_t> skipped;  // slots passed over while empty; looked at again
  auto waiting_since = Clock::now();
  for (int64_t slot = 0; !stopping_.load();) {
    try {
      std::string text;
      try {
        text = store_->get(keys.exit_slot(slot), kSlice);
      } catch (const rdzv::StoreTimeout&) {
        // A skipped slot written late still counts.
        for (auto it = skipped.begin(); it != skipped.end();) {
          if (store_->check({keys.exit_slot(*it)})) {
            take(store_->get(keys.exit_slot(*it), kSlice));
            it = skipped.erase(it);
          } else {
            ++it;
          }
        }
        // add(0) reads the count (an agent's first add(1) still takes slot 0).
        if (Clock::now() - waiting_since >= kSkipAfter && store_->add(keys.exit_count(), 0) > slot + 1) {
          skipped.push_back(slot++);
          waiting_since = Clock::now();
        }
        continue;
      }
      ++slot;
      waiting_since = Clock::now();
      take(text);
    } catch (const rdzv::StoreError&) {
      return;  // stopping, or the store is gone (the job is ending): nothing more to learn
    }
  }
}

}  // namespace ddp::detail
