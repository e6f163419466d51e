// How init() builds a group's backend (internal), and the helpers backends use to
// form a group: waiting for the ranks' keys, the all-ranks exchange.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "group_peers.hpp"
#include "rdzv/store.hpp"

namespace ddp::detail {

// Everything a backend needs to form a group.
struct GroupSetup {
  std::shared_ptr<rdzv::Store> store;  // private to this group (already under its own key prefix)
  int rank = 0;                        // rank in the group
  int size = 1;                        // ranks in the group
  int local_rank = 0;                  // rank on this node: the GPU a NCCL rank uses
  int local_size = 1;                  // ranks on this node
  std::string advertise_host = "127.0.0.1";  // this host's address as peers on other hosts reach it
  std::string bind_host;               // the TCP mesh listens here only (DDP_SOCKET_IFNAME); empty: everywhere
  Millis timeout{600000};              // limit of every collective
  Millis connect_timeout{300000};      // limit of forming the group
  GroupPeers peers;                    // who the ranks are in the job; their exits
};

// Shared memory within a host, TCP across hosts.
std::unique_ptr<Backend> make_cpu_backend(const GroupSetup& setup);

// NCCL on GPU local_rank, or on the only visible GPU when this node runs one rank.
// Throws Error when NCCL was not built in.
std::unique_ptr<Backend> make_nccl_backend(const GroupSetup& setup);
// True when the NCCL backend was built in and every one of `local_size` ranks on
// this node can have a visible CUDA device of its own.
bool nccl_usable(int local_size);
// One backend over two of the same ranks: collectives on GPU buffers (Device::Cuda)
// go to `gpu`, all others, barrier and allocate to `host` (backend "auto" on a GPU
// host). Throws InvalidArgument when they disagree on rank or size.
std::unique_ptr<Backend> make_routed_backend(std::unique_ptr<Backend> host, std::unique_ptr<Backend> gpu);
// One key a wait needs, and the group rank that sets it.
struct RankKey {
  int rank;
  std::string key;
};
// Waits until every key exists and returns their values, in order. Waits in short
// slices: a rank still missing whose exit is published fails it at once (PeerError
// naming how it exited); every peers.notice_every a line on stderr says who is
// still missing. Throws Timeout naming the ranks still missing after `timeout`.
std::vector<std::string> await_ranks(rdzv::Store& store, const std::vector<RankKey>& keys, Millis timeout,
                                     const GroupPeers& peers);
// Every rank of a group sets `<prefix><rank>` to `mine` and returns all ranks'
// values, in rank order (waiting as await_ranks does).
std::vector<std::string> exchange_all(rdzv::Store& store, const std::string& prefix, int rank, int size,
                                      const std::string& mine, Millis timeout, const GroupPeers& peers = {});
// `setup` with its store narrowed to the keys under `prefix` (kept alive by the view).
GroupSetup with_store_prefix(const GroupSetup& setup, const std::string& prefix);
// Rank 0 creates a ncclUniqueId and publishes it under `key`; every rank returns
// the same 128 raw bytes. Throws Error when NCCL was not built in.
// Fails at once when rank 0's exit is published (PeerError).
std::string exchange_nccl_unique_id(rdzv::Store& store, const std::string& key, int rank, Millis timeout,
                                    const GroupPeers& peers = {});

}  // namespace ddp::detail
