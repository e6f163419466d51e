// The progress publisher's thread, the record it writes, and report_step()'s counter.
#include "progress_publisher.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "ddp/contract/store_keys.hpp"
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

ProgressPublisher::ProgressPublisher(PublisherOptions options)
    : options_(std::move(options)), owner_pid_(static_cast<int>(::getpid())), state_(new State) {
  listener_ = add_failure_listener([state = state_.get()] {
    {
      std::lock_guard lock(state->mu);
      state->failed = true;
    }
    state->cv.notify_all();
  });
  thread_ = std::thread([this] { loop(); });
}

ProgressPublisher::~ProgressPublisher() {
  if (static_cast<int>(::getpid()) != owner_pid_) {
    // A forked child (exiting): the thread is the parent's, and the listener registry's
    // mutex may have been held by another parent thread at the fork, so it is left alone.
    // So is the state: its condition variable counts the parent thread's wait, and
    // destroying it would wait for that thread forever (glibc).
    thread_.detach();
    (void)state_.release();
    return;
  }
  remove_failure_listener(listener_);
  std::shared_ptr<rdzv::TcpStore> client;
  {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
    client = state_->client;
  }
  state_->cv.notify_all();
  if (client) client->abort();  // a set in flight returns at once
  thread_.join();
}

void ProgressPublisher::loop() {
  std::unique_lock lock(state_->mu);
  while (!state_->stopping) {
    state_->failed = false;
    lock.unlock();
    publish();
    lock.lock();
    state_->cv.wait_for(lock, options_.interval, [&] { return state_->stopping || state_->failed; });
  }
}

void ProgressPublisher::publish() {
  const std::string record = snapshot(options_.rank).encode();
  std::shared_ptr<rdzv::TcpStore> client;
  {
    std::lock_guard lock(state_->mu);
    client = state_->client;
  }
  if (!client) {
    try {
      client = std::make_shared<rdzv::TcpStore>(options_.store);
    } catch (const std::exception&) {
      return;  // the store is gone (or not yet there): try again next tick
    }
    std::lock_guard lock(state_->mu);
    if (state_->stopping) return;
    state_->client = client;
  }
  try {
    client->set(options_.key, record);
  } catch (const std::exception&) {
    std::lock_guard lock(state_->mu);
    if (state_->client == client) state_->client.reset();  // reconnect next tick
  }
}

void start_progress_publisher(const contract::WorkerEnv& env) {
  if (!env.store) return;
  static std::mutex mu;
  static std::unique_ptr<ProgressPublisher> publisher;  // stopped by static destruction at exit
  std::lock_guard lock(mu);
  if (publisher) return;
  PublisherOptions o;
  o.store.host = env.store->addr;
  o.store.port = static_cast<uint16_t>(env.store->port);
  o.store.token = env.store->token;
  o.store.ns = env.store->ns;
  // Short bounds: the publisher must never hold up the worker's exit for long.
  o.store.connect_timeout = rdzv::Millis(1000);
  o.store.io_timeout = rdzv::Millis(2000);
  o.key = contract::JobKeys(env.restart_count).progress(env.rank);
  o.rank = env.rank;
  publisher = std::make_unique<ProgressPublisher>(std::move(o));
}

}  // namespace ddp::detail
