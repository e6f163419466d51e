#include "algorithms.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ddp/contract/worker_env.hpp"
#include "reduce.hpp"

namespace ddp::cpu {
namespace {

using Bytes = std::byte*;

Bytes at(Buffer b, size_t element) { return static_cast<Bytes>(b.data) + element * dtype_size(b.dtype); }

// offsets[i] .. offsets[i+1]: chunk i of `count` elements split n ways.
std::vector<size_t> split(size_t count, int n) {
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[i] = count * static_cast<size_t>(i) / static_cast<size_t>(n);
  return off;
}

void run(Team& t, std::vector<Xfer>& xs) { t.progress.run(std::span<Xfer>(xs), t.deadline); }

// Reduce-scatter around the ring, in place: afterwards chunk `me` of buf holds
// the reduction over the team (other chunks hold partial sums).
//   step s: send chunk me-s-1 to the right, fold chunk me-s-2 from the left into buf.
void ring_reduce_scatter(Team& t, Buffer buf, const std::vector<size_t>& off, ReduceOp op) {
  const int n = t.size();
  const size_t esz = dtype_size(buf.dtype);
  for (int s = 0; s < n - 1; ++s) {
    const int send_chunk = ((t.me - s - 1) % n + n) % n;
    const int recv_chunk = ((t.me - s - 2) % n + n) % n;
    std::vector<Xfer> xs{
        Xfer::send(t.peer(t.me + 1), at(buf, off[send_chunk]), (off[send_chunk + 1] - off[send_chunk]) * esz),
        Xfer::recv_reduce(t.peer(t.me - 1), at(buf, off[recv_chunk]), off[recv_chunk + 1] - off[recv_chunk],
                          buf.dtype, op)};
    run(t, xs);
  }
}

// All-gather around the ring, in place: chunk `me` is ours on entry, every chunk
// is everyone's on return.   step s: send chunk me-s right, receive chunk me-s-1.
void ring_all_gather(Team& t, Buffer buf, const std::vector<size_t>& off) {
  const int n = t.size();
  const size_t esz = dtype_size(buf.dtype);
  for (int s = 0; s < n - 1; ++s) {
    const int send_chunk = ((t.me - s) % n + n) % n;
    const int recv_chunk = ((t.me - s - 1) % n + n) % n;
    std::vector<Xfer> xs{
        Xfer::send(t.peer(t.me + 1), at(buf, off[send_chunk]), (off[send_chunk + 1] - off[send_chunk]) * esz),
        Xfer::recv(t.peer(t.me - 1), at(buf, off[recv_chunk]), (off[recv_chunk + 1] - off[recv_chunk]) * esz)};
    run(t, xs);
  }
}

void divide_chunk(Buffer buf, size_t from, size_t to, int n) {
  if (to > from) divide(buf.dtype, at(buf, from), to - from, n);
}

// Small all-reduce: everyone sends its buffer to everyone; each folds the
// contributions in rank order (so every rank adds in the same order).
void all_reduce_exchange(Team& t, Buffer buf, ReduceOp op) {
  const int n = t.size();
  const size_t bytes = buf.bytes();
  std::vector<Xfer> xs;
  if (n == 2 && op != ReduceOp::Min && op != ReduceOp::Max) {
    // Sum and product of two operands commute exactly: fold the peer's straight out
    // of the channel. (std::min/max do not with NaN or signed zeros: rank order below.)
    xs = {Xfer::send(t.peer(t.me + 1), buf.data, bytes),
          Xfer::recv_reduce(t.peer(t.me + 1), buf.data, buf.count, buf.dtype, op)};
    // The send must read buf before the fold writes it: the fold can only start
    // once the peer sent, but a shm send copies in pieces, so stage our copy.
    Bytes mine = t.scratch_bytes(bytes);
    std::memcpy(mine, buf.data, bytes);
    xs[0].src = mine;
    run(t, xs);
  } else {
    Bytes slots = t.scratch_bytes(bytes * static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      if (i == t.me) continue;
      xs.push_back(Xfer::send(t.members[i], buf.data, bytes));
      xs.push_back(Xfer::recv(t.members[i], slots + bytes * static_cast<size_t>(i), bytes));
    }
    std::memcpy(slots + bytes * static_cast<size_t>(t.me), buf.data, bytes);
    run(t, xs);
    std::memcpy(buf.data, slots, bytes);
    for (int i = 1; i < n; ++i) reduce_inplace(buf.dtype, op, buf.data, slots + bytes * static_cast<size_t>(i), buf.count);
  }
  if (op == ReduceOp::Avg) divide_chunk(buf, 0, buf.count, n);
}

void all_reduce_ring(Team& t, Buffer buf, ReduceOp op) {
  const auto off = split(buf.count, t.size());
  ring_reduce_scatter(t, buf, off, op);
  if (op == ReduceOp::Avg) divide_chunk(buf, off[t.me], off[t.me + 1], t.size());
  ring_all_gather(t, buf, off);
}

void dissemination_barrier(Team& t);

// One host, large buffer: ranks reach each other's buffers directly instead of
// passing bytes through rings. Each chunk is reduced by one rank only, so every rank
// ends with the same bits.
//   1. Each rank tells every other where its buffer is (it has entered the call, so
//      the buffer is stable): its address, and the shared region holding it, if any.
//   2a. Every buffer in shared memory (ProcessGroup::allocate), the usual case for
//      DDP's buckets: each rank folds chunk `me` of every peer's buffer into its
//      own, straight from the mapped pages, and writes the result into every
//      peer's buffer. A barrier, and all are done: two synchronisations, no copy
//      through a staging buffer, no system call.
//   2b. Otherwise, where the ranks may read and write each other's memory
//      (process_vm_readv/writev, probed at formation): each rank, piece by piece,
//      reads chunk `me` of every peer's buffer into a small scratch, folds it into
//      its own, and writes the result into every peer's chunk `me`. Nobody else
//      touches chunk `me` of anyone's buffer meanwhile. A barrier, and all are done:
//      two synchronisations, the least memory traffic of the paths that work on
//      ordinary buffers.
//   2c. Otherwise, below DDP_STAGED_ALLREDUCE_BYTES (1 MiB), the staged path (see
//      all_reduce_staged): two copies, but no system call and no permission needed.
//   2d. Otherwise, the ring through the shared-memory rings.
void all_reduce_mapped(Team& t, Buffer buf, ReduceOp op, const std::vector<std::byte*>& views);
void all_reduce_staged(Team& t, Buffer buf, ReduceOp op);
void all_reduce_push(Team& t, Buffer buf, ReduceOp op, const std::vector<uint64_t>& address);

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

void all_reduce_direct(Team& t, Buffer buf, ReduceOp op) {
  const int n = t.size();
  const std::vector<Where> where = exchange_where(t, buf.data, buf.bytes());
  const std::vector<std::byte*> views = mapped_views(t, where, buf.data, buf.bytes());
  if (!views.empty()) return all_reduce_mapped(t, buf, op, views);
  if (t.mesh.peer_memory().permitted()) {
    std::vector<uint64_t> address(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) address[static_cast<size_t>(i)] = where[static_cast<size_t>(i)].address;
    return all_reduce_push(t, buf, op, address);
  }
  if (buf.bytes() < Tuning::get().staged_allreduce_bytes) return all_reduce_staged(t, buf, op);
  all_reduce_ring(t, buf, op);
}

void all_reduce_push(Team& t, Buffer buf, ReduceOp op, const std::vector<uint64_t>& address) {
  const int n = t.size();
  const auto off = split(buf.count, n);
  const size_t esz = dtype_size(buf.dtype);
  constexpr size_t kPiece = 256 * 1024;
  const size_t piece_elems = std::max<size_t>(1, kPiece / esz);
  Bytes scratch = t.scratch_bytes(piece_elems * esz);
  const PeerMemory& peers = t.mesh.peer_memory();
  for (size_t from = off[t.me]; from < off[t.me + 1]; from += piece_elems) {
    const size_t count = std::min(piece_elems, off[t.me + 1] - from);
    for (int i = 0; i < n; ++i) {
      if (i == t.me) continue;
      peers.read(t.members[i], address[static_cast<size_t>(i)] + from * esz, scratch, count * esz);
      reduce_inplace(buf.dtype, op, at(buf, from), scratch, count);
    }
    if (op == ReduceOp::Avg) divide_chunk(buf, from, from + count, n);
    for (int i = 0; i < n; ++i)
      if (i != t.me) peers.write(t.members[i], address[static_cast<size_t>(i)] + from * esz, at(buf, from), count * esz);
  }
  dissemination_barrier(t);
}

// Reduces `count` elements in place at views[me] (from element `from` of the
// views) with the same span of every other view, and writes the result into all
// of them: this rank's share of a mapped or staged all-reduce.
void reduce_share(const std::vector<std::byte*>& views, int me, DType dtype, ReduceOp op, size_t from, size_t count) {
  const int n = static_cast<int>(views.size());
  const size_t esz = dtype_size(dtype);
  // Small pieces: the reduced piece is still in this core's cache when it is
  // written out to the peers.
  constexpr size_t kPiece = 32 * 1024;
  const size_t piece_elems = std::max<size_t>(1, kPiece / esz);
  for (size_t at_elem = from; at_elem < from + count; at_elem += piece_elems) {
    const size_t k = std::min(piece_elems, from + count - at_elem);
    std::byte* own = views[static_cast<size_t>(me)] + at_elem * esz;
    for (int i = 0; i < n; ++i)
      if (i != me) reduce_inplace(dtype, op, own, views[static_cast<size_t>(i)] + at_elem * esz, k);
    if (op == ReduceOp::Avg) divide_chunk(Buffer{own, k, dtype}, 0, k, n);
    for (int i = 0; i < n; ++i)
      if (i != me) std::memcpy(views[static_cast<size_t>(i)] + at_elem * esz, own, k * esz);
  }
}

void all_reduce_mapped(Team& t, Buffer buf, ReduceOp op, const std::vector<std::byte*>& views) {
  const auto off = split(buf.count, t.size());
  reduce_share(views, t.me, buf.dtype, op, off[t.me], off[t.me + 1] - off[t.me]);
  dissemination_barrier(t);
}

// One host, ordinary buffers: the ranks meet in their staging areas (shared memory
// every local rank maps), a piece at a time. Per piece: each rank copies its piece
// in; a barrier; each reduces its share across every staging area and writes the
// result into all of them; a barrier; each copies the whole reduced piece out.
// The next piece's copy-in cannot overtake a peer still writing this one: it
// comes after the second barrier.
void all_reduce_staged(Team& t, Buffer buf, ReduceOp op) {
  const int n = t.size();
  const size_t esz = dtype_size(buf.dtype);
  const size_t piece = std::max<size_t>(1, Mesh::staging_bytes() / esz);
  std::vector<std::byte*> views(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) views[static_cast<size_t>(i)] = t.mesh.staging(t.members[i]);
  for (size_t from = 0; from < buf.count; from += piece) {
    const size_t count = std::min(piece, buf.count - from);
    std::memcpy(views[static_cast<size_t>(t.me)], at(buf, from), count * esz);
    dissemination_barrier(t);
    const auto share = split(count, n);
    reduce_share(views, t.me, buf.dtype, op, share[t.me], share[t.me + 1] - share[t.me]);
    dissemination_barrier(t);
    std::memcpy(at(buf, from), views[static_cast<size_t>(t.me)], count * esz);
  }
}

void all_reduce_flat(Team& t, Buffer buf, ReduceOp op) {
  if (t.size() == 1 || buf.count == 0) return;
  if (buf.bytes() <= Tuning::get().small_allreduce_bytes) return all_reduce_exchange(t, buf, op);
  bool one_host = true;
  for (int r : t.members) one_host &= t.mesh.host_of(r) == t.mesh.host_of(t.members[0]);
  const Tuning& tune = Tuning::get();
  if (one_host && buf.bytes() >= tune.direct_allreduce_bytes) return all_reduce_direct(t, buf, op);
  all_reduce_ring(t, buf, op);
}

// Large broadcast: the root scatters chunk i to member i, then a ring all-gather.
void broadcast_scatter_gather(Team& t, Buffer buf, int root) {
  const auto off = split(buf.count, t.size());
  const size_t esz = dtype_size(buf.dtype);
  std::vector<Xfer> xs;
  if (t.me == root) {
    for (int i = 0; i < t.size(); ++i)
      if (i != root) xs.push_back(Xfer::send(t.members[i], at(buf, off[i]), (off[i + 1] - off[i]) * esz));
  } else {
    xs.push_back(Xfer::recv(t.members[root], at(buf, off[t.me]), (off[t.me + 1] - off[t.me]) * esz));
  }
  run(t, xs);
  ring_all_gather(t, buf, off);
}

void broadcast_flat(Team& t, Buffer buf, int root) {
  std::vector<Xfer> xs;
  if (t.me == root) {
    for (int i = 0; i < t.size(); ++i)
      if (i != root) xs.push_back(Xfer::send(t.members[i], buf.data, buf.bytes()));
  } else {
    xs.push_back(Xfer::recv(t.members[root], buf.data, buf.bytes()));
  }
  run(t, xs);
}

// Rooted calls: a rank may otherwise only send (a root's broadcast) or only
// receive, and two ranks that disagree on the root might never read each other's
// stamps. An empty message to the right and one from the left first: if any two
// ranks disagree, some neighbours do, and they hear of it before a byte moves.
void check_neighbours(Team& t) {
  std::vector<Xfer> xs{Xfer::send(t.peer(t.me + 1), nullptr, 0), Xfer::recv(t.peer(t.me - 1), nullptr, 0)};
  run(t, xs);
}

Team sub_team(Team& t, std::vector<int> members) {
  int me = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == t.members[t.me]) me = static_cast<int>(i);
  return Team{t.progress, t.mesh, t.regions, std::move(members), me, t.scratch, t.deadline};
}

// Several hosts, several ranks on some: reduce to each host's first rank (ring
// reduce-scatter, then chunks to the leader), all-reduce among leaders, then
// broadcast within each host.
void all_reduce_hierarchical(Team& t, Buffer buf, ReduceOp op) {
  const ReduceOp fold = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  const Mesh& mesh = t.mesh;
  std::vector<int> local, leaders;
  std::vector<int> seen_hosts;
  for (int r : t.members) {
    if (mesh.host_of(r) == mesh.host_of(t.members[t.me])) local.push_back(r);
    if (std::find(seen_hosts.begin(), seen_hosts.end(), mesh.host_of(r)) == seen_hosts.end()) {
      seen_hosts.push_back(mesh.host_of(r));
      leaders.push_back(r);
    }
  }
  Team host = sub_team(t, local);
  const bool leader = host.me == 0;
  if (host.size() > 1) {
    const auto off = split(buf.count, host.size());
    const size_t esz = dtype_size(buf.dtype);
    ring_reduce_scatter(host, buf, off, fold);
    std::vector<Xfer> xs;
    if (leader) {
      for (int i = 1; i < host.size(); ++i)
        xs.push_back(Xfer::recv(host.members[i], at(buf, off[i]), (off[i + 1] - off[i]) * esz));
    } else {
      xs.push_back(Xfer::send(host.members[0], at(buf, off[host.me]), (off[host.me + 1] - off[host.me]) * esz));
    }
    run(host, xs);
  }
  if (leader) {
    Team heads = sub_team(t, leaders);
    all_reduce_flat(heads, buf, fold);
  }
  if (host.size() > 1) {
    if (buf.bytes() <= Tuning::get().small_broadcast_bytes) broadcast_flat(host, buf, 0);
    else broadcast_scatter_gather(host, buf, 0);
  }
  if (op == ReduceOp::Avg) divide_chunk(buf, 0, buf.count, t.size());
}

}  // namespace

const Tuning& Tuning::get() {
  static const Tuning t = [] {
    const auto s = contract::CommSettings::from_environment();
    return Tuning{s.small_allreduce_bytes, s.small_broadcast_bytes, s.direct_allreduce_bytes,
                  s.staged_allreduce_bytes};
  }();
  return t;
}

void all_reduce(Team& t, Buffer buf, ReduceOp op) {
  if (t.size() == 1 || buf.count == 0) return;
  const Mesh& mesh = t.mesh;
  bool many_hosts = false, shared_host = false;
  std::vector<int> counted;
  for (int r : t.members) {
    many_hosts |= mesh.host_of(r) != mesh.host_of(t.members[0]);
    if (std::find(counted.begin(), counted.end(), mesh.host_of(r)) != counted.end()) shared_host = true;
    counted.push_back(mesh.host_of(r));
  }
  if (many_hosts && shared_host) all_reduce_hierarchical(t, buf, op);
  else all_reduce_flat(t, buf, op);
}

void broadcast(Team& t, Buffer buf, int root) {
  if (t.size() == 1 || buf.count == 0) return;
  check_neighbours(t);
  if (t.size() == 2 || buf.bytes() <= Tuning::get().small_broadcast_bytes) broadcast_flat(t, buf, root);
  else broadcast_scatter_gather(t, buf, root);
}

void reduce(Team& t, Buffer buf, int root, ReduceOp op) {
  const int n = t.size();
  if (n == 1 || buf.count == 0) return;
  check_neighbours(t);
  const size_t bytes = buf.bytes();
  const ReduceOp fold = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  if (bytes <= Tuning::get().small_allreduce_bytes) {
    // Everyone sends to the root; it folds in rank order.
    std::vector<Xfer> xs;
    if (t.me != root) {
      xs.push_back(Xfer::send(t.members[root], buf.data, bytes));
      run(t, xs);
      return;
    }
    Bytes slots = t.scratch_bytes(bytes * static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      if (i != root) xs.push_back(Xfer::recv(t.members[i], slots + bytes * static_cast<size_t>(i), bytes));
    std::memcpy(slots + bytes * static_cast<size_t>(root), buf.data, bytes);
    run(t, xs);
    std::memcpy(buf.data, slots, bytes);
    for (int i = 1; i < n; ++i) reduce_inplace(buf.dtype, fold, buf.data, slots + bytes * static_cast<size_t>(i), buf.count);
  } else {
    // Ring reduce-scatter on a copy (non-roots keep their buffer), chunks to the root.
    Bytes copy = t.scratch_bytes(bytes);
    std::memcpy(copy, buf.data, bytes);
    Buffer work{copy, buf.count, buf.dtype, buf.device};
    const auto off = split(buf.count, n);
    const size_t esz = dtype_size(buf.dtype);
    ring_reduce_scatter(t, work, off, fold);
    std::vector<Xfer> xs;
    if (t.me == root) {
      std::memcpy(at(buf, off[root]), at(work, off[root]), (off[root + 1] - off[root]) * esz);
      for (int i = 0; i < n; ++i)
        if (i != root) xs.push_back(Xfer::recv(t.members[i], at(buf, off[i]), (off[i + 1] - off[i]) * esz));
    } else {
      xs.push_back(Xfer::send(t.members[root], at(work, off[t.me]), (off[t.me + 1] - off[t.me]) * esz));
    }
    run(t, xs);
    if (t.me != root) return;
  }
  if (op == ReduceOp::Avg) divide_chunk(buf, 0, buf.count, n);
}

void all_gather(Team& t, Buffer input, Buffer output) {
  const int n = t.size();
  const size_t esz = dtype_size(input.dtype);
  std::memmove(at(output, input.count * static_cast<size_t>(t.me)), input.data, input.count * esz);
  if (n == 1 || input.count == 0) return;
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[i] = input.count * static_cast<size_t>(i);
  ring_all_gather(t, output, off);
}

void gather(Team& t, Buffer input, Buffer output, int root) {
  const int n = t.size();
  const size_t bytes = input.bytes();
  if (n > 1 && bytes > 0) check_neighbours(t);
  std::vector<Xfer> xs;
  if (t.me == root) {
    std::memmove(at(output, input.count * static_cast<size_t>(root)), input.data, bytes);
    for (int i = 0; i < n; ++i)
      if (i != root) xs.push_back(Xfer::recv(t.members[i], at(output, input.count * static_cast<size_t>(i)), bytes));
  } else {
    xs.push_back(Xfer::send(t.members[root], input.data, bytes));
  }
  if (bytes > 0) run(t, xs);
}

void scatter(Team& t, Buffer input, Buffer output, int root) {
  const int n = t.size();
  const size_t bytes = output.bytes();
  if (n > 1 && bytes > 0) check_neighbours(t);
  std::vector<Xfer> xs;
  if (t.me == root) {
    std::memmove(output.data, at(input, output.count * static_cast<size_t>(root)), bytes);
    for (int i = 0; i < n; ++i)
      if (i != root) xs.push_back(Xfer::send(t.members[i], at(input, output.count * static_cast<size_t>(i)), bytes));
  } else {
    xs.push_back(Xfer::recv(t.members[root], output.data, bytes));
  }
  if (bytes > 0) run(t, xs);
}

// Widening reduce-scatter (16-bit float input, f32 output): block `me` of every
// rank's input is converted exactly to f32 and summed in rank order 0..n-1, in f32,
// then divided by n for Avg. Only 16-bit elements cross between ranks, and each
// output element is computed by one rank from the same inputs in the same order, so
// the result does not depend on timing or transport.
//   1. Where every input is (see exchange_where). If all are shared memory this rank
//      maps (DDP's staging buffers come from ProcessGroup::allocate), each rank reads
//      block `me` of every peer's input straight from the mapped pages; a barrier
//      then tells every rank that nobody reads its input any more.
//   2. Otherwise an all-to-all exchange of the blocks: block j of my input to rank j,
//      block `me` of rank i's input into scratch slot i.
//   3. One fold, a cache-sized piece at a time: out = f32(slot 0), out += f32(slot i).
namespace {
void reduce_scatter_widening(Team& t, Buffer input, Buffer output, ReduceOp op) {
  const int n = t.size();
  if (output.count == 0) return;
  const size_t block = output.count, esz = dtype_size(input.dtype);
  auto* out = static_cast<float*>(output.data);
  std::vector<const std::byte*> blocks(static_cast<size_t>(n));
  std::vector<std::byte*> views;
  if (n > 1) views = mapped_views(t, exchange_where(t, input.data, input.bytes()), input.data, input.bytes());
  if (!views.empty() || n == 1) {
    for (int i = 0; i < n; ++i) {
      const auto* base = n == 1 ? static_cast<const std::byte*>(input.data) : views[static_cast<size_t>(i)];
      blocks[static_cast<size_t>(i)] = base + block * static_cast<size_t>(t.me) * esz;
    }
  } else {
    Bytes slots = t.scratch_bytes(block * esz * static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) blocks[static_cast<size_t>(i)] = slots + block * esz * static_cast<size_t>(i);
    blocks[static_cast<size_t>(t.me)] = at(input, block * static_cast<size_t>(t.me));
    for (int s = 1; s < n; ++s) {
      const int to = (t.me + s) % n, from = (t.me - s + n) % n;
      std::vector<Xfer> xs{Xfer::send(t.members[to], at(input, block * static_cast<size_t>(to)), block * esz),
                           Xfer::recv(t.members[from], slots + block * esz * static_cast<size_t>(from), block * esz)};
      run(t, xs);
    }
  }
  constexpr size_t kPiece = 8 * 1024;  // f32 elements: 32 KiB of output stays in L1/L2 while n inputs fold in
  for (size_t from = 0; from < block; from += kPiece) {
    const size_t k = std::min(kPiece, block - from);
    for (int i = 0; i < n; ++i) widen_into(input.dtype, out + from, blocks[static_cast<size_t>(i)] + from * esz, k, i > 0);
    if (op == ReduceOp::Avg) divide(DType::F32, out + from, k, n);
  }
  if (!views.empty()) dissemination_barrier(t);
}
}  // namespace

void reduce_scatter(Team& t, Buffer input, Buffer output, ReduceOp op) {
  if (input.dtype != output.dtype) return reduce_scatter_widening(t, input, output, op);
  const int n = t.size();
  const size_t esz = dtype_size(input.dtype);
  if (n == 1) {
    std::memmove(output.data, input.data, output.bytes());
    return;
  }
  if (output.count == 0) return;
  const ReduceOp fold = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  Bytes copy = t.scratch_bytes(input.bytes());
  std::memcpy(copy, input.data, input.bytes());
  Buffer work{copy, input.count, input.dtype, input.device};
  std::vector<size_t> off(static_cast<size_t>(n) + 1);
  for (int i = 0; i <= n; ++i) off[i] = output.count * static_cast<size_t>(i);
  ring_reduce_scatter(t, work, off, fold);
  std::memcpy(output.data, at(work, off[t.me]), output.count * esz);
  if (op == ReduceOp::Avg) divide_chunk(output, 0, output.count, n);
}

void all_to_all(Team& t, Buffer input, Buffer output) {
  const int n = t.size();
  const size_t block = input.count / static_cast<size_t>(n);
  const size_t bytes = block * dtype_size(input.dtype);
  std::memmove(at(output, block * static_cast<size_t>(t.me)), at(input, block * static_cast<size_t>(t.me)), bytes);
  if (bytes == 0) return;
  // Pairwise exchange: at step s, send to me+s while receiving from me-s.
  for (int s = 1; s < n; ++s) {
    const int to = (t.me + s) % n;
    const int from = (t.me - s + n) % n;
    std::vector<Xfer> xs{Xfer::send(t.members[to], at(input, block * static_cast<size_t>(to)), bytes),
                         Xfer::recv(t.members[from], at(output, block * static_cast<size_t>(from)), bytes)};
    run(t, xs);
  }
}

void barrier(Team& t) { dissemination_barrier(t); }

namespace {
// After round k every rank has heard, indirectly, from 2^k others.
void dissemination_barrier(Team& t) {
  const int n = t.size();
  for (int k = 1; k < n; k *= 2) {
    std::byte out{1}, in{0};
    std::vector<Xfer> xs{Xfer::send(t.peer(t.me + k), &out, 1), Xfer::recv(t.peer(t.me - k), &in, 1)};
    run(t, xs);
  }
}
}  // namespace

// Point to point: one message; its stamp carries the count, dtype and the send's
// number, which the receiver checks (see stamp.hpp).
void send(Team& t, Buffer buf, int dst) {
  std::vector<Xfer> xs{Xfer::send(t.members[dst], buf.data, buf.bytes())};
  run(t, xs);
}

void recv(Team& t, Buffer buf, int src) {
  std::vector<Xfer> xs{Xfer::recv(t.members[src], buf.data, buf.bytes())};
  run(t, xs);
}

}  // namespace ddp::cpu
