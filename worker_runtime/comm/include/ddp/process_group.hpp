// A process group: the ranks of a job (or a subgroup of them) and the collectives
// they run together.
//
// Contract shared by every collective:
//  - Every rank of the group calls the same collectives in the same order, with the
//    same counts, dtypes, ops and roots (and a recv matches its peer's send in count
//    and dtype). The CPU backend pairs each rank's k-th call with the others' and
//    fails paired calls that differ on every rank with Mismatch naming both sides,
//    before any wrong data is used (the group is broken then); a skipped call whose
//    neighbours have the same shape leaves a rank waiting until the timeout. NCCL
//    hangs on a mismatch until the timeout.
//  - Blocking by default; with CollectiveOptions::async_op the call returns a Work at
//    once and the operation runs on the group's progress thread. Operations of one
//    group run one at a time in the order they were issued, sync and async alike.
//    Buffers of an async operation must stay valid and untouched until wait().
//  - When a peer dies, every pending and later operation fails with PeerError
//    naming it (on NCCL, a pending call whose dead peer had already done its part
//    may still complete: a peer on this host counts as dead 300 ms after a waiting
//    call first saw it gone); when an operation runs past its timeout it fails with
//    Timeout.
//    Either way the group is broken from then on (like an aborted NCCL communicator):
//    later calls fail at once with the same error.
//  - Counts are elements. Empty buffers (count 0) are allowed (nothing moves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/types.hpp"
#include "ddp/work.hpp"

namespace ddp {

namespace detail {
class Backend;  // what runs the calls (internal)
class FlightRecorder;
struct Op;
}  // namespace detail

// Memory from ProcessGroup::allocate: page-aligned, zero-filled, freed with this object.
class GroupMemory {
 public:
  virtual ~GroupMemory() = default;
  GroupMemory(const GroupMemory&) = delete;
  GroupMemory& operator=(const GroupMemory&) = delete;
  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // True when the group's collectives reach this memory on every rank of the host
  // without copying (see ProcessGroup::allocate).
  bool shared() const { return shared_; }

 protected:
  GroupMemory(std::byte* data, size_t bytes, bool shared) : data_(data), bytes_(bytes), shared_(shared) {}

 private:
  std::byte* data_;
  size_t bytes_;
  bool shared_;
};

struct CollectiveOptions {
  bool async_op = false;  // return at once; wait() on the Work
  Millis timeout{0};      // 0: the group's timeout (InitOptions::timeout)
};

class ProcessGroup {
 public:
  // Made by init() and new_group(). Records its calls in a flight recorder of
  // DDP_FLIGHT_RECORDER entries (none at 0).
  explicit ProcessGroup(std::unique_ptr<detail::Backend> backend);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }  // this process's rank in the group
  int size() const { return size_; }  // number of ranks in the group
  std::string backend() const;        // "cpu", "nccl" or "cpu+nccl" (see InitOptions)
  // The group's name in reports: "0" for init()'s group, "<parent>.<k>" for the group
  // its parent's k-th new_group call made (k from 0, counted on every rank alike).
  const std::string& name() const;
  // Collectives issued on this group so far (the last one's sequence number; sends
  // and recvs are numbered per peer and not counted here).
  uint64_t issued() const { return issued_; }

  // Every operation below checks its arguments on the calling rank before anything
  // is queued (counts, dtypes, roots, peers, the memory the backend reaches) and
  // throws InvalidArgument on a violation; the group stays usable. On NCCL an argument
  // NCCL itself refuses (one this ProcessGroup cannot check, e.g. memory NCCL cannot
  // use) breaks the group instead: that call and every later one throw the same
  // InvalidArgument.

  // buf = op over every rank's buf (in place).
  Work all_reduce(Buffer buf, ReduceOp op = ReduceOp::Sum, CollectiveOptions o = {});
  // Every rank's buf = root's buf.
  Work broadcast(Buffer buf, int root, CollectiveOptions o = {});
  // root's buf = op over every rank's buf; other ranks' buf is left unchanged.
  Work reduce(Buffer buf, int root, ReduceOp op = ReduceOp::Sum, CollectiveOptions o = {});
  // output (size() * input.count elements) = every rank's input, in rank order.
  // input may be block rank() of output (in place).
  Work all_gather(Buffer input, Buffer output, CollectiveOptions o = {});
  // As all_gather, but only root's output is written (others may pass an empty one).
  Work gather(Buffer input, Buffer output, int root, CollectiveOptions o = {});
  // Rank r's output = block r of root's input (size() * output.count elements; only
  // root's input is read, others may pass an empty one).
  Work scatter(Buffer input, Buffer output, int root, CollectiveOptions o = {});
  // input holds size() blocks of output.count elements; rank r's output = op over
  // every rank's block r.
  // Widening, for 16-bit gradient communication: input BF16 or F16 with output F32,
  // op Sum or Avg only. Each rank's block r is converted exactly to f32 and summed
  // in f32 in rank order 0..size()-1 (then divided by size() for Avg), so the result is
  // the same bits on every rank and in every run; the wire carries the 16-bit blocks.
  // Host buffers only.
  Work reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::Sum, CollectiveOptions o = {});
  // input and output hold size() blocks each; block j of rank i's input lands in
  // block i of rank j's output.
  Work all_to_all(Buffer input, Buffer output, CollectiveOptions o = {});
  // Returns (or completes) once every rank has entered the barrier.
  Work barrier(CollectiveOptions o = {});
  // Point to point. Messages between two ranks arrive in the order sent; send and
  // recv run in issue order with the collectives, so a large send completes only
  // once the peer has issued the matching recv (count and dtype must match).
  Work send(Buffer buf, int dst, CollectiveOptions o = {});
  Work recv(Buffer buf, int src, CollectiveOptions o = {});

  // A subgroup of `ranks` (ranks of this group, distinct, any order, at least one:
  // the subgroup's rank i is ranks[i]). Every rank of this group must call it, in
  // the same order as its other new_group calls; ranks outside `ranks` get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

  // Memory this group's collectives reach without copying, in the spirit of NCCL's
  // ncclMemAlloc + ncclCommRegister or MPI_Win_allocate_shared: on the CPU backend,
  // an all-reduce whose buffers lie in such memory on every rank of a host works on
  // the peers' buffers in place. A collective: every rank calls it, in order with its
  // other operations (sizes may differ). Where the backend cannot share it, it is
  // plain memory with shared() false; every collective accepts either. Throws Error
  // when this rank cannot get the memory at all (the group stays usable). The group
  // must outlive it; freed memory may stay mapped by local peers until the group's
  // next allocate (or its end).
  std::unique_ptr<GroupMemory> allocate(size_t bytes);

  // Fails every pending operation with `reason` and breaks the group (idempotent;
  // safe from any thread).
  void abort(const std::string& reason);

 private:
  // Every operation passes here: the argument check, its number, its record, then
  // the backend.
  Work issue(detail::Op&& op);

  int rank_;
  int size_;
  uint64_t issued_ = 0;
  std::vector<uint64_t> sends_;  // per peer: sends issued to it
  std::vector<uint64_t> recvs_;  // per peer: recvs issued from it
  int subgroups_made_ = 0;
  std::shared_ptr<detail::FlightRecorder> recorder_;  // null: records nothing
  std::unique_ptr<detail::Backend> backend_;          // after recorder_: it goes first
};

}  // namespace ddp
