// Forming the CPU transport's mesh (see mesh.hpp): every rank publishes who it is
// through the store, ranks that share a host map each other's shared-memory
// segments and probe single-copy access, and ranks on different hosts connect
// over TCP.
#include "mesh.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "../group_setup.hpp"
#include "../peer_watch.hpp"
#include "ddp/contract/store_keys.hpp"
#include "rdzv/waiting.hpp"
#include "ddp/contract/worker_env.hpp"

namespace ddp::cpu {
namespace {

constexpr uint32_t kHelloMagic = 0x64647031;  // "ddp1"
constexpr size_t kRingBudgetBytes = 8 << 20;
constexpr size_t kMinRingBytes = 256 << 10;
constexpr size_t kMaxRingBytes = 4 << 20;
constexpr int kSocketBufferBytes = 4 << 20;
constexpr size_t kStagingBytes = Mesh::staging_bytes();

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

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t group_id;
};

uint64_t random_u64() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

// One try at a TCP connection to `to` within `budget`: the socket, or -1 with the
// reason in `why`.
int try_connect(const addrinfo& to, Millis budget, std::string& why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  int err = ::connect(fd, to.ai_addr, to.ai_addrlen) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    socklen_t len = sizeof(err);
    err = ETIMEDOUT;
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(budget.count(), 1000000))) > 0) {
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
  }
  if (err == 0) return fd;
  why = std::strerror(err);
  ::close(fd);
  return -1;
}

}  // namespace

Mesh::Mesh(rdzv::Store& store, int rank, int size, const MeshOptions& options)
    : rank_(rank), size_(size), options_(options) {
  const auto deadline = deadline_after(options.connect_timeout);
  const auto store_timeout = options.connect_timeout;
  channels_.resize(size);
  pid_fds_.assign(size, -1);
  headers_.assign(size, nullptr);

  // A listener for peers on other hosts: on the interface DDP_SOCKET_IFNAME chose,
  // else on every interface; peers are told the address it advertises.
  int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd < 0) fail_errno("socket");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } listen_closer{listen_fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!options.bind_host.empty() && ::inet_pton(AF_INET, options.bind_host.c_str(), &addr.sin_addr) != 1) {
    fail("cannot listen on '" + options.bind_host + "': not an IPv4 address");
  }
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    fail_errno(options.bind_host.empty() ? "bind" : "bind " + options.bind_host);
  }
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
       << PeerMemory::probe_address() << '\n';
  const std::vector<std::string> infos = detail::exchange_all(store, contract::group_keys::exchange(contract::group_keys::kInfo), rank, size, info.str(), store_timeout, options.peers);
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

  try {
    form_shm(store, deadline);
    probe_cma(store, probe_addrs, deadline);
    form_tcp(listen_fd, group_id, deadline);
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void Mesh::form_shm(rdzv::Store& store, Clock::time_point deadline) {
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
  auto* mine = new (base[rank_]) SegmentHeader{};
  mine->pid = ::getpid();
  mine->rings = static_cast<uint32_t>(n);
  mine->ring_bytes = ring;
  for (size_t i = 0; i < n; ++i) new (base[rank_] + ctl_offset + i * sizeof(RingControl)) RingControl{};
  headers_[rank_] = mine;
  store.set(contract::group_keys::record(contract::group_keys::kShmReady, rank_), "1");

  std::vector<detail::RankKey> ready, mapped;
  for (int r : local) {
    if (r == rank_) continue;
    ready.push_back({r, contract::group_keys::record(contract::group_keys::kShmReady, r)});
    mapped.push_back({r, contract::group_keys::record(contract::group_keys::kShmMapped, r)});
  }
  detail::await_ranks(store, ready, store_timeout, options_.peers);
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
  detail::await_ranks(store, mapped, store_timeout, options_.peers);
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

void Mesh::probe_cma(rdzv::Store& store, const std::vector<uint64_t>& probe_addrs, Clock::time_point deadline) {
  const auto& local = hosts_[host_of_[rank_]];
  if (local.size() < 2 || contract::CommSettings::from_environment().disable_cma) return;
  bool ok = true;
  for (int r : local) {
    if (r == rank_) continue;
    ok &= PeerMemory::probe(pids_[r], probe_addrs[r]);
  }
  // Every rank of the host must choose the same algorithm: all or none.
  store.set(contract::group_keys::record(contract::group_keys::kCma, rank_), ok ? "1" : "0");
  std::vector<detail::RankKey> keys;
  for (int r : local) keys.push_back({r, contract::group_keys::record(contract::group_keys::kCma, r)});
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  bool all = true;
  for (const auto& v : detail::await_ranks(store, keys, std::max(left, Millis(1)), options_.peers)) all &= v == "1";
  peer_memory_ = PeerMemory(pids_, all);
}

void Mesh::form_tcp(int listen_fd, uint64_t group_id, Clock::time_point deadline) {
  const auto& peers = options_.peers;
  rdzv::Waiting w;
  w.notice_every = peers.notice_every;
  const std::string me = "ddp: rank " + std::to_string(peers.me);
  int expected_accepts = 0;
  for (int r = 0; r < size_; ++r) {
    if (host_of_[r] == host_of_[rank_]) continue;
    if (r > rank_) {
      ++expected_accepts;
      continue;
    }
    // Connect to the lower rank's listener, retrying while it is still coming up (or
    // its backlog overflowed): a refused connection cannot be waited for.
    const std::string& ep = endpoints_[r];
    const auto colon = ep.rfind(':');
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (::getaddrinfo(ep.substr(0, colon).c_str(), ep.substr(colon + 1).c_str(), &hints, &found) != 0 || !found) {
      fail("cannot resolve " + describe(r) + " at " + ep);
    }
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> res(found, ::freeaddrinfo);
    std::string why = "no answer";
    int fd = -1;
    w.timeout = std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
    w.retry_pause = Millis(20);
    w.describe = [&] { return me + " still waiting to connect to " + describe(r) + " at " + ep + ": " + why; };
    const auto end = rdzv::wait_in_slices(w, [&](Millis budget) {
      peers.throw_if_exited({r});
      fd = try_connect(*res, budget, why);
      return fd >= 0;
    });
    if (end != rdzv::WaitEnd::kArrived) fail("cannot connect to " + describe(r) + " at " + ep + ": " + why);
    tune_socket(fd);
    Hello hello{kHelloMagic, rank_, group_id};
    if (!io_exact(fd, &hello, sizeof(hello), true, deadline)) {
      ::close(fd);
      fail("handshake with " + describe(r) + " failed");
    }
    channels_[r] = std::make_unique<TcpChannel>(r, fd);
  }
  if (expected_accepts == 0) return;
  // The higher ranks on other hosts connect to us: accept in slices, looking at the
  // exits of the ranks still to connect between them.
  auto not_connected = [&] {
    std::vector<int> ranks;
    for (int r = rank_ + 1; r < size_; ++r) {
      if (host_of_[r] != host_of_[rank_] && !channels_[r]) ranks.push_back(r);
    }
    return ranks;
  };
  auto listed = [](const std::vector<int>& ranks) {
    std::string out;
    for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  };
  w.timeout = std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
  w.slice = detail::kFormSlice;
  w.retry_pause = Millis(0);
  w.describe = [&] {
    const auto ranks = not_connected();
    return me + " still waiting for rank" + (ranks.size() == 1 ? " " : "s ") + listed(ranks) + " to connect over TCP";
  };
  const auto end = rdzv::wait_in_slices(w, [&](Millis budget) {
    pollfd p{listen_fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(budget.count(), 1000000))) > 0 &&
        accept_peer(listen_fd, group_id, deadline)) {
      --expected_accepts;
    }
    if (expected_accepts == 0) return true;
    peers.throw_if_exited(not_connected());
    return false;
  });
  if (end != rdzv::WaitEnd::kArrived) fail("ranks " + listed(not_connected()) + " did not connect in time");
}

bool Mesh::accept_peer(int listen_fd, uint64_t group_id, Clock::time_point deadline) {
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return false;
    fail_errno("accept");
  }
  Hello hello{};
  const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
  if (!io_exact(fd, &hello, sizeof(hello), false, hello_deadline) || hello.magic != kHelloMagic ||
      hello.group_id != group_id || hello.rank <= rank_ || hello.rank >= size_ ||
      host_of_[hello.rank] == host_of_[rank_] || channels_[hello.rank]) {
    ::close(fd);  // not one of ours (a stray client, another group)
    return false;
  }
  tune_socket(fd);
  channels_[hello.rank] = std::make_unique<TcpChannel>(hello.rank, fd);
  return true;
}

Mesh::~Mesh() { release(); }

void Mesh::release() {
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
}

std::string Mesh::describe(int r) const {
  if (r < 0 || r >= size_) return std::string("rank ") + std::to_string(r);
  std::string out = "rank " + std::to_string(options_.peers.global(r));  // as exit reports name it
  if (pids_.empty()) return out;
  return out + " (pid " + std::to_string(pids_[r]) + " on " + hostnames_[r] + ")";
}

}  // namespace ddp::cpu
