// One-host collectives that reach the peers' buffers directly, and the rank-order
// folds they share: see direct.hpp for the fold order and the synchronisation.
#include "direct.hpp"

#include <algorithm>
#include <cstring>

#include "chunks.hpp"
#include "reduce.hpp"

namespace ddp::cpu {
namespace {

using Bytes = std::byte*;

// Where each rank's buffer of a call is: its address, and the shared region holding
// it (0: not in shared memory). Every rank tells every other (it has entered the
// call, so the buffer is stable). Ranks that disagree on the call (count, dtype...)
// never get past this: the stamps of these messages differ (see stamp.hpp), so
// nobody touches a buffer of another size.
struct Where {
  uint64_t address;
  uint64_t region;
};
std::vector<Where> exchange_where(Team& t, const void* data, size_t bytes) {
  const int n = t.size();
  const Where mine{reinterpret_cast<uintptr_t>(data), t.regions.shared_region_of(data, bytes)};
  std::vector<Where> where(static_cast<size_t>(n), Where{0, 0});
  std::vector<Xfer> xs;
  for (int i = 0; i < n; ++i) {
    if (i == t.me) continue;
    xs.push_back(Xfer::send(t.members[i], &mine, sizeof(mine)));
    xs.push_back(Xfer::recv(t.members[i], &where[static_cast<size_t>(i)], sizeof(Where)));
  }
  run(t, xs);
  where[static_cast<size_t>(t.me)] = mine;
  return where;
}

// Every rank's buffer mapped here (views[me] is `data`), or empty unless all are in
// shared memory this rank maps. Every rank sees the same answers, so all take the
// same branch.
std::vector<std::byte*> mapped_views(Team& t, const std::vector<Where>& where, void* data, size_t bytes) {
  const int n = t.size();
  std::vector<std::byte*> views(static_cast<size_t>(n), nullptr);
  for (int i = 0; i < n; ++i) {
    const Where& w = where[static_cast<size_t>(i)];
    if (w.region == 0) return {};
    views[static_cast<size_t>(i)] =
        i == t.me ? static_cast<std::byte*>(data) : t.regions.peer_view(t.members[i], w.region, w.address, bytes);
    if (views[static_cast<size_t>(i)] == nullptr) return {};
  }
  return views;
}

// Small pieces: a folded piece is still in this core's cache when it is written out
// (to the peers, or to the output).
constexpr size_t kPieceBytes = 32 * 1024;

// own = the rank-order fold of every rank's piece (own is rank me's piece, piece(i)
// rank i's), without an extra pass: the ranks before `me` fold into `scratch`, which
// then folds into own as op(partial, own) (the same operands in the same order), and
// the ranks after `me` fold straight into own.
template <typename Piece>
void fold_into_own(DType dtype, ReduceOp op, int n, int me, Bytes own, Bytes scratch, size_t k, Piece piece) {
  if (me > 0) {
    const std::byte* partial = piece(0);
    if (me > 1) {
      reduce_into(dtype, op, scratch, partial, piece(1), k);
      for (int i = 2; i < me; ++i) reduce_inplace(dtype, op, scratch, piece(i), k);
      partial = scratch;
    }
    reduce_into(dtype, op, own, partial, own, k);
  }
  for (int i = me + 1; i < n; ++i) reduce_inplace(dtype, op, own, piece(i), k);
}

// Reduces `count` elements from element `from` of every view, in rank order, and
// writes the result into all of them: this rank's share of a mapped or staged
// all-reduce.
void reduce_share(Team& t, const std::vector<std::byte*>& views, DType dtype, ReduceOp op, size_t from, size_t count) {
  const int n = static_cast<int>(views.size());
  const size_t esz = dtype_size(dtype);
  const size_t piece_elems = std::max<size_t>(1, kPieceBytes / esz);
  Bytes scratch = t.me > 1 ? t.scratch_bytes(piece_elems * esz) : nullptr;
  for (size_t e = from; e < from + count; e += piece_elems) {
    const size_t k = std::min(piece_elems, from + count - e);
    const size_t off = e * esz;
    Bytes own = views[static_cast<size_t>(t.me)] + off;
    fold_into_own(dtype, op, n, t.me, own, scratch, k, [&](int i) { return views[static_cast<size_t>(i)] + off; });
    if (op == ReduceOp::Avg) divide(dtype, own, k, n);
    for (int i = 0; i < n; ++i)
      if (i != t.me) std::memcpy(views[static_cast<size_t>(i)] + off, own, k * esz);
  }
}

// All-reduce, one host, large buffer: ranks reach each other's buffers directly
// instead of passing bytes through rings. Each chunk is reduced by one rank only, in
// rank order, so every rank ends with the same bits.
//   1. exchange_where: where every rank's buffer is.
//   2a. Every buffer in shared memory (ProcessGroup::allocate), the usual case for
//       DDP's buckets: each rank folds chunk `me` of every buffer straight from the
//       mapped pages and writes the result into every buffer. A barrier, and all are
//       done: two synchronisations, no copy through a staging buffer, no system call.
void all_reduce_mapped(Team& t, Buffer buf, ReduceOp op, const std::vector<std::byte*>& views) {
  const auto off = split(buf.count, t.size());
  reduce_share(t, views, buf.dtype, op, off[t.me], off[t.me + 1] - off[t.me]);
  barrier(t);
}

//   2b. Where the ranks may read and write each other's memory (process_vm_readv/
//       writev, probed at formation): each rank, piece by piece, reads chunk `me` of
//       every peer's buffer into a small scratch, folds them in rank order, and writes the
//       result into every rank's chunk `me`. Nobody else touches chunk `me` of anyone's
//       buffer meanwhile. A barrier, and all are done: the least memory traffic of the
//       paths that work on ordinary buffers.
void all_reduce_push(Team& t, Buffer buf, ReduceOp op, const std::vector<Where>& where) {
  const int n = t.size();
  const auto off = split(buf.count, n);
  const size_t esz = dtype_size(buf.dtype);
  constexpr size_t kPiece = 256 * 1024;
  const size_t piece_elems = std::max<size_t>(1, kPiece / esz);
  Bytes scratch = t.scratch_bytes(3 * piece_elems * esz);
  Bytes partial = scratch + piece_elems * esz, theirs = scratch + 2 * piece_elems * esz;
  const PeerMemory& peers = t.mesh.peer_memory();
  auto remote = [&](int i, size_t e) { return where[static_cast<size_t>(i)].address + e * esz; };
  for (size_t from = off[t.me]; from < off[t.me + 1]; from += piece_elems) {
    const size_t count = std::min(piece_elems, off[t.me + 1] - from);
    Bytes own = at(buf, from);
    // Ranks 0 and 1 can be in hand at once (partial, theirs); later ones one at a time.
    fold_into_own(buf.dtype, op, n, t.me, own, scratch, count, [&](int i) {
      Bytes into = i == 0 ? partial : theirs;
      peers.read(t.members[i], remote(i, from), into, count * esz);
      return into;
    });
    if (op == ReduceOp::Avg) divide(buf.dtype, own, count, n);
    for (int i = 0; i < n; ++i)
      if (i != t.me) peers.write(t.members[i], remote(i, from), own, count * esz);
  }
  barrier(t);
}

//   2c. Below DDP_STAGED_ALLREDUCE_BYTES (1 MiB), ordinary buffers: the ranks meet in
//       their staging areas (shared memory every local rank maps), a piece at a time.
//       Per piece: each rank copies its piece in; a barrier; each reduces its share
//       across every staging area and writes the result into all of them; a barrier;
//       each copies the whole reduced piece out. The next piece's copy-in cannot
//       overtake a peer still writing this one: it comes after the second barrier.
//   2d. Otherwise the caller's ring through the shared-memory rings.
void all_reduce_staged(Team& t, Buffer buf, ReduceOp op) {
  const int n = t.size();
  const size_t esz = dtype_size(buf.dtype);
  const size_t piece = std::max<size_t>(1, Mesh::staging_bytes() / esz);
  std::vector<std::byte*> views(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) views[static_cast<size_t>(i)] = t.mesh.staging(t.members[i]);
  for (size_t from = 0; from < buf.count; from += piece) {
    const size_t count = std::min(piece, buf.count - from);
    std::memcpy(views[static_cast<size_t>(t.me)], at(buf, from), count * esz);
    barrier(t);
    const auto share = split(count, n);
    reduce_share(t, views, buf.dtype, op, share[t.me], share[t.me + 1] - share[t.me]);
    barrier(t);
    std::memcpy(at(buf, from), views[static_cast<size_t>(t.me)], count * esz);
  }
}

// output = the rank-order fold of `blocks` (block `me` of every rank's input), a piece
// at a time: same dtype, or 16-bit floats widened exactly to f32. ÷n for Avg.
void fold_blocks(const std::vector<const std::byte*>& blocks, DType in, Buffer output, ReduceOp op) {
  const int n = static_cast<int>(blocks.size());
  const size_t in_size = dtype_size(in);
  const size_t piece = std::max<size_t>(1, kPieceBytes / dtype_size(output.dtype));
  for (size_t from = 0; from < output.count; from += piece) {
    const size_t k = std::min(piece, output.count - from);
    Bytes out = at(output, from);
    auto block = [&](int i) { return blocks[static_cast<size_t>(i)] + from * in_size; };
    if (in != output.dtype) {
      for (int i = 0; i < n; ++i) widen_into(in, reinterpret_cast<float*>(out), block(i), k, i > 0);
    } else if (n == 1) {
      std::memmove(out, block(0), k * in_size);
    } else {
      reduce_into(in, op, out, block(0), block(1), k);
      for (int i = 2; i < n; ++i) reduce_inplace(in, op, out, block(i), k);
    }
    if (op == ReduceOp::Avg) divide(output.dtype, out, k, n);
  }
}

bool overlaps(Buffer a, Buffer b) {
  const auto* pa = static_cast<const std::byte*>(a.data);
  const auto* pb = static_cast<const std::byte*>(b.data);
  return pa < pb + b.bytes() && pb < pa + a.bytes();
}

// A reduce-scatter's fold: into the output, or, when the output overlaps this rank's
// input (which peers may still be reading), into a copy that lands after `done` (the
// barrier that ends their reads) has run.
template <typename Done>
void fold_into(const std::vector<const std::byte*>& blocks, Buffer input, Buffer output, ReduceOp op, Done done) {
  if (!overlaps(input, output)) {
    fold_blocks(blocks, input.dtype, output, op);
    return done();
  }
  std::vector<std::byte> copy(output.bytes());
  fold_blocks(blocks, input.dtype, Buffer{copy.data(), output.count, output.dtype, output.device}, op);
  done();
  std::memcpy(output.data, copy.data(), copy.size());
}

// Block `me` of every mapped input (views), or empty.
std::vector<const std::byte*> my_blocks(Team& t, Buffer input, size_t block) {
  const auto views = mapped_views(t, exchange_where(t, input.data, input.bytes()), input.data, input.bytes());
  std::vector<const std::byte*> blocks;
  for (std::byte* v : views) blocks.push_back(v + block * static_cast<size_t>(t.me) * dtype_size(input.dtype));
  return blocks;
}

}  // namespace

bool all_reduce_direct(Team& t, Buffer buf, ReduceOp op) {
  const std::vector<Where> where = exchange_where(t, buf.data, buf.bytes());
  const std::vector<std::byte*> views = mapped_views(t, where, buf.data, buf.bytes());
  if (!views.empty()) return all_reduce_mapped(t, buf, op, views), true;
  if (t.mesh.peer_memory().permitted()) return all_reduce_push(t, buf, op, where), true;
  if (buf.bytes() < Tuning::get().staged_allreduce_bytes) return all_reduce_staged(t, buf, op), true;
  return false;
}

bool reduce_scatter_direct(Team& t, Buffer input, Buffer output, ReduceOp op) {
  const auto blocks = my_blocks(t, input, output.count);
  if (blocks.empty()) return false;
  fold_into(blocks, input, output, op, [&] { barrier(t); });
  return true;
}

// Widening reduce-scatter (16-bit float input, f32 output): block `me` of every
// rank's input is converted exactly to f32 and summed in rank order 0..n-1, in f32,
// then divided by n for Avg. Only 16-bit elements cross between ranks, and each
// output element is computed by one rank from the same inputs in the same order, so
// the result does not depend on timing or transport.
//   1. Every input mapped (DDP's staging buffers come from ProcessGroup::allocate):
//      the direct fold, straight from the mapped pages, then a barrier.
//   2. Otherwise an all-to-all exchange of the blocks: block j of my input to rank j,
//      block `me` of rank i's input into scratch slot i; then the same fold.
void reduce_scatter_widening(Team& t, Buffer input, Buffer output, ReduceOp op) {
  const int n = t.size();
  if (output.count == 0) return;
  const size_t block = output.count, esz = dtype_size(input.dtype);
  if (n > 1 && reduce_scatter_direct(t, input, output, op)) return;
  std::vector<const std::byte*> blocks(static_cast<size_t>(n));
  Bytes slots = n == 1 ? nullptr : t.scratch_bytes(block * esz * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) blocks[static_cast<size_t>(i)] = slots + block * esz * static_cast<size_t>(i);
  blocks[static_cast<size_t>(t.me)] = at(input, block * static_cast<size_t>(t.me));
  for (int s = 1; s < n; ++s) {
    const int to = (t.me + s) % n, from = (t.me - s + n) % n;
    std::vector<Xfer> xs{Xfer::send(t.members[to], at(input, block * static_cast<size_t>(to)), block * esz),
                         Xfer::recv(t.members[from], slots + block * esz * static_cast<size_t>(from), block * esz)};
    run(t, xs);
  }
  // Every block this rank sends has gone: only block `me` is read from here on.
  fold_into(blocks, input, output, op, [] {});
}

// Pull, not push: each rank writes only its own output (so the gathered blocks land
// in its own cache) and reads block j of rank j's output, which rank j filled before
// it sent its answer to the exchange.
//   Where process_vm_readv is permitted it reads the blocks, mapped or not: every page
// of a peer's buffer read through a mapping stays in this rank's RSS (RssShmem), and
// FSDP gathers into two 16.8 MB pools (wide MLP): 17 MB of the peers' pages at 2 ranks.
// It costs some speed (16 MB, 2 ranks: 1.22 -> 1.47 ms). The reduce-scatter keeps its
// mapped fold: a fold over pieces read into scratch was 1.6x slower.
bool all_gather_direct(Team& t, Buffer output, size_t block) {
  const size_t bytes = block * dtype_size(output.dtype);
  const auto where = exchange_where(t, output.data, output.bytes());
  const PeerMemory& peers = t.mesh.peer_memory();
  std::vector<std::byte*> views;
  if (!peers.permitted()) {
    views = mapped_views(t, where, output.data, output.bytes());
    if (views.empty()) return false;
  }
  for (int j = 0; j < t.size(); ++j) {
    if (j == t.me) continue;
    const size_t off = bytes * static_cast<size_t>(j);
    Bytes mine = static_cast<Bytes>(output.data) + off;
    if (views.empty()) {
      peers.read(t.members[j], where[static_cast<size_t>(j)].address + off, mine, bytes);
    } else {
      std::memcpy(mine, views[static_cast<size_t>(j)] + off, bytes);
    }
  }
  barrier(t);  // rank j may reuse its output (block j) only once nobody reads it
  return true;
}

}  // namespace ddp::cpu
