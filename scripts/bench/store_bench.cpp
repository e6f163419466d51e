// ddp-store-bench: load generator for scripts/bench/rendezvous.
//
//   ddp-store-bench rendezvous HOST PORT TOKEN CLIENTS
//       CLIENTS connections each connect, authenticate, add("arrived") and
//       get("nccl_id"); client 0 sets nccl_id (128 bytes) once authenticated.
//       Prints the time until every client has the id, then keeps the
//       connections open and idle until stdin closes (so the caller can read
//       the server's RSS), then closes them.
//   ddp-store-bench throughput HOST PORT TOKEN CLIENTS SECONDS set|get
//       CLIENTS connections, each one request at a time (no pipelining), for
//       SECONDS; prints operations per second.
// One thread, Boost.Asio; at most kMaxConnecting connects in flight so the
// server's listen backlog does not overflow.
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <netinet/in.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "auth.hpp"
#include "protocol.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using rdzv::wire::Type;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxConnecting = 1024;
constexpr size_t kMagicBytes = 4;  // the frame magic opening a HELLO

struct Config {
  tcp::endpoint endpoint;
  std::string token;
};

// One client connection running a script of requests.
class Client : public std::enable_shared_from_this<Client> {
 public:
  using Done = std::function<void(Client&)>;
  Client(asio::io_context& io, const Config& cfg) : socket_(io), cfg_(cfg) {}

  // On loopback, clients come from 256 source addresses (127.1.0.x), as they would
  // from many hosts: one source address has only ~28k ephemeral ports, and the
  // kernel's search for a free one slows down long before they run out.
  void connect(std::function<void()> on_ready, size_t index) {
    if (cfg_.endpoint.address().is_loopback() && cfg_.endpoint.address().is_v4()) {
      socket_.open(tcp::v4());
      int one = 1;
      setsockopt(socket_.native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      socket_.bind(tcp::endpoint(asio::ip::make_address_v4(0x7f010000u + static_cast<uint32_t>(index % 256)), 0));
    }
    socket_.async_connect(cfg_.endpoint, [self = shared_from_this(), on_ready](const boost::system::error_code& ec) {
      if (ec) fail("connect: " + ec.message());
      self->socket_.set_option(tcp::no_delay(true));
      // The HELLO's magic goes first, as rdzv::connect sends it: a store that also
      // admits torch's clients greets a connection only once its first bytes are ddprun's.
      self->out_ = rdzv::wire::make_frame(Type::kHello, 0, {}).substr(0, kMagicBytes);
      asio::async_write(self->socket_, asio::buffer(self->out_), [self, on_ready](const boost::system::error_code& e, size_t) {
        if (e) fail("write: " + e.message());
        self->read_greeting(on_ready);
      });
    });
  }

  // The CHALLENGE, then the rest of the HELLO; on_ready once it is accepted.
  void read_greeting(std::function<void()> on_ready) {
    read_frame([self = shared_from_this(), on_ready](Type, std::string body) {
      rdzv::wire::BodyReader r(body, {});
      std::string server_nonce = r.bytes();
      std::string client_nonce = rdzv::auth::random_bytes(rdzv::wire::kNonceSize);
      rdzv::wire::Request hello;
      hello.type = Type::kHello;
      hello.values = {"bench", client_nonce,
                      self->cfg_.token.empty()
                          ? ""
                          : rdzv::auth::client_proof(self->cfg_.token, server_nonce, client_nonce, "bench")};
      auto accepted = [on_ready](Type t, std::string) {
        if (t != Type::kOk) fail("authentication refused");
        on_ready();
      };
      self->request(hello, accepted, kMagicBytes);
    });
  }

  // Sends `q` (less its first `sent` bytes, already on their way) and reads the reply.
  void request(const rdzv::wire::Request& q, std::function<void(Type, std::string)> on_reply, size_t sent = 0) {
    out_ = rdzv::wire::make_frame(q.type, ++id_, rdzv::wire::encode_request(q)).substr(sent);
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this(), on_reply](const boost::system::error_code& ec, size_t) {
                        if (ec) fail("write: " + ec.message());
                        self->read_frame(on_reply);
                      });
  }

  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  static void fail(const std::string& what) {
    std::fprintf(stderr, "ddp-store-bench: %s\n", what.c_str());
    std::exit(1);
  }

 private:
  // Answers are small and come one at a time: one read_some usually holds a whole frame.
  void read_frame(std::function<void(Type, std::string)> on_frame) {
    socket_.async_read_some(asio::buffer(in_.data() + filled_, in_.size() - filled_),
                            [self = shared_from_this(), on_frame](const boost::system::error_code& ec, size_t n) {
                              if (ec) fail("read: " + ec.message());
                              self->filled_ += n;
                              if (self->filled_ < rdzv::wire::kHeaderSize) return self->read_frame(on_frame);
                              auto h = rdzv::wire::decode_header(self->in_.data(), {});
                              size_t frame = rdzv::wire::kHeaderSize + h.body_size;
                              if (frame > self->in_.size()) fail("answer too large for the bench client");
                              if (self->filled_ < frame) return self->read_frame(on_frame);
                              std::string body(self->in_.data() + rdzv::wire::kHeaderSize, h.body_size);
                              std::memmove(self->in_.data(), self->in_.data() + frame, self->filled_ - frame);
                              self->filled_ -= frame;
                              on_frame(h.type, std::move(body));
                            });
  }

  tcp::socket socket_;
  const Config& cfg_;
  std::array<char, 512> in_{};
  size_t filled_ = 0;
  std::string out_;
  uint32_t id_ = 0;
};

rdzv::wire::Request make(Type t, std::string key, std::string value = "", int64_t number = 0) {
  rdzv::wire::Request q;
  q.type = t;
  q.keys = {std::move(key)};
  if (t == Type::kSet) q.values = {std::move(value)};
  q.number = number;
  return q;
}

int run_rendezvous(asio::io_context& io, const Config& cfg, size_t n) {
  std::vector<std::shared_ptr<Client>> clients;
  size_t next = 0, connecting = 0, have_id = 0;
  auto start = Clock::now();
  Clock::time_point finished;
  std::function<void()> launch_more;
  launch_more = [&] {
    while (next < n && connecting < kMaxConnecting) {
      size_t index = next++;
      ++connecting;
      auto c = std::make_shared<Client>(io, cfg);
      clients.push_back(c);
      c->connect([&, c, index] {
        --connecting;
        launch_more();
        auto after_add = [&, c](Type, std::string) {
          c->request(make(Type::kGet, "nccl_id", "", 120000), [&](Type t, std::string body) {
            if (t != Type::kOk) Client::fail("get(nccl_id) failed");
            rdzv::wire::BodyReader r(body, {});
            if (r.bytes().size() != 128) Client::fail("wrong nccl_id");
            if (++have_id == n) finished = Clock::now();
          });
        };
        if (index == 0) {
          c->request(make(Type::kSet, "nccl_id", std::string(128, '\x42')), [&, c, after_add](Type, std::string) {
            c->request(make(Type::kAdd, "arrived", "", 1), after_add);
          });
        } else {
          c->request(make(Type::kAdd, "arrived", "", 1), after_add);
        }
      }, index);
    }
  };
  launch_more();
  while (have_id < n) io.run_one();
  double seconds = std::chrono::duration<double>(finished - start).count();
  std::printf("clients %zu: all had nccl_id after %.3f s\n", n, seconds);
  std::printf("idle\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);  // the caller reads the server's RSS, then closes stdin
  for (auto& c : clients) c->close();
  return 0;
}

int run_throughput(asio::io_context& io, const Config& cfg, size_t n, double seconds, const std::string& op) {
  size_t ready = 0;
  uint64_t ops = 0;
  bool stop = false;
  std::vector<std::shared_ptr<Client>> clients;
  for (size_t i = 0; i < n; ++i) {
    auto c = std::make_shared<Client>(io, cfg);
    clients.push_back(c);
    c->connect([&] { ++ready; }, i);
  }
  while (ready < n) io.run_one();
  bool seeded = false;
  clients[0]->request(make(Type::kSet, "key:0", std::string(3, 'x')), [&](Type, std::string) { seeded = true; });
  while (!seeded) io.run_one();
  // Like redis-benchmark: a 3-byte value, a few distinct keys.
  std::function<void(std::shared_ptr<Client>, size_t)> loop = [&](std::shared_ptr<Client> c, size_t i) {
    if (stop) return;
    auto q = op == "set" ? make(Type::kSet, "key:" + std::to_string(i % 16), "xxx")
                         : make(Type::kGet, "key:0", "", 1000);
    c->request(q, [&, c, i](Type t, std::string) {
      if (t != Type::kOk) Client::fail(op + " failed");
      ++ops;
      loop(c, i + 1);
    });
  };
  asio::steady_timer timer(io);
  auto start = Clock::now();
  timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  timer.async_wait([&](const boost::system::error_code&) { stop = true; });
  for (size_t i = 0; i < n; ++i) loop(clients[i], i);
  while (!stop) io.run_one();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%s: %.0f ops/s (%zu clients, %.1f s)\n", op.c_str(), static_cast<double>(ops) / elapsed, n, elapsed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: ddp-store-bench rendezvous|throughput HOST PORT TOKEN CLIENTS [SECONDS set|get]\n");
    return 2;
  }
  std::string mode = argv[1];
  Config cfg{tcp::endpoint(asio::ip::make_address(argv[2]), static_cast<uint16_t>(std::stoi(argv[3]))),
             std::string(argv[4]) == "-" ? "" : argv[4]};
  size_t clients = std::stoul(argv[5]);
  asio::io_context io;
  auto keep_running = asio::make_work_guard(io);  // run_one() between phases must not find it stopped
  if (mode == "rendezvous") return run_rendezvous(io, cfg, clients);
  if (mode == "throughput" && argc == 8) return run_throughput(io, cfg, clients, std::stod(argv[6]), argv[7]);
  std::fprintf(stderr, "ddp-store-bench: bad arguments\n");
  return 2;
}
