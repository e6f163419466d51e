// Knowing at once that a rank of the job has exited, wherever it ran: ddprun's
// agents record every worker exit in the job's store (ExitRecord, exit slots), and
// an ExitWatch reads them as they come, on a thread of its own with its own store
// connection. Waits that depend on a peer ask it; asking never blocks or locks
// while no rank has exited.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/contract/job_records.hpp"
#include "ddp/work.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp::detail {

class ExitWatch {
 public:
  struct Options {
    rdzv::TcpStoreOptions store;  // the job's store, unprefixed (job keys)
    int attempt = 0;              // whose exits to watch (TORCHELASTIC_RESTART_COUNT)
    int world_size = 1;           // records of other ranks are ignored
  };
  // Connects and starts watching. Throws rdzv::StoreError when the store cannot be reached.
  explicit ExitWatch(Options options);
  // Stops within a moment (its blocking read is cut short). In a forked child it
  // touches neither the parent's thread nor its connection (they are left as they are).
  ~ExitWatch();
  ExitWatch(const ExitWatch&) = delete;
  ExitWatch& operator=(const ExitWatch&) = delete;

  // How many exits have been seen; a waiter that saw this value before need not
  // look again while it is unchanged.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // Whether global rank `rank` has exited. Lock-free.
  bool exited(int rank) const;
  // Its exit record, once seen.
  std::optional<contract::ExitRecord> record(int rank) const;
  // Waits up to `timeout` for the record of `rank`.
  std::optional<contract::ExitRecord> wait_record(int rank, Millis timeout) const;

 private:
  void loop();
  void take(const std::string& text);  // one slot's contents

  Options options_;
  int owner_pid_ = 0;  // the process whose thread this is
  std::unique_ptr<rdzv::TcpStore> store_;
  std::unique_ptr<std::atomic<bool>[]> exited_;  // by global rank
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::unique_ptr<std::condition_variable> cv_{new std::condition_variable};  // left to a forked child
  std::vector<std::optional<contract::ExitRecord>> records_;  // by global rank; guarded by mu_
  std::thread thread_;
};

}  // namespace ddp::detail
