// The exit publisher (exit_publisher.hpp): a queue, and a chain of requests on the
// store link that writes each record into the next exit slot of its attempt.
#include "store/exit_publisher.hpp"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include "ddp/contract/store_keys.hpp"
#include "rdzv/rider.hpp"

namespace ddprun {

using Millis = std::chrono::milliseconds;

namespace {
// Tries per record (a request may go unanswered in time while the store stays up).
constexpr int kTries = 2;
}  // namespace

struct ExitPublisher::Queue : std::enable_shared_from_this<Queue> {
  explicit Queue(rdzv::TcpStore& store) : rider(store) {}

  // ---- the steps, under the rider: one record at a time ----
  void next(rdzv::TcpStore& store) {
    {
      std::lock_guard lock(mu);
      if (queue.empty()) {
        busy = false;
        cv.notify_all();
        return;
      }
    }
    slot = -1;
    tries = 0;
    write(store);
  }
  void write(rdzv::TcpStore& store) {
    ++tries;
    const ddp::contract::JobKeys keys(front().first);
    auto self = shared_from_this();
    if (slot < 0) {  // reserved once: a second try fills the same slot
      store.add_async(keys.exit_count(), 1, [self](rdzv::Outcome<int64_t> n) {
        self->rider.ride([&](rdzv::TcpStore& s) {
          if (!n.ok()) return self->failed(s, n.error);
          self->slot = *n.value - 1;
          self->write_slot(s);
        });
      });
      return;
    }
    write_slot(store);
  }
  void write_slot(rdzv::TcpStore& store) {
    const auto& [attempt, record] = front();
    store.set_async(ddp::contract::JobKeys(attempt).exit_slot(slot), record.encode(), [self = shared_from_this()](rdzv::Done done) {
      self->rider.ride([&](rdzv::TcpStore& s) {
        if (!done.ok()) return self->failed(s, done.error);
        self->failing = false;
        self->pop();
        self->next(s);
      });
    });
  }
  void failed(rdzv::TcpStore& store, const std::exception_ptr& error) {
    bool lost = false;
    std::string why;
    try {
      std::rethrow_exception(error);
    } catch (const rdzv::StoreConnectionError& e) {
      lost = true;
      why = e.what();
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!lost && tries < kTries) return write(store);
    if (!failing) {
      spdlog::warn("cannot publish a worker exit to the store ({}); other ranks will not hear of it at once", why);
    }
    failing = true;  // warned; later records still try
    pop();
    next(store);
  }
  const std::pair<int, ddp::contract::ExitRecord>& front() {
    std::lock_guard lock(mu);
    return queue.front();
  }
  void pop() {
    std::lock_guard lock(mu);
    queue.pop_front();
  }

  rdzv::Rider rider;
  int64_t slot = -1;     // the record's slot once reserved
  int tries = 0;         // of the record being written
  bool failing = false;  // the last record was dropped (and warned about)

  std::mutex mu;  // guards what publish() and flush() share with the steps
  std::condition_variable cv;
  std::deque<std::pair<int, ddp::contract::ExitRecord>> queue;  // the front one is being written while busy
  bool busy = false;
};

ExitPublisher::ExitPublisher(std::shared_ptr<rdzv::TcpStore> store)
    : queue_(std::make_shared<Queue>(*store)), store_(std::move(store)) {}

ExitPublisher::~ExitPublisher() {
  if (rdzv::abandoned_in_child(queue_, store_)) return;
  flush(Millis(2000));
  queue_->rider.stop();
}

void ExitPublisher::publish(int attempt, ddp::contract::ExitRecord record) {
  {
    std::lock_guard lock(queue_->mu);
    queue_->queue.emplace_back(attempt, std::move(record));
    if (queue_->busy) return;  // the chain takes it after the records before it
    queue_->busy = true;
  }
  store_->post([q = queue_] { q->rider.ride([&](rdzv::TcpStore& s) { q->next(s); }); });
}

bool ExitPublisher::flush(Millis timeout) {
  std::unique_lock lock(queue_->mu);
  return queue_->cv.wait_for(lock, timeout, [&] { return queue_->queue.empty() && !queue_->busy; });
}

}  // namespace ddprun
