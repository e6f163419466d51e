#include "transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "../group_memory.hpp"
#include "../backend.hpp"
#include "../peer_watch.hpp"
#include "ddp/contract/store_keys.hpp"
#include "ddp/contract/worker_env.hpp"
#include "reduce.hpp"

namespace ddp::cpu {
namespace {

constexpr uint32_t kHelloMagic = 0x64647031;  // "ddp1"
constexpr size_t kRingBudgetBytes = 8 << 20;
constexpr size_t kMinRingBytes = 256 << 10;
constexpr size_t kMaxRingBytes = 4 << 20;
constexpr int kSocketBufferBytes = 4 << 20;
constexpr size_t kStagingBytes = Transport::staging_bytes();
constexpr auto kHealthEvery = std::chrono::milliseconds(10);
constexpr auto kSleepSlice = std::chrono::milliseconds(20);

[[noreturn]] void fail(const std::string& what) { throw Error("process group: " + what); }
[[noreturn]] void fail_errno(const std::string& what) { fail(what + ": " + std::strerror(errno)); }

// Ranks with the same key share /dev/shm, can open each other's pidfds and so
// count as one host.
std::string host_key(int rank) {
  if (contract::CommSettings::from_environment().disable_shm) return std::string("rank-") + std::to_string(rank);
  return detail::host_identity();
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

int ms_until(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1000000));
}

void tune_socket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int bytes = kSocketBufferBytes;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Reads or writes exactly n bytes on a non-blocking socket before the deadline.
bool io_exact(int fd, void* p, size_t n, bool write, Clock::time_point deadline) {
  auto* b = static_cast<char*>(p);
  size_t done = 0;
  while (done < n) {
    ssize_t r = write ? ::send(fd, b + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                      : ::recv(fd, b + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    if (::poll(&pfd, 1, ms_until(deadline)) <= 0) return false;
  }
  return true;
}

// A known value at a known address: peers read it with process_vm_readv to learn
// whether single-copy reads are allowed (ptrace policy, seccomp, containers).
const volatile uint64_t kCmaProbe = 0x646470636d617631ull;  // "ddpcmav1"

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t group_id;
};

uint64_t random_u64() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace

Clock::time_point deadline_after(Millis timeout) {
  const auto now = Clock::now();
  const auto room = std::chrono::duration_cast<Millis>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

// ---------------------------------------------------------------------------
// Forming the mesh
// ---------------------------------------------------------------------------

Transport::Transport(rdzv::Store& store, int rank, int size, const TransportOptions& options)
    : rank_(rank), size_(size), options_(options) {
  const auto deadline = deadline_after(options.connect_timeout);
  const auto store_timeout = options.connect_timeout;
  channels_.resize(size);
  pid_fds_.assign(size, -1);
  headers_.assign(size, nullptr);

  // A listener for peers on other hosts, on every interface; peers are told the
  // address that reaches the store.
  int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) fail_errno("socket");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } listen_closer{listen_fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) fail_errno("bind");
  if (::listen(listen_fd, SOMAXCONN) < 0) fail_errno("listen");
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  set_nonblocking(listen_fd);

  // Publish who we are; read everyone.
  const uint64_t my_group_id = random_u64();
  std::ostringstream info;
  info << host_key(rank) << '\n'
       << ::getpid() << '\n'
       << options.advertise_host << ':' << ntohs(addr.sin_port) << '\n'
       << "/ddp-" << std::hex << random_u64() << std::dec << "-" << rank << '\n'
       << hostname() << '\n'
       << my_group_id << '\n'
       << reinterpret_cast<uintptr_t>(&kCmaProbe) << '\n';
  const std::vector<std::string> infos = detail::exchange_all(store, contract::group_keys::exchange(contract::group_keys::kInfo), rank, size, info.str(), store_timeout);
  std::vector<std::string> host_keys(size);
  std::vector<uint64_t> probe_addrs(size);
  pids_.resize(size);
  endpoints_.resize(size);
  shm_names_.resize(size);
  hostnames_.resize(size);
  uint64_t group_id = 0;
  for (int r = 0; r < size; ++r) {
    std::istringstream in(infos[r]);
    std::string pid, gid, probe;
    std::getline(in, host_keys[r]);
    std::getline(in, pid);
    std::getline(in, endpoints_[r]);
    std::getline(in, shm_names_[r]);
    std::getline(in, hostnames_[r]);
    std::getline(in, gid);
    std::getline(in, probe);
    if (!in) fail(std::string("malformed peer record of rank ") + std::to_string(r));
    probe_addrs[r] = std::strtoull(probe.c_str(), nullptr, 10);
    pids_[r] = std::atoi(pid.c_str());
    if (r == 0) group_id = std::strtoull(gid.c_str(), nullptr, 10);
  }
  host_of_.assign(size, -1);
  for (int r = 0; r < size; ++r) {
    if (host_of_[r] >= 0) continue;
    host_of_[r] = static_cast<int>(hosts_.size());
    hosts_.push_back({r});
    for (int q = r + 1; q < size; ++q) {
      if (host_keys[q] == host_keys[r]) {
        host_of_[q] = host_of_[r];
        hosts_.back().push_back(q);
      }
    }
  }

  const long env_spin = contract::CommSettings::from_environment().spin_us;
  long spin_us = options.spin_us >= 0 ? options.spin_us : env_spin;
  if (spin_us < 0) spin_us = static_cast<int>(hosts_[host_of_[rank]].size()) <= online_cpus() ? 50 : 0;
  spin_ns_ = spin_us * 1000;

  try {
    form_shm(store, deadline);
    probe_cma(store, probe_addrs, deadline);
    form_tcp(listen_fd, group_id, deadline);
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void Transport::form_shm(rdzv::Store& store, Clock::time_point deadline) {
  const auto& local = hosts_[host_of_[rank_]];
  if (local.size() < 2) return;
  const auto store_timeout = std::chrono::duration_cast<rdzv::Millis>(deadline - Clock::now());
  size_t ring = options_.ring_bytes;
  if (ring == 0) ring = contract::CommSettings::from_environment().shm_ring_bytes;
  if (ring == 0) {
    // A budget per rank, shared by its peers' rings: big rings (fewer waits for
    // space) with few local peers, bounded /dev/shm use with many.
    ring = std::clamp<size_t>(kRingBudgetBytes / (local.size() - 1), kMinRingBytes, kMaxRingBytes);
  }
  ring = std::max<size_t>(4096, (ring + 63) & ~size_t{63});
  const size_t n = local.size();
  const size_t ctl_offset = 4096;
  const size_t data_offset = ctl_offset + ((n * sizeof(RingControl) + 4095) & ~size_t{4095});
  const size_t staging_offset = data_offset + ((n * ring + 4095) & ~size_t{4095});
  const size_t bytes = staging_offset + kStagingBytes;
  auto local_index = [&](int r) { return static_cast<size_t>(std::find(local.begin(), local.end(), r) - local.begin()); };

  auto map = [&](const std::string& name, bool create) -> std::byte* {
    int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600)
                    : ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) fail_errno("shm_open " + name);
    if (create) {
      my_segment_linked_ = true;
      if (::ftruncate(fd, static_cast<off_t>(bytes)) < 0) {
        ::close(fd);
        fail_errno("ftruncate " + name + " (is /dev/shm large enough?)");
      }
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail_errno("mmap " + name);
    mappings_.emplace_back(p, bytes);
    return static_cast<std::byte*>(p);
  };

  std::vector<std::byte*> base(size_, nullptr);
  base[rank_] = map(shm_names_[rank_], true);
  my_header_ = new (base[rank_]) SegmentHeader{};
  my_header_->pid = ::getpid();
  my_header_->rings = static_cast<uint32_t>(n);
  my_header_->ring_bytes = ring;
  for (size_t i = 0; i < n; ++i) new (base[rank_] + ctl_offset + i * sizeof(RingControl)) RingControl{};
  headers_[rank_] = my_header_;
  store.set(contract::group_keys::record(contract::group_keys::kShmReady, rank_), "1");

  std::vector<std::string> ready, mapped;
  for (int r : local) {
    if (r == rank_) continue;
    ready.push_back(contract::group_keys::record(contract::group_keys::kShmReady, r));
    mapped.push_back(contract::group_keys::record(contract::group_keys::kShmMapped, r));
  }
  store.wait(ready, store_timeout);
  for (int r : local) {
    if (r == rank_) continue;
    base[r] = map(shm_names_[r], false);
    headers_[r] = reinterpret_cast<SegmentHeader*>(base[r]);
    if (headers_[r]->ring_bytes != ring || headers_[r]->rings != n) {
      fail("shared-memory layout of " + describe(r) + " differs from ours (is DDP_SHM_RING_BYTES the same for every rank?)");
    }
    pid_fds_[r] = static_cast<int>(::syscall(SYS_pidfd_open, pids_[r], 0));
  }
  store.set(contract::group_keys::record(contract::group_keys::kShmMapped, rank_), "1");
  store.wait(mapped, store_timeout);
  // Everyone holds a mapping now: the name can go, and nothing is left behind in
  // /dev/shm however the job ends.
  ::shm_unlink(shm_names_[rank_].c_str());
  my_segment_linked_ = false;

  staging_.assign(static_cast<size_t>(size_), nullptr);
  for (int r : local) staging_[static_cast<size_t>(r)] = base[r] + staging_offset;
  const size_t me = local_index(rank_);
  for (int r : local) {
    if (r == rank_) continue;
    const size_t them = local_index(r);
    auto* send_ctl = reinterpret_cast<RingControl*>(base[r] + ctl_offset + me * sizeof(RingControl));
    auto* send_data = base[r] + data_offset + me * ring;
    auto* recv_ctl = reinterpret_cast<RingControl*>(base[rank_] + ctl_offset + them * sizeof(RingControl));
    auto* recv_data = base[rank_] + data_offset + them * ring;
    channels_[r] = std::make_unique<ShmChannel>(r, pid_fds_[r], headers_[r], send_ctl, send_data, recv_ctl,
                                                recv_data, ring);
  }
}

void Transport::probe_cma(rdzv::Store& store, const std::vector<uint64_t>& probe_addrs, Clock::time_point deadline) {
  const auto& local = hosts_[host_of_[rank_]];
  if (local.size() < 2 || contract::CommSettings::from_environment().disable_cma) return;
  bool ok = true;
  for (int r : local) {
    if (r == rank_) continue;
    uint64_t value = 0;
    iovec l{&value, sizeof(value)}, rem{reinterpret_cast<void*>(probe_addrs[r]), sizeof(value)};
    ok &= ::process_vm_readv(pids_[r], &l, 1, &rem, 1, 0) == static_cast<ssize_t>(sizeof(value)) &&
          value == kCmaProbe;
  }
  // Every rank of the host must choose the same algorithm: all or none.
  store.set(contract::group_keys::record(contract::group_keys::kCma, rank_), ok ? "1" : "0");
  std::vector<std::string> keys;
  for (int r : local) keys.push_back(contract::group_keys::record(contract::group_keys::kCma, r));
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  bool all = true;
  for (const auto& v : store.multi_get(keys, std::max(left, Millis(1)))) all &= v == "1";
  cma_ = all;
}

void Transport::read_peer(int peer, uint64_t remote, void* local, size_t bytes) {
  copy_peer(peer, remote, static_cast<std::byte*>(local), bytes, false);
}

void Transport::write_peer(int peer, uint64_t remote, const void* local, size_t bytes) {
  copy_peer(peer, remote, static_cast<std::byte*>(const_cast<void*>(local)), bytes, true);
}

void Transport::copy_peer(int peer, uint64_t remote, std::byte* local, size_t bytes, bool write) {
  while (bytes > 0) {
    iovec l{local, bytes}, rem{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = write ? ::process_vm_writev(pids_[peer], &l, 1, &rem, 1, 0)
                            : ::process_vm_readv(pids_[peer], &l, 1, &rem, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const char* what = write ? "writing" : "reading";
      throw PeerLost{peer, n < 0 ? std::string(what) + " its memory failed: " + std::strerror(errno)
                                 : std::string(what) + " its memory moved nothing"};
    }
    local += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

// ---------------------------------------------------------------------------
// Shared regions
// ---------------------------------------------------------------------------

std::unique_ptr<GroupMemory> Transport::share_memory(size_t bytes, Clock::time_point deadline) {
  const size_t mapped = detail::page_rounded(bytes);
  const uint64_t id = ++regions_made_;  // the same sequence on every rank
  const auto& local = hosts_[host_of_[rank_]];
  if (!cma_ || local.size() < 2) {  // nobody to share with, or no permission to
    return std::make_unique<detail::MappedMemory>(detail::map_private(mapped), mapped, bytes, false);
  }
  if (peer_regions_.empty()) peer_regions_.resize(static_cast<size_t>(size_));

  // Undone on every way out but success (a peer may die in the exchanges below):
  // our mappings go, and the freed ids we meant to report wait for the next time.
  struct Pending {
    int fd = -1;
    std::byte* data = nullptr;
    size_t mapped = 0;
    std::map<int, PeerRegion> views;
    std::vector<uint64_t> freed;
    std::shared_ptr<OwnRegions> regions;
    ~Pending() {
      if (fd >= 0) ::close(fd);
      if (data) ::munmap(data, mapped);
      for (auto& [r, v] : views) ::munmap(v.here, v.bytes);
      if (!freed.empty()) {
        std::lock_guard lock(regions->mu);
        regions->freed.insert(regions->freed.end(), freed.begin(), freed.end());
      }
    }
  } pending;
  pending.mapped = mapped;
  pending.regions = own_regions_;

  // This rank's pages: a memfd, so peers can map the very same pages.
  struct Offer {
    int64_t fd = -1;
    uint64_t id = 0;
    uint64_t base = 0;
    uint64_t bytes = 0;
    uint64_t freed = 0;  // ids this rank freed since its last offer follow in the second round
  };
  Offer mine;
  std::vector<uint64_t>& freed = pending.freed;
  {
    std::lock_guard lock(own_regions_->mu);
    freed.swap(own_regions_->freed);
  }
  mine.freed = freed.size();
  pending.fd = ::memfd_create("ddp-shared", MFD_CLOEXEC);
  if (pending.fd >= 0 && ::ftruncate(pending.fd, static_cast<off_t>(mapped)) == 0) {
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, pending.fd, 0);
    if (p != MAP_FAILED) pending.data = static_cast<std::byte*>(p);
  }
  // Out of memory is only reported after both rounds, so peers are not left waiting.
  std::exception_ptr no_memory;
  if (pending.data) {
    mine = Offer{pending.fd, id, reinterpret_cast<uintptr_t>(pending.data), mapped, mine.freed};
  } else {
    try {
      pending.data = detail::map_private(mapped);
    } catch (const Error&) {
      no_memory = std::current_exception();
    }
  }

  // Offers out; map what peers offer; then agree, so every rank of the host makes
  // the same choice (all shared or none).
  std::vector<Offer> offers(static_cast<size_t>(size_));
  std::vector<Xfer> xs;
  for (int r : local) {
    if (r == rank_) continue;
    xs.push_back(Xfer::send(r, &mine, sizeof(mine)));
    xs.push_back(Xfer::recv(r, &offers[static_cast<size_t>(r)], sizeof(Offer)));
  }
  run(std::span<Xfer>(xs), deadline);
  uint8_t ok = mine.fd >= 0;
  for (int r : local) {
    const Offer& o = offers[static_cast<size_t>(r)];
    if (r == rank_ || !ok) continue;
    if (o.fd < 0 || o.id != id || o.bytes == 0) {
      ok = 0;
      continue;
    }
    const int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, pid_fds_[r], static_cast<int>(o.fd), 0));
    void* p = dup < 0 ? MAP_FAILED : ::mmap(nullptr, o.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, dup, 0);
    if (dup >= 0) ::close(dup);
    if (p == MAP_FAILED) ok = 0;
    else pending.views[r] = PeerRegion{o.base, o.bytes, static_cast<std::byte*>(p)};
  }
  // Second round: the verdicts, and the regions peers have freed (their pages go
  // once our mappings of them go: this bounds what a freed region costs the host
  // to the time until the next allocate).
  std::vector<uint8_t> verdicts(static_cast<size_t>(size_), 0);
  std::vector<std::vector<uint64_t>> their_freed(static_cast<size_t>(size_));
  xs.clear();
  for (int r : local) {
    if (r == rank_) continue;
    auto& theirs = their_freed[static_cast<size_t>(r)];
    theirs.resize(std::min<uint64_t>(offers[static_cast<size_t>(r)].freed, regions_made_));
    xs.push_back(Xfer::send(r, &ok, 1));
    xs.push_back(Xfer::recv(r, &verdicts[static_cast<size_t>(r)], 1));
    if (!freed.empty()) xs.push_back(Xfer::send(r, freed.data(), freed.size() * sizeof(uint64_t)));
    if (!theirs.empty()) xs.push_back(Xfer::recv(r, theirs.data(), theirs.size() * sizeof(uint64_t)));
  }
  run(std::span<Xfer>(xs), deadline);
  freed.clear();  // reported
  for (int r : local) {
    if (r == rank_) continue;
    auto& regions = peer_regions_[static_cast<size_t>(r)];
    for (uint64_t gone : their_freed[static_cast<size_t>(r)]) {
      if (auto it = regions.find(gone); it != regions.end()) {
        ::munmap(it->second.here, it->second.bytes);
        regions.erase(it);
      }
    }
  }
  // Every peer has mapped our pages or given up: they live on in the mappings.
  if (pending.fd >= 0) ::close(std::exchange(pending.fd, -1));
  if (no_memory) std::rethrow_exception(no_memory);
  bool all = ok;
  for (int r : local) all &= r == rank_ || verdicts[static_cast<size_t>(r)] != 0;
  std::byte* data = std::exchange(pending.data, nullptr);
  if (!all) return std::make_unique<detail::MappedMemory>(data, mapped, bytes, false);
  for (auto& [r, v] : pending.views) peer_regions_[static_cast<size_t>(r)][id] = v;
  pending.views.clear();
  {
    std::lock_guard lock(own_regions_->mu);
    own_regions_->live[id] = {reinterpret_cast<uintptr_t>(data), mapped};
  }
  return std::make_unique<detail::MappedMemory>(data, mapped, bytes, true, [regions = own_regions_, id] {
    std::lock_guard lock(regions->mu);
    regions->live.erase(id);
    regions->freed.push_back(id);
  });
}

uint64_t Transport::shared_region_of(const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(own_regions_->mu);
  for (const auto& [id, region] : own_regions_->live) {
    if (at >= region.first && bytes <= region.second && at - region.first <= region.second - bytes) return id;
  }
  return 0;
}

std::byte* Transport::peer_view(int peer, uint64_t id, uint64_t remote, size_t bytes) const {
  if (id == 0 || static_cast<size_t>(peer) >= peer_regions_.size()) return nullptr;
  const auto& regions = peer_regions_[static_cast<size_t>(peer)];
  auto it = regions.find(id);
  if (it == regions.end()) return nullptr;
  const PeerRegion& v = it->second;
  if (remote < v.base || bytes > v.bytes || remote - v.base > v.bytes - bytes) return nullptr;
  return v.here + (remote - v.base);
}

void Transport::form_tcp(int listen_fd, uint64_t group_id, Clock::time_point deadline) {
  int expected_accepts = 0;
  for (int r = 0; r < size_; ++r) {
    if (host_of_[r] == host_of_[rank_]) continue;
    if (r > rank_) {
      ++expected_accepts;
      continue;
    }
    // Connect to the lower rank's listener.
    const std::string& ep = endpoints_[r];
    const auto colon = ep.rfind(':');
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(ep.substr(0, colon).c_str(), ep.substr(colon + 1).c_str(), &hints, &res) != 0 || !res) {
      fail("cannot resolve " + describe(r) + " at " + ep);
    }
    int fd = -1;
    for (;;) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
      if (rc < 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int err = 0;
        socklen_t elen = sizeof(err);
        if (::poll(&p, 1, ms_until(deadline)) > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 &&
            err == 0) {
          rc = 0;
        } else {
          errno = err ? err : ETIMEDOUT;
        }
      }
      if (rc == 0) break;
      const int saved = errno;
      ::close(fd);
      if (Clock::now() >= deadline) {
        ::freeaddrinfo(res);
        errno = saved;
        fail_errno("cannot connect to " + describe(r) + " at " + ep);
      }
      ::usleep(20000);  // a listener that is still coming up (a backlog overflow)
    }
    ::freeaddrinfo(res);
    tune_socket(fd);
    Hello hello{kHelloMagic, rank_, group_id};
    if (!io_exact(fd, &hello, sizeof(hello), true, deadline)) {
      ::close(fd);
      fail("handshake with " + describe(r) + " failed");
    }
    channels_[r] = std::make_unique<TcpChannel>(r, fd);
  }
  while (expected_accepts > 0) {
    pollfd p{listen_fd, POLLIN, 0};
    if (Clock::now() >= deadline || ::poll(&p, 1, ms_until(deadline)) <= 0) {
      std::string missing;
      for (int r = rank_ + 1; r < size_; ++r)
        if (host_of_[r] != host_of_[rank_] && !channels_[r]) missing += std::string(" ") + std::to_string(r);
      fail(std::string("ranks") + missing + " did not connect in time");
    }
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      fail_errno("accept");
    }
    Hello hello{};
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!io_exact(fd, &hello, sizeof(hello), false, hello_deadline) || hello.magic != kHelloMagic ||
        hello.group_id != group_id || hello.rank <= rank_ || hello.rank >= size_ ||
        host_of_[hello.rank] == host_of_[rank_] || channels_[hello.rank]) {
      ::close(fd);  // not one of ours (a stray client, another group)
      continue;
    }
    tune_socket(fd);
    channels_[hello.rank] = std::make_unique<TcpChannel>(hello.rank, fd);
    --expected_accepts;
  }
}

Transport::~Transport() { release(); }

void Transport::release() {
  channels_.clear();
  for (int& fd : pid_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (my_segment_linked_) ::shm_unlink(shm_names_[rank_].c_str());
  my_segment_linked_ = false;
  for (auto& [p, n] : mappings_) ::munmap(p, n);
  mappings_.clear();
  staging_.clear();
  for (auto& regions : peer_regions_)
    for (auto& [id, v] : regions) ::munmap(v.here, v.bytes);
  peer_regions_.clear();
  my_header_ = nullptr;
}

std::string Transport::describe(int r) const {
  if (r < 0 || r >= size_ || pids_.empty()) return std::string("rank ") + std::to_string(r);
  return std::string("rank ") + std::to_string(r) + std::string(" (pid ") + std::to_string(pids_[r]) + " on " + hostnames_[r] + ")";
}

// ---------------------------------------------------------------------------
// Progress
// ---------------------------------------------------------------------------

bool Transport::step(Xfer& x) {
  Channel& ch = *channels_[x.peer];
  bool moved = false;
  // Pieces of at most a quarter ring let both sides work at once on a big message.
  constexpr size_t kPiece = 256 * 1024;
  switch (x.kind) {
    case Xfer::Kind::Send: {
      size_t n = ch.write_some(x.src + x.done, std::min(kPiece, x.bytes - x.done));
      x.done += n;
      moved = n > 0;
      break;
    }
    case Xfer::Kind::Recv: {
      size_t n = ch.read_some(x.dst + x.done, std::min(kPiece, x.bytes - x.done));
      x.done += n;
      moved = n > 0;
      break;
    }
    case Xfer::Kind::RecvReduce: {
      const size_t esz = dtype_size(x.dtype);
      auto span = ch.peek(std::min(kPiece, x.bytes - x.done));
      const size_t whole = span.size() / esz * esz;
      if (whole > 0) {
        reduce_inplace(x.dtype, x.op, x.dst + x.done, span.data(), whole / esz);
        ch.consume(whole);
        x.done += whole;
        moved = true;
      }
      break;
    }
  }
  if (x.done == x.bytes && !x.closed) {
    if (x.kind == Xfer::Kind::Send) ch.end_send();
    else ch.end_recv();
    x.closed = true;
    moved = true;
  }
  return moved;
}

void Transport::run(std::span<Xfer> xfers, Clock::time_point deadline) {
  if (poisoned_) throw PeerLost{-1, "the group is broken"};
  bool spinning = false;
  Clock::time_point spin_until{};
  for (;;) {
    const uint32_t bell = my_header_ ? my_header_->doorbell.load(std::memory_order_acquire) : 0;
    bool progressed = false;
    bool all_done = true;
    for (auto& x : xfers) {
      if (x.closed) continue;
      progressed |= step(x);
      all_done &= x.closed;
    }
    if (all_done) return;
    if (progressed) {
      spinning = false;
      continue;
    }
    const auto now = Clock::now();
    if (!spinning) {
      spinning = true;
      spin_until = now + std::chrono::nanoseconds(spin_ns_);
    }
    if (now < spin_until) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
      continue;
    }
    if (now >= next_health_check_) {
      check_health(xfers, deadline);
      next_health_check_ = now + kHealthEvery;
    }
    sleep(xfers, bell);
  }
}

void Transport::sleep(std::span<Xfer> xfers, uint32_t bell) {
  bool shm = false;
  std::vector<pollfd> fds;
  for (auto& x : xfers) {
    if (x.closed) continue;
    const int fd = channels_[x.peer]->fd();
    if (fd < 0) {
      shm = true;
    } else {
      fds.push_back(pollfd{fd, static_cast<short>(x.kind == Xfer::Kind::Send ? POLLOUT : POLLIN), 0});
    }
  }
  if (shm) {
    // Sleep on our doorbell; with sockets pending too, only briefly, then poll them.
    const auto slice = fds.empty() ? kSleepSlice : std::chrono::milliseconds(1);
    timespec ts{0, static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count())};
    my_header_->sleeping.store(1, std::memory_order_seq_cst);
    if (my_header_->doorbell.load(std::memory_order_seq_cst) == bell) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&my_header_->doorbell), FUTEX_WAIT, bell, &ts, nullptr, 0);
    }
    my_header_->sleeping.store(0, std::memory_order_relaxed);
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 0);
  } else if (!fds.empty()) {
    ::poll(fds.data(), fds.size(), static_cast<int>(kSleepSlice.count()));
  }
}

void Transport::interrupt() {
  interrupted_.store(true);
  if (my_header_) ring_doorbell(my_header_);
}

void Transport::check_health(std::span<Xfer> xfers, Clock::time_point deadline) {
  if (interrupted_.load()) throw PeerLost{-1, "aborted"};
  // A local peer that saw a failure first says whom it blames.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !headers_[r]) continue;
    const int blamed = headers_[r]->failed.load(std::memory_order_acquire);
    if (blamed != 0) throw PeerLost{blamed - 1, "reported by " + describe(r)};
  }
  // The peers we wait on: has one died or hung up?
  for (auto& x : xfers) {
    if (x.closed) continue;
    if (channels_[x.peer]->peer_gone()) {
      throw PeerLost{x.peer, channels_[x.peer]->fd() < 0 ? "process exited" : "connection closed"};
    }
  }
  if (Clock::now() >= deadline) {
    StuckTimeout t;
    for (auto& x : xfers)
      if (!x.closed && std::find(t.waiting_for.begin(), t.waiting_for.end(), x.peer) == t.waiting_for.end())
        t.waiting_for.push_back(x.peer);
    throw t;
  }
}

void Transport::poison(int blamed) {
  if (poisoned_) return;
  poisoned_ = true;
  if (my_header_ && blamed >= 0) {
    int expected = 0;
    my_header_->failed.compare_exchange_strong(expected, blamed + 1);
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && headers_[r]) ring_doorbell(headers_[r]);
  }
  for (auto& ch : channels_)
    if (ch && ch->fd() >= 0) ::shutdown(ch->fd(), SHUT_RDWR);
}

}  // namespace ddp::cpu
