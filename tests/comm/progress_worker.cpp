// A worker for tests/comm/progress_test.cpp, run by the real ddprun with 2 ranks:
// rank 1 makes known calls (two groups, DDP steps, report_step(), a collective that
// times out); rank 0 reads rank 1's ProgressRecord from the job's store, as ddprun
// would (DDPRUN_STORE_*, unprefixed job keys), and checks what it says. Prints
// "progress: ..." lines; exits 1 after "progress: FAILED: ..." when a check fails.
// With DDP_FLIGHT_RECORDER=0 the record must hold no groups but still the steps.
// Every rank also checks what init() costs it: one store connection for init, the
// exit watch and the progress records together, and at most one thread.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/contract/job_records.hpp"
#include "ddp/contract/store_keys.hpp"
#include "ddp/distributed_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/nn.hpp"
#include "ddp/progress.hpp"
#include "rdzv/tcp_store.hpp"

using namespace std::chrono_literals;
using ddp::contract::GroupProgress;
using ddp::contract::ProgressRecord;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("progress: %s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

const GroupProgress* group_of(const ProgressRecord& r, const std::string& name) {
  for (const auto& g : r.groups) {
    if (g.group == name) return &g;
  }
  return nullptr;
}

// Threads of this process, now.
int threads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  closedir(d);
  return n;
}

// Sockets of this process connected to TCP port `port` (the store's).
int connections_to(int port) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    if (getpeername(std::atoi(e->d_name), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (peer.ss_family == AF_INET && ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port) == port) ++n;
  }
  closedir(d);
  return n;
}

// Reads rank `rank`'s record until `ready` accepts it (or 15 s pass).
std::optional<ProgressRecord> await_record(rdzv::Store& store, const std::string& key,
                                           bool (*ready)(const ProgressRecord&)) {
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  std::optional<ProgressRecord> last;
  while (std::chrono::steady_clock::now() < deadline) {
    if (store.check({key})) {
      last = ProgressRecord::decode(store.get(key, 1000ms));
      if (last && ready(*last)) return last;
    }
    std::this_thread::sleep_for(20ms);  // polling a peer's record, as ddprun status does
  }
  if (last) std::printf("progress: last record seen:\n%s\n", last->encode().c_str());
  return std::nullopt;
}

std::string summary(const std::optional<ddp::contract::OpSummary>& s) {
  if (!s) return "(none)";
  return "#" + std::to_string(s->seq) + " " + s->what + " " + s->state;
}

// The calls both ranks make: 5 all-reduces, a subgroup's broadcast, DDP's broadcast
// and two steps (a no_sync backward between them), an all-reduce of 7 i64 (max).
// Returns the subgroup (records show live groups only).
std::shared_ptr<ddp::ProcessGroup> known_calls(const std::shared_ptr<ddp::ProcessGroup>& pg) {
  std::vector<float> f(1024, 1.0f);
  for (int i = 0; i < 5; ++i) pg->all_reduce(ddp::view(f));
  auto sub = pg->new_group({0, 1});
  std::vector<int32_t> b(8, pg->rank());
  sub->broadcast(ddp::view(b), 1);
  auto model = ddp::make_mlp({.sizes = {8, 4, 2}, .seed = 1});
  ddp::DistributedDataParallel dp(*model, pg);  // broadcast #6
  ddp::Tensor x(4, 8), dlogits;
  for (float& v : x.span()) v = 0.5f;
  std::vector<int32_t> y{0, 1, 0, 1};
  auto step = [&] {
    ddp::softmax_cross_entropy(dp.forward(x), y, dlogits);
    dp.backward(dlogits);
  };
  step();  // all_reduce #7, step 1
  {
    auto guard = dp.no_sync();
    step();  // no reduction, no step
  }
  step();  // all_reduce #8, step 2
  std::vector<int64_t> m(7, pg->rank());
  pg->all_reduce(ddp::view(m), ddp::ReduceOp::Max);  // #9
  return sub;
}

}  // namespace

int main() {
  try {
    const int threads_before = threads();
    auto pg = ddp::init();
    const auto env = ddp::contract::WorkerEnv::from_environment();
    const int added = threads() - threads_before;
    check(added <= 1, "init() added at most one thread (" + std::to_string(added) + ")");
    const int links = env.store ? connections_to(env.store->port) : -1;
    check(links == 1, "one store connection for init, exit watch and progress (" + std::to_string(links) + ")");
    const bool recording = ddp::contract::CommSettings::from_environment().flight_recorder_entries > 0;
    if (!env.store || env.world_size != 2) {
      std::printf("progress: FAILED: run me under ddprun with 2 ranks\n");
      return 1;
    }
    rdzv::TcpStoreOptions so;
    so.host = env.store->addr;
    so.port = static_cast<uint16_t>(env.store->port);
    so.token = env.store->token;
    so.ns = env.store->ns;
    rdzv::TcpStore store(so);
    const ddp::contract::JobKeys keys(env.restart_count);
    const std::string theirs = keys.progress(1);
    const std::string checked = keys.process_groups() + "progress_test/checked";

    const auto sub = known_calls(pg);
    if (env.rank == 1) {
      ddp::report_step();  // the program's own count adds to DDP's
      pg->barrier();       // #10: waits until rank 0 has read this rank's record
      if (recording) {
        // #11, alone: it times out while rank 0 watches the record.
        std::vector<float> f(16);
        try {
          pg->all_reduce(ddp::view(f), ddp::ReduceOp::Sum, {.timeout = 300ms});
          check(false, "a lone all_reduce times out");
        } catch (const ddp::Error& e) {
          std::printf("progress: rank 1's all_reduce failed as planned: %s\n", e.what());
        }
      }
      store.get(checked, 60000ms);
      return 0;
    }

    // Rank 0: rank 1 is in barrier #10, which this rank has not entered.
    auto r = recording ? await_record(store, theirs, [](const ProgressRecord& p) {
      const auto* g = group_of(p, "0");
      return g && g->current && g->current->seq == 10;
    })
                       : await_record(store, theirs, [](const ProgressRecord& p) { return p.steps == 3; });
    check(r.has_value(), "rank 1's record appears in the store");
    if (r) {
      check(r->rank == 1 && r->pid > 0 && !r->host.empty() && r->rss_kb > 0,
            "it names rank 1, its pid " + std::to_string(r->pid) + ", host " + r->host + ", RSS " +
                std::to_string(r->rss_kb) + " KiB");
      check(r->steps == 3, "steps: DDP's 2 and report_step()'s 1 (got " + std::to_string(r->steps) + ")");
      check(std::llabs(ddp::contract::unix_millis_now() - r->time_ms) < 5000, "its time is now");
      if (!recording) {
        check(r->groups.empty(), "DDP_FLIGHT_RECORDER=0: no groups");
      } else {
        check(r->groups.size() == 2, "two groups (" + std::to_string(r->groups.size()) + ")");
        const auto* g = group_of(*r, "0");
        check(g && g->rank == 1 && g->size == 2 && g->issued == 10 && g->completed == 9,
              "group 0: rank 1 of 2, 10 issued, 9 completed");
        check(g && g->current && g->current->what == "barrier" && g->current->state != "completed",
              "group 0 waits in barrier #10: " + summary(g ? g->current : std::nullopt));
        check(g && g->last_completed && g->last_completed->seq == 9 &&
                  g->last_completed->what == "all_reduce 7\u00d7i64 max" && g->last_completed->state == "completed",
              "group 0 last completed all_reduce #9: " + summary(g ? g->last_completed : std::nullopt));
        const auto* s = group_of(*r, "0.0");
        check(s && s->issued == 1 && s->completed == 1 && s->last_completed &&
                  s->last_completed->what == "broadcast 8\u00d7i32 root 1",
              "group 0.0 completed broadcast #1: " + summary(s ? s->last_completed : std::nullopt));
      }
    }
    pg->barrier();  // #10
    if (recording) {
      // Rank 1's all_reduce #11 times out (this rank never calls it): the failure is
      // published at once, not at the next heartbeat.
      auto f = await_record(store, theirs, [](const ProgressRecord& p) {
        const auto* g = group_of(p, "0");
        return g && g->current && g->current->state == "failed";
      });
      check(f.has_value(), "rank 1's failed all_reduce appears in its record");
      if (f) {
        const auto* g = group_of(*f, "0");
        check(g->current->seq == 11 && g->current->what == "all_reduce 16\u00d7f32 sum",
              "the failed call is all_reduce #11: " + summary(g->current));
        const int64_t lag = f->time_ms - g->current->since_ms;
        std::printf("progress: published %lld ms after the failure\n", static_cast<long long>(lag));
        check(lag >= 0 && lag < 300, "the failure is published at once (heartbeats are 1 s apart)");
      }
    }
    store.set(checked, "1");
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("progress: FAILED: %s\n", e.what());
    return 1;
  }
}
