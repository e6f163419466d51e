// Knowing at once that a rank of the job has exited, wherever it ran: ddprun's
// agents record every worker exit in the job's store (ExitRecord, exit slots), and
// an ExitWatch reads them as they come, riding on the worker's store link (one
// standing get at a time, answered on the link's thread: no thread of its own). Waits
// that depend on a peer ask it; asking never blocks or locks while no rank has exited.
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "ddp/contract/job_records.hpp"
#include "ddp/work.hpp"
#include "rdzv/tcp_store.hpp"

namespace ddp::detail {

class ExitWatch {
 public:
  struct Options {
    int attempt = 0;     // whose exits to watch (TORCHELASTIC_RESTART_COUNT)
    int world_size = 1;  // records of other ranks are ignored
  };
  // Starts watching the job's store (unprefixed: job keys) through `store`.
  ExitWatch(std::shared_ptr<rdzv::TcpStore> store, Options options);
  // Stops at once (its standing get is given up). In a forked child it leaves the
  // parent's watch and client alone (rdzv/rider.hpp).
  ~ExitWatch();
  ExitWatch(const ExitWatch&) = delete;
  ExitWatch& operator=(const ExitWatch&) = delete;

  // How many exits have been seen; a waiter that saw this value before need not
  // look again while it is unchanged.
  uint64_t generation() const;
  // Whether global rank `rank` has exited. Lock-free.
  bool exited(int rank) const;
  // Its exit record, once seen.
  std::optional<contract::ExitRecord> record(int rank) const;
  // Waits up to `timeout` for the record of `rank`.
  std::optional<contract::ExitRecord> wait_record(int rank, Millis timeout) const;

 private:
  struct Watch;  // exit_watch.cpp: what the link thread's steps share with the watchers
  std::shared_ptr<Watch> watch_;
  std::shared_ptr<rdzv::TcpStore> store_;
};

}  // namespace ddp::detail
