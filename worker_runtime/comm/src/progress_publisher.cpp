// The progress publisher's ticks, the record it writes, and report_step()'s counter.
#include "progress_publisher.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <utility>

#include "ddp/contract/store_keys.hpp"
#include "rdzv/rider.hpp"
#include "ddp/progress.hpp"
#include "flight_recorder.hpp"

namespace ddp {
namespace {
std::atomic<uint64_t> g_steps{0};
}  // namespace

void report_step() { g_steps.fetch_add(1, std::memory_order_relaxed); }
uint64_t reported_steps() { return g_steps.load(std::memory_order_relaxed); }

}  // namespace ddp

namespace ddp::detail {
namespace {

// Resident memory in KiB from /proc/self/statm (0 where it cannot be read).
int64_t resident_kb() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128] = {};
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  long long size = 0, resident = 0;
  if (std::sscanf(text, "%lld %lld", &size, &resident) != 2) return 0;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

}  // namespace

contract::ProgressRecord ProgressPublisher::snapshot(int rank) {
  static const std::string* host = new std::string(host_name());  // kept past static destruction
  contract::ProgressRecord r;
  r.rank = rank;
  r.pid = static_cast<int>(::getpid());
  r.host = *host;
  r.steps = reported_steps();
  r.rss_kb = resident_kb();
  r.groups = all_group_progress();
  r.time_ms = contract::unix_millis_now();
  return r;
}

// The ticks: a task on the link thread every interval (and one posted when a call
// fails) writes the record, unless the last one is still on its way; then the write
// that follows it carries the news.
struct ProgressPublisher::Ticks : std::enable_shared_from_this<Ticks> {
  Ticks(rdzv::TcpStore& store, PublisherOptions o) : rider(store), options(std::move(o)) {}

  void tick(rdzv::TcpStore& store) {  // a step (under the rider)
    if (sending) {
      again = true;
      return;
    }
    sending = true;
    store.set_async(options.key, snapshot(options.rank).encode(), [self = shared_from_this()](rdzv::Done) {
      // A store that went away costs nothing more than failed writes until exit.
      self->rider.ride([&](rdzv::TcpStore& s) {
        self->sending = false;
        if (std::exchange(self->again, false)) self->tick(s);
      });
    });
  }
  void heartbeat(rdzv::TcpStore& store) {
    tick(store);
    store.post_after(options.interval, [self = shared_from_this()] {
      self->rider.ride([&](rdzv::TcpStore& s) { self->heartbeat(s); });
    });
  }

  rdzv::Rider rider;
  const PublisherOptions options;
  bool sending = false;  // a record is on its way
  bool again = false;    // ...and another is due when it arrives
};

ProgressPublisher::ProgressPublisher(std::shared_ptr<rdzv::TcpStore> store, PublisherOptions options)
    : ticks_(std::make_shared<Ticks>(*store, std::move(options))), store_(std::move(store)) {
  ticks_->rider.ride([&](rdzv::TcpStore& s) { ticks_->heartbeat(s); });
  // Called with the listener registry's mutex held, on a thread whose call failed: it
  // only posts a tick. The client stays alive until the listener is removed.
  listener_ = add_failure_listener([ticks = ticks_.get(), store = store_.get()] {
    store->post([self = ticks->shared_from_this()] {
      self->rider.ride([&](rdzv::TcpStore& s) { self->tick(s); });
    });
  });
}

ProgressPublisher::~ProgressPublisher() {
  // In a forked child the listener stays too: the registry's mutex may have been held
  // by another parent thread at the fork.
  if (rdzv::abandoned_in_child(ticks_, store_)) return;
  remove_failure_listener(listener_);
  ticks_->rider.stop();
}

}  // namespace ddp::detail
