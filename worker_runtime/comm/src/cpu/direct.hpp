// One-host collectives of the CPU backend that reach the peers' buffers directly
// (group memory the peers map, or process_vm_readv/writev) instead of passing bytes
// through the shared-memory rings, and the rank-order folds they share.
//
// Fold order: every reduction here computes element e as op(...op(op(x0, x1), x2)...,
// x_{n-1}) over the team's ranks in rank order 0..n-1 (then ÷n for Avg), whichever
// rank computes it and whichever path runs. The small all-reduce (all_reduce_exchange)
// folds in the same order, so on one host an all_reduce, a reduce_scatter and a
// widening reduce_scatter of the same inputs give the same bits for the same element:
// DDP's all-reduced bucket, ZeRO-1's and FSDP's reduce-scattered shards agree at any
// world size.
//
// Synchronisation: each call starts with exchange_where (every rank tells every other
// where its buffer is; receiving a peer's answer means the peer has entered the call,
// so its buffer is stable) and ends with a barrier (nobody returns, and so reuses its
// buffer, while a peer still reads or writes it). Operations on a group run in issue
// order on every rank, so that final barrier is what separates one call from the next.
#pragma once

#include "algorithms.hpp"

namespace ddp::cpu {

// All-reduce on one host: the peers' buffers mapped, else process_vm_readv/writev,
// else (small) the staging areas. Collective; false (every rank alike) when none of
// those applies and the caller should run the ring.
bool all_reduce_direct(Team& t, Buffer buf, ReduceOp op);

// Same-dtype reduce-scatter on one host where every rank's input is group memory:
// each rank folds block `me` of every input, in rank order, straight into its
// output. Collective; false (every rank alike, after the exchange) when some input
// is not mapped here and the caller should run the ring.
bool reduce_scatter_direct(Team& t, Buffer input, Buffer output, ReduceOp op);

// Widening reduce-scatter (bf16/f16 in, f32 out): the direct fold where every input
// is mapped, otherwise an all-to-all exchange of the blocks and the same fold.
void reduce_scatter_widening(Team& t, Buffer input, Buffer output, ReduceOp op);

// All-gather on one host where the ranks may read each other (process_vm_readv) or
// every rank's output is group memory; this rank's input is already block `me` of its
// output (`block` elements each): each rank copies block j out of rank j's output.
// Collective; false (every rank alike, after the exchange) when neither holds and the
// caller should run the ring.
bool all_gather_direct(Team& t, Buffer output, size_t block);

}  // namespace ddp::cpu
