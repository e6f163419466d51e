// A process group: the ranks of a job (or a subgroup of them) and the collectives
// they run together.
//
// Contract shared by every collective:
//  - Every rank of the group calls the same collectives in the same order, with the
//    same counts, dtypes, ops and roots. Violations are detected where cheap
//    (counts, dtypes) and reported as InvalidArgument; otherwise they hang until the
//    group's timeout.
//  - Blocking by default; with CollectiveOptions::async_op the call returns a Work at
//    once and the operation runs on the group's progress thread. Operations of one
//    group run one at a time in the order they were issued, sync and async alike.
//    Buffers of an async operation must stay valid and untouched until wait().
//  - When a peer dies, every pending and later operation fails with PeerError
//    naming it; when an operation runs past its timeout it fails with Timeout.
//    Either way the group is broken from then on (like an aborted NCCL communicator):
//    later calls fail at once with the same error.
//  - Counts are elements. Empty buffers (count 0) are allowed (nothing moves).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddp/types.hpp"
#include "ddp/work.hpp"

namespace ddp {

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
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }        // this process's rank in the group
  int size() const { return size_; }        // number of ranks in the group
  virtual std::string backend() const = 0;  // "cpu", "nccl" or "cpu+nccl" (see InitOptions)

  // buf = op over every rank's buf (in place).
  virtual Work all_reduce(Buffer buf, ReduceOp op = ReduceOp::Sum, CollectiveOptions o = {}) = 0;
  // Every rank's buf = root's buf.
  virtual Work broadcast(Buffer buf, int root, CollectiveOptions o = {}) = 0;
  // root's buf = op over every rank's buf; other ranks' buf is left unchanged.
  virtual Work reduce(Buffer buf, int root, ReduceOp op = ReduceOp::Sum, CollectiveOptions o = {}) = 0;
  // output (size() * input.count elements) = every rank's input, in rank order.
  virtual Work all_gather(Buffer input, Buffer output, CollectiveOptions o = {}) = 0;
  // As all_gather, but only root's output is written (others may pass an empty one).
  virtual Work gather(Buffer input, Buffer output, int root, CollectiveOptions o = {}) = 0;
  // Rank r's output = block r of root's input (size() * output.count elements; only
  // root's input is read, others may pass an empty one).
  virtual Work scatter(Buffer input, Buffer output, int root, CollectiveOptions o = {}) = 0;
  // input holds size() blocks of output.count elements; rank r's output = op over
  // every rank's block r.
  virtual Work reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::Sum,
                              CollectiveOptions o = {}) = 0;
  // input and output hold size() blocks each; block j of rank i's input lands in
  // block i of rank j's output.
  virtual Work all_to_all(Buffer input, Buffer output, CollectiveOptions o = {}) = 0;
  // Returns (or completes) once every rank has entered the barrier.
  virtual Work barrier(CollectiveOptions o = {}) = 0;
  // Point to point. Messages between two ranks arrive in the order sent; send and
  // recv run in issue order with the collectives, so a large send completes only
  // once the peer has issued the matching recv (count and dtype must match).
  virtual Work send(Buffer buf, int dst, CollectiveOptions o = {}) = 0;
  virtual Work recv(Buffer buf, int src, CollectiveOptions o = {}) = 0;

  // A subgroup of `ranks` (ranks of this group, distinct, any order: the subgroup's
  // rank i is ranks[i]). Every rank of this group must call it, in the same order
  // as its other new_group calls; ranks outside `ranks` get nullptr.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

  // Memory this group's collectives reach without copying, in the spirit of NCCL's
  // ncclMemAlloc + ncclCommRegister or MPI_Win_allocate_shared. On the CPU backend it
  // is mapped by every rank of this host, so an all-reduce whose buffers lie in such
  // memory on every rank reads and writes the peers' buffers directly (no system call,
  // no staging copy): what DDP's gradient buckets use. A collective: every rank calls
  // it, in order with its other operations (sizes may differ). Where sharing is not
  // possible (one rank per host, DDP_DISABLE_CMA=1, no ptrace permission between the
  // ranks, a kernel before 5.6 or a seccomp policy without memfd_create or
  // pidfd_getfd) it is plain memory with shared() false; every collective accepts
  // either. Throws Error when this rank cannot get the memory at all (the group
  // stays usable).
  // The group must outlive it. Local peers keep their mapping of freed memory until
  // the next allocate (or the end of the group), so freeing returns the pages then.
  virtual std::unique_ptr<GroupMemory> allocate(size_t bytes);

  // Fails every pending operation with `reason` and breaks the group (idempotent;
  // safe from any thread).
  virtual void abort(const std::string& reason) = 0;

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_;
  int size_;
};

}  // namespace ddp
