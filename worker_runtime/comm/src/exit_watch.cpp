// The exit watch (exit_watch.hpp): a chain of requests on the link thread reads exit
// slot after exit slot of its attempt, each a get that blocks in the store for a short
// slice. A slot an agent reserved but never wrote (it died, or its store call failed in
// between) must not hide the exits after it: once the exit count says later slots
// exist and the slot has stayed empty for kSkipAfter, the watch reads on and looks at
// the skipped slot again after every slice.
#include "exit_watch.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "ddp/contract/store_keys.hpp"
#include "rdzv/rider.hpp"

namespace ddp::detail {

namespace {
using Clock = std::chrono::steady_clock;
constexpr Millis kSlice{1000};      // one standing get; a given-up one stays parked at most this long
constexpr Millis kSkipAfter{2000};  // an empty slot with later ones filled is passed over
}  // namespace

struct ExitWatch::Watch : std::enable_shared_from_this<Watch> {
  Watch(rdzv::TcpStore& store, Options o)
      : rider(store),
        options(o),
        keys(o.attempt),
        exited(new std::atomic<bool>[static_cast<size_t>(std::max(o.world_size, 1))]()),
        records(static_cast<size_t>(std::max(o.world_size, 1))) {}

  // ---- the steps, on the link thread (under the rider) ----
  void read_slot(rdzv::TcpStore& store);
  void on_slot(rdzv::TcpStore& store, rdzv::Outcome<std::string> got);
  void on_count(rdzv::TcpStore& store, rdzv::Outcome<int64_t> count);
  void take(const std::string& text);
  // A completion that runs `step` as a step of this watch.
  template <typename T, typename Step>
  std::function<void(T)> then(Step step) {
    return [self = shared_from_this(), step](T outcome) {
      self->rider.ride([&](rdzv::TcpStore& store) { (self.get()->*step)(store, std::move(outcome)); });
    };
  }

  rdzv::Rider rider;
  const Options options;
  const contract::JobKeys keys;
  rdzv::RequestId standing = 0;   // the get in flight for `slot`
  int64_t slot = 0;               // the next slot to read
  std::vector<int64_t> skipped;   // slots passed over while empty; looked at again
  Clock::time_point waiting_since = Clock::now();

  // ---- what watchers read ----
  std::unique_ptr<std::atomic<bool>[]> exited;  // by global rank
  std::atomic<uint64_t> generation{0};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::optional<contract::ExitRecord>> records;  // by global rank; guarded by mu
};

void ExitWatch::Watch::read_slot(rdzv::TcpStore& store) {
  standing = store.get_async(keys.exit_slot(slot), kSlice, then<rdzv::Outcome<std::string>>(&Watch::on_slot));
}

void ExitWatch::Watch::on_slot(rdzv::TcpStore& store, rdzv::Outcome<std::string> got) {
  if (got.ok()) {
    ++slot;
    waiting_since = Clock::now();
    take(*got.value);
    return read_slot(store);
  }
  try {
    std::rethrow_exception(got.error);
  } catch (const rdzv::StoreTimeout&) {
    // An empty slice: look below.
  } catch (const rdzv::StoreError&) {
    return;  // the store is gone (the job is ending): nothing more to learn
  }
  // A skipped slot written late still counts (a timeout of 0 only looks).
  for (int64_t s : skipped) {
    store.get_async(keys.exit_slot(s), Millis(0), [self = shared_from_this(), s](rdzv::Outcome<std::string> late) {
      self->rider.ride([&](rdzv::TcpStore&) {
        if (!late.ok()) return;
        std::erase(self->skipped, s);
        self->take(*late.value);
      });
    });
  }
  if (Clock::now() - waiting_since < kSkipAfter) return read_slot(store);
  // add(0) reads the count (an agent's first add(1) still takes slot 0).
  store.add_async(keys.exit_count(), 0, then<rdzv::Outcome<int64_t>>(&Watch::on_count));
}

void ExitWatch::Watch::on_count(rdzv::TcpStore& store, rdzv::Outcome<int64_t> count) {
  if (!count.ok()) {
    try {
      std::rethrow_exception(count.error);
    } catch (const rdzv::StoreConnectionError&) {
      return;  // gone
    } catch (const rdzv::StoreError&) {
      // Read it again after the next slice.
    }
  } else if (*count.value > slot + 1) {
    skipped.push_back(slot++);
    waiting_since = Clock::now();
  }
  read_slot(store);
}

void ExitWatch::Watch::take(const std::string& text) {
  const auto record = contract::ExitRecord::decode(text);
  if (!record || record->rank < 0 || record->rank >= options.world_size) return;
  {
    std::lock_guard lock(mu);
    if (records[static_cast<size_t>(record->rank)]) return;  // the first exit counts
    records[static_cast<size_t>(record->rank)] = *record;
  }
  exited[static_cast<size_t>(record->rank)].store(true, std::memory_order_release);
  generation.fetch_add(1, std::memory_order_acq_rel);
  cv.notify_all();
}

ExitWatch::ExitWatch(std::shared_ptr<rdzv::TcpStore> store, Options options)
    : watch_(std::make_shared<Watch>(*store, options)), store_(std::move(store)) {
  watch_->rider.ride([&](rdzv::TcpStore& s) { watch_->read_slot(s); });
}

ExitWatch::~ExitWatch() {
  if (rdzv::abandoned_in_child(watch_, store_)) return;
  watch_->rider.stop();
  store_->cancel(watch_->standing);  // no step runs any more: `standing` stays as it is
}

uint64_t ExitWatch::generation() const { return watch_->generation.load(std::memory_order_acquire); }

bool ExitWatch::exited(int rank) const {
  if (rank < 0 || rank >= watch_->options.world_size) return false;
  return watch_->exited[static_cast<size_t>(rank)].load(std::memory_order_acquire);
}

std::optional<contract::ExitRecord> ExitWatch::record(int rank) const {
  if (!exited(rank)) return std::nullopt;
  std::lock_guard lock(watch_->mu);
  return watch_->records[static_cast<size_t>(rank)];
}

std::optional<contract::ExitRecord> ExitWatch::wait_record(int rank, Millis timeout) const {
  if (rank < 0 || rank >= watch_->options.world_size) return std::nullopt;
  std::unique_lock lock(watch_->mu);
  watch_->cv.wait_for(lock, timeout, [&] { return watch_->records[static_cast<size_t>(rank)].has_value(); });
  return watch_->records[static_cast<size_t>(rank)];
}

}  // namespace ddp::detail
