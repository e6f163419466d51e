// The exit watch (exit_watch.hpp): one thread reads exit slot after exit slot of
// its attempt, blocking in the store for the next one in short slices.
#include "exit_watch.hpp"

#include "ddp/contract/store_keys.hpp"

namespace ddp::detail {

namespace {
constexpr Millis kSlice{1000};  // one blocking read; the stop flag is looked at in between
}  // namespace

ExitWatch::ExitWatch(Options options)
    : options_(std::move(options)),
      exited_(new std::atomic<bool>[static_cast<size_t>(std::max(options_.world_size, 1))]()),
      records_(static_cast<size_t>(std::max(options_.world_size, 1))) {
  store_ = std::make_unique<rdzv::TcpStore>(options_.store);
  thread_ = std::thread([this] { loop(); });
}

ExitWatch::~ExitWatch() {
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
  cv_.wait_for(lock, timeout, [&] { return records_[static_cast<size_t>(rank)].has_value(); });
  return records_[static_cast<size_t>(rank)];
}

void ExitWatch::loop() {
  const contract::JobKeys keys(options_.attempt);
  for (int64_t slot = 0; !stopping_.load();) {
    std::string text;
    try {
      text = store_->get(keys.exit_slot(slot), kSlice);
    } catch (const rdzv::StoreTimeout&) {
      continue;
    } catch (const rdzv::StoreError&) {
      return;  // stopping, or the store is gone (the job is ending): nothing more to learn
    }
    ++slot;
    const auto record = contract::ExitRecord::decode(text);
    if (!record || record->rank < 0 || record->rank >= options_.world_size) continue;
    {
      std::lock_guard lock(mu_);
      if (records_[static_cast<size_t>(record->rank)]) continue;  // the first exit counts
      records_[static_cast<size_t>(record->rank)] = *record;
    }
    exited_[static_cast<size_t>(record->rank)].store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    cv_.notify_all();
  }
}

}  // namespace ddp::detail
