// The NCCL backend: each operation, already checked by ProcessGroup,
// becomes NCCL calls enqueued on the group's communicator (communicator.hpp), on the
// GPU numbered local_rank. Empty operations still meet (as a barrier), so that every
// rank issues the same NCCL calls.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ddp/contract/store_keys.hpp"
#include "group_setup.hpp"
#include "communicator.hpp"

namespace ddp::detail {
namespace {

using nccl::check_cuda;
using nccl::Communicator;
using nccl::ms_text;
using nccl::nccl_text;

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  throw InvalidArgument("NCCL backend: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // integer types: sum then truncating division
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Prod: return ncclProd;
  }
  throw InvalidArgument("NCCL backend: unknown reduce op");
}

// ncclGroupStart/End around `body`, ending the group even when body failed.
template <typename Body>
ncclResult_t grouped(Body&& body) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = body();
  ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(int rank, int size, std::shared_ptr<Communicator> comm, Millis timeout, Millis connect_timeout)
      : Backend(rank, size, Reach::Gpu), comm_(std::move(comm)), timeout_(timeout),
        connect_timeout_(connect_timeout) {}

  std::string kind() const override { return "nccl"; }

  void abort(const std::string& reason) override {
    comm_->fail(std::make_exception_ptr(Error("process group aborted: " + reason)));
  }

  Work run(const Op& op) override {
    switch (op.kind) {
      case OpKind::AllReduce: return all_reduce_on_gpu(op.input, op.reduce, op);
      case OpKind::Broadcast: return broadcast_on_gpu(op.input, op.peer, op);
      case OpKind::Reduce: return reduce_on_gpu(op.input, op.peer, op.reduce, op);
      case OpKind::AllGather: return all_gather_on_gpu(op.input, op.output, op);
      case OpKind::Gather: return gather_on_gpu(op.input, op.output, op.peer, op);
      case OpKind::Scatter: return scatter_on_gpu(op.input, op.output, op.peer, op);
      case OpKind::ReduceScatter: return reduce_scatter_on_gpu(op.input, op.output, op.reduce, op);
      case OpKind::AllToAll: return all_to_all_on_gpu(op.input, op.output, op);
      case OpKind::Barrier: return barrier_on_gpu(op);
      case OpKind::Send: return send_on_gpu(op.input, op.peer, op);
      case OpKind::Recv: return recv_on_gpu(op.output, op.peer, op);
    }
    throw InvalidArgument(std::string("NCCL: unknown operation ") + op_kind_name(op.kind));
  }

  std::unique_ptr<Backend> make_subgroup(const std::vector<int>& ranks) override {
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    const bool member = it != ranks.end();
    const int position = member ? static_cast<int>(it - ranks.begin()) : -1;
    // Every rank takes part in the split; the key orders members as `ranks` lists them.
    std::shared_ptr<const PeerWatch> members = comm_->watch()->narrow(ranks);
    ncclComm_t child = comm_->split(member ? 0 : NCCL_SPLIT_NOCOLOR, member ? position : rank(), connect_timeout_,
                                    member ? *members : *comm_->watch());
    if (!member) return nullptr;
    auto comm = std::make_shared<Communicator>(child, comm_->device(), timeout_, std::move(members));
    return std::make_unique<NcclBackend>(position, static_cast<int>(ranks.size()), std::move(comm), timeout_,
                                              connect_timeout_);
  }

 private:
  Work all_reduce_on_gpu(Buffer buf, ReduceOp op, const Op& call) {
    if (buf.count == 0) return barrier_on_gpu(call);
    return enqueue("all_reduce", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), nccl_op(op), c, s);
    });
  }

  Work broadcast_on_gpu(Buffer buf, int root, const Op& call) {
    if (buf.count == 0) return barrier_on_gpu(call);
    return enqueue("broadcast", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), root, c, s);
    });
  }

  Work reduce_on_gpu(Buffer buf, int root, ReduceOp op, const Op& call) {
    if (buf.count == 0) return barrier_on_gpu(call);
    // recvbuff is only written on root, so the other ranks' buf stays as it was.
    return enqueue("reduce", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(buf.data, buf.data, buf.count, nccl_dtype(buf.dtype), nccl_op(op), root, c, s);
    });
  }

  Work all_gather_on_gpu(Buffer input, Buffer output, const Op& call) {
    if (input.count == 0) return barrier_on_gpu(call);
    return enqueue("all_gather", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(input.data, output.data, input.count, nccl_dtype(input.dtype), c, s);
    });
  }

  Work gather_on_gpu(Buffer input, Buffer output, int root, const Op& call) {
    if (input.count == 0) return barrier_on_gpu(call);
    const bool is_root = rank() == root;
    const int n = size();
    return enqueue("gather", call, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(input.dtype);
        ncclResult_t r = ncclSend(input.data, input.count, t, root, c, s);
        for (int peer = 0; is_root && peer < n && r == ncclSuccess; ++peer) {
          r = ncclRecv(output.slice(peer * input.count, input.count).data, input.count, t, peer, c, s);
        }
        return r;
      });
    });
  }

  Work scatter_on_gpu(Buffer input, Buffer output, int root, const Op& call) {
    if (output.count == 0) return barrier_on_gpu(call);
    const bool is_root = rank() == root;
    const int n = size();
    return enqueue("scatter", call, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(output.dtype);
        ncclResult_t r = ncclSuccess;
        for (int peer = 0; is_root && peer < n && r == ncclSuccess; ++peer) {
          r = ncclSend(input.slice(peer * output.count, output.count).data, output.count, t, peer, c, s);
        }
        if (r == ncclSuccess) r = ncclRecv(output.data, output.count, t, root, c, s);
        return r;
      });
    });
  }

  Work reduce_scatter_on_gpu(Buffer input, Buffer output, ReduceOp op, const Op& call) {
    // ProcessGroup::check refuses it first; NCCL has no widening reduce-scatter.
    if (input.dtype != output.dtype) {
      throw InvalidArgument(std::string(dtype_name(input.dtype)) + "\u2192f32 reduce_scatter: host buffers only");
    }
    if (output.count == 0) return barrier_on_gpu(call);
    return enqueue("reduce_scatter", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(input.data, output.data, output.count, nccl_dtype(output.dtype), nccl_op(op), c, s);
    });
  }

  Work all_to_all_on_gpu(Buffer input, Buffer output, const Op& call) {
    if (input.count == 0) return barrier_on_gpu(call);
    const size_t block = input.count / size();
    const int n = size();
    return enqueue("all_to_all", call, [=](ncclComm_t c, cudaStream_t s) {
      return grouped([&] {
        ncclDataType_t t = nccl_dtype(input.dtype);
        ncclResult_t r = ncclSuccess;
        for (int peer = 0; peer < n && r == ncclSuccess; ++peer) {
          r = ncclSend(input.slice(peer * block, block).data, block, t, peer, c, s);
          if (r == ncclSuccess) r = ncclRecv(output.slice(peer * block, block).data, block, t, peer, c, s);
        }
        return r;
      });
    });
  }

  Work barrier_on_gpu(const Op& call) {
    int32_t* scratch = comm_->scratch();
    return enqueue("barrier", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, c, s);
    });
  }

  Work send_on_gpu(Buffer buf, int dst, const Op& call) {
    return enqueue("send", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclSend(buf.data, buf.count, nccl_dtype(buf.dtype), dst, c, s);
    });
  }

  Work recv_on_gpu(Buffer buf, int src, const Op& call) {
    return enqueue("recv", call, [=](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(buf.data, buf.count, nccl_dtype(buf.dtype), src, c, s);
    });
  }

  // Enqueues `call` on the group's stream; a blocking call then waits for the Work
  // (bounded by the operation's timeout, which aborts the communicator when it
  // passes). The call counts as started once enqueued, and ends when its event fires.
  template <typename Enqueue>
  Work enqueue(const char* what, const Op& call, Enqueue&& body) {
    const CollectiveOptions& o = call.options;
    Millis timeout = o.timeout.count() > 0 ? o.timeout : timeout_;
    // A send or recv waits on its peer alone; a collective on every rank.
    nccl::CallId id{what, call.seq, group_name(), is_point_to_point(call.kind) ? call.peer : -1};
    std::shared_ptr<Work::State> state = comm_->launch(std::move(id), timeout, std::forward<Enqueue>(body));
    state->attach(call, /*keep_recorder_alive=*/true);  // its event may be seen after the group is gone
    state->mark_started(nccl::Clock::now());
    Work work(std::move(state));
    if (!o.async_op) work.wait();
    return work;
  }

  std::shared_ptr<Communicator> comm_;
  Millis timeout_;          // default limit of every operation
  Millis connect_timeout_;  // limit of forming subgroups
};

}  // namespace

std::string exchange_nccl_unique_id(rdzv::Store& store, const std::string& key, int rank, Millis timeout,
                                    const GroupPeers& peers) {
  if (rank == 0) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error("ncclGetUniqueId failed: " + nccl_text(r, nullptr));
    std::string bytes(id.internal, sizeof(id.internal));
    try {
      store.set(key, bytes);
    } catch (const rdzv::StoreError& e) {
      throw Error("publishing the NCCL unique id under '" + key + "': " + e.what());
    }
    return bytes;
  }
  std::string bytes;
  try {
    bytes = await_ranks(store, {{0, key}}, timeout, peers)[0];  // fails at once if rank 0 has exited
  } catch (const Timeout&) {
    throw Timeout("rank " + std::to_string(rank) + " waited " + ms_text(timeout) +
                  " for rank 0's NCCL unique id (store key '" + key + "')");
  } catch (const rdzv::StoreError& e) {
    throw Error("reading the NCCL unique id from the store: " + std::string(e.what()));
  }
  if (bytes.size() != sizeof(ncclUniqueId::internal)) {
    throw Error("the NCCL unique id under '" + key + "' has " + std::to_string(bytes.size()) + " bytes, expected " +
                std::to_string(sizeof(ncclUniqueId::internal)));
  }
  return bytes;
}

bool nccl_usable(int local_size) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the error for later CUDA calls
    return false;
  }
  return count > 0 && local_size <= count;
}

std::unique_ptr<Backend> make_nccl_backend(const GroupSetup& setup) {
  if (setup.size < 1 || setup.rank < 0 || setup.rank >= setup.size) {
    throw InvalidArgument("NCCL group: rank " + std::to_string(setup.rank) + " of " + std::to_string(setup.size));
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("the nccl backend needs a GPU, but CUDA reports: ") + cudaGetErrorString(e));
  }
  // GPU local_rank, as torchrun programs do; but when a launcher gave each process one
  // GPU of its own (srun --gpus-per-task: one task per node in the group's view, or
  // CUDA_VISIBLE_DEVICES per task) the only visible device is this rank's.
  const int device = devices == 1 && setup.local_size == 1 ? 0 : setup.local_rank;
  if (device < 0 || device >= devices) {
    throw Error("the nccl backend puts local rank " + std::to_string(setup.local_rank) + " on GPU " +
                std::to_string(device) + ", but " + std::to_string(devices) + " GPU(s) are visible");
  }
  // NCCL takes the current device as the communicator's; it stays current for the
  // caller too, which is what a one-GPU-per-process program expects.
  check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  std::string id = exchange_nccl_unique_id(*setup.store, contract::group_keys::nccl_unique_id(), setup.rank,
                                           setup.connect_timeout, setup.peers);
  auto watch = std::make_shared<const PeerWatch>(*setup.store, setup.rank, setup.size, setup.connect_timeout, setup.peers);
  ncclComm_t comm = nccl::init_communicator(id, setup.size, setup.rank, setup.connect_timeout, *watch);
  auto communicator = std::make_shared<Communicator>(comm, device, setup.timeout, std::move(watch));
  return std::make_unique<NcclBackend>(setup.rank, setup.size, std::move(communicator), setup.timeout,
                                            setup.connect_timeout);
}

}  // namespace ddp::detail
