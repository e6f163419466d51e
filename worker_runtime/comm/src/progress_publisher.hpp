// The progress publisher (internal): writes this rank's ProgressRecord
// (contract/job_records.hpp) to the job's store, so ddprun can tell a stall from slow
// work, explain it across ranks and answer `ddprun status`.
//
// It writes about once a second (a heartbeat: the record's time says how fresh it
// is, changed or not) and at once when a recorded call of any group fails. It rides
// on the worker's store link (rdzv/rider.hpp): its ticks are tasks on the link's thread,
// each record an asynchronous set, at most one in flight; it never touches the
// training thread's work, and a failing call only posts a tick.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddp/contract/job_records.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp::detail {

struct PublisherOptions {
  std::string key;  // where the record goes: JobKeys(attempt).progress(rank)
  int rank = 0;     // global rank
  std::chrono::milliseconds interval{1000};  // between heartbeats
};

class ProgressPublisher {
 public:
  // Publishes to the job's store (unprefixed: job keys) through `store`.
  ProgressPublisher(std::shared_ptr<rdzv::TcpStore> store, PublisherOptions options);
  // Stops at once. In a forked child it leaves the parent's publisher alone.
  ~ProgressPublisher();
  ProgressPublisher(const ProgressPublisher&) = delete;
  ProgressPublisher& operator=(const ProgressPublisher&) = delete;

  // This process's progress as rank `rank`, now.
  static contract::ProgressRecord snapshot(int rank);

 private:
  struct Ticks;  // progress_publisher.cpp: what the link thread's steps share
  std::shared_ptr<Ticks> ticks_;
  std::shared_ptr<rdzv::TcpStore> store_;
  int listener_ = -1;  // the failure listener's handle
};

}  // namespace ddp::detail
