// The NCCL double's shared-memory segment, channels and bells (see shm_transport.hpp).
#include "shm_transport.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

namespace gpu_double::nccl {
namespace {

constexpr size_t kHeaderBytes = 64;

uint64_t fnv1a(const void* data, size_t size, uint64_t hash) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

struct Header {
  std::atomic<uint32_t> nranks;  // set by whoever maps first; checked by the others
};

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

struct Segment::Channel {
  alignas(64) std::atomic<uint64_t> written;  // bytes ever pushed (by the sender)
  alignas(64) std::atomic<uint64_t> read;     // bytes ever popped (by the receiver)
  alignas(64) uint8_t data[kChannelBytes];
};

uint64_t host_identity() {
  utsname u{};
  uname(&u);
  uint64_t h = fnv1a(u.nodename, std::strlen(u.nodename), 0xcbf29ce484222325ull);
  struct stat st{};
  if (::stat("/proc/self/ns/net", &st) == 0) h = fnv1a(&st.st_ino, sizeof(st.st_ino), h);
  return h;
}

namespace {

// Whether the segment `name` has a joined rank and none of its joined ranks lives.
bool stale(const std::string& name) {
  const int fd = shm_open(("/" + name).c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  struct stat st{};
  bool dead = false;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderBytes) {
    void* head = mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
    const uint32_t n = head == MAP_FAILED ? 0 : static_cast<Header*>(head)->nranks.load();
    if (head != MAP_FAILED) munmap(head, kHeaderBytes);
    const size_t size = kHeaderBytes + sizeof(Slot) * n;
    if (n > 0 && static_cast<size_t>(st.st_size) >= size) {
      void* base = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (base != MAP_FAILED) {
        const auto* slots = reinterpret_cast<const Slot*>(static_cast<uint8_t*>(base) + kHeaderBytes);
        bool joined = false, alive = false;
        for (uint32_t r = 0; r < n; ++r) {
          if (slots[r].joined.load() == 0) continue;
          joined = true;
          if (kill(slots[r].pid, 0) == 0 || errno == EPERM) alive = true;
        }
        dead = joined && !alive;
        munmap(base, size);
      }
    }
  }
  close(fd);
  return dead;
}

}  // namespace

void collect_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("gpu_double_", 0) == 0) names.push_back(name);
  }
  closedir(dir);
  for (const auto& name : names)
    if (stale(name)) shm_unlink(("/" + name).c_str());
}

std::string segment_name(const char* id_bytes, size_t size) {
  const uint64_t a = fnv1a(id_bytes, size, 0xcbf29ce484222325ull);
  const uint64_t b = fnv1a(id_bytes, size, 0x84222325cbf29ce4ull);
  char text[64];
  std::snprintf(text, sizeof(text), "gpu_double_%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return text;
}

std::unique_ptr<Segment> Segment::open(const std::string& name, int nranks) {
  const size_t size = kHeaderBytes + sizeof(Slot) * nranks + sizeof(Channel) * nranks * nranks;
  const std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return nullptr;
  // Every rank sizes it alike; a file is zero-filled where it grows, and the
  // channels' pages are touched only when used.
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return nullptr;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  auto* header = static_cast<Header*>(base);
  uint32_t expected = 0;
  if (!header->nranks.compare_exchange_strong(expected, static_cast<uint32_t>(nranks)) &&
      expected != static_cast<uint32_t>(nranks)) {
    munmap(base, size);
    errno = EINVAL;  // the same id with another size: a caller error
    return nullptr;
  }
  return std::unique_ptr<Segment>(new Segment(name, nranks, base, size));
}

Segment::Segment(std::string name, int nranks, void* base, size_t size)
    : name_(std::move(name)), nranks_(nranks), base_(static_cast<uint8_t*>(base)), size_(size) {}

Segment::~Segment() { munmap(base_, size_); }

Slot& Segment::slot(int rank) { return reinterpret_cast<Slot*>(base_ + kHeaderBytes)[rank]; }

Segment::Channel& Segment::channel(int from, int to) {
  auto* first = reinterpret_cast<Channel*>(base_ + kHeaderBytes + sizeof(Slot) * nranks_);
  return first[from * nranks_ + to];
}

size_t Segment::push(int from, int to, const uint8_t* data, size_t bytes) {
  Channel& c = channel(from, to);
  const uint64_t w = c.written.load(std::memory_order_relaxed);
  const uint64_t r = c.read.load(std::memory_order_acquire);
  const size_t n = std::min<size_t>(bytes, kChannelBytes - static_cast<size_t>(w - r));
  if (n == 0) return 0;
  const size_t at = w % kChannelBytes;
  const size_t first = std::min(n, kChannelBytes - at);
  std::memcpy(c.data + at, data, first);
  std::memcpy(c.data, data + first, n - first);
  c.written.store(w + n, std::memory_order_release);
  ring(to);
  return n;
}

size_t Segment::pop(int from, int to, uint8_t* data, size_t bytes) {
  Channel& c = channel(from, to);
  const uint64_t r = c.read.load(std::memory_order_relaxed);
  const uint64_t w = c.written.load(std::memory_order_acquire);
  const size_t n = std::min<size_t>(bytes, static_cast<size_t>(w - r));
  if (n == 0) return 0;
  const size_t at = r % kChannelBytes;
  const size_t first = std::min(n, kChannelBytes - at);
  std::memcpy(data, c.data + at, first);
  std::memcpy(data + first, c.data, n - first);
  c.read.store(r + n, std::memory_order_release);
  ring(from);
  return n;
}

void Segment::ring(int rank) {
  Slot& s = slot(rank);
  s.bell.fetch_add(1, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) != 0) futex(&s.bell, FUTEX_WAKE, INT_MAX, nullptr);
}

void Segment::ring_all() {
  for (int r = 0; r < nranks_; ++r) ring(r);
}

void Segment::sleep(int rank, uint32_t seen) {
  Slot& s = slot(rank);
  s.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (s.bell.load(std::memory_order_seq_cst) == seen) {
    const timespec bound{0, 100 * 1000 * 1000};
    futex(&s.bell, FUTEX_WAIT, seen, &bound);
  }
  s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void Segment::unlink() {
  if (unlinked_.exchange(true)) return;
  shm_unlink(("/" + name_).c_str());
}

void Waiter::idle() {
  // A peer on another core usually answers within microseconds: yield a few times
  // before paying for a sleep and a wake-up.
  if (spins_ < 16) {
    ++spins_;
    std::this_thread::yield();
    return;
  }
  segment_.sleep(rank_, seen_);
}

}  // namespace gpu_double::nccl
