// A process group: the ranks of a job (or a subgroup of them) and the collectives
// they run together.
//
// Contract shared by every collective:
//  - Every rank of the group calls the same collectives in the same order, with the
//    same counts, dtypes, ops and roots (and a recv matches its peer's send in count
//    and dtype). On the CPU backend calls pair up by their place in each rank's
//    order (the k-th with the k-th); when paired calls differ in op, count, dtype,
//    reduce op or root, the call fails on every rank at once with Mismatch naming
//    both sides, before any wrong data is used, and breaks the group; a rank whose
//    part only sends (a root's broadcast, a send) may complete it and fails at its
//    next call. A skipped call is caught so only where the calls it brings together
//    differ; when they have the same shape they run together, and the rank left
//    with an extra call waits in it until the group's timeout (the stall report
//    shows each rank's call). A count-0 call moves no message: paired with a
//    non-empty one it is caught only at the empty rank's next call with that peer
//    (waiting until the timeout if none comes). On NCCL mismatches hang until the
//    timeout.
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
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/types.hpp"
#include "ddp/work.hpp"

namespace ddp {

namespace detail {
class FlightRecorder;
}

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

// The collectives and point-to-point operations a backend runs.
enum class OpKind : uint8_t {
  AllReduce, Broadcast, Reduce, AllGather, Gather, Scatter, ReduceScatter, AllToAll, Barrier, Send, Recv
};
const char* op_kind_name(OpKind k);  // "all_reduce", "broadcast", ...

// One call of a ProcessGroup operation as its backend receives it, after the checks.
// `input` is what the call reads and `output` what it writes: both are the one buffer
// of all_reduce, broadcast, reduce, send and recv; the side a rank does not use (a
// non-root's gather output or scatter input) may be empty. `peer` is the root, dst
// or src (-1 where there is none).
struct Op {
  OpKind kind = OpKind::Barrier;
  Buffer input;
  Buffer output;
  int peer = -1;
  ReduceOp reduce = ReduceOp::Sum;
  CollectiveOptions options;
  // Set as the call is issued: a collective's number in its group's collectives, or a
  // send's (recv's) number among this rank's sends to (recvs from) that peer; from 1.
  // Ranks that make the same calls give them the same numbers.
  uint64_t seq = 0;
  // Set as the call is issued: its entry in the issuing group's flight recorder
  // (recorder null where the group records nothing). A backend hands it to the Work
  // it returns (Work::State::attach), which marks the call started and ended.
  detail::FlightRecorder* recorder = nullptr;
  uint64_t record = 0;
};
inline bool is_point_to_point(OpKind k) { return k == OpKind::Send || k == OpKind::Recv; }
// How reports name a call, without its number: "all_reduce 262144×f32 sum",
// "broadcast 10×i64 root 0", "send 4×f32 to 1", "barrier".
std::string describe_op(const Op& op);

// The memory a backend's collectives can reach.
enum class Reach : uint8_t { Host, Gpu, HostAndGpu };

class ProcessGroup {
 public:
  virtual ~ProcessGroup();

  int rank() const { return rank_; }        // this process's rank in the group
  int size() const { return size_; }        // number of ranks in the group
  virtual std::string backend() const = 0;  // "cpu", "nccl" or "cpu+nccl" (see InitOptions)
  // The group's name in reports: "0" for init()'s group, "<parent>.<k>" for the group
  // its parent's k-th new_group call made (k from 0, counted on every rank alike).
  const std::string& name() const { return name_; }
  // Collectives issued on this group so far (the last one's sequence number; sends
  // and recvs are numbered per peer and not counted here).
  uint64_t issued() const { return issued_; }

  // Every operation below checks its arguments on the calling rank before anything
  // is queued (counts, dtypes, roots, peers, the memory the backend reaches) and
  // throws InvalidArgument on a violation; the group stays usable.

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
  // Widening (issue 16, bf16 gradient communication): input BF16 or F16 with output
  // F32, op Sum or Avg only. Each rank's block r is converted exactly to f32 and summed
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
  virtual void abort(const std::string& reason) = 0;

 protected:
  // Records its calls in a flight recorder of DDP_FLIGHT_RECORDER entries (none at 0).
  ProcessGroup(int rank, int size, Reach reach);

  // What a backend implements. Each is called only with arguments that passed the
  // checks, so a backend checks nothing the contract above states.
  // Runs (or queues, with op.options.async_op) one operation.
  virtual Work run(const Op& op) = 0;
  // new_group for a member (`ranks` valid and holding rank()) or, with nullptr as
  // the answer, for a rank outside `ranks` (which must still take part).
  virtual std::shared_ptr<ProcessGroup> make_subgroup(const std::vector<int>& ranks) = 0;
  // allocate; by default plain private pages.
  virtual std::unique_ptr<GroupMemory> allocate_memory(size_t bytes);

  // For groups made of other groups: hands a checked call to `member` as is.
  static Work run_on(ProcessGroup& member, const Op& op) { return member.run(op); }
  static std::shared_ptr<ProcessGroup> make_subgroup_on(ProcessGroup& member, const std::vector<int>& ranks) {
    return member.make_subgroup(ranks);
  }
  static std::unique_ptr<GroupMemory> allocate_memory_on(ProcessGroup& member, size_t bytes) {
    return member.allocate_memory(bytes);
  }
  // `member` only runs calls this group issued and recorded: it records nothing itself.
  static void leave_recording_to_outer(ProcessGroup& member);

 private:
  // Every operation passes here: the argument check, then the backend.
  Work issue(const Op& op);
  void check(const Op& op) const;

  int rank_;
  int size_;
  Reach reach_;
  std::string name_ = "0";
  uint64_t issued_ = 0;
  std::vector<uint64_t> sends_;  // per peer: sends issued to it
  std::vector<uint64_t> recvs_;  // per peer: recvs issued from it
  int subgroups_made_ = 0;
  std::shared_ptr<detail::FlightRecorder> recorder_;  // null: records nothing
};

}  // namespace ddp
