// exit_worker: a ddp_worker program for the exit cases of the hang matrix (under the
// real ddprun, or as a plain process). One rank, the victim, goes away or never
// comes; every other rank must fail at once with an error that names it.
//
//   exit_worker before_init <victim>          the victim exits 0 before ddp::init()
//   exit_worker in_collective <victim> <bytes> the victim exits 0 after a barrier while
//                                             the others enter an all_reduce of <bytes>
//   exit_worker subgroup <victim>             ranks 1..n-1 form a subgroup; the victim
//                                             (a member) exits 0 while the other members
//                                             all_reduce on the subgroup; rank 0 exits 0
//   exit_worker recv_barrier <victim>         the victim exits 0 while rank 0 waits in a
//                                             recv from it and the others in a barrier
//   exit_worker never <victim>                the victim never calls init (sleeps 10 s)
//   exit_worker init_only                     init() and a barrier; nothing else
//
// The victim prints "EXIT <unix seconds>" just before it exits; every other rank
// prints "ERROR <unix seconds> <exception type> <what()>" when its call fails, or
// "OK" when it did not. Exits 0 when it saw what its role expects, 1 otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ddp/init.hpp"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int env_rank() {
  const char* r = std::getenv("RANK");
  return r ? std::atoi(r) : 0;
}

[[noreturn]] void exit_now() {
  std::printf("EXIT %.6f\n", now_s());
  std::fflush(stdout);
  std::_Exit(0);
}

// Runs `body`; prints how it failed. Returns 0 when it failed (what a survivor expects).
template <class F>
int expect_failure(F&& body) {
  try {
    body();
  } catch (const ddp::PeerError& e) {
    std::printf("ERROR %.6f PeerError %s\n", now_s(), e.what());
    return 0;
  } catch (const ddp::Timeout& e) {
    std::printf("ERROR %.6f Timeout %s\n", now_s(), e.what());
    return 0;
  } catch (const std::exception& e) {
    std::printf("ERROR %.6f Error %s\n", now_s(), e.what());
    return 0;
  }
  std::printf("OK\n");
  return 1;
}

void all_reduce_bytes(ddp::ProcessGroup& pg, size_t bytes) {
  std::vector<float> v(std::max<size_t>(bytes / sizeof(float), 1), 1.0f);
  pg.all_reduce(ddp::view(v));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  const int rank = env_rank();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (mode == "init_only") return expect_failure([] { ddp::init()->barrier(); }) == 0 ? 1 : 0;  // 0: it worked
  if (mode == "before_init" || mode == "never") {
    if (rank == victim) {
      if (mode == "never") std::this_thread::sleep_for(std::chrono::seconds(10));
      exit_now();
    }
    return expect_failure([] { ddp::init(); });
  }
  auto pg = ddp::init();
  pg->barrier();
  if (mode == "in_collective") {
    const size_t bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 4096;
    if (rank == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting by now
      exit_now();
    }
    return expect_failure([&] { all_reduce_bytes(*pg, bytes); });
  }
  if (mode == "recv_barrier") {
    if (rank == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      exit_now();
    }
    if (rank != 0) return expect_failure([&] { pg->barrier(); });
    std::vector<float> v(16);
    return expect_failure([&] { pg->recv(ddp::view(v), victim); });
  }
  if (mode == "subgroup") {
    std::vector<int> members;
    for (int r = 1; r < pg->size(); ++r) members.push_back(r);
    auto sub = pg->new_group(members);
    if (!sub) return 0;  // rank 0: not a member, nothing waits for the victim
    if (rank == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      exit_now();
    }
    return expect_failure([&] { all_reduce_bytes(*sub, 4096); });
  }
  std::fprintf(stderr, "usage: exit_worker before_init|in_collective|recv_barrier|subgroup|never <victim> [bytes] | init_only\n");
  return 2;
}
