// The NCCL double's operations: how the calls of one fused task move bytes through
// the segment's channels and reduce them.
//
// Terms:
//  - flow: the bytes one call sends to, or receives from, one peer, as a stream of
//    offsets 0..total. A flow moves as far as its limit and the channel allow.
//  - per-peer order: a channel carries the flows of a task in call order (one call
//    finishes its bytes to a peer before the next starts), the same order on every
//    rank, as NCCL matches calls by their position.
//  - window: a reducing call receives its peers' contributions into staging buffers
//    a window (kWindowBytes) at a time, reduces the window in rank order into the
//    output once every peer's part (and its own sends of that range, for in-place
//    calls) arrived, and moves on. Memory stays bounded whatever the size.
#include <cstring>
#include <deque>

#include "../gpu_double.hpp"
#include "comm.hpp"
#include "reduce.hpp"


namespace gpu_double::nccl {
namespace {

constexpr size_t kWindowBytes = 256 * 1024;

struct Flow {
  int peer = -1;
  const uint8_t* src = nullptr;  // a send reads src[offset - base]
  uint8_t* dst = nullptr;        // a receive writes dst[offset - base]
  size_t base = 0;
  size_t total = 0;
  size_t done = 0;
  size_t limit = 0;              // how far it may move now (<= total)
  bool finished() const { return done == total; }
};

// One call in flight: its flows and, for reductions, its windows.
class Op {
 public:
  virtual ~Op() = default;
  // Local work (a copy, a reduced window); true if anything happened.
  virtual bool step() = 0;
  virtual bool finished() const = 0;
  std::deque<Flow> sends, recvs;

 protected:
  bool flows_finished() const {
    for (const Flow& f : sends)
      if (!f.finished()) return false;
    for (const Flow& f : recvs)
      if (!f.finished()) return false;
    return true;
  }
  void add_send(int peer, const void* src, size_t bytes) {
    if (bytes > 0) sends.push_back(Flow{peer, static_cast<const uint8_t*>(src), nullptr, 0, bytes, 0, bytes});
  }
  void add_recv(int peer, void* dst, size_t bytes) {
    if (bytes > 0) recvs.push_back(Flow{peer, nullptr, static_cast<uint8_t*>(dst), 0, bytes, 0, bytes});
  }
};

// Sends and receives whole buffers, with an optional local copy first.
class MoveOp final : public Op {
 public:
  MoveOp(void* copy_dst, const void* copy_src, size_t copy_bytes)
      : copy_dst_(copy_dst), copy_src_(copy_src), copy_bytes_(copy_bytes) {}
  using Op::add_recv;
  using Op::add_send;
  bool step() override {
    if (copied_) return false;
    if (copy_bytes_ > 0 && copy_dst_ != copy_src_) std::memmove(copy_dst_, copy_src_, copy_bytes_);
    copied_ = true;
    return true;
  }
  bool finished() const override { return copied_ && flows_finished(); }

 private:
  void* copy_dst_;
  const void* copy_src_;
  size_t copy_bytes_;
  bool copied_ = false;
};

// Reduces `bytes` of every rank's contribution into `out`: its own from `mine`,
// the others' received through staging windows, in rank order.
class ReduceOp final : public Op {
 public:
  ReduceOp(const Call& c, int rank, int nranks, const uint8_t* mine, uint8_t* out, size_t bytes)
      : dtype_(c.dtype), op_(c.op), rank_(rank), nranks_(nranks), mine_(mine), out_(out), bytes_(bytes),
        elem_(dtype_size(c.dtype)) {
    window_ = kWindowBytes / elem_ * elem_;
    staging_.resize(static_cast<size_t>(nranks) * window_);
    for (int p = 0; p < nranks; ++p)
      if (p != rank && bytes > 0)
        recvs.push_back(Flow{p, nullptr, staging_.data() + static_cast<size_t>(p) * window_, 0, bytes, 0, 0});
    open_window(0);
  }
  using Op::add_send;
  bool step() override {
    if (at_ >= bytes_) return false;
    for (const Flow& f : recvs)
      if (f.done < end_) return false;
    for (const Flow& f : sends)
      if (f.done < std::min(end_, f.total)) return false;  // in place: sent before overwritten
    const uint8_t* inputs[kMaxInputs];
    std::vector<const uint8_t*> many;
    const uint8_t** in = inputs;
    if (nranks_ > kMaxInputs) many.resize(nranks_), in = many.data();
    for (int r = 0; r < nranks_; ++r)
      in[r] = r == rank_ ? mine_ + at_ : staging_.data() + static_cast<size_t>(r) * window_;
    reduce(dtype_, op_, in, nranks_, out_ + at_, (end_ - at_) / elem_);
    open_window(end_);
    return true;
  }
  bool finished() const override { return at_ >= bytes_ && flows_finished(); }

 private:
  static constexpr int kMaxInputs = 64;
  void open_window(size_t at) {
    at_ = at;
    end_ = std::min(bytes_, at + window_);
    for (Flow& f : recvs) {
      f.base = at_;
      f.limit = end_;
    }
  }
  ncclDataType_t dtype_;
  ncclRedOp_t op_;
  int rank_, nranks_;
  const uint8_t* mine_;
  uint8_t* out_;
  size_t bytes_, elem_, window_ = 0;
  std::vector<uint8_t> staging_;  // a window per rank (its own slot unused)
  size_t at_ = 0, end_ = 0;       // the window being gathered
};

// An op that never finishes: the async_error fault's pending work.
class HangOp final : public Op {
 public:
  bool step() override { return false; }
  bool finished() const override { return false; }
};

std::unique_ptr<Op> make_op(const Call& c, int rank, int n) {
  const size_t elem = dtype_size(c.dtype);
  const size_t bytes = c.count * elem;
  const auto* send = static_cast<const uint8_t*>(c.send);
  auto* recv = static_cast<uint8_t*>(c.recv);
  if (c.hang) return std::make_unique<HangOp>();
  switch (c.kind) {
    case Kind::AllReduce: {
      auto op = std::make_unique<ReduceOp>(c, rank, n, send, recv, bytes);
      for (int p = 0; p < n; ++p)
        if (p != rank) op->add_send(p, send, bytes);
      return op;
    }
    case Kind::Reduce: {
      if (rank == c.peer) return std::make_unique<ReduceOp>(c, rank, n, send, recv, bytes);
      auto op = std::make_unique<MoveOp>(nullptr, nullptr, 0);
      op->add_send(c.peer, send, bytes);
      return op;
    }
    case Kind::ReduceScatter: {
      auto op = std::make_unique<ReduceOp>(c, rank, n, send + rank * bytes, recv, bytes);
      for (int p = 0; p < n; ++p)
        if (p != rank) op->add_send(p, send + p * bytes, bytes);
      return op;
    }
    case Kind::Broadcast: {
      if (rank != c.peer) {
        auto op = std::make_unique<MoveOp>(nullptr, nullptr, 0);
        op->add_recv(c.peer, recv, bytes);
        return op;
      }
      auto op = std::make_unique<MoveOp>(recv, send, bytes);
      for (int p = 0; p < n; ++p)
        if (p != rank) op->add_send(p, send, bytes);
      return op;
    }
    case Kind::AllGather: {
      auto op = std::make_unique<MoveOp>(recv + rank * bytes, send, bytes);
      for (int p = 0; p < n; ++p) {
        if (p == rank) continue;
        op->add_send(p, send, bytes);
        op->add_recv(p, recv + p * bytes, bytes);
      }
      return op;
    }
    case Kind::Send: {
      auto op = std::make_unique<MoveOp>(nullptr, nullptr, 0);
      op->add_send(c.peer, send, bytes);
      return op;
    }
    case Kind::Recv: {
      auto op = std::make_unique<MoveOp>(nullptr, nullptr, 0);
      op->add_recv(c.peer, recv, bytes);
      return op;
    }
  }
  return nullptr;
}

// Sends and receives a rank addresses to itself: the k-th send to self feeds the
// k-th receive from self (NCCL's matching by order). An unmatched one never finishes.
void match_self(std::vector<Call>& calls, int rank, std::vector<std::unique_ptr<Op>>& ops) {
  std::vector<const Call*> sends, recvs;
  for (const Call& c : calls) {
    if (c.peer != rank || c.hang) continue;
    if (c.kind == Kind::Send) sends.push_back(&c);
    if (c.kind == Kind::Recv) recvs.push_back(&c);
  }
  const size_t pairs = std::min(sends.size(), recvs.size());
  for (size_t i = 0; i < pairs; ++i) {
    const size_t bytes = std::min(sends[i]->count, recvs[i]->count) * dtype_size(sends[i]->dtype);
    ops.push_back(std::make_unique<MoveOp>(recvs[i]->recv, sends[i]->send, bytes));
  }
  if (sends.size() != recvs.size()) ops.push_back(std::make_unique<HangOp>());
}

// Moves the flows of one peer queue in order as far as `move(flow, bytes)` lets
// them (it returns how many bytes it moved); true if any byte moved.
template <typename Move>
bool move_flows(std::deque<Flow*>& queue, Move move) {
  bool moved = false;
  while (!queue.empty()) {
    Flow& f = *queue.front();
    const size_t want = std::min(f.limit, f.total) - f.done;
    const size_t k = want == 0 ? 0 : move(f, want);
    f.done += k;
    moved |= k > 0;
    if (!f.finished()) break;
    queue.pop_front();
  }
  return moved;
}

}  // namespace

void run_calls(Core& core, std::vector<Call>& calls) {
  Segment& seg = *core.segment;
  const int rank = core.rank;
  const int n = core.nranks;
  for (const Call& c : calls)
    if (c.fault) {
      // A kernel fault: nothing moves, and the device's later work fails.
      gpu_double_fault_device(core.device);
      return;
    }

  std::vector<std::unique_ptr<Op>> ops;
  for (const Call& c : calls) {
    const bool to_self = (c.kind == Kind::Send || c.kind == Kind::Recv) && c.peer == rank;
    if (!to_self) ops.push_back(make_op(c, rank, n));
  }
  match_self(calls, rank, ops);

  // Per-peer queues of flows in call order.
  std::vector<std::deque<Flow*>> sends(n), recvs(n);
  for (auto& op : ops) {
    for (Flow& f : op->sends) sends[f.peer].push_back(&f);
    for (Flow& f : op->recvs) recvs[f.peer].push_back(&f);
  }

  Waiter waiter(seg, rank);
  for (;;) {
    waiter.seen();
    if (core.aborted.load()) return;
    bool moved = false;
    for (int p = 0; p < n; ++p) {
      moved |= move_flows(sends[p], [&](Flow& f, size_t want) {
        return seg.push(rank, p, f.src + (f.done - f.base), want);
      });
      moved |= move_flows(recvs[p], [&](Flow& f, size_t want) {
        return seg.pop(p, rank, f.dst + (f.done - f.base), want);
      });
    }
    bool all = true;
    for (auto& op : ops) {
      moved |= op->step();
      all = all && op->finished();
    }
    if (all) return;
    if (moved) {
      waiter.reset();
    } else {
      waiter.idle();
    }
  }
}

}  // namespace gpu_double::nccl
