// The CPU transport's mesh: forms a channel to every other rank of a group
// (shared-memory rings within a host, TCP across hosts) and owns what it made:
// the channels, the host layout, the shared-memory segments and the peers'
// pidfds. See transport.hpp for the terms.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "channel.hpp"
#include "ddp/types.hpp"
#include "deadline.hpp"
#include "../group_peers.hpp"
#include "peer_memory.hpp"
#include "rdzv/store.hpp"

namespace ddp::cpu {

struct MeshOptions {
  std::string advertise_host = "127.0.0.1";  // address peers on other hosts connect to
  std::string bind_host;  // the one IPv4 address to listen on (DDP_SOCKET_IFNAME); empty: every interface
  Millis connect_timeout{300000};
  size_t ring_bytes = 0;  // per shared-memory ring; 0: DDP_SHM_RING_BYTES, or 8 MiB / local peers in [256 KiB, 4 MiB]
  detail::GroupPeers peers;  // the ranks in the job: formation and transfers fail at once on a published exit
};

class Mesh {
 public:
  // Forms the mesh through `store` (keys info/<rank>, shm/<rank>...). Every rank
  // of the group calls it. Throws Error (with the store's reason) on failure.
  Mesh(rdzv::Store& store, int rank, int size, const MeshOptions& options);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Hosts in order of their lowest rank; host_of(r) indexes it.
  const std::vector<std::vector<int>>& hosts() const { return hosts_; }
  int host_of(int r) const { return host_of_[r]; }
  // The ranks of this rank's host, itself included, in rank order.
  const std::vector<int>& local() const { return hosts_[host_of_[rank_]]; }
  std::string describe(int r) const;  // group rank r as "rank 3 (pid 123 on node-b)", 3 its global rank
  const detail::GroupPeers& peers() const { return options_.peers; }

  // The channel to rank r (null for this rank).
  Channel* channel(int r) const { return channels_[r].get(); }
  // Local rank r's segment header (null for ranks elsewhere or a host of one).
  SegmentHeader* segment(int r) const { return headers_[r]; }
  // A pidfd of local peer r (-1 for ranks elsewhere).
  int pid_fd(int r) const { return pid_fds_[r]; }
  // Single-copy access to local peers' memory.
  const PeerMemory& peer_memory() const { return peer_memory_; }

  // Local rank r's staging area in its shared-memory segment (staging_bytes() long,
  // mapped by every rank of the host; null for ranks elsewhere or a host of one):
  // where large all-reduces of ordinary buffers meet, piece by piece.
  std::byte* staging(int r) const {
    return static_cast<size_t>(r) < staging_.size() ? staging_[static_cast<size_t>(r)] : nullptr;
  }
  static constexpr size_t staging_bytes() { return size_t{1} << 20; }

 private:
  void form_shm(rdzv::Store& store, Clock::time_point deadline);
  void probe_cma(rdzv::Store& store, const std::vector<uint64_t>& probe_addrs, Clock::time_point deadline);
  void form_tcp(int listen_fd, uint64_t group_id, Clock::time_point deadline);
  // Accepts one connection on `listen_fd`: true when it is a peer of this group that
  // was still to connect (its channel is made), false for anything else.
  bool accept_peer(int listen_fd, uint64_t group_id, Clock::time_point deadline);
  void release();

  int rank_;
  int size_;
  MeshOptions options_;
  std::vector<std::unique_ptr<Channel>> channels_;  // by group rank; null for self
  std::vector<int> host_of_;
  std::vector<std::vector<int>> hosts_;
  std::vector<int> pids_;
  std::vector<std::string> hostnames_;
  std::vector<std::string> endpoints_;   // host:port of each rank's listener
  std::vector<std::string> shm_names_;
  std::vector<int> pid_fds_;             // local peers (-1 elsewhere)
  std::vector<std::pair<void*, size_t>> mappings_;
  std::vector<SegmentHeader*> headers_;  // local ranks' segment headers (null elsewhere)
  std::vector<std::byte*> staging_;      // by group rank (null elsewhere)
  bool my_segment_linked_ = false;
  PeerMemory peer_memory_;
};

}  // namespace ddp::cpu
