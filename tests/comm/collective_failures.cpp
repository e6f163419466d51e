// collective_worker's failure modes (collective_failures.hpp).
#include "collective_failures.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace collective_failures {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

int die(ddp::ProcessGroup& pg, int victim) {
  pg.barrier();
  if (pg.rank() == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::printf("rank %d: dying at %.6f\n", pg.rank(), now_s());
    std::fflush(stdout);
    raise(SIGKILL);
  }
  std::vector<float> v(1 << 16, 1.0f);
  try {
    pg.all_reduce(ddp::view(v));
    std::printf("rank %d: all_reduce returned without error\n", pg.rank());
    return 1;
  } catch (const ddp::PeerError& e) {
    std::printf("rank %d: PeerError rank=%d at %.6f: %s\n", pg.rank(), e.rank(), now_s(), e.what());
  }
  // The group stays broken: the next call fails at once.
  try {
    pg.barrier();
    std::printf("rank %d: barrier after failure returned\n", pg.rank());
    return 1;
  } catch (const ddp::PeerError& e) {
    std::printf("rank %d: then %s\n", pg.rank(), e.what());
  }
  std::fflush(stdout);
  // Stay a moment, as a real program tearing down would: without a launcher rank 0
  // hosts the store, where the others look up the root cause of the failure.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return 0;
}

int stuck(ddp::ProcessGroup& pg, int victim) {
  pg.barrier();
  if (pg.rank() == victim) {
    std::printf("rank %d: stuck at %.6f\n", pg.rank(), now_s());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  std::vector<float> v(1024, 1.0f);
  const double t0 = now_s();
  try {
    pg.all_reduce(ddp::view(v));
    std::printf("rank %d: all_reduce returned without error\n", pg.rank());
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("rank %d: error after %.3f s: %s\n", pg.rank(), now_s() - t0, e.what());
  }
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // keep the store up (see die())
  return 0;
}

// Caller mistakes: one found before anything moves keeps the group usable; a
// recv of the wrong size (bytes already sent) breaks it on both sides, no hang.
// Ranks disagree on a large all-reduce's count: every rank must be refused (none
// may write into a peer's buffer of another size), at once rather than at the timeout.
int disagree(ddp::ProcessGroup& pg) {
  const int r = pg.rank();
  pg.barrier();
  std::vector<float> v(r == 0 ? 100000 : 100001, 1.0f);
  try {
    pg.all_reduce(ddp::view(v));
    std::printf("rank %d: mismatched all_reduce accepted\n", r);
    return 1;
  } catch (const ddp::InvalidArgument& e) {
    std::printf("rank %d: refused: %s\n", r, e.what());
  }
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // keep the store up (see die())
  return 0;
}

// Rank 0 makes another call than the others (mismatch <case> <count>): every rank
// must fail with Mismatch at once. A rank whose part of the call only sends, or
// that never hears from rank 0, may complete it: then its data must be right, and
// its next call (a barrier) fails. Lines name the global rank.
int mismatch(ddp::ProcessGroup& pg, const std::string& what, size_t count, int global_rank) {
  const int r = pg.rank();
  const int g = global_rank;
  const bool odd = r == 0;
  pg.barrier();
  std::vector<float> v(what == "count" && !odd ? 4 * count : count, static_cast<float>(r + 1));
  std::vector<float> out(v.size() * static_cast<size_t>(pg.size()));
  std::vector<int32_t> iv(count, r + 1);
  std::vector<uint8_t> bytes(odd ? count : count - 1, 7);
  const double t0 = now_s();
  try {
    float want = static_cast<float>(r + 1);  // what v holds after a completed call
    if (what == "all_gather") {
      odd ? pg.all_reduce(ddp::view(v)) : pg.all_gather(ddp::view(v), ddp::view(out));
    } else if (what == "broadcast") {
      odd ? pg.all_reduce(ddp::view(v)) : pg.broadcast(ddp::view(v), 0);
    } else if (what == "count") {
      pg.all_reduce(ddp::view(v));
    } else if (what == "dtype") {
      odd ? pg.all_reduce(ddp::view(v)) : pg.all_reduce(ddp::view(iv));
    } else if (what == "root") {
      pg.broadcast(ddp::view(v), odd ? 0 : 1);
      want = odd ? 1.0f : 2.0f;
    } else if (what == "reduce_op") {
      pg.all_reduce(ddp::view(v), odd ? ddp::ReduceOp::Sum : ddp::ReduceOp::Max);
    } else if (what == "skip_then_barrier") {
      // Rank 0 skips the first of two all_reduces. Calls pair by order, so its second
      // runs with the others' first (same shape: not a mismatch); caught only because
      // the others' second then meets rank 0's barrier.
      if (!odd) pg.all_reduce(ddp::view(v));
      pg.all_reduce(ddp::view(v));
      want = static_cast<float>(pg.size() * (pg.size() + 1) / 2);
    } else if (what == "p2p") {  // rank 0 sends count bytes, rank 1 expects count - 1
      if (r == 0) pg.send(ddp::view(bytes), 1);
      if (r == 1) pg.recv(ddp::view(bytes), 0);
    } else {
      std::fprintf(stderr, "collective_worker: unknown mismatch case %s\n", what.c_str());
      return 2;
    }
    const bool right = std::all_of(v.begin(), v.end(), [&](float x) { return x == want; });
    std::printf("rank %d: call returned, data %s\n", g, right ? "right" : "WRONG");
    pg.barrier();
    std::printf("rank %d: mismatch went unnoticed\n", g);
    return 1;
  } catch (const ddp::Mismatch& e) {
    std::printf("rank %d: Mismatch after %.3f s: %s\n", g, now_s() - t0, e.what());
  } catch (const ddp::Error& e) {
    std::printf("rank %d: other error after %.3f s: %s\n", g, now_s() - t0, e.what());
  }
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // keep the store up (see die())
  return 0;
}

// mismatch() in group 0.1 (global ranks 2 and 3; group 0.0 holds ranks 0 and 1,
// which only wait): its text must name global ranks.
int mismatch_in_subgroup(ddp::ProcessGroup& pg, const std::string& what, size_t count, int global_rank) {
  if (pg.size() != 4) {
    std::fprintf(stderr, "collective_worker: mismatch_in_subgroup needs 4 ranks\n");
    return 2;
  }
  auto low = pg.new_group({0, 1});
  auto high = pg.new_group({2, 3});
  if (high) return mismatch(*high, what, count, global_rank);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return 0;
}

int misuse(ddp::ProcessGroup& pg) {
  const int r = pg.rank();
  std::vector<float> in(4, 1.0f), bad_out(3);
  if (r == 0) {
    try {
      pg.all_gather(ddp::view(in), ddp::view(bad_out));
      std::printf("rank 0: bad all_gather accepted\n");
      return 1;
    } catch (const ddp::InvalidArgument& e) {
      std::printf("rank 0: refused: %s\n", e.what());
    }
  }
  pg.barrier();
  std::printf("rank %d: still usable\n", r);
  std::vector<uint8_t> msg(100, 7), small(80);
  try {
    if (r == 0) pg.send(ddp::view(msg), 1);
    if (r == 1) pg.recv(ddp::view(small), 0);
    pg.barrier();
    std::printf("rank %d: mismatched recv went unnoticed\n", r);
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("rank %d: broken: %s\n", r, e.what());
  }
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // keep the store up (see die())
  return 0;
}

int deadlock(ddp::ProcessGroup& pg) {
  std::vector<float> v(4, 1.0f);
  pg.all_reduce(ddp::view(v));
  const int r = pg.rank();
  std::printf("rank %d: deadlocked at %.6f\n", r, now_s());
  std::fflush(stdout);
  try {
    if (r < 2) {
      pg.recv(ddp::view(v), 1 - r);
    } else {
      pg.barrier();
    }
    std::printf("rank %d: the deadlock returned\n", r);
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("rank %d: %s\n", r, e.what());
  }
  return 0;
}

}  // namespace collective_failures
