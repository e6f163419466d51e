// ProcessGroup's public operations: the one place where a call's arguments are
// checked against the contract in process_group.hpp before any backend sees it.
//
// Every operation builds an Op and passes through issue(): check it, then hand it to
// the backend's run(). A step that must see every operation of a group in issue order
// (a sequence number, a record of it, comparing it across ranks) belongs in issue().
#include <string>

#include "backend.hpp"
#include "flight_recorder.hpp"
#include "group_memory.hpp"
#include "work_state.hpp"

namespace ddp {

using detail::Op;
using detail::OpKind;
using detail::Reach;

ProcessGroup::ProcessGroup(std::unique_ptr<detail::Backend> backend)
    : rank_(backend->rank()), size_(backend->size()), backend_(std::move(backend)) {
  if (const size_t entries = detail::configured_recorder_entries(); entries > 0) {
    recorder_ = detail::FlightRecorder::create(entries, rank_, size_);
    recorder_->set_name(backend_->group_name());
  }
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend() const { return backend_->kind(); }
const std::string& ProcessGroup::name() const { return backend_->group_name(); }
void ProcessGroup::abort(const std::string& reason) { backend_->abort(reason); }

namespace detail {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
  }
  return "?";
}

}  // namespace detail

Work ProcessGroup::all_reduce(Buffer buf, ReduceOp op, CollectiveOptions o) {
  return issue(Op{OpKind::AllReduce, buf, buf, -1, op, o});
}
Work ProcessGroup::broadcast(Buffer buf, int root, CollectiveOptions o) {
  return issue(Op{OpKind::Broadcast, buf, buf, root, ReduceOp::Sum, o});
}
Work ProcessGroup::reduce(Buffer buf, int root, ReduceOp op, CollectiveOptions o) {
  return issue(Op{OpKind::Reduce, buf, buf, root, op, o});
}
Work ProcessGroup::all_gather(Buffer input, Buffer output, CollectiveOptions o) {
  return issue(Op{OpKind::AllGather, input, output, -1, ReduceOp::Sum, o});
}
Work ProcessGroup::gather(Buffer input, Buffer output, int root, CollectiveOptions o) {
  return issue(Op{OpKind::Gather, input, output, root, ReduceOp::Sum, o});
}
Work ProcessGroup::scatter(Buffer input, Buffer output, int root, CollectiveOptions o) {
  return issue(Op{OpKind::Scatter, input, output, root, ReduceOp::Sum, o});
}
Work ProcessGroup::reduce_scatter(Buffer input, Buffer output, ReduceOp op, CollectiveOptions o) {
  return issue(Op{OpKind::ReduceScatter, input, output, -1, op, o});
}
Work ProcessGroup::all_to_all(Buffer input, Buffer output, CollectiveOptions o) {
  return issue(Op{OpKind::AllToAll, input, output, -1, ReduceOp::Sum, o});
}
Work ProcessGroup::barrier(CollectiveOptions o) { return issue(Op{OpKind::Barrier, {}, {}, -1, ReduceOp::Sum, o}); }
Work ProcessGroup::send(Buffer buf, int dst, CollectiveOptions o) {
  return issue(Op{OpKind::Send, buf, buf, dst, ReduceOp::Sum, o});
}
Work ProcessGroup::recv(Buffer buf, int src, CollectiveOptions o) {
  return issue(Op{OpKind::Recv, buf, buf, src, ReduceOp::Sum, o});
}

std::string detail::describe_op(const Op& op) {
  std::string out = op_kind_name(op.kind);
  if (op.kind == OpKind::Barrier) return out;
  // The buffer that says how much this rank moves: the output where the input is a
  // block of it (all_gather) or absent (a non-root's scatter).
  const Buffer& b = op.input.count == 0 && op.output.count > 0 ? op.output : op.input;
  out += ' ';
  out += std::to_string(b.count);
  out += "\u00d7";
  out += dtype_name(b.dtype);
  // A widening reduce_scatter names both: "reduce_scatter 1024×bf16→f32 avg".
  if (op.kind == OpKind::ReduceScatter && op.output.dtype != op.input.dtype) {
    out += "\u2192";
    out += dtype_name(op.output.dtype);
  }
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::ReduceScatter: out += std::string(" ") + reduce_op_name(op.reduce); break;
    case OpKind::Reduce: out += std::string(" ") + reduce_op_name(op.reduce) + " root " + std::to_string(op.peer); break;
    case OpKind::Broadcast:
    case OpKind::Gather:
    case OpKind::Scatter: out += " root " + std::to_string(op.peer); break;
    case OpKind::Send: out += " to " + std::to_string(op.peer); break;
    case OpKind::Recv: out += " from " + std::to_string(op.peer); break;
    default: break;
  }
  return out;
}

namespace {
void check(const Op& op, int rank, int size, const detail::Backend& backend);
}  // namespace

Work ProcessGroup::issue(Op&& op) {
  check(op, rank_, size_, *backend_);
  if (detail::is_point_to_point(op.kind)) {
    auto& count = op.kind == OpKind::Send ? sends_ : recvs_;
    if (count.empty()) count.assign(static_cast<size_t>(size_), 0);
    op.seq = ++count[static_cast<size_t>(op.peer)];
  } else {
    op.seq = ++issued_;
  }
  if (!recorder_) return backend_->run(op);
  op.recorder = recorder_.get();
  op.record = recorder_->queued(op, detail::coarse_now());
  // The backend marks the call through its Work; what it could not mark (a call
  // refused before it had a Work, a backend without one) is settled here.
  try {
    Work w = backend_->run(op);
    if (!op.options.async_op) {
      recorder_->ended(op.record, true);
    } else if (w.is_completed()) {
      recorder_->ended(op.record, w.exception() == nullptr);
    }
    return w;
  } catch (...) {
    recorder_->ended(op.record, false);
    throw;
  }
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  if (ranks.empty()) throw InvalidArgument("new_group: no ranks given");
  std::vector<bool> seen(static_cast<size_t>(size()), false);
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      throw InvalidArgument("new_group: rank " + std::to_string(r) + " is not a rank of this group of " +
                            std::to_string(size()));
    }
    if (seen[static_cast<size_t>(r)]) throw InvalidArgument("new_group: rank " + std::to_string(r) + " is listed twice");
    seen[static_cast<size_t>(r)] = true;
  }
  const int k = subgroups_made_++;  // every rank counts, members or not
  std::unique_ptr<detail::Backend> member = backend_->make_subgroup(ranks);
  if (!member) return nullptr;
  member->set_group_name(name() + "." + std::to_string(k));
  return std::make_shared<ProcessGroup>(std::move(member));
}

std::unique_ptr<GroupMemory> ProcessGroup::allocate(size_t bytes) {
  detail::page_rounded(bytes);  // a size no system could map is refused here, not in the group
  return backend_->allocate_memory(bytes);
}

// ---- the argument check ---------------------------------------------------------
namespace {

const char* memory_name(Device d) { return d == Device::Cuda ? "GPU memory" : "host memory"; }

bool reaches(Reach reach, Device d) {
  switch (reach) {
    case Reach::Host: return d == Device::Cpu;
    case Reach::Gpu: return d == Device::Cuda;
    case Reach::HostAndGpu: return true;
  }
  return false;
}

// What one operation's checks need to know about the group and the call.
struct Checker {
  const char* what;  // "all_reduce", ...
  int rank;
  int size;
  Reach reach;
  const detail::Backend& backend;  // for kind(), on the error path only

  [[noreturn]] void fail(const std::string& text) const { throw InvalidArgument(std::string(what) + ": " + text); }

  // A buffer the operation reads or writes. An empty one is never touched, so only
  // its dtype matters (a default-made Buffer{} is fine wherever the count is 0).
  void known_dtype(const Buffer& b, const char* name) const {
    if (static_cast<unsigned>(b.dtype) > static_cast<unsigned>(DType::U8)) {
      fail(std::string(name) + " has an unknown dtype (" + std::to_string(static_cast<unsigned>(b.dtype)) + ")");
    }
  }
  void buffer(const Buffer& b, const char* name) const {
    known_dtype(b, name);
    if (b.count == 0) return;
    if (b.data == nullptr) fail(std::string(name) + " is a null buffer of " + std::to_string(b.count) + " elements");
    if (!reaches(reach, b.device)) {
      fail(std::string(name) + " is " + memory_name(b.device) + "; the " + backend.kind() + " backend needs " +
           memory_name(b.device == Device::Cuda ? Device::Cpu : Device::Cuda) +
           (b.device == Device::Cuda ? "" : " (Device::Cuda)"));
    }
  }
  // An input and an output used together, of the same dtype unless `widening`.
  void pair(const Buffer& in, const Buffer& out, bool widening = false) const {
    buffer(in, "input");
    buffer(out, "output");
    if (in.count > 0 && out.count > 0 && in.device != out.device) {
      fail("input and output must both be host memory or both GPU memory");
    }
    if (in.dtype != out.dtype && !widening) {
      fail(std::string("input is ") + dtype_name(in.dtype) + " but output is " + dtype_name(out.dtype));
    }
  }
  // reduce_scatter's one mixed pair: 16-bit float input, f32 output, summed in f32.
  // Checked before the buffers' memory, so a GPU group names this rule.
  bool widening(const Buffer& in, const Buffer& out, ReduceOp op) const {
    if (in.dtype == out.dtype) return false;
    known_dtype(in, "input");
    known_dtype(out, "output");
    const bool sixteen = in.dtype == DType::BF16 || in.dtype == DType::F16;
    if (!sixteen || out.dtype != DType::F32) {
      fail(std::string("input is ") + dtype_name(in.dtype) + " but output is " + dtype_name(out.dtype) +
           " (only bf16 or f16 input with f32 output may differ)");
    }
    if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
      fail(std::string(dtype_name(in.dtype)) + "\u2192f32 reduce_scatter supports sum and avg only, not " +
           reduce_op_name(op));
    }
    if (!reaches(reach, Device::Cpu) || in.device == Device::Cuda || out.device == Device::Cuda) {
      fail(std::string(dtype_name(in.dtype)) + "\u2192f32 reduce_scatter: host buffers only");
    }
    return true;
  }
  // `name` must hold size blocks of `block` elements.
  void blocks(size_t whole, size_t block, const char* name) const {
    if (whole != block * static_cast<size_t>(size)) {
      fail(std::string(name) + " holds " + std::to_string(whole) + " elements, expected " + std::to_string(size) +
           " x " + std::to_string(block));
    }
  }
  void member(int r, const char* name) const {
    if (r < 0 || r >= size) {
      fail(std::string(name) + " " + std::to_string(r) + " is not a rank of this group of " + std::to_string(size));
    }
  }
  void peer(int r, const char* name) const {
    member(r, name);
    if (r == rank) fail(std::string(name) + " " + std::to_string(r) + " is this rank: a rank cannot address itself");
  }
  void reduce_op(ReduceOp op) const {
    if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::Prod)) {
      fail("unknown reduce op (" + std::to_string(static_cast<unsigned>(op)) + ")");
    }
  }
};

void check(const Op& op, int rank, int size, const detail::Backend& backend) {
  const Checker c{op_kind_name(op.kind), rank, size, backend.reach(), backend};
  const Buffer& in = op.input;
  const Buffer& out = op.output;
  switch (op.kind) {
    case OpKind::AllReduce:
      c.buffer(in, "buf");
      c.reduce_op(op.reduce);
      return;
    case OpKind::Broadcast:
      c.member(op.peer, "root");
      c.buffer(in, "buf");
      return;
    case OpKind::Reduce:
      c.member(op.peer, "root");
      c.buffer(in, "buf");
      c.reduce_op(op.reduce);
      return;
    case OpKind::AllGather:
      c.pair(in, out);
      c.blocks(out.count, in.count, "output");
      return;
    case OpKind::Gather:  // only the root's output is written
      c.member(op.peer, "root");
      if (rank != op.peer) return c.buffer(in, "input");
      c.pair(in, out);
      c.blocks(out.count, in.count, "the root's output");
      return;
    case OpKind::Scatter:  // only the root's input is read
      c.member(op.peer, "root");
      if (rank != op.peer) return c.buffer(out, "output");
      c.pair(in, out);
      c.blocks(in.count, out.count, "the root's input");
      return;
    case OpKind::ReduceScatter:
      c.reduce_op(op.reduce);
      c.pair(in, out, c.widening(in, out, op.reduce));
      c.blocks(in.count, out.count, "input");
      return;
    case OpKind::AllToAll:
      c.pair(in, out);
      if (in.count != out.count || in.count % static_cast<size_t>(size) != 0) {
        c.fail("input and output need the same count, a multiple of " + std::to_string(size) + " (got " +
               std::to_string(in.count) + " and " + std::to_string(out.count) + ")");
      }
      return;
    case OpKind::Barrier: return;
    case OpKind::Send:
      c.peer(op.peer, "dst");
      c.buffer(in, "buf");
      return;
    case OpKind::Recv:
      c.peer(op.peer, "src");
      c.buffer(out, "buf");
      return;
  }
  c.fail("unknown operation");
}

}  // namespace

}  // namespace ddp
