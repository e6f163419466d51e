// Collective algorithms of the CPU backend, written once over the transport's
// point-to-point transfers (shared memory or TCP underneath; see transport.hpp).
//
// Terms:
//  - team: the ranks taking part, in order; `me` is this rank's index in it. A
//    team is the whole group, or the ranks of one host, or one rank per host.
//  - chunk: a contiguous slice of the buffer; offsets[i]..offsets[i+1] (elements)
//    is chunk i, owned by team member i.
//  - ring: member i sends to i+1 and receives from i-1 (mod n). Reduce-scatter
//    then all-gather around the ring moves 2(n-1)/n of the buffer per rank: the
//    bandwidth-optimal all-reduce. Small buffers instead go to everyone at once and
//    are reduced in rank order (one step: the latency-optimal choice for small n).
//  - hierarchical: with several hosts and several ranks on some host, reduce
//    within each host, all-reduce among one leader per host, broadcast within hosts.
// Arguments come checked by ProcessGroup (block sizes, roots, peers); ranks that
// disagree are found by the progress engine, which checks each message's stamp
// (stamp.hpp) before its bytes are used.
// Every algorithm leaves bit-identical results on every rank (the same additions
// in the same order), which data-parallel training relies on.
#pragma once

#include <vector>

#include "ddp/types.hpp"
#include "mesh.hpp"
#include "progress.hpp"
#include "shared_regions.hpp"

namespace ddp::cpu {

struct Team {
  Progress& progress;            // moves the transfers
  const Mesh& mesh;              // who shares a host; staging areas; peer memory
  const RegionRegistry& regions; // which buffers local peers have mapped
  std::vector<int> members;  // group ranks
  int me = 0;                // index of this rank in members
  std::vector<std::byte>& scratch;
  Clock::time_point deadline;

  int size() const { return static_cast<int>(members.size()); }
  int peer(int index) const { return members[static_cast<size_t>((index % size() + size()) % size())]; }
  std::byte* scratch_bytes(size_t n) {
    if (scratch.size() < n) scratch.resize(n);
    return scratch.data();
  }
};

// Tuning, read once from the environment (DDP_SMALL_ALLREDUCE_BYTES...).
struct Tuning {
  size_t small_allreduce_bytes;  // at most: exchange and reduce in one step
  size_t small_broadcast_bytes;  // at most: the root sends to everyone
  size_t direct_allreduce_bytes; // at least (one host): read peers' memory directly
  size_t staged_allreduce_bytes; // below (one host, ordinary buffers): meet in the staging areas
  static const Tuning& get();
};

void all_reduce(Team& team, Buffer buf, ReduceOp op);
void broadcast(Team& team, Buffer buf, int root);
void reduce(Team& team, Buffer buf, int root, ReduceOp op);
void all_gather(Team& team, Buffer input, Buffer output);
void gather(Team& team, Buffer input, Buffer output, int root);
void scatter(Team& team, Buffer input, Buffer output, int root);
void reduce_scatter(Team& team, Buffer input, Buffer output, ReduceOp op);
void all_to_all(Team& team, Buffer input, Buffer output);
void barrier(Team& team);
void send(Team& team, Buffer buf, int dst);
void recv(Team& team, Buffer buf, int src);

}  // namespace ddp::cpu
