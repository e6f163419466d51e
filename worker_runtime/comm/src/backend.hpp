// What a backend implements (internal): ProcessGroup checks every call against its
// contract (process_group.hpp), numbers and records it, and hands it to its Backend
// as an Op. Backends: cpu (cpu/cpu_backend.cpp), nccl (nccl/nccl_backend.cpp) and the
// routed pair of backend "auto" (routed_backend.cpp); group_setup.hpp builds them.
//
// Calls that do not match across ranks. Every rank must make the same calls in the
// same order; what a backend does when they do not:
//  - cpu: calls pair up by their place in each rank's order (the k-th with the k-th);
//    every message carries its sender's call (cpu/stamp.hpp), so paired calls that
//    differ in op, count, dtype, reduce op or root fail on every rank at once with
//    Mismatch naming both sides, before any wrong data is used, and break the group.
//    A rank whose part only sends (a root's broadcast, a send) may complete it and
//    fails at its next call. A skipped call is caught only where the calls it brings
//    together differ; when they have the same shape they run together, and the rank
//    left with an extra call waits in it until the group's timeout (the stall report
//    shows each rank's call). A count-0 call moves no message: paired with a
//    non-empty one it is caught only at the empty rank's next call with that peer
//    (waiting until the timeout if none comes).
//  - nccl: a mismatch hangs until the timeout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/process_group.hpp"

namespace ddp::detail {

class FlightRecorder;

// The collectives and point-to-point operations a backend runs.
enum class OpKind : uint8_t {
  AllReduce, Broadcast, Reduce, AllGather, Gather, Scatter, ReduceScatter, AllToAll, Barrier, Send, Recv
};
const char* op_kind_name(OpKind k);  // "all_reduce", "broadcast", ...
inline bool is_point_to_point(OpKind k) { return k == OpKind::Send || k == OpKind::Recv; }

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
  FlightRecorder* recorder = nullptr;
  uint64_t record = 0;
};
// How reports name a call, without its number: "all_reduce 262144×f32 sum",
// "broadcast 10×i64 root 0", "send 4×f32 to 1", "barrier".
std::string describe_op(const Op& op);

// The memory a backend's collectives can reach.
enum class Reach : uint8_t { Host, Gpu, HostAndGpu };

class Backend {
 public:
  Backend(int rank, int size, Reach reach) : rank_(rank), size_(size), reach_(reach) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Reach reach() const { return reach_; }
  // The group's name in reports (ProcessGroup::name()).
  const std::string& group_name() const { return group_name_; }
  // new_group names a subgroup once made; a backend made of others names them too.
  virtual void set_group_name(const std::string& name) { group_name_ = name; }

  // Each is called only with arguments that passed ProcessGroup's checks, so a
  // backend checks nothing the contract states.
  // "cpu", "nccl" or "cpu+nccl": ProcessGroup::backend().
  virtual std::string kind() const = 0;
  // Runs (or queues, with op.options.async_op) one operation.
  virtual Work run(const Op& op) = 0;
  // new_group for a member (`ranks` valid and holding rank()) or, with nullptr as
  // the answer, for a rank outside `ranks` (which must still take part).
  virtual std::unique_ptr<Backend> make_subgroup(const std::vector<int>& ranks) = 0;
  // ProcessGroup::allocate (`bytes` already known to be mappable); by default plain
  // private pages.
  virtual std::unique_ptr<GroupMemory> allocate_memory(size_t bytes);
  // ProcessGroup::abort.
  virtual void abort(const std::string& reason) = 0;

 private:
  int rank_;
  int size_;
  Reach reach_;
  std::string group_name_ = "0";
};

}  // namespace ddp::detail
