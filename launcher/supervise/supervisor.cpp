#include "supervise/supervisor.hpp"

#include <signal.h>

#include <boost/asio/post.hpp>

#include "supervise/console.hpp"
#include "supervise/worker_group.hpp"

namespace ddprun {

namespace asio = boost::asio;

// ---------------------------------------------------------------------------
// Supervisor
// ---------------------------------------------------------------------------

Supervisor::Supervisor(const LaunchPlan& plan)
    : plan_(plan), signals_(io_), error_files_(plan), drain_hook_(std::make_shared<DrainHook>()) {
  drain_hook_->supervisor = this;
  // Called on a console thread, possibly after this Supervisor is gone: the hook is
  // shared and cleared under its lock by the destructor.
  auto resume = [hook = drain_hook_] {
    std::lock_guard lock(hook->mutex);
    if (hook->supervisor == nullptr) return;
    Supervisor* sup = hook->supervisor;
    asio::post(sup->io_, [sup] {
      if (sup->current_ != nullptr) sup->current_->resume_reading();
    });
  };
  Console::out().on_drained(resume);
  Console::err().on_drained(resume);
  for (int sig : kStopSignals) signals_.add(sig);
  for (int sig : kForwardOnlySignals) signals_.add(sig);
  for (int sig : plan.options.handled_signals) signals_.add(sig);  // adding one twice is harmless
  signals_.add(SIGCHLD);
}

Supervisor::~Supervisor() {
  std::lock_guard lock(drain_hook_->mutex);
  drain_hook_->supervisor = nullptr;
}

int Supervisor::poll_stop_signal() {
  while (true) {
    int got = 0;
    bool fired = false;
    signals_.async_wait([&](const boost::system::error_code& ec, int sig) {
      fired = true;
      if (!ec) got = sig;
    });
    io_.restart();
    io_.poll();
    if (!fired) {
      signals_.cancel();
      io_.restart();
      io_.poll();  // runs the cancelled handler while `fired` and `got` still exist
      return 0;
    }
    if (stops_job(got, plan_.options)) return got;
    // SIGCHLD (the guard is the only child now) or USR1/USR2 with no workers to forward to.
  }
}

void Supervisor::stop_for_remote(int attempt, RemoteCause cause) {
  asio::post(io_, [this, attempt, cause = std::move(cause)]() mutable {
    if (current_ != nullptr && current_->attempt() == attempt) current_->on_remote_failure(std::move(cause));
  });
}

AttemptResult Supervisor::run_attempt(int attempt, const JobLayout& layout, const AttemptHooks& hooks) {
  WorkerGroup group({plan_, io_, guard_, error_files_}, attempt, layout, hooks);
  current_ = &group;
  struct Clear {
    WorkerGroup*& p;
    ~Clear() { p = nullptr; }
  } clear{current_};

  std::function<void(const boost::system::error_code&, int)> on_signal;
  on_signal = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGCHLD) {
      group.reap();
    } else {
      group.on_signal(sig);
    }
    if (!group.done()) signals_.async_wait(on_signal);
  };

  group.start();
  signals_.async_wait(on_signal);
  group.reap();  // children that exited before the handler was armed
  io_.restart();
  while (!group.done()) {
    io_.run();
    io_.restart();
  }
  signals_.cancel();
  return group.finish();
}

}  // namespace ddprun
