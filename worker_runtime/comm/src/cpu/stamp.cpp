// Stamps: what each message's sender is running (see stamp.hpp).
#include "stamp.hpp"

namespace ddp::cpu {

using detail::Op;
using detail::OpKind;

namespace {

bool reduces(OpKind k) { return k == OpKind::AllReduce || k == OpKind::Reduce || k == OpKind::ReduceScatter; }

// The dtype byte: the input's dtype in the low nibble; a widening reduce_scatter adds
// its output's dtype + 1 in the high nibble, so ranks passing f32 against bf16 (either
// side) disagree in the stamp.
constexpr unsigned kOutputShift = 4;
uint8_t dtype_byte(const Op& op, const Buffer& b) {
  auto v = static_cast<unsigned>(b.dtype);
  if (op.kind == OpKind::ReduceScatter && op.output.dtype != op.input.dtype) {
    v |= (static_cast<unsigned>(op.output.dtype) + 1) << kOutputShift;
  }
  return static_cast<uint8_t>(v);
}

}  // namespace

Stamp stamp_of(const Op& op) {
  Stamp s;
  s.seq = op.seq;
  s.kind = static_cast<uint8_t>(op.kind);
  // Every rank has the input but a non-root's scatter, where the output tells the block.
  const Buffer& b = op.kind == OpKind::Scatter ? op.output : op.input;
  if (op.kind != OpKind::Barrier) {
    s.count = b.count;
    s.dtype = dtype_byte(op, b);
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
  const unsigned in = s.dtype & 0xfu, widened = s.dtype >> kOutputShift;
  if (s.kind > static_cast<uint8_t>(OpKind::Recv) || in > static_cast<unsigned>(DType::U8) ||
      widened > static_cast<unsigned>(DType::U8) + 1 || s.reduce > static_cast<uint8_t>(ReduceOp::Prod)) {
    return "an unknown call";
  }
  Op op;
  op.kind = static_cast<OpKind>(s.kind);
  op.input = Buffer{nullptr, s.count, static_cast<DType>(in)};
  op.output = op.input;
  if (widened > 0) op.output.dtype = static_cast<DType>(widened - 1);
  op.peer = s.root;
  op.reduce = static_cast<ReduceOp>(s.reduce);
  std::string out = describe_op(op);
  const size_t space = out.find(' ');
  const std::string number = " #" + std::to_string(s.seq);
  return space == std::string::npos ? out + number : out.insert(space, number);
}

}  // namespace ddp::cpu
