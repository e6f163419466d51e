// The NCCL double's collective and point-to-point calls and groups: each call is
// checked, counted for the faults, and queued as (part of) one task on its stream.
#include <algorithm>
#include <iterator>
#include <tuple>

#include "../common/knobs.hpp"
#include "../gpu_double.hpp"
#include "comm.hpp"
#include "reduce.hpp"


namespace gpu_double::nccl {
namespace {

thread_local int t_depth = 0;             // ncclGroupStart nesting
thread_local std::vector<Call> t_pending;  // calls of the open group, in issue order
thread_local ncclResult_t t_group_error = ncclSuccess;  // the open group's first failed call

struct Task {
  std::shared_ptr<Core> core;
  std::vector<Call> calls;
};

void run_task(void* arg) {
  std::unique_ptr<Task> task(static_cast<Task*>(arg));
  Core& c = *task->core;
  {
    std::lock_guard lock(c.mu);
    if (c.aborted.load()) return;  // NCCL's abort ends queued work too
    ++c.running;
  }
  run_calls(c, task->calls);
  {
    std::lock_guard lock(c.mu);
    --c.running;
  }
  c.idle.notify_all();
}

void drop_task(void* arg) { delete static_cast<Task*>(arg); }

// Records an event after the last task on `stream`, for ncclCommFinalize.
cudaEvent_t mark(Core& c, cudaStream_t stream) {
  std::lock_guard lock(c.mu);
  cudaEvent_t& e = c.last[stream];
  if (e == nullptr) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  cudaEventRecord(e, stream);
  return e;
}

// Queues one task for `calls` (all on one communicator). Calls on other streams than
// the first one's join it: the task waits for their earlier work, and their later
// work waits for the task.
// Returns what the call answers: ncclInProgress for the first launch on a
// non-blocking communicator (NCCL connects peers then, in the background), which
// the double has settled already; ncclSuccess otherwise.
ncclResult_t launch(const std::shared_ptr<Core>& core, std::vector<Call> calls) {
  // As NCCL, work on the communicator's device: stream 0 is that device's legacy stream.
  int caller_device = 0;
  cudaGetDevice(&caller_device);
  cudaSetDevice(core->device);
  std::vector<cudaStream_t> streams;
  for (const Call& c : calls)
    if (std::find(streams.begin(), streams.end(), c.stream) == streams.end()) streams.push_back(c.stream);
  const cudaStream_t first = streams.front();
  // As NCCL, a communicator's operations run in issue order whatever their streams:
  // each task waits for the one launched before it.
  std::lock_guard order_lock(core->launch_mu);
  if (core->order != nullptr) {
    cudaStreamWaitEvent(first, core->order, 0);
  } else {
    cudaEventCreateWithFlags(&core->order, cudaEventDisableTiming);
  }
  for (size_t i = 1; i < streams.size(); ++i) {
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, streams[i]);
    cudaStreamWaitEvent(first, e, 0);
    cudaEventDestroy(e);
  }
  // A task the stream skips (after a kernel fault) is deleted, not leaked.
  gpu_double_launch_host_func(first, &run_task, new Task{core, std::move(calls)}, &drop_task);
  cudaEventRecord(core->order, first);
  const cudaEvent_t after = mark(*core, first);
  for (size_t i = 1; i < streams.size(); ++i) {
    cudaStreamWaitEvent(streams[i], after, 0);
    mark(*core, streams[i]);
  }
  cudaSetDevice(caller_device);
  std::lock_guard lock(core->mu);
  const bool first_launch = !core->launched;
  core->launched = true;
  return first_launch && !core->blocking ? ncclInProgress : ncclSuccess;
}

ncclResult_t launch_all(std::vector<Call> calls) {
  // One task per communicator, in the order each first appeared.
  std::vector<std::pair<Core*, std::vector<Call>>> by_comm;
  for (Call& c : calls) {
    auto it = std::find_if(by_comm.begin(), by_comm.end(), [&](auto& p) { return p.first == c.core.get(); });
    if (it == by_comm.end()) {
      by_comm.emplace_back(c.core.get(), std::vector<Call>{});
      it = std::prev(by_comm.end());
    }
    it->second.push_back(std::move(c));
  }
  ncclResult_t result = ncclSuccess;
  for (auto& [core, list] : by_comm) {
    auto owner = list.front().core;
    if (launch(owner, std::move(list)) == ncclInProgress) result = ncclInProgress;
  }
  return result;
}

bool reduces(Kind k) { return k == Kind::AllReduce || k == Kind::Reduce || k == Kind::ReduceScatter; }

// A call's failure, as NCCL's enqueue check handles it: the open group remembers the
// first error (ncclGroupEnd returns it and drops the group), and a non-blocking
// communicator keeps it as its async state (every later call fails with it).
ncclResult_t refuse(Core& core, ncclResult_t r, const std::string& text) {
  if (t_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  if (!core.blocking) {
    int expected = ncclSuccess;
    core.state.compare_exchange_strong(expected, r);
  }
  return fail(r, text);
}

// Checks `call` against its communicator: ncclSuccess or what the call answers.
ncclResult_t check_call(Core& core, const Call& call, const std::string& name) {
  const size_t elem = dtype_size(call.dtype);
  if (elem == 0)
    return refuse(core, ncclInvalidArgument,
                  name + ": data type " + std::to_string(call.dtype) + " not supported by the double");
  if (reduces(call.kind) && !valid_op(call.op))
    return refuse(core, ncclInvalidArgument, name + ": reduction op " + std::to_string(call.op) + " not supported");
  const int n = core.nranks;
  const int me = core.rank;
  if (call.kind != Kind::AllReduce && call.kind != Kind::AllGather && call.kind != Kind::ReduceScatter &&
      (call.peer < 0 || call.peer >= n))
    return refuse(core, ncclInvalidArgument, name + ": peer/root " + std::to_string(call.peer) + " out of range");
  const size_t bytes = call.count * elem;
  size_t send_bytes = bytes, recv_bytes = bytes;
  switch (call.kind) {
    case Kind::AllGather: recv_bytes = bytes * n; break;
    case Kind::ReduceScatter: send_bytes = bytes * n; break;
    case Kind::Broadcast: send_bytes = me == call.peer ? bytes : 0; break;
    case Kind::Reduce: recv_bytes = me == call.peer ? bytes : 0; break;
    case Kind::Send: recv_bytes = 0; break;
    case Kind::Recv: send_bytes = 0; break;
    case Kind::AllReduce: break;
  }
  for (auto [p, size, what] : {std::tuple{call.send, send_bytes, "sendbuff"}, {call.recv, recv_bytes, "recvbuff"}})
    if (size > 0 && gpu_double_device_of(p, size) < 0)
      return refuse(core, ncclInvalidArgument,
                    name + ": " + what + " is not device memory of " + std::to_string(size) +
                        " bytes (a host pointer, or beyond its allocation)");
  return ncclSuccess;
}

// Checks `call`, applies the faults, and queues it (or keeps it for the group).
ncclResult_t submit(ncclComm_t comm, Call call, const std::string& name) {
  if (comm == nullptr) {
    if (t_depth > 0 && t_group_error == ncclSuccess) t_group_error = ncclInvalidArgument;
    return fail(ncclInvalidArgument, name + ": comm is null");
  }
  auto core = comm->core;
  call.core = core;
  if (core->stuck.load()) return ncclInProgress;
  const auto state = static_cast<ncclResult_t>(core->state.load());
  if (state == ncclInProgress) {
    // As NCCL's ncclCommEnsureReady. (NCCL then also stores the error as the async
    // state; the init or split settling later overwrites it there and here.)
    if (t_depth > 0 && t_group_error == ncclSuccess) t_group_error = ncclInvalidArgument;
    return fail(ncclInvalidArgument, name + ": communicator not ready (init or split in progress)");
  }
  if (state != ncclSuccess) return refuse(*core, state, name + ": communicator failed earlier");
  if (auto r = check_call(*core, call, name); r != ncclSuccess) return r;
  // The task reads and writes the buffers through the double's readable view.
  call.send = gpu_double_host_view(call.send);
  call.recv = gpu_double_host_view(call.recv);
  long count = 0;
  {
    std::lock_guard lock(core->mu);
    count = core->calls;
  }
  const Fault* f = nullptr;
  if ((f = find_fault("enqueue_error", core->fault_rank)) && count >= f->after)
    return refuse(*core, ncclSystemError, name + ": enqueue_error fault");
  if ((f = find_fault("enqueue_pending", core->fault_rank)) && count >= f->after) {
    core->stuck.store(true);
    return ncclInProgress;
  }
  if ((f = find_fault("async_error", core->fault_rank)) && count >= f->after) {
    core->state.store(ncclRemoteError);
    call.hang = true;
  }
  if ((f = find_fault("event_error", core->fault_rank)) && count == f->after) call.fault = true;
  {
    std::lock_guard lock(core->mu);
    ++core->calls;
  }
  trace(core.get(), name + " count " + std::to_string(call.count) + " " + dtype_name(call.dtype) +
                        (reduces(call.kind) ? std::string(" ") + op_name(call.op) : "") +
                        (call.peer >= 0 ? " peer/root " + std::to_string(call.peer) : "") +
                        (t_depth > 0 ? " (grouped)" : ""));
  if (t_depth > 0) {
    t_pending.push_back(std::move(call));
    return ncclSuccess;
  }
  return launch(core, {std::move(call)});
}

Call make(Kind kind, const void* send, void* recv, size_t count, ncclDataType_t dtype, ncclRedOp_t op, int peer,
          cudaStream_t stream) {
  return Call{.kind = kind, .core = nullptr, .send = send, .recv = recv, .count = count, .dtype = dtype, .op = op,
              .peer = peer, .stream = stream};
}

}  // namespace
}  // namespace gpu_double::nccl

using namespace gpu_double::nccl;

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, make(Kind::AllReduce, sendbuff, recvbuff, count, datatype, op, -1, stream), "ncclAllReduce");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, make(Kind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, stream),
                "ncclBroadcast");
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, make(Kind::Reduce, sendbuff, recvbuff, count, datatype, op, root, stream), "ncclReduce");
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, make(Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, -1, stream),
                "ncclAllGather");
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, make(Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, stream),
                "ncclReduceScatter");
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return submit(comm, make(Kind::Send, sendbuff, nullptr, count, datatype, ncclSum, peer, stream), "ncclSend");
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return submit(comm, make(Kind::Recv, nullptr, recvbuff, count, datatype, ncclSum, peer, stream), "ncclRecv");
}

ncclResult_t ncclGroupStart() {
  ++t_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<Call> calls;
  calls.swap(t_pending);
  const ncclResult_t error = t_group_error;
  t_group_error = ncclSuccess;
  if (error != ncclSuccess) {
    // As NCCL: a group with a failed call launches none of its calls, and every
    // non-blocking communicator in it keeps the error.
    for (Call& c : calls) {
      int expected = ncclSuccess;
      if (!c.core->blocking) c.core->state.compare_exchange_strong(expected, error);
    }
    return error;
  }
  return calls.empty() ? ncclSuccess : launch_all(std::move(calls));
}
