// The CPU backend: collectives over shared memory and TCP (see transport.hpp
// and algorithms.hpp), run one at a time in issue order.
//
// Execution: a blocking call runs on the caller's thread when nothing is queued
// (no thread hop: small collectives stay at a few microseconds); an async call, or
// a blocking one behind queued work, goes to the group's progress thread, started
// on first use.
//
// Group memory (allocate): a memfd per rank that the host's other ranks duplicate
// with pidfd_getfd and map, so an all-reduce whose buffers all lie in it reads and
// writes the peers' buffers directly (no system call, no staging copy): what DDP's
// gradient buckets use. It is plain memory (shared() false) where sharing is not
// possible: one rank per host, DDP_DISABLE_CMA=1, no ptrace permission between the
// ranks, a kernel before 5.6, or a seccomp policy without memfd_create or pidfd_getfd.
//
// Mismatch: every message carries its sender's stamp (stamp.hpp); a rank that
// receives another call's stamp than its own fails with Mismatch, recorded in the
// store like a failure, so every rank of the group reports the same text.
//
// Failure: the first PeerLost, StuckTimeout or mismatch breaks the group. The rank that saw
// it first records the root cause in the store (key "failure"), marks its shared
// memory and shuts its sockets, so every peer notices at once and names the same
// dead rank; every later call fails with the same error.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "ddp/contract/store_keys.hpp"
#include "../group_memory.hpp"
#include "algorithms.hpp"
#include "stamp.hpp"
#include "group_setup.hpp"
#include "transport.hpp"
#include "work_state.hpp"

namespace ddp::detail {
namespace {

using cpu::Clock;
constexpr Millis kExitRecordWait{500};  // for ddprun to publish an exit the transport saw first

class CpuBackend final : public Backend {
 public:
  CpuBackend(const GroupSetup& setup, const cpu::TransportOptions& topts)
      : Backend(setup.rank, setup.size, Reach::Host),
        setup_(setup),
        transport_options_(topts),
        transport_(*setup.store, setup.rank, setup.size, topts),
        team_{transport_.progress(), transport_.mesh(), transport_.regions(), every_rank(setup.size), setup.rank,
              scratch_, {}} {}

  ~CpuBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::string kind() const override { return "cpu"; }

  void abort(const std::string& reason) override {
    std::exception_ptr e = std::make_exception_ptr(Error("process group aborted: " + reason));
    std::deque<Task> dropped;
    {
      std::lock_guard lock(mu_);
      if (!broken_) broken_ = e;
      dropped.swap(queue_);
    }
    for (auto& t : dropped) t.state->complete(e);
    transport_.interrupt();  // a running operation stops at its next wait
    cv_.notify_all();
  }

  Work run(const Op& op) override {
    const Call call{op_kind_name(op.kind), op.seq, timeout_of(op.options)};
    return submit(
        call, op.options,
        [op](cpu::Team& t) {
          t.progress.set_call(cpu::stamp_of(op));
          run_algorithm(t, op);
        },
        &op);
  }

  // Group memory: every rank of this host maps it (see Transport::share_memory).
  std::unique_ptr<GroupMemory> allocate_memory(size_t bytes) override {
    std::unique_ptr<GroupMemory> memory;
    std::exception_ptr out_of_memory;  // this rank's alone: the group stays in step and whole
    submit(Call{"allocate", 0, setup_.timeout}, {}, [&](cpu::Team& t) {
      t.progress.set_call(cpu::allocate_stamp());
      try {
        memory = transport_.share_memory(bytes, t.deadline);
      } catch (const Error&) {
        out_of_memory = std::current_exception();
      }
    });
    if (out_of_memory) std::rethrow_exception(out_of_memory);
    return memory;
  }

  std::unique_ptr<Backend> make_subgroup(const std::vector<int>& ranks) override {
    const int id = next_subgroup_++;  // counted on every rank, members or not
    const auto it = std::find(ranks.begin(), ranks.end(), rank());
    if (it == ranks.end()) return nullptr;
    // The subgroup's keys live under its own prefix.
    GroupSetup sub = with_store_prefix(setup_, contract::group_keys::subgroup(id));
    sub.rank = static_cast<int>(it - ranks.begin());
    sub.size = static_cast<int>(ranks.size());
    sub.peers = setup_.peers.narrow(ranks);
    cpu::TransportOptions topts = transport_options_;
    topts.peers = sub.peers;
    return std::make_unique<CpuBackend>(sub, topts);
  }

 private:
  // A task as errors name it, and its limit.
  struct Call {
    const char* name;  // "all_reduce", ..., "allocate"
    uint64_t seq;      // the call's number (Op::seq); 0 for allocate
    Millis timeout;
  };
  // A task's body, borrowed (no allocation) where it runs on the caller's thread.
  class BodyRef {
   public:
    template <typename F>
    static BodyRef of(F& f) {
      return BodyRef(&f, [](void* p, cpu::Team& t) { (*static_cast<F*>(p))(t); });
    }
    void operator()(cpu::Team& t) const { call_(fn_, t); }

   private:
    BodyRef(void* fn, void (*call)(void*, cpu::Team&)) : fn_(fn), call_(call) {}
    void* fn_;
    void (*call_)(void*, cpu::Team&);
  };
  // A task queued for the progress thread.
  struct Task {
    Call call;
    std::function<void(cpu::Team&)> fn;
    std::shared_ptr<Work::State> state;
  };

  static std::vector<int> every_rank(int size) {
    std::vector<int> all(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
    return all;
  }
  Millis timeout_of(const CollectiveOptions& o) const { return o.timeout.count() > 0 ? o.timeout : setup_.timeout; }

  // One checked operation on the algorithms.
  static void run_algorithm(cpu::Team& t, const Op& op) {
    switch (op.kind) {
      case OpKind::AllReduce: return cpu::all_reduce(t, op.input, op.reduce);
      case OpKind::Broadcast: return cpu::broadcast(t, op.input, op.peer);
      case OpKind::Reduce: return cpu::reduce(t, op.input, op.peer, op.reduce);
      case OpKind::AllGather: return cpu::all_gather(t, op.input, op.output);
      case OpKind::Gather: return cpu::gather(t, op.input, op.output, op.peer);
      case OpKind::Scatter: return cpu::scatter(t, op.input, op.output, op.peer);
      case OpKind::ReduceScatter: return cpu::reduce_scatter(t, op.input, op.output, op.reduce);
      case OpKind::AllToAll: return cpu::all_to_all(t, op.input, op.output);
      case OpKind::Barrier: return cpu::barrier(t);
      case OpKind::Send: return cpu::send(t, op.input, op.peer);
      case OpKind::Recv: return cpu::recv(t, op.output, op.peer);
    }
  }

  // ---- execution ------------------------------------------------------------
  // `op`: the operation whose Work this is (null for allocate, which is no call).
  template <typename Fn>
  Work submit(const Call& call, CollectiveOptions o, Fn&& fn, const Op* op = nullptr) {
    std::shared_ptr<Work::State> state = fresh_state();
    if (op) state->attach(*op);
    {
      std::unique_lock lock(mu_);
      if (broken_) std::rethrow_exception(broken_);
      if (!o.async_op && queue_.empty() && !running_) {
        running_ = true;  // run inline: nothing is ahead of us, and the group is whole
        lock.unlock();
        execute(call, BodyRef::of(fn), *state, nullptr);
        lock.lock();
        running_ = false;
        const bool queued = !queue_.empty();  // the progress thread waits for running_
        lock.unlock();
        if (queued) cv_.notify_all();
        // Completed on this thread, and only this thread completes it.
        if (state->error) std::rethrow_exception(state->error);
        return Work(std::move(state));
      }
      queue_.push_back(Task{call, std::forward<Fn>(fn), state});
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    Work w(state);
    if (!o.async_op) w.wait();
    return w;
  }

  // The State of a call's Work: the previous call's again once nothing holds it but
  // this group (a blocking call's Work is mostly dropped at once), else a new one.
  // Only the issuing thread calls this.
  std::shared_ptr<Work::State> fresh_state() {
    if (spare_ && spare_.use_count() == 1) {
      // The last other holder's uses of it happen before its release of the count.
      std::atomic_thread_fence(std::memory_order_acquire);
      spare_->reset();
    } else {
      spare_ = std::make_shared<Work::State>();
    }
    return spare_;
  }

  void loop() {
    for (;;) {
      Task task;
      std::exception_ptr broken;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
        broken = broken_;
      }
      execute(task.call, BodyRef::of(task.fn), *task.state, broken);
      {
        std::lock_guard lock(mu_);
        running_ = false;
      }
      cv_.notify_all();
    }
  }

  // Runs one task (`broken`: the group's error when it was taken, which fails it at
  // once). Tasks run one at a time (running_), so the transport and team_ are this
  // thread's.
  void execute(const Call& call, BodyRef body, Work::State& state, std::exception_ptr error) {
    const auto start = Clock::now();
    state.mark_started(start);
    if (!error) {
      team_.deadline = cpu::deadline_after(call.timeout);
      try {
        body(team_);
      } catch (const cpu::PeerLost& lost) {
        if (lost.peer < 0) {  // abort(), or a broken transport
          std::lock_guard lock(mu_);
          if (!broken_) broken_ = std::make_exception_ptr(Error(std::string(call.name) + ": " + lost.detail));
          error = broken_;
        } else {
          error = fail(call, lost.peer, exit_cause(lost).value_or(lost.detail), false);
        }
      } catch (const cpu::Mismatched& m) {
        error = fail(call, m.peer, mismatch_text(m), false, true);
      } catch (const cpu::StuckTimeout& stuck) {
        error = fail(call, stuck.waiting_for.empty() ? -1 : stuck.waiting_for.front(),
                     "timed out after " + std::to_string(call.timeout.count()) + " ms", true);
      } catch (const InvalidArgument& e) {
        // Found while running (a recv of the wrong size, counts that only one rank
        // can check): peers may already have sent bytes this rank will not read, so
        // the streams are out of step. Peers hear about it; this rank gets the error.
        fail(call, rank(), e.what(), false);
        error = std::current_exception();
      } catch (...) {
        error = std::current_exception();
        std::lock_guard lock(mu_);
        if (!broken_) broken_ = error;
      }
    }
    state.complete(error, Work::Timing{start, Clock::now(), true});
  }

  // "mismatched calls in group 0.1: rank 2: all_reduce #3 262144×f32 sum; rank 3:
  // all_gather #3 1048576×f32": the same text on both sides (lower rank first), ranks
  // named by their global rank as exit reports name them (a stamp's root stays a group rank).
  std::string mismatch_text(const cpu::Mismatched& m) {
    const auto& peers = setup_.peers;
    std::string a = "rank " + std::to_string(peers.global(rank())) + ": " + cpu::describe(transport_.progress().call());
    std::string b = "rank " + std::to_string(peers.global(m.peer)) + ": " + cpu::describe(m.theirs);
    if (m.peer < rank()) std::swap(a, b);
    return "mismatched calls in group " + group_name() + ": " + a + "; " + b;
  }

  // How errors name a task: "all_reduce #57 of group 0" (built only when one fails).
  std::string label(const Call& call) const {
    std::string out = call.name;
    if (call.seq > 0) out += " #" + std::to_string(call.seq);
    return out + " of group " + group_name();
  }

  // How `peer`, gone while this rank waited for it, exited, as ddprun published it
  // ("rank 1 exited with code 0 at ... on node 0 (hosta)"); nothing without ddprun.
  std::optional<std::string> exit_cause(const cpu::PeerLost& lost) const {
    const auto& exits = setup_.peers.exits;
    if (!exits) return std::nullopt;
    const int global = setup_.peers.global(lost.peer);
    auto exit = exits->record(global);
    if (!exit) {
      // Its pidfd or socket (closed, reset) may tell a moment before ddprun has reaped
      // it; unless a peer already recorded the group's root cause (then that names it).
      try {
        if (!setup_.store->check({contract::group_keys::failure()})) exit = exits->wait_record(global, kExitRecordWait);
      } catch (const std::exception&) {
        // The store is gone too: go on with what the transport saw.
      }
    }
    if (!exit) return std::nullopt;
    return exit->describe();
  }

  // Breaks the group; returns the error every pending and later call reports. A
  // mismatch is recorded as "<blamed> mismatch\n<text>" and reported as Mismatch; an
  // exit as "<blamed> exit\n<how it exited>", to which each rank adds its own call
  // (", while this rank waits for it in barrier #2 of group 0"): the rank that
  // recorded it may wait in another.
  std::exception_ptr fail(const Call& call, int blamed, const std::string& detail, bool timeout,
                          bool mismatch = false) {
    const char* op = call.name;
    bool exited = !mismatch && !timeout && detail.starts_with("rank ");  // an exit as ddprun published it
    // Someone may already have recorded the root cause: prefer it, so every rank
    // names the same dead rank.
    std::string cause;
    try {
      if (setup_.store->check({contract::group_keys::failure()})) cause = setup_.store->get(contract::group_keys::failure(), Millis(1000));
    } catch (const std::exception&) {
      // The store is gone too (its host died or exited): go on with what we saw.
    }
    if (cause.empty() && blamed >= 0) {
      std::string mine = std::to_string(blamed);
      if (mismatch) mine += " mismatch\n" + detail;
      else if (timeout) mine += "\nno progress from " + transport_.describe(blamed) + ": " + detail;
      else if (exited) mine += " exit\n" + detail;
      else mine += "\n" + transport_.describe(blamed) + " failed (" + detail + ")";
      try {
        cause = setup_.store->compare_set(contract::group_keys::failure(), "", mine);
      } catch (const std::exception&) {
        cause = mine;
      }
    }
    int root = blamed;
    std::string text = detail;
    if (const auto nl = cause.find('\n'); nl != std::string::npos) {
      root = std::atoi(cause.substr(0, nl).c_str());
      text = cause.substr(nl + 1);
      mismatch = cause.compare(0, nl, std::to_string(root) + " mismatch") == 0;
      exited = cause.compare(0, nl, std::to_string(root) + " exit") == 0;
    }
    if (exited) text += ", while this rank waits for it in " + label(call);
    transport_.poison(root);
    std::exception_ptr e;
    // This rank by its global rank, as the exit reports and mismatch texts name ranks
    // (a subgroup's own rank would name another process); the label names the group.
    const std::string what = std::string(op) + " failed on rank " + std::to_string(setup_.peers.global(rank())) + ": " + text;
    if (mismatch) e = std::make_exception_ptr(Mismatch(text));
    else if (timeout && root == blamed) e = std::make_exception_ptr(Timeout(what));
    else e = std::make_exception_ptr(PeerError(root, what));
    std::deque<Task> dropped;
    {
      std::lock_guard lock(mu_);
      if (!broken_) broken_ = e;
      e = broken_;
      dropped.swap(queue_);
    }
    for (auto& t : dropped) t.state->complete(e);
    return e;
  }

  GroupSetup setup_;
  cpu::TransportOptions transport_options_;
  cpu::Transport transport_;
  std::vector<std::byte> scratch_;
  cpu::Team team_;  // every rank of the group; its deadline is set per task
  std::shared_ptr<Work::State> spare_;  // the last call's State (fresh_state)
  int next_subgroup_ = 0;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::exception_ptr broken_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const GroupSetup& setup) {
  cpu::TransportOptions topts;
  topts.advertise_host = setup.advertise_host;
  topts.bind_host = setup.bind_host;
  topts.connect_timeout = setup.connect_timeout;
  topts.peers = setup.peers;
  return std::make_unique<CpuBackend>(setup, topts);
}

}  // namespace ddp::detail
