// Knowing that a peer process has died (counted 300 ms after its exit is first seen),
// for backends whose transport does not tell (NCCL kernels simply wait for a peer that
// is gone).
//
// Ranks publish who they are through the group's store; each rank opens a pidfd for
// every peer that shares its host (same boot id and mount, pid and ipc namespaces:
// the peers whose pids mean something here). A pidfd becomes readable when its
// process exits, so one poll() with no wait says whether any of them died. Peers on
// other hosts are known gone from their exits as ddprun publishes them (ExitWatch).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "ddp/work.hpp"
#include "group_peers.hpp"
#include "rdzv/store.hpp"

namespace ddp::detail {

// What makes processes one host here: the boot id and the mount, pid and ipc
// namespaces. Equal strings mean shared /dev/shm and pids that name the same process.
std::string host_identity();

class PeerWatch {
 public:
  // Every rank of the group calls it: publishes this rank under "watch/<rank>" and
  // reads every other rank's record within `timeout` (Timeout names the ranks that
  // never published, PeerError one whose exit is published). Throws Error on a
  // malformed record. `peers`: the group's ranks in the job and their exits.
  PeerWatch(rdzv::Store& store, int rank, int size, Millis timeout, GroupPeers peers = {});
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The record a rank publishes: "<host identity>\n<pid>\n<hostname>".
  static std::string record_of(int pid);

  // The group rank of a watched peer that has exited, or -1. Never blocks. A peer
  // counts from 300 ms after its exit was first seen here (it may exit right after its
  // part of an operation this rank has not seen end yet); only one whose pidfd could not
  // be opened because it had already exited (ESRCH when the watch began) counts at once.
  // `only`: the one rank a point-to-point call waits on; -1: every rank (a collective).
  int dead_peer(int only = -1) const;
  // Group rank `rank` by its global rank: "rank 3 (pid 4711 on node-b)", in a subgroup
  // "rank 3 (group rank 1, pid 4711 on node-b)".
  std::string describe(int rank) const;
  // How dead_peer() `rank` is gone: "rank 3 exited with code 0 at 12:00:01.234 on node 1
  // (node-b), while this rank waits for it" (a call may follow: " in all_reduce #57 of group 0"),
  // or "peer rank 3 (pid 4711 on node-b) exited".
  std::string how_gone(int rank) const;
  // How many peers are watched (those on this host).
  size_t watched() const { return peers_.size(); }

  // The same watch for a subgroup: `ranks` are this group's ranks, the subgroup's
  // rank i being ranks[i] (as new_group takes them).
  std::shared_ptr<PeerWatch> narrow(const std::vector<int>& ranks) const;

 private:
  PeerWatch() = default;
  int published_exit(int only) const;
  bool past_grace(int rank) const;  // its published exit has been known for the grace
  void watch_local_peers(const std::vector<std::string>& records, int rank, const std::string& here);
  void close_all();
  struct Peer {
    int rank;  // in the group
    int pid;
    int fd;    // pidfd; -1 when none could be opened
    bool gone; // the peer had exited before we could open one
    std::string hostname;
  };
  std::vector<Peer> peers_;
  GroupPeers group_;  // the group's ranks in the job and their published exits
  int rank_ = 0;
  int size_ = 0;
  // By group rank: the steady clock when its published exit was first seen (0: not yet).
  std::unique_ptr<std::atomic<int64_t>[]> exit_seen_ns_;
};

}  // namespace ddp::detail
