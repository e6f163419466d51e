// The progress publisher (progress_publisher.hpp) in a forked child: destroying the
// child's copy must neither join the parent's thread nor take the failure listener
// registry's mutex, which another parent thread may have held at the fork.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "flight_recorder.hpp"
#include "forked.hpp"
#include "progress_publisher.hpp"
#include "server_fixture.hpp"

using namespace std::chrono_literals;

TEST_CASE("a forked child destroys its copy of the progress publisher without hanging", "[progress_publisher]") {
  testing::ServerThread server;
  ddp::detail::PublisherOptions o;
  o.key = "progress/0";
  auto publisher = std::make_unique<ddp::detail::ProgressPublisher>(std::shared_ptr<rdzv::TcpStore>(server.client()), o);
  // Another thread takes the registry mutex over and over, as groups forming do.
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load()) ddp::detail::remove_failure_listener(ddp::detail::add_failure_listener([] {}));
  });
  int hung = 0, gone = 0;
  for (int i = 0; i < 20; ++i) {  // forks land at random points of the churn
    testing::ForkedChild child([&] {
      publisher.reset();
      return std::string("gone");
    });
    try {
      if (child.wait(5s).ok) ++gone;
    } catch (const std::runtime_error&) {
      ++hung;  // killed by wait()
    }
  }
  stop.store(true);
  churn.join();
  CHECK(hung == 0);
  CHECK(gone == 20);
  publisher.reset();  // the parent's stops and joins as before
}
