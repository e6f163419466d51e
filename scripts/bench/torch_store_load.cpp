// ddp-torch-store-load: a load generator for scripts/bench/torch_store that speaks
// PyTorch's TCPStore wire protocol the way torch's own client (torch >= 2.1) does. Any
// server of that protocol can be measured: ddp-rendezvous admitting torch clients, or
// torch's own TCPStore server (libuv or the legacy backend).
//
//   ddp-torch-store-load barrier HOST PORT CLIENTS [--max-connecting K] [--timeout S]
//                                [--wait-timeout S]
//   ddp-torch-store-load ops HOST PORT CLIENTS SECONDS set|get
//
// The wire, as PyTorch 2.15's client writes it (checked byte for byte against it through
// a proxy). Integers are little-endian, a string is a u64 length and its bytes; a request
// is one query-type byte and its fields, a reply has no header: its shape follows from
// the request.
//   VALIDATE 0     u32 magic 0x3C85F7CE                 no reply
//   PING 13        u32 nonce                            -> u32 the nonce
//   ADD 4          string key, i64 delta                -> i64 the new value
//   SET 1          string key, string value             no reply
//   GET 3          string key                           -> string value
//   WAIT 6         u64 count, count strings             -> u8 0 (STOP_WAITING) once all exist
//   CANCEL_WAIT 12                                      -> u8 1 (WAIT_CANCELED), after a 0
//                                                          when the wait had just ended
// torch's client prefixes a user's key with "/"; the init key "init/" goes bare.
//
// barrier: CLIENTS clients each do what a torch 2.15 worker does in
// init_process_group(...) against a store it does not host (the agent's store, as with
// TORCHELASTIC_USE_AGENT_STORE=True) with TORCH_DIST_INIT_BARRIER=1:
//   TCPStore(host, port, world_size=N, is_master=False):
//     connect; VALIDATE; PING; waitForWorkers(): ADD "init/" 1 (a client goes on at
//     once: only the process hosting the server polls that count);
//   _store_based_barrier() on the key K = "/default_pg/store_based_barrier_key:0":
//     ADD K 1; ADD K 0 -> count; if count == N: SET "K:last_worker" "1";
//     WAIT ["K:last_worker"] with a client-side timeout of max(10 s, 10 s + N/1000 s);
//     on that timeout CANCEL_WAIT, ADD K 0 (torch logs the count), and WAIT again
//     (--wait-timeout S replaces that timeout, to exercise the path).
//   A client is released when its WAIT answers STOP_WAITING. Prints the time from the
//   first connect to the last client released, then keeps every connection open and
//   idle until stdin closes (the caller reads the server's RSS meanwhile).
//   A connect refused or reset before PING's answer is retried after torch's backoff
//   (500 ms, x1.5, +-50% jitter). At most K connects are in flight (default 1024, as
//   ddp-store-bench), so that the listen backlog does not overflow.
// ops: CLIENTS clients loop store.set("key:i", "xxx") (one write per call; torch's set
//   expects no reply) or store.get("key:0") (WAIT then GET: two round trips, one call)
//   for SECONDS; then every client sends a PING and the clock stops when the last PING
//   is answered, so SETs still queued at the server count only once it has read them.
//   Prints calls per second.
// One thread, non-blocking sockets and epoll (level-triggered). Exits 1 with one line on
// any protocol error or timeout, 2 on bad arguments.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Query types and reply values of torch's protocol (TCPStoreBackend.hpp, torch >= 2.1).
enum Query : uint8_t { kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kWait = 6, kCancelWait = 12, kPing = 13 };
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kStopWaiting = 0;
constexpr uint8_t kWaitCanceled = 1;

constexpr const char* kInitKey = "init/";
constexpr const char* kBarrierKey = "/default_pg/store_based_barrier_key:0";

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "ddp-torch-store-load: %s\n", what.c_str());
  std::exit(1);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Request bytes, as torch's SendBuffer lays them out.
class Request {
 public:
  explicit Request(Query q) { bytes_.push_back(static_cast<char>(q)); }
  template <typename T>
  Request& value(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Request& string(const std::string& s) {
    value<uint64_t>(s.size());
    bytes_ += s;
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

std::string wait_request(const std::string& key) { return Request(kWait).value<uint64_t>(1).string(key).bytes(); }

// What a client is waiting for.
enum class Step {
  kIdle,
  kConnecting,
  kPing,          // u32 nonce
  kAddInit,       // i64
  kAddArrived,    // i64
  kAddCount,      // i64: the count of the barrier
  kWaitLast,      // u8 STOP_WAITING
  kCanceling,     // u8s until WAIT_CANCELED
  kAddLogged,     // i64 (after a timed-out wait)
  kGetWait,       // u8 STOP_WAITING of get()'s WAIT
  kGetLength,     // u64 of get()'s GET
  kGetValue,      // the value's bytes
  kFence,         // u32 nonce of the closing PING
  kReleased,
};

struct Client {
  int fd = -1;
  Step step = Step::kIdle;
  std::string out;           // bytes not yet written
  size_t out_done = 0;
  std::array<char, 64> in{};  // the reply being read
  size_t got = 0, need = 0;
  uint32_t nonce = 0;
  int retries = 0;
  bool want_out = false;     // EPOLLOUT registered
  uint64_t generation = 0;   // invalidates timers of an earlier connection or wait
  uint64_t key_index = 0;    // ops: the next key
};

struct Timer {
  Clock::time_point at;
  size_t client;
  uint64_t generation;
  bool operator>(const Timer& o) const { return at > o.at; }
};

struct Options {
  sockaddr_in server{};
  size_t clients = 0;
  size_t max_connecting = 1024;
  double timeout_s = 300;
  double wait_timeout_s = 0;  // 0: torch's, max(10 s, 10 s + CLIENTS/1000 s)
};

class Load {
 public:
  explicit Load(const Options& opt) : opt_(opt), clients_(opt.clients), epoll_(epoll_create1(EPOLL_CLOEXEC)) {
    if (epoll_ < 0) fail(std::string("epoll_create1: ") + std::strerror(errno));
  }

  // ------------------------------------------------------------------ the barrier
  int run_barrier() {
    const size_t n = clients_.size();
    double wait_s = opt_.wait_timeout_s > 0 ? opt_.wait_timeout_s : std::max(10.0, 10.0 + n / 1000.0);
    wait_timeout_ = std::chrono::microseconds(static_cast<int64_t>(1e6 * wait_s));
    on_ready_ = [this](size_t i) { send(i, Request(kAdd).string(kInitKey).value<int64_t>(1).bytes(), Step::kAddInit, 8); };
    start_ = Clock::now();
    while (next_ < n && connecting_ < opt_.max_connecting) connect_next();
    loop([&] { return released_ == n; });
    double took = seconds_since(start_);
    std::printf("clients %zu: all released after %.3f s (connected after %.3f s; connect retries %zu, "
                "wait timeouts %zu)\n", n, took, connected_s_, retries_, wait_timeouts_);
    std::printf("idle\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);  // the caller reads the server's RSS, then closes stdin
    for (auto& c : clients_) ::close(c.fd);
    return 0;
  }

  // ------------------------------------------------------------------ set/get throughput
  int run_ops(double seconds, bool set) {
    const size_t n = clients_.size();
    on_ready_ = [](size_t) {};
    start_ = Clock::now();
    while (next_ < n && connecting_ < opt_.max_connecting) connect_next();
    loop([&] { return ready_ == n; });
    // get() needs the key: one set and a fence before the clock starts.
    send(0, Request(kSet).string("/key:0").string("xxx").bytes(), Step::kIdle, 0);
    fence(0);
    loop([&] { return fenced_ == 1; });

    set_mode_ = set;
    fenced_ = 0;
    start_ = Clock::now();
    stop_at_ = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    running_ = true;
    for (size_t i = 0; i < n; ++i) next_op(i);
    loop([&] { return !running_ && fenced_ == n; });
    double took = seconds_since(start_);
    std::printf("%s: %.0f calls/s (%zu clients, %llu calls in %.2f s, the last %.3f s draining)\n", set ? "set" : "get",
                static_cast<double>(ops_) / took, n, static_cast<unsigned long long>(ops_), took, took - seconds);
    for (auto& c : clients_) ::close(c.fd);
    return 0;
  }

 private:
  // ------------------------------------------------------------------ connections
  void connect_next() {
    size_t i = next_++;
    ++connecting_;
    open(i);
  }

  // On loopback, clients come from 256 source addresses (127.1.0.x), as from many hosts:
  // one source address has only ~28k ephemeral ports.
  void open(size_t i) {
    Client& c = clients_[i];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) fail(std::string("socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if ((ntohl(opt_.server.sin_addr.s_addr) >> 24) == 127) {
      setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr = htonl(0x7f010000u + static_cast<uint32_t>(i % 256));
      if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0)
        fail(std::string("bind: ") + std::strerror(errno));
    }
    c.step = Step::kConnecting;
    c.got = c.need = 0;
    c.out.clear();
    c.out_done = 0;
    ++c.generation;
    int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&opt_.server), sizeof(opt_.server));
    if (rc != 0 && errno != EINPROGRESS) return retry(i, std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u64 = i;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev) != 0) fail(std::string("epoll_ctl: ") + std::strerror(errno));
    c.want_out = true;
  }

  // torch's client retries a failed connect or handshake after ExponentialBackoffWithJitter.
  void retry(size_t i, const std::string& why) {
    Client& c = clients_[i];
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
    if (seconds_since(start_) > opt_.timeout_s) fail("client " + std::to_string(i) + " could not connect: " + why);
    ++retries_;
    double interval = 500.0 * std::pow(1.5, std::min(c.retries++, 20));
    interval = std::min(interval, 60000.0);
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    c.step = Step::kIdle;
    ++c.generation;
    timers_.push({Clock::now() + std::chrono::microseconds(static_cast<int64_t>(1000.0 * interval * jitter(rng_))), i,
                  c.generation});
  }

  void connected(size_t i) {
    Client& c = clients_[i];
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return retry(i, std::strerror(err));
    c.nonce = static_cast<uint32_t>(i) * 2654435761u + 1;
    std::string hello = Request(kValidate).value<uint32_t>(kValidationMagic).bytes() +
                        Request(kPing).value<uint32_t>(c.nonce).bytes();
    send(i, hello, Step::kPing, 4);
  }

  // ------------------------------------------------------------------ requests and replies
  // Queues `bytes`, then waits for a reply of `need` bytes in `step` (none: need 0).
  void send(size_t i, const std::string& bytes, Step step, size_t need) {
    Client& c = clients_[i];
    c.out += bytes;
    c.step = step;
    c.got = 0;
    c.need = need;
    flush(i);
  }

  void flush(size_t i) {
    Client& c = clients_[i];
    while (c.out_done < c.out.size()) {
      ssize_t w = ::send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        return lost(i, std::strerror(errno));
      }
      c.out_done += static_cast<size_t>(w);
    }
    if (c.out_done == c.out.size()) {
      c.out.clear();
      c.out_done = 0;
    }
    bool want = !c.out.empty() || (running_ && set_mode_ && c.step == Step::kIdle);
    watch(i, want);
  }

  void watch(size_t i, bool want_out) {
    Client& c = clients_[i];
    if (c.want_out == want_out) return;
    epoll_event ev{};
    ev.events = EPOLLIN | (want_out ? EPOLLOUT : 0u);
    ev.data.u64 = i;
    if (epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev) != 0) fail(std::string("epoll_ctl: ") + std::strerror(errno));
    c.want_out = want_out;
  }

  void lost(size_t i, const std::string& why) {
    Client& c = clients_[i];
    if (c.step == Step::kPing) {  // before the handshake's answer torch's client retries
      epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
      return retry(i, why);
    }
    fail("client " + std::to_string(i) + " lost its connection: " + why);
  }

  void readable(size_t i) {
    Client& c = clients_[i];
    for (;;) {
      if (c.need == 0) {  // nothing expected: anything but EAGAIN is an error
        char byte;
        ssize_t r = ::recv(c.fd, &byte, 1, MSG_PEEK);
        if (r > 0) fail("client " + std::to_string(i) + ": the server sent bytes nobody asked for");
        if (r == 0) return lost(i, "closed by the server");
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return lost(i, std::strerror(errno));
      }
      ssize_t r = ::recv(c.fd, c.in.data() + c.got, c.need - c.got, 0);
      if (r == 0) return lost(i, "closed by the server");
      if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        return lost(i, std::strerror(errno));
      }
      c.got += static_cast<size_t>(r);
      if (c.got < c.need) continue;
      c.need = 0;
      replied(i);
      if (c.fd < 0) return;
    }
  }

  template <typename T>
  T reply_value(const Client& c) {
    T v;
    std::memcpy(&v, c.in.data(), sizeof(v));
    return v;
  }

  void replied(size_t i) {
    Client& c = clients_[i];
    switch (c.step) {
      case Step::kPing:
        if (reply_value<uint32_t>(c) != c.nonce) fail("PING answered with another nonce");
        --connecting_;
        ++ready_;
        if (ready_ == clients_.size()) connected_s_ = seconds_since(start_);
        while (next_ < clients_.size() && connecting_ < opt_.max_connecting) connect_next();
        c.step = Step::kIdle;
        return on_ready_(i);
      case Step::kAddInit:
        return send(i, Request(kAdd).string(kBarrierKey).value<int64_t>(1).bytes(), Step::kAddArrived, 8);
      case Step::kAddArrived:
        return send(i, Request(kAdd).string(kBarrierKey).value<int64_t>(0).bytes(), Step::kAddCount, 8);
      case Step::kAddCount:
        if (reply_value<int64_t>(c) == static_cast<int64_t>(clients_.size()))
          send(i, Request(kSet).string(std::string(kBarrierKey) + ":last_worker").string("1").bytes(), Step::kIdle, 0);
        return wait_last(i);
      case Step::kWaitLast:
        if (c.in[0] != static_cast<char>(kStopWaiting)) fail("WAIT answered " + std::to_string(c.in[0]));
        c.step = Step::kReleased;
        ++c.generation;
        ++released_;
        return;
      case Step::kCanceling:
        if (c.in[0] == static_cast<char>(kStopWaiting)) return send(i, "", Step::kCanceling, 1);
        if (c.in[0] != static_cast<char>(kWaitCanceled)) fail("CANCEL_WAIT answered " + std::to_string(c.in[0]));
        return send(i, Request(kAdd).string(kBarrierKey).value<int64_t>(0).bytes(), Step::kAddLogged, 8);
      case Step::kAddLogged:
        return wait_last(i);
      case Step::kGetWait:
        if (c.in[0] != static_cast<char>(kStopWaiting)) fail("WAIT answered " + std::to_string(c.in[0]));
        return send(i, Request(kGet).string("/key:0").bytes(), Step::kGetLength, 8);
      case Step::kGetLength: {
        auto len = reply_value<uint64_t>(c);
        if (len == 0 || len > c.in.size()) fail("GET answered a value of " + std::to_string(len) + " bytes");
        c.step = Step::kGetValue;
        c.got = 0;
        c.need = len;
        return;
      }
      case Step::kGetValue:
        ++ops_;
        return next_op(i);
      case Step::kFence:
        if (reply_value<uint32_t>(c) != c.nonce) fail("PING answered with another nonce");
        c.step = Step::kIdle;
        ++fenced_;
        return;
      default:
        fail("a reply in an unexpected state");
    }
  }

  void wait_last(size_t i) {
    send(i, wait_request(std::string(kBarrierKey) + ":last_worker"), Step::kWaitLast, 1);
    Client& c = clients_[i];
    timers_.push({Clock::now() + wait_timeout_, i, ++c.generation});
  }

  // The client-side WAIT timeout of _store_based_barrier: cancel, log the count, wait again.
  void wait_timed_out(size_t i) {
    ++wait_timeouts_;
    send(i, Request(kCancelWait).bytes(), Step::kCanceling, 1);
  }

  // ops: the next call of client i, or its closing PING once the time is up.
  void next_op(size_t i) {
    if (!running_ || Clock::now() >= stop_at_) return fence(i);
    if (set_mode_) {
      Client& c = clients_[i];
      // One write per set() call, as torch's client; stop when the socket is full.
      for (int k = 0; k < 16 && c.out.empty(); ++k) {
        ++ops_;
        send(i, Request(kSet).string("/key:" + std::to_string(c.key_index++ % 16)).string("xxx").bytes(), Step::kIdle, 0);
      }
      return;
    }
    send(i, wait_request("/key:0"), Step::kGetWait, 1);
  }

  void fence(size_t i) {
    Client& c = clients_[i];
    c.nonce = static_cast<uint32_t>(i) + 7;
    send(i, Request(kPing).value<uint32_t>(c.nonce).bytes(), Step::kFence, 4);
  }

  // ------------------------------------------------------------------ the loop
  void loop(const std::function<bool()>& done) {
    std::vector<epoll_event> events(1024);
    auto deadline = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.timeout_s));
    while (!done()) {
      auto now = Clock::now();
      if (now > deadline && !running_)
        fail("timed out after " + std::to_string(opt_.timeout_s) + " s: " + std::to_string(ready_) + " connected, " +
             std::to_string(released_) + " released");
      while (!timers_.empty() && timers_.top().at <= now) {
        Timer t = timers_.top();
        timers_.pop();
        Client& c = clients_[t.client];
        if (t.generation != c.generation) continue;
        if (c.step == Step::kWaitLast) wait_timed_out(t.client);
        else if (c.step == Step::kIdle && c.fd < 0) open(t.client);
      }
      int wait_ms = 100;
      if (!timers_.empty())
        wait_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(timers_.top().at - now).count() + 1, 0, 100));
      if (running_) wait_ms = std::min(wait_ms, 10);
      int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), wait_ms);
      if (n < 0 && errno != EINTR) fail(std::string("epoll_wait: ") + std::strerror(errno));
      for (int k = 0; k < n; ++k) {
        size_t i = events[k].data.u64;
        Client& c = clients_[i];
        if (c.fd < 0) continue;
        if (c.step == Step::kConnecting) {
          connected(i);
          continue;
        }
        if (events[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) readable(i);
        if (c.fd >= 0 && (events[k].events & EPOLLOUT)) {
          flush(i);
          if (running_ && set_mode_ && c.out.empty() && c.step == Step::kIdle) next_op(i);
        }
      }
      if (running_ && Clock::now() >= stop_at_) {
        running_ = false;
        for (size_t i = 0; i < clients_.size(); ++i)
          if (set_mode_ && clients_[i].step == Step::kIdle) fence(i);
      }
    }
  }

  Options opt_;
  std::vector<Client> clients_;
  int epoll_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::mt19937 rng_{12345};
  std::function<void(size_t)> on_ready_;
  Clock::time_point start_, stop_at_;
  Clock::duration wait_timeout_{};
  size_t next_ = 0, connecting_ = 0, ready_ = 0, released_ = 0, fenced_ = 0;
  size_t retries_ = 0, wait_timeouts_ = 0;
  double connected_s_ = 0;
  bool running_ = false, set_mode_ = false;
  uint64_t ops_ = 0;
};

// Lifts the soft open-files limit to the hard one; fails when `need` descriptors do not fit.
void raise_fd_limit(size_t need) {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur != RLIM_INFINITY && need > lim.rlim_cur)
    fail("needs " + std::to_string(need) + " open files; the hard limit is " + std::to_string(lim.rlim_cur));
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: ddp-torch-store-load barrier HOST PORT CLIENTS [--max-connecting K] [--timeout S] [--wait-timeout S]\n"
               "       ddp-torch-store-load ops HOST PORT CLIENTS SECONDS set|get\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) usage();
  std::string mode = argv[1];
  Options opt;
  opt.server.sin_family = AF_INET;
  if (inet_pton(AF_INET, argv[2], &opt.server.sin_addr) != 1) usage();
  opt.server.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[3])));
  opt.clients = std::strtoul(argv[4], nullptr, 10);
  if (opt.clients == 0) usage();
  raise_fd_limit(opt.clients + 16);
  if (mode == "barrier") {
    for (int a = 5; a < argc; a += 2) {
      if (a + 1 >= argc) usage();
      std::string flag = argv[a];
      if (flag == "--max-connecting") opt.max_connecting = std::max(1ul, std::strtoul(argv[a + 1], nullptr, 10));
      else if (flag == "--timeout") opt.timeout_s = std::atof(argv[a + 1]);
      else if (flag == "--wait-timeout") opt.wait_timeout_s = std::atof(argv[a + 1]);
      else usage();
    }
    return Load(opt).run_barrier();
  }
  if (mode == "ops" && argc == 7) {
    std::string op = argv[6];
    if (op != "set" && op != "get") usage();
    opt.timeout_s = std::atof(argv[5]) + 120;
    return Load(opt).run_ops(std::atof(argv[5]), op == "set");
  }
  usage();
}
