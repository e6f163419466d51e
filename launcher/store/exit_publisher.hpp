// Publishes this node's worker exits into the job's store (ExitRecord, exit slots:
// ddp/contract/store_keys.hpp), so the worker runtime of every other rank learns at
// once that a peer is gone. exit_records.hpp reads them back.
//
// publish() only queues: a thread of its own, with its own store connection, writes
// the records, so ddprun's event loop never waits for the store. Every store call is
// bounded; a record that cannot be written after a retry on a fresh connection is
// dropped with a warning (once per run of failures). Later records try again.
// The destructor gives the queue a short while to drain, then gives up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "ddp/contract/job_records.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddprun {

class ExitPublisher {
 public:
  // `store`: where the job's keys live (unprefixed: the job's namespace). Nothing
  // connects until the first record is published.
  explicit ExitPublisher(rdzv::TcpStoreOptions store);
  ~ExitPublisher();
  ExitPublisher(const ExitPublisher&) = delete;
  ExitPublisher& operator=(const ExitPublisher&) = delete;

  // Queues `record` as an exit of attempt `attempt`. Never blocks on the store.
  void publish(int attempt, ddp::contract::ExitRecord record);

  // Waits up to `timeout` until every record queued so far is written (or dropped).
  // Returns whether the queue is empty.
  bool flush(std::chrono::milliseconds timeout);

 private:
  void loop();
  void write(int attempt, const ddp::contract::ExitRecord& record);

  rdzv::TcpStoreOptions options_;
  std::unique_ptr<rdzv::TcpStore> store_;  // the thread's own; made on use, dropped on failure (mu_ to change)
  bool failing_ = false;                   // the last record was dropped (and warned about)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int, ddp::contract::ExitRecord>> queue_;
  bool busy_ = false;   // the thread is writing a record it took off the queue
  bool stopping_ = false;
  bool busy_aborted_ = false;  // the destructor cut the write in flight short: no more tries
  std::thread thread_;
};

}  // namespace ddprun
