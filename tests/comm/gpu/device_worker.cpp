// device_worker: a ddp_worker program on GPU buffers (cudaMalloc), run by the tests
// of tests/comm/gpu/ under the real ddprun (or as plain processes) on the GPU test
// double (tests/gpu_double/), or on a real GPU machine.
//
//   device_worker matrix        every collective x dtype x reduce op x count {0, 1, 7,
//                               1000} on device buffers against a serial reference;
//                               async work (several in flight), subgroups
//   device_worker auto          backend auto: host buffers and device buffers in one
//                               job (prints the backend it got)
//   device_worker flight        the flight recorder's marks of a call that waits for
//                               a late peer, then completes
//   device_worker die <victim>  the victim SIGKILLs itself while the others wait in an
//                               all_reduce
//   device_worker exit <victim> the victim exits 0 while the others wait in one
//   device_worker subexit <victim>  the same in a subgroup of ranks 1..n-1
//   device_worker mismatch      rank 0 calls broadcast, rank 1 scatter (stalls)
//   device_worker drop <victim> the victim exits 0; the others end their group with an
//                               async all_reduce left unwaited
//   device_worker leave         rank 0 exits 0 right after an all_reduce; the others'
//                               part of it still completes (exit 3: inconclusive)
//   device_worker fault         init, a subgroup and all_reduces until one fails (the
//                               double's DDP_GPU_DOUBLE_FAULTS decides which)
//   device_worker sticky        a kernel fault from earlier work (the double's) fails the
//                               next call's launch, and every later call the same way
//   device_worker misuse        a call NCCL refuses breaks its (sub)group; an
//                               operation timeout and abort() break the group
//
// Prints "rank R: ..." lines; a failure "rank R: ERROR <unix s> <type>: <what>".
// Exits 0 when every check passed, 1 otherwise, 2 on bad use: an unknown mode, a mode
// that needs a peer at world size 1 ("needs at least 2 ranks"), or
// DDP_EXPECT_GPU_DOUBLE=1 (set by the tests under the double) without the double
// loaded (the real libraries would run silently).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/init.hpp"
#include "device_values.hpp"
#include "flight_recorder.hpp"
#include "gpu_double_check.hpp"

namespace {

using ddp::Buffer;
using ddp::DType;
using ddp::ReduceOp;
using namespace std::chrono_literals;
using namespace device_test;

int g_rank = 0;
int g_checks = 0;
int g_failures = 0;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  if (g_failures <= 20) std::printf("rank %d: FAILED %s\n", g_rank, what.c_str());
}

const char* type_of(const std::exception& e) {
  if (dynamic_cast<const ddp::PeerError*>(&e)) return "PeerError";
  if (dynamic_cast<const ddp::Timeout*>(&e)) return "Timeout";
  if (dynamic_cast<const ddp::InvalidArgument*>(&e)) return "InvalidArgument";
  if (dynamic_cast<const ddp::Error*>(&e)) return "Error";
  return "exception";
}

void print_error(const std::exception& e) {
  std::printf("rank %d: ERROR %.6f %s: %s\n", g_rank, now_s(), type_of(e), e.what());
}

// Runs `body`; true when it threw (printed unless `quiet`), false when it returned.
bool fails(const std::function<void()>& body, bool quiet = false) {
  try {
    body();
  } catch (const std::exception& e) {
    if (!quiet) print_error(e);
    return true;
  }
  return false;
}

// ---- the matrix ------------------------------------------------------------

void reducing(ddp::ProcessGroup& pg, DType t, ReduceOp op, size_t c) {
  const int n = pg.size(), r = pg.rank();
  const char* name = ddp::reduce_op_name(op);
  std::vector<double> want(c * n);
  for (size_t i = 0; i < want.size(); ++i) want[i] = reduced(t, op, n, i);
  {
    DeviceBuffer b(t, c);
    b.upload(values(r, c, op));
    pg.all_reduce(b.buf(), op);
    check(same(t, b.download(), {want.begin(), want.begin() + c}), label("all_reduce", t, c, name));
  }
  {
    const int root = n - 1;
    DeviceBuffer b(t, c);
    b.upload(values(r, c, op));
    pg.reduce(b.buf(), root, op);
    check(same(t, b.download(), r == root ? std::vector<double>(want.begin(), want.begin() + c) : values(r, c, op)),
          label("reduce", t, c, name));
  }
  {
    DeviceBuffer in(t, c * n), out(t, c);
    in.upload(values(r, c * n, op));
    pg.reduce_scatter(in.buf(), out.buf(), op);
    check(same(t, out.download(), {want.begin() + r * c, want.begin() + (r + 1) * c}),
          label("reduce_scatter", t, c, name));
  }
}

void moving(ddp::ProcessGroup& pg, DType t, size_t c) {
  const int n = pg.size(), r = pg.rank();
  std::vector<double> everyone;  // every rank's values(rank, c), in rank order
  for (int k = 0; k < n; ++k) {
    auto v = values(k, c);
    everyone.insert(everyone.end(), v.begin(), v.end());
  }
  {
    const int root = 1 % n;
    DeviceBuffer b(t, c);
    b.upload(values(r, c));
    pg.broadcast(b.buf(), root);
    check(same(t, b.download(), values(root, c)), label("broadcast", t, c));
  }
  {
    DeviceBuffer in(t, c), out(t, c * n);
    in.upload(values(r, c));
    pg.all_gather(in.buf(), out.buf());
    check(same(t, out.download(), everyone), label("all_gather", t, c));
  }
  {
    DeviceBuffer in(t, c), out(t, c * n);
    in.upload(values(r, c));
    out.upload(std::vector<double>(c * n, 0));
    pg.gather(in.buf(), out.buf(), 0);
    check(same(t, out.download(), r == 0 ? everyone : std::vector<double>(c * n, 0)), label("gather", t, c));
  }
  {
    const int root = n - 1;
    DeviceBuffer in(t, c * n), out(t, c);
    in.upload(values(r, c * n));
    pg.scatter(in.buf(), out.buf(), root);
    check(same(t, out.download(), values(root, c, ReduceOp::Sum, r * c)), label("scatter", t, c));
  }
  {
    // Block j of rank i's input (values(i, .) from j * c) lands in block i of rank j's output.
    DeviceBuffer in(t, c * n), out(t, c * n);
    in.upload(values(r, c * n));
    pg.all_to_all(in.buf(), out.buf());
    std::vector<double> want;
    for (int k = 0; k < n; ++k) {
      auto v = values(k, c, ReduceOp::Sum, r * c);
      want.insert(want.end(), v.begin(), v.end());
    }
    check(same(t, out.download(), want), label("all_to_all", t, c));
  }
  if (n > 1) {  // a ring: both directions in flight at once
    DeviceBuffer to(t, c), from(t, c);
    to.upload(values(r, c));
    auto s = pg.send(to.buf(), (r + 1) % n, {.async_op = true});
    auto v = pg.recv(from.buf(), (r + n - 1) % n, {.async_op = true});
    s.wait();
    v.wait();
    check(same(t, from.download(), values((r + n - 1) % n, c)), label("send/recv", t, c));
  }
  pg.barrier();
}

// Several operations in flight on the group's stream at once, each waited for later.
void async_work(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<ddp::Work> works;
  for (int k = 0; k < 4; ++k) {
    bufs.push_back(std::make_unique<DeviceBuffer>(DType::F32, 257));
    bufs.back()->upload(std::vector<double>(257, r + k));
    works.push_back(pg.all_reduce(bufs.back()->buf(), ReduceOp::Sum, {.async_op = true}));
  }
  // A caller driving another GPU keeps it: the group's calls run on its own device.
  int mine = -1, devices = 0, now = -1;
  cuda_ok(cudaGetDevice(&mine), "cudaGetDevice");
  cuda_ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cuda_ok(cudaSetDevice((mine + 1) % devices), "cudaSetDevice");
  works.push_back(pg.barrier({.async_op = true}));
  cuda_ok(cudaGetDevice(&now), "cudaGetDevice");
  check(now == (mine + 1) % devices, "the caller's current device is left as it was");
  cuda_ok(cudaSetDevice(mine), "cudaSetDevice");
  DeviceBuffer in(DType::I64, 3), out(DType::I64, 3 * n);
  in.upload(values(r, 3));
  works.push_back(pg.all_gather(in.buf(), out.buf(), {.async_op = true}));
  ddp::wait_all(works);
  for (auto& w : works) check(w.is_completed() && !w.exception(), "async work completed without error");
  for (int k = 0; k < 4; ++k) {
    check(same(DType::F32, bufs[k]->download(), std::vector<double>(257, n * (n - 1) / 2.0 + n * k)),
          "async all_reduce " + std::to_string(k));
  }
  check(out.download()[3 * (n - 1)] == value(n - 1, 0), "async all_gather");
  // One left unwaited: the group's end lets it finish (its buffer outlives the group).
  static DeviceBuffer dropped(DType::F32, 64);
  pg.all_reduce(dropped.buf(), ReduceOp::Sum, {.async_op = true});
}

// new_group({1, 0}) and the odd ranks: members get their own ranks, the others nullptr.
void subgroups(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  if (n < 2) return;
  auto pair = pg.new_group({1, 0});
  check((pair != nullptr) == (r < 2), "new_group({1, 0}) membership");
  if (pair) {
    check(pair->rank() == 1 - r && pair->size() == 2, "new_group({1, 0}) ranks");
    DeviceBuffer b(DType::F32, 5);
    b.upload(std::vector<double>(5, r + 1));
    pair->all_reduce(b.buf());
    check(same(DType::F32, b.download(), std::vector<double>(5, 3)), "subgroup all_reduce");
    DeviceBuffer root(DType::I32, 2);
    root.upload({static_cast<double>(r), 7});
    pair->broadcast(root.buf(), 0);  // the subgroup's rank 0 is global rank 1
    check(same(DType::I32, root.download(), {1, 7}), "subgroup broadcast from its rank 0");
  }
  if (n >= 3) {  // a subgroup of a subgroup: ranks {2, 0} of {0, 1, 2}
    auto trio = pg.new_group({0, 1, 2});
    auto inner = trio ? trio->new_group({2, 0}) : nullptr;
    check((inner != nullptr) == (r == 0 || r == 2), "nested new_group membership");
    if (inner) {
      check(inner->rank() == (r == 2 ? 0 : 1), "nested new_group ranks");
      DeviceBuffer b(DType::I32, 4);
      b.upload(std::vector<double>(4, r + 1));
      inner->all_reduce(b.buf());
      check(same(DType::I32, b.download(), std::vector<double>(4, 4)), "nested subgroup all_reduce");
    }
  }
  std::vector<int> odd;
  for (int k = 1; k < n; k += 2) odd.push_back(k);
  auto odds = pg.new_group(odd);
  check((odds != nullptr) == (r % 2 == 1), "new_group(odd ranks) membership");
  if (odds) {
    DeviceBuffer b(DType::I64, 3);
    b.upload(std::vector<double>(3, r));
    odds->all_reduce(b.buf(), ReduceOp::Max);
    check(same(DType::I64, b.download(), std::vector<double>(3, odd.back())), "odd subgroup all_reduce max");
  }
  pg.barrier();
}

int matrix(ddp::ProcessGroup& pg) {
  const DType dtypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};
  for (DType t : dtypes) {
    for (size_t c : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      for (ReduceOp op : ops) reducing(pg, t, op, c);
      moving(pg, t, c);
    }
  }
  async_work(pg);
  subgroups(pg);
  return 0;
}

// ---- the router --------------------------------------------------------------

int routed(ddp::ProcessGroup& pg) {
  const int n = pg.size(), r = pg.rank();
  std::printf("rank %d: backend %s\n", r, pg.backend().c_str());
  std::vector<float> host(6, static_cast<float>(r + 1));
  pg.all_reduce(ddp::view(host));
  check(host == std::vector<float>(6, n * (n + 1) / 2.0f), "host all_reduce");
  if (pg.backend() == "cpu") {  // there may be no device at all: the refusal comes first
    try {
      pg.all_reduce(Buffer{host.data(), host.size(), DType::F32, ddp::Device::Cuda});
      check(false, "a device buffer on a cpu-only group is refused");
    } catch (const ddp::InvalidArgument& e) {
      check(std::string(e.what()).find("GPU memory") != std::string::npos, "the refusal names GPU memory");
    }
    return 0;
  }
  DeviceBuffer dev(DType::F32, 6);
  dev.upload(std::vector<double>(6, r + 1));
  pg.all_reduce(dev.buf());
  check(same(DType::F32, dev.download(), std::vector<double>(6, n * (n + 1) / 2.0)), "device all_reduce");
  // Device and host calls in flight together: each kind on its own member.
  auto w_dev = pg.all_reduce(dev.buf(), ReduceOp::Max, {.async_op = true});
  auto w_host = pg.all_reduce(ddp::view(host), ReduceOp::Max, {.async_op = true});
  w_dev.wait();
  w_host.wait();
  // Gather and scatter where only the root passes the buffer on the other side.
  DeviceBuffer in(DType::I32, 2), out(DType::I32, r == 0 ? 2 * n : 0);
  in.upload({static_cast<double>(r), static_cast<double>(10 * r)});
  pg.gather(in.buf(), r == 0 ? out.buf() : Buffer{}, 0);
  if (r == 0) check(out.download()[2 * (n - 1) + 1] == 10 * (n - 1), "routed gather");
  pg.scatter(r == 0 ? out.buf() : Buffer{}, in.buf(), 0);
  check(same(DType::I32, in.download(), {static_cast<double>(r), 10.0 * r}), "routed scatter");
  auto sub = n > 1 ? pg.new_group({0, n - 1}) : nullptr;  // at world 1: no subgroup to form
  if (sub) {
    sub->all_reduce(dev.buf());
    sub->all_reduce(ddp::view(host));
  }
  pg.barrier();
  return 0;
}

// ---- the flight recorder ------------------------------------------------------

int flight(ddp::ProcessGroup& pg) {
  DeviceBuffer b(DType::F32, 16);
  b.upload(std::vector<double>(16, 1));
  pg.barrier();
  if (pg.rank() != 0) {
    std::this_thread::sleep_for(300ms);  // rank 0's call waits for this one
    pg.all_reduce(b.buf());
    pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
    pg.barrier();
    return 0;
  }
  std::shared_ptr<ddp::detail::FlightRecorder> rec;
  for (auto& candidate : ddp::detail::all_recorders()) {
    if (candidate->name() == "0") rec = candidate;
  }
  check(rec != nullptr, "group 0 has a flight recorder");
  if (!rec) return 0;
  auto w = pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
  auto c = rec->calls().back();
  check(c.kind == ddp::detail::OpKind::AllReduce, "the last call is the all_reduce");
  check(c.state == ddp::detail::CallState::Started, std::string("pending call is started, not ") +
                                                        ddp::detail::call_state_name(c.state));
  check(!w.is_completed(), "the Work is pending while the peer is away");
  w.wait();
  c = rec->calls().back();
  check(c.state == ddp::detail::CallState::Completed, "completed once its event fired");
  check(c.started >= c.queued && c.ended >= c.started, "queued <= started <= ended");
  check(c.ended - c.started >= 200ms, "the call ended when the late peer came");
  check(rec->progress().completed == rec->progress().issued, "nothing left open");
  // A call nobody waits for still ends in the record once a later call's event fired
  // (the stream runs in order), or the group would look stuck in it for good.
  pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
  pg.barrier();
  for (const auto& call : rec->calls()) {
    check(call.state == ddp::detail::CallState::Completed,
          "call " + std::to_string(call.id) + " (" + call.describe() + ") is " + ddp::detail::call_state_name(call.state));
  }
  check(rec->progress().completed == rec->progress().issued, "an unwaited call is counted completed");
  return 0;
}

// ---- failures ------------------------------------------------------------------

// Whether the GPU test double, not the real CUDA runtime, is loaded.
bool under_double() { return dlsym(RTLD_DEFAULT, "gpu_double_version") != nullptr; }

// A host pointer said to be device memory, in a subgroup of ranks {0, 1}: the double
// refuses it as NCCL refuses a bad argument, which breaks the subgroup for good (NCCL
// refuses every later call on a non-blocking communicator); the parent goes on. Real
// NCCL accepted a host pointer at world 1; with more ranks it is not known, so on a real
// GPU either answer passes, but a refusal must still break the subgroup.
void refusal_breaks_subgroup(ddp::ProcessGroup& pg) {
  auto sub = pg.new_group({0, 1});
  if (!sub) return;
  std::vector<float> host(8, 1);
  Buffer lying{host.data(), host.size(), DType::F32, ddp::Device::Cuda};
  std::string first;
  try {
    sub->all_reduce(lying);
    std::printf("rank %d: NCCL accepted a host pointer\n", g_rank);
    check(!under_double(), "the double refuses a host pointer as device memory");
    return;
  } catch (const ddp::InvalidArgument& e) {
    print_error(e);
    first = e.what();
  }
  check(first.find("the group can no longer be used") != std::string::npos, "the refusal says the group is broken");
  DeviceBuffer b(DType::F32, 8);
  try {
    sub->all_reduce(b.buf());
    check(false, "a call after NCCL's refusal fails");
  } catch (const ddp::InvalidArgument& e) {
    check(e.what() == first, "a call after NCCL's refusal rethrows it");
  }
}

// A refusal breaks its subgroup; a call that outlives its timeout breaks the group,
// and so does abort().
int misuse(ddp::ProcessGroup& pg) {
  const int r = pg.rank();
  refusal_breaks_subgroup(pg);
  DeviceBuffer b(DType::F32, 8);
  b.upload(std::vector<double>(8, 1));
  pg.all_reduce(b.buf());
  check(same(DType::F32, b.download(), std::vector<double>(8, pg.size())), "the group works after the subgroup broke");
  // Rank 1 comes late: a short wait gives up, the operation goes on and completes.
  if (r == 1) std::this_thread::sleep_for(500ms);
  auto w = pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
  if (r == 0) check(fails([&] { w.wait(50ms); }), "a short wait on a pending call times out");
  w.wait();
  pg.barrier();
  // Rank 1 never calls: rank 0's operation times out and breaks its group.
  if (r == 0) {
    check(fails([&] { pg.all_reduce(b.buf(), ReduceOp::Sum, {.timeout = 400ms}); }), "a stuck call times out");
    check(fails([&] { pg.barrier(); }), "the group stays broken");
  } else {
    std::this_thread::sleep_for(1s);
    pg.abort("the test aborts rank " + std::to_string(r));
    check(fails([&] { pg.all_reduce(b.buf()); }), "a call after abort() fails");
  }
  return 0;
}

// Init, a subgroup, then all_reduces until one fails: the first error is printed.
int faulty(ddp::ProcessGroup& pg) {
  auto sub = pg.new_group({0, 1});
  DeviceBuffer b(DType::F32, 32);
  b.upload(std::vector<double>(32, 1));
  for (int i = 0; i < 6; ++i) {
    ddp::Work w = pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
    w.wait();
  }
  std::printf("rank %d: no error\n", g_rank);
  return 1;
}

int victim_job(ddp::ProcessGroup& parent, const std::string& mode, int victim) {
  DeviceBuffer b(DType::F32, 1024);
  std::shared_ptr<ddp::ProcessGroup> sub;
  if (mode == "subexit") {  // ranks 1..n-1; rank 0, no member, leaves at once
    std::vector<int> members;
    for (int k = 1; k < parent.size(); ++k) members.push_back(k);
    sub = parent.new_group(members);
    if (!sub) return 0;
  }
  ddp::ProcessGroup& pg = sub ? *sub : parent;
  pg.barrier();
  if (parent.rank() == victim) {
    std::this_thread::sleep_for(300ms);  // the others wait in the all_reduce by now
    std::printf("rank %d: dying (pid %d) at %.6f\n", g_rank, static_cast<int>(::getpid()), now_s());
    std::fflush(stdout);
    if (mode == "die") ::kill(::getpid(), SIGKILL);
    std::_Exit(0);
  }
  if (!fails([&] { pg.all_reduce(b.buf()); })) return 1;
  check(fails([&] { pg.barrier(); }, /*quiet=*/true), "the group stays broken");
  // Stay a while: a survivor that left at once would be the next one its peers see go.
  std::this_thread::sleep_for(1s);
  return 0;
}

// The victim exits 0; the others leave an async all_reduce unwaited and end the group:
// it must not wait out the group's timeout for a peer that is gone.
int drop_at_exit(ddp::ProcessGroup& pg, int victim) {
  static DeviceBuffer b(DType::F32, 64);  // outlives the group
  pg.barrier();
  if (pg.rank() == victim) std::_Exit(0);
  pg.all_reduce(b.buf(), ReduceOp::Sum, {.async_op = true});
  std::this_thread::sleep_for(300ms);
  return 0;
}

// Rank 0 leaves right after an all_reduce it completed: the others may see its exit
// before their own part ended (DDP_GPU_DOUBLE_DELAY_US makes their streams lag), and
// must still complete it rather than fail naming rank 0 (rank 0 likewise, should a
// peer finish and leave first). A failure proves a bug only when it came within the
// 300 ms grace of the call's start (a peer leaves only after this call started, and
// the grace runs from the first look at its exit); a later one may be this rank lagging
// past the grace on a loaded machine: it says "inconclusive" and exits 3.
int leave_after_call(ddp::ProcessGroup& pg) {
  static DeviceBuffer b(DType::F32, 64);
  b.upload(std::vector<double>(64, 1));
  const auto start = std::chrono::steady_clock::now();
  try {
    pg.all_reduce(b.buf());
  } catch (const std::exception& e) {
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (took < 0.3) throw;
    std::printf("rank %d: inconclusive: the call failed after %.3f s, past the grace: %s\n", g_rank, took, e.what());
    return 3;
  }
  if (pg.rank() == 0) {
    std::printf("rank 0: leaving\n");
    std::fflush(stdout);
    std::_Exit(0);
  }
  check(same(DType::F32, b.download(), std::vector<double>(64, pg.size())), "the call completes after rank 0 left");
  return 0;
}

// The device faults between two calls (the double's gpu_double_fault_device, as a kernel
// fault would): the second call's launch meets CUDA's sticky error, names it, and breaks
// the group, so a third call throws the same error.
int sticky(ddp::ProcessGroup& pg) {
  DeviceBuffer b(DType::F32, 32);
  pg.all_reduce(b.buf());
  auto fault = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "gpu_double_fault_device"));
  int device = -1;
  if (fault == nullptr || cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("sticky needs the double");
  fault(device);
  std::string first, later;
  try {
    pg.all_reduce(b.buf());
  } catch (const std::exception& e) {
    print_error(e);
    first = e.what();
  }
  try {
    pg.all_reduce(b.buf());
  } catch (const std::exception& e) {
    later = e.what();
  }
  check(!first.empty() && later == first, "a later call throws the launch's CUDA error");
  return 0;
}

// Rank 0 calls broadcast from rank 1, rank 1 scatter from rank 0: each waits for data
// the other never sends (NCCL matches calls by position and checks nothing), a hang.
int mismatch(ddp::ProcessGroup& pg) {
  DeviceBuffer buf(DType::F32, 256);
  pg.all_reduce(buf.buf());
  std::printf("rank %d: calling\n", g_rank);
  std::fflush(stdout);
  if (pg.rank() == 0) {
    pg.broadcast(buf.buf(), 1);
  } else {
    pg.scatter(Buffer{}, buf.buf(), 0);
  }
  return 1;  // never reached: ddprun stops the stalled job
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  const char* rank = std::getenv("RANK");
  g_rank = rank ? std::atoi(rank) : 0;
  if (const std::string problem = gpu_double_check::expected_problem(); !problem.empty()) {
    std::fprintf(stderr, "device_worker: %s\n", problem.c_str());
    return 2;
  }
  // Modes whose checks need a peer (a late one, a victim, a second caller).
  static const char* const kNeedsPeers[] = {"flight", "misuse", "fault", "die", "exit", "subexit", "mismatch", "drop",
                                             "leave"};
  const bool needs_peers =
      std::any_of(std::begin(kNeedsPeers), std::end(kNeedsPeers), [&](const char* m) { return mode == m; });
  std::shared_ptr<ddp::ProcessGroup> pg;
  int rc = 1;
  try {
    pg = ddp::init();
    g_rank = pg->rank();
    if (needs_peers && pg->size() < 2) {
      std::fprintf(stderr, "device_worker: mode '%s' needs at least 2 ranks, got %d\n", mode.c_str(), pg->size());
      return 2;
    }
    if (under_double()) std::printf("rank %d: on the GPU test double\n", g_rank);
    if (mode == "matrix") rc = matrix(*pg);
    else if (mode == "auto") rc = routed(*pg);
    else if (mode == "flight") rc = flight(*pg);
    else if (mode == "misuse") rc = misuse(*pg);
    else if (mode == "fault") rc = faulty(*pg);
    else if (mode == "die" || mode == "exit" || mode == "subexit") rc = victim_job(*pg, mode, victim);
    else if (mode == "mismatch") rc = mismatch(*pg);
    else if (mode == "drop") rc = drop_at_exit(*pg, victim);
    else if (mode == "leave") rc = leave_after_call(*pg);
    else if (mode == "sticky") rc = sticky(*pg);
    else {
      std::fprintf(stderr, "device_worker: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    const auto ending = std::chrono::steady_clock::now();
    pg.reset();  // the group ends here, letting unwaited work finish
    std::printf("rank %d: the group ended in %.3f s\n", g_rank,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - ending).count());
  } catch (const std::exception& e) {
    print_error(e);
    if (mode != "fault") return 1;
    // Stay a moment: where every rank fails alike, none should see another leave first.
    std::this_thread::sleep_for(500ms);
    return 0;
  }
  std::printf("rank %d: %d checks, %d failed\n", g_rank, g_checks, g_failures);
  return g_failures == 0 ? rc : 1;
}
