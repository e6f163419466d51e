// Publishes this node's worker exits into the job's store (ExitRecord, exit slots:
// ddp/contract/store_keys.hpp), so the worker runtime of every other rank learns at
// once that a peer is gone. exit_records.hpp reads them back.
//
// publish() only queues: the records are written from the store client's link thread
// (rdzv/rider.hpp), one after another, each an add() for its slot and a set() into it,
// so ddprun's event loop never waits for the store. A record whose write fails is
// tried once more (same slot); after that it is dropped with a warning (once per run
// of failures), and later records try again. Once the connection is lost, every
// record is dropped: the client does not reconnect (rdzv/tcp_store.hpp).
#pragma once

#include <chrono>
#include <memory>

#include "ddp/contract/job_records.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddprun {

class ExitPublisher {
 public:
  // `store`: the job's store (unprefixed: the job's keys).
  explicit ExitPublisher(std::shared_ptr<rdzv::TcpStore> store);
  // Gives the queue a short while (2 s) to drain, then gives up on what is left.
  ~ExitPublisher();
  ExitPublisher(const ExitPublisher&) = delete;
  ExitPublisher& operator=(const ExitPublisher&) = delete;

  // Queues `record` as an exit of attempt `attempt`. Never blocks on the store.
  void publish(int attempt, ddp::contract::ExitRecord record);

  // Waits up to `timeout` until every record queued so far is written (or dropped).
  // Returns whether the queue is empty.
  bool flush(std::chrono::milliseconds timeout);

 private:
  struct Queue;  // exit_publisher.cpp: what the link thread's steps share
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<rdzv::TcpStore> store_;
};

}  // namespace ddprun
