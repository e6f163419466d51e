#include "peer_watch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "ddp/contract/store_keys.hpp"
#include "group_setup.hpp"
#include "ddp/types.hpp"

namespace ddp::detail {

std::string host_identity() {
  std::string key;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> key;
  for (const char* ns : {"/proc/self/ns/mnt", "/proc/self/ns/pid", "/proc/self/ns/ipc"}) {
    struct stat st {};
    if (::stat(ns, &st) != 0) continue;
    key += '/';
    key += std::to_string(st.st_ino);
  }
  return key;
}

std::string PeerWatch::record_of(int pid) {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return host_identity() + "\n" + std::to_string(pid) + "\n" + name;
}

PeerWatch::PeerWatch(rdzv::Store& store, int rank, int size, Millis timeout, GroupPeers peers)
    : group_(std::move(peers)), rank_(rank), size_(size),
      exit_seen_ns_(new std::atomic<int64_t>[static_cast<size_t>(std::max(size, 1))]()) {
  const auto records = exchange_all(store, contract::group_keys::exchange(contract::group_keys::kWatch), rank, size,
                                    record_of(static_cast<int>(::getpid())), timeout, group_);
  const std::string here = host_identity();
  try {
    watch_local_peers(records, rank, here);
  } catch (...) {
    close_all();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void PeerWatch::watch_local_peers(const std::vector<std::string>& records, int rank, const std::string& here) {
  peers_.reserve(records.size());  // push_back cannot throw once a pidfd is open
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    if (r == rank) continue;
    std::istringstream in(records[static_cast<size_t>(r)]);
    std::string host, pid_text, hostname;
    std::getline(in, host);
    std::getline(in, pid_text);
    std::getline(in, hostname);
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (!in || pid_text.empty() || *end != '\0' || pid <= 0) {
      throw Error("process group: malformed peer record of rank " + std::to_string(r));
    }
    if (host != here) continue;  // its pid means nothing here
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    // ESRCH: it has exited already. Other failures (a kernel without pidfds): not watched.
    if (fd < 0 && errno != ESRCH) continue;
    peers_.push_back(Peer{r, static_cast<int>(pid), fd, fd < 0, hostname});
  }
}

PeerWatch::~PeerWatch() { close_all(); }

void PeerWatch::close_all() {
  for (const Peer& p : peers_)
    if (p.fd >= 0) ::close(p.fd);
  peers_.clear();
}

// A peer whose exit is known (its pidfd fired, or ddprun published it) for kExitGrace:
// an exit may come right after the peer's part of an operation that is still finishing
// here. The grace runs per rank, from when this watch first saw that rank's exit.
bool PeerWatch::past_grace(int rank) const {
  constexpr int64_t kExitGraceNs = 300'000'000;
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t seen = 0;
  std::atomic<int64_t>& first = exit_seen_ns_[static_cast<size_t>(rank)];
  if (first.compare_exchange_strong(seen, now)) seen = now;
  return now - seen >= kExitGraceNs;
}

int PeerWatch::published_exit(int only) const {
  if (!group_.exits || group_.exits->generation() == 0) return -1;
  const int begin = only >= 0 ? only : 0;
  const int end = only >= 0 ? std::min(only + 1, size_) : size_;
  for (int r = begin; r < end; ++r) {
    if (r == rank_ || !group_.exits->exited(group_.global(r))) continue;
    if (past_grace(r)) return r;
  }
  return -1;
}

std::string PeerWatch::how_gone(int rank) const {
  if (const auto exit = group_.exit_of(rank)) return exit->describe() + ", while this rank waits for it";
  return "peer " + describe(rank) + " exited";
}

int PeerWatch::dead_peer(int only) const {
  if (peers_.empty()) return published_exit(only);
  std::vector<pollfd> fds;
  fds.reserve(peers_.size());
  for (const Peer& p : peers_) {
    if (only >= 0 && p.rank != only) continue;
    if (p.gone) return p.rank;
    fds.push_back(pollfd{p.fd, POLLIN, 0});
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    for (const pollfd& f : fds) {
      if (f.revents == 0) continue;
      // The same grace as a published exit: a peer may exit right after its part of
      // an operation whose end this rank has not seen yet.
      for (const Peer& p : peers_)
        if (p.fd == f.fd && past_grace(p.rank)) return p.rank;
    }
  }
  return published_exit(only);
}

// By global rank: in a subgroup its own rank numbers would name another process
// (global rank 1 told "rank 1 exited" reads as if it had died itself).
std::string PeerWatch::describe(int rank) const {
  const int global = group_.global(rank);
  std::string in_group = global != rank ? "group rank " + std::to_string(rank) : "";
  for (const Peer& p : peers_) {
    if (p.rank != rank) continue;
    return "rank " + std::to_string(global) + " (" + (in_group.empty() ? "" : in_group + ", ") + "pid " +
           std::to_string(p.pid) + " on " + p.hostname + ")";
  }
  return "rank " + std::to_string(global) + (in_group.empty() ? "" : " (" + in_group + ")");
}

std::shared_ptr<PeerWatch> PeerWatch::narrow(const std::vector<int>& ranks) const {
  std::shared_ptr<PeerWatch> sub(new PeerWatch());
  sub->group_ = group_.narrow(ranks);
  sub->size_ = static_cast<int>(ranks.size());
  sub->exit_seen_ns_.reset(new std::atomic<int64_t>[std::max<size_t>(ranks.size(), 1)]());
  sub->rank_ = -1;  // this rank's place in the subgroup: set below when a member
  for (size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == rank_) sub->rank_ = static_cast<int>(i);
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (const Peer& p : peers_) {
      if (p.rank != ranks[i]) continue;
      const int fd = p.fd >= 0 ? ::fcntl(p.fd, F_DUPFD_CLOEXEC, 0) : -1;  // not inherited by exec
      if (p.fd >= 0 && fd < 0) continue;  // out of descriptors: that peer goes unwatched
      sub->peers_.push_back(Peer{static_cast<int>(i), p.pid, fd, p.gone, p.hostname});
    }
  }
  return sub;
}

}  // namespace ddp::detail
