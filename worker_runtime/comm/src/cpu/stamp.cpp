// Stamps: what each message's sender is running (see stamp.hpp).
#include "stamp.hpp"

namespace ddp::cpu {
namespace {

bool reduces(OpKind k) { return k == OpKind::AllReduce || k == OpKind::Reduce || k == OpKind::ReduceScatter; }

}  // namespace

Stamp stamp_of(const Op& op) {
  Stamp s;
  s.seq = op.seq;
  s.kind = static_cast<uint8_t>(op.kind);
  // Every rank has the input but a non-root's scatter, where the output tells the block.
  const Buffer& b = op.kind == OpKind::Scatter ? op.output : op.input;
  if (op.kind != OpKind::Barrier) {
    s.count = b.count;
    s.dtype = static_cast<uint8_t>(b.dtype);
  }
  s.root = op.peer;
  if (reduces(op.kind)) s.reduce = static_cast<uint8_t>(op.reduce);
  return s;
}

Stamp allocate_stamp() {
  Stamp s;
  s.kind = Stamp::kAllocate;
  return s;
}

Stamp expected_from(const Stamp& mine, int me) {
  if (mine.kind != static_cast<uint8_t>(OpKind::Recv)) return mine;
  Stamp s = mine;
  s.kind = static_cast<uint8_t>(OpKind::Send);
  s.root = me;
  return s;
}

std::string describe(const Stamp& s) {
  if (s.magic != Stamp::kMagic) return "an unreadable message";
  if (s.kind == Stamp::kAllocate) return "allocate";
  if (s.kind > static_cast<uint8_t>(OpKind::Recv) || s.dtype > static_cast<uint8_t>(DType::U8) ||
      s.reduce > static_cast<uint8_t>(ReduceOp::Prod)) {
    return "an unknown call";
  }
  Op op;
  op.kind = static_cast<OpKind>(s.kind);
  op.input = Buffer{nullptr, s.count, static_cast<DType>(s.dtype)};
  op.output = op.input;
  op.peer = s.root;
  op.reduce = static_cast<ReduceOp>(s.reduce);
  std::string out = describe_op(op);
  const size_t space = out.find(' ');
  const std::string number = " #" + std::to_string(s.seq);
  return space == std::string::npos ? out + number : out.insert(space, number);
}

}  // namespace ddp::cpu
