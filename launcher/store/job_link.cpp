// The node's store link (job_link.hpp): connecting with notices, and the heartbeat.
#include "store/job_link.hpp"

#include <spdlog/spdlog.h>

#include "errors.hpp"
#include "job/failure_notice.hpp"
#include "rdzv/rider.hpp"

namespace ddprun {

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

std::shared_ptr<rdzv::TcpStore> connect(const JobLinkOptions& o) {
  rdzv::TcpStoreOptions so;
  so.host = o.host;
  so.port = static_cast<uint16_t>(o.port);
  so.token = o.token;
  so.ns = o.ns;
  so.io_timeout = o.heartbeat_timeout;
  so.heartbeat_timeout = o.heartbeat_timeout;
  const std::string where = o.host + ":" + std::to_string(o.port);
  int signal = 0;
  rdzv::Waiting w;
  w.timeout = o.connect_timeout;
  w.slice = kStopCheckEvery;  // between tries, a stop signal is looked at
  w.notice_every = o.notice_every;
  w.say = [](const std::string& line) { spdlog::info("{}", line); };
  w.cancelled = [&] { return (signal = o.stop_signal ? o.stop_signal() : 0) != 0; };
  const auto start = Clock::now();
  rdzv::Connecting c;
  try {
    c = rdzv::connect_waiting(so, w, [&](const std::string& reason) {
      return "still waiting for the store at " + where + ": " + reason;
    });
  } catch (const rdzv::StoreError& e) {
    throw LaunchError(std::string("rendezvous: ") + e.what());
  }
  if (c.end == rdzv::WaitEnd::kCancelled) throw Interrupted{signal};
  if (!c.store) {
    const auto took = std::chrono::round<std::chrono::seconds>(Clock::now() - start).count();
    throw LaunchError("rendezvous: cannot reach the store at " + where + " within " + std::to_string(took) + " s (" +
                      c.reason + ")");
  }
  return c.store;
}

}  // namespace

// Pings from the link thread, one at a time, until the link is lost or the owner stops.
struct JobLink::Heartbeat : std::enable_shared_from_this<Heartbeat> {
  Heartbeat(rdzv::TcpStore& store, Millis every) : rider(store), every(every) {}

  void schedule(rdzv::TcpStore& store) {  // a step (under the rider)
    store.post_after(every, [self = shared_from_this()] {
      self->rider.ride([&](rdzv::TcpStore& s) { self->beat(s); });
    });
  }
  void beat(rdzv::TcpStore& store) {
    store.ping_async([self = shared_from_this()](rdzv::Done done) {
      try {
        done.get();
      } catch (const rdzv::StoreConnectionError&) {
        return;  // gone: the failure watch tells what that means
      } catch (const rdzv::StoreError&) {
        // One ping that got no answer in time: the next one goes out as planned.
      }
      self->rider.ride([&](rdzv::TcpStore& s) { self->schedule(s); });
    });
  }

  rdzv::Rider rider;
  const Millis every;
};

JobLink::JobLink(JobLinkOptions options) : options_(std::move(options)) {
  if (options_.connect_in_background) {
    client_ = std::async(std::launch::async, [o = options_] { return connect(o); }).share();
  } else {
    std::promise<std::shared_ptr<rdzv::TcpStore>> connected;
    connected.set_value(connect(options_));
    client_ = connected.get_future().share();
  }
}

JobLink::~JobLink() {
  {
    std::lock_guard lock(exits_mu_);
    exits_.reset();  // gives the queued records a short while
  }
  if (heartbeat_) {
    std::shared_ptr<rdzv::TcpStore> link = client();
    if (!rdzv::abandoned_in_child(heartbeat_, link)) heartbeat_->rider.stop();
  }
  client_.wait();  // a connection still being made is waited for (bounded by its timeout)
}

void JobLink::publish_exit(int attempt, const ddp::contract::ExitRecord& record) {
  std::lock_guard lock(exits_mu_);
  if (!exits_ && !exits_failed_) {
    try {
      exits_ = std::make_unique<ExitPublisher>(client());
    } catch (const std::exception& e) {
      exits_failed_ = true;
      spdlog::warn("cannot publish worker exits to the store ({}); other ranks will not hear of them at once",
                   e.what());
    }
  }
  if (exits_) exits_->publish(attempt, record);
}

void JobLink::keep_alive(Millis every) {
  if (heartbeat_) return;
  heartbeat_ = std::make_shared<Heartbeat>(store(), every);
  heartbeat_->rider.ride([&](rdzv::TcpStore& s) { heartbeat_->schedule(s); });
}

}  // namespace ddprun
