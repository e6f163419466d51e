#include "algorithms.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "chunks.hpp"
#include "ddp/contract/worker_env.hpp"
#include "direct.hpp"
#include "reduce.hpp"

namespace ddp::cpu {
namespace {

using Bytes = std::byte*;

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

// Small all-reduce: everyone sends its buffer to everyone; each folds the
// contributions in rank order (so every rank adds in the same order).
void all_reduce_exchange(Team& t, Buffer buf, ReduceOp op) {
  const int n = t.size();
  const size_t bytes = buf.bytes();
  if (n == 2 && op != ReduceOp::Min && op != ReduceOp::Max) {
    // Sum and product of two operands commute exactly: fold the peer's straight out
    // of the channel. (std::min/max do not with NaN or signed zeros: rank order below.)
    Xfer xs[] = {Xfer::send(t.peer(t.me + 1), buf.data, bytes),
                 Xfer::recv_reduce(t.peer(t.me + 1), buf.data, buf.count, buf.dtype, op)};
    // The send must read buf before the fold writes it. It goes whole at once where
    // the channel has room (small messages nearly always); otherwise what is left of
    // it is sent from a copy.
    if (!t.progress.try_complete(xs[0])) {
      Bytes rest = t.scratch_bytes(bytes);
      std::memcpy(rest + xs[0].done, static_cast<Bytes>(buf.data) + xs[0].done, bytes - xs[0].done);
      xs[0].src = rest;
    }
    run(t, xs);
  } else {
    std::vector<Xfer> xs;
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

void all_reduce_flat(Team& t, Buffer buf, ReduceOp op) {
  if (t.size() == 1 || buf.count == 0) return;
  if (buf.bytes() <= Tuning::get().small_allreduce_bytes) return all_reduce_exchange(t, buf, op);
  if (one_host(t) && buf.bytes() >= Tuning::get().direct_allreduce_bytes && all_reduce_direct(t, buf, op)) return;
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

// One host, the peers readable (process_vm_readv) or every output in group memory: the
// direct pull (direct.hpp). Otherwise around the ring.
void all_gather(Team& t, Buffer input, Buffer output) {
  const int n = t.size();
  std::memmove(at(output, input.count * static_cast<size_t>(t.me)), input.data, input.bytes());
  if (n == 1 || input.count == 0) return;
  if (one_host(t) && all_gather_direct(t, output, input.count)) return;
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

// Widening: direct.hpp. Same dtype, one host with every input in group memory: the
// direct rank-order fold (direct.hpp), the same bits as all_reduce's for the same
// element. Otherwise around the ring, on a copy (the caller's input stays as it was).
void reduce_scatter(Team& t, Buffer input, Buffer output, ReduceOp op) {
  if (input.dtype != output.dtype) return reduce_scatter_widening(t, input, output, op);
  const int n = t.size();
  const size_t esz = dtype_size(input.dtype);
  if (n == 1) {
    std::memmove(output.data, input.data, output.bytes());
    return;
  }
  if (output.count == 0) return;
  if (one_host(t) && reduce_scatter_direct(t, input, output, op)) return;
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

// Dissemination: after round k every rank has heard, indirectly, from 2^k others.
void barrier(Team& t) {
  const int n = t.size();
  for (int k = 1; k < n; k *= 2) {
    std::byte out{1}, in{0};
    std::vector<Xfer> xs{Xfer::send(t.peer(t.me + k), &out, 1), Xfer::recv(t.peer(t.me - k), &in, 1)};
    run(t, xs);
  }
}

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
