// The flight recorder's ring and the process-wide registry of recorders (see
// flight_recorder.hpp for the terms and the cost model).
#include "flight_recorder.hpp"

#include <time.h>

#include <algorithm>
#include <thread>
#include <type_traits>

#include "ddp/contract/worker_env.hpp"

namespace ddp::detail {
namespace {

int64_t to_ns(RecorderClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
RecorderClock::time_point from_ns(int64_t ns) { return RecorderClock::time_point(std::chrono::nanoseconds(ns)); }

// A steady-clock instant as unix milliseconds (the clocks' offset taken now).
int64_t unix_millis(RecorderClock::time_point t) {
  const auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(RecorderClock::now() - t).count();
  return contract::unix_millis_now() - ago;
}

uint64_t ring_capacity(size_t entries) {
  uint64_t c = 1;
  while (c < entries) c <<= 1;
  return c;
}

// Every live recorder (weakly) and who wants to hear of failures. Never destroyed:
// groups and the publisher may outlive static destruction.
struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
  std::vector<std::pair<int, std::function<void()>>> listeners;
  int next_listener = 0;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void notify_failure() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (auto& [handle, listener] : r.listeners) listener();
}

}  // namespace

constexpr uint64_t kWriting = ~uint64_t{0};  // a slot's id while a writer holds it

// One call; every field atomic so a reader never tears a value. `id` is the slot's
// version: 0 while unused, kWriting while a writer holds it (see claim()).
struct alignas(64) FlightRecorder::Slot {
  std::atomic<uint64_t> id{0};
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> count{0};
  std::atomic<uint32_t> what{0};  // kind | dtype << 8 | reduce << 16
  std::atomic<int32_t> peer{-1};
  std::atomic<uint8_t> state{0};  // CallState; written after the timestamp it implies
  std::atomic<int64_t> queued{0}, started{0}, ended{0};  // steady-clock ns
};

// Writers take a slot by swapping its id for 0 and give it back by storing the id:
// queued() takes it whatever call it holds (waiting while another writer has it),
// started()/ended() only while it still holds call `id`. So marking a call whose
// slot a newer call took (more calls in flight than the ring holds) leaves the
// newer entry intact. Writers hold a slot for a few stores.
bool FlightRecorder::claim(Slot& s, uint64_t id) {
  for (;;) {
    uint64_t v = s.id.load(std::memory_order_relaxed);
    if (v == kWriting) {  // another writer: a few stores (unless it was preempted)
      std::this_thread::yield();
      continue;
    }
    if (id != 0 && v != id) return false;
    if (s.id.compare_exchange_weak(v, kWriting, std::memory_order_acquire, std::memory_order_relaxed)) break;
  }
  std::atomic_thread_fence(std::memory_order_release);  // readers see kWriting before any new field
  return true;
}

RecorderClock::time_point coarse_now() {
  // steady_clock is CLOCK_MONOTONIC: the coarse clock counts from the same origin.
  static_assert(std::is_same_v<RecorderClock, std::chrono::steady_clock>);
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return from_ns(static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
}

const char* call_state_name(CallState s) {
  switch (s) {
    case CallState::Queued: return "queued";
    case CallState::Started: return "started";
    case CallState::Completed: return "completed";
    case CallState::Failed: return "failed";
  }
  return "?";
}

std::string CallRecord::describe() const {
  Op op;
  op.kind = kind;
  op.input = op.output = Buffer{nullptr, count, dtype, Device::Cpu};
  op.peer = peer;
  op.reduce = reduce;
  return describe_op(op);
}

RecorderClock::time_point CallRecord::since() const {
  switch (state) {
    case CallState::Queued: return queued;
    case CallState::Started: return started;
    default: return ended;
  }
}

FlightRecorder::FlightRecorder(size_t entries, int rank, int size)
    : entries_(entries),
      mask_(ring_capacity(entries) - 1),
      ring_(new Slot[mask_ + 1]),
      rank_(rank),
      size_(size) {}

FlightRecorder::~FlightRecorder() = default;

std::shared_ptr<FlightRecorder> FlightRecorder::create(size_t entries, int rank, int size) {
  if (entries == 0) throw InvalidArgument("flight recorder: at least one entry");
  std::shared_ptr<FlightRecorder> r(new FlightRecorder(entries, rank, size));
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  std::erase_if(reg.recorders, [](const auto& w) { return w.expired(); });
  reg.recorders.push_back(r);
  return r;
}

void FlightRecorder::set_name(const std::string& name) {
  std::lock_guard lock(name_mu_);
  name_ = name;
}

std::string FlightRecorder::name() const {
  std::lock_guard lock(name_mu_);
  return name_;
}

FlightRecorder::Slot& FlightRecorder::slot(uint64_t id) const { return ring_[(id - 1) & mask_]; }

uint64_t FlightRecorder::queued(const Op& op, RecorderClock::time_point now) {
  constexpr auto relaxed = std::memory_order_relaxed;
  const uint64_t id = last_id_.load(relaxed) + 1;
  const Buffer& b = op.input.count == 0 && op.output.count > 0 ? op.output : op.input;
  Slot& s = slot(id);
  claim(s, 0);  // readers of this slot retry from here on
  // A send or recv still pending in this slot will not see its end counted (its
  // ended() finds the slot taken): count it ended now, as not known to complete.
  if (s.queued.load(relaxed) != 0 && s.state.load(relaxed) < static_cast<uint8_t>(CallState::Completed) &&
      is_point_to_point(static_cast<OpKind>(s.what.load(relaxed) & 0xff))) {
    p2p_failed_.fetch_add(1, relaxed);
    p2p_ended_.fetch_add(1, std::memory_order_release);
  }
  s.seq.store(op.seq, relaxed);
  s.count.store(b.count, relaxed);
  s.what.store(static_cast<uint32_t>(op.kind) | static_cast<uint32_t>(b.dtype) << 8 |
                   static_cast<uint32_t>(op.reduce) << 16,
               relaxed);
  s.peer.store(op.peer, relaxed);
  s.queued.store(to_ns(now), relaxed);
  s.started.store(0, relaxed);
  s.ended.store(0, relaxed);
  s.state.store(static_cast<uint8_t>(CallState::Queued), relaxed);
  s.id.store(id, std::memory_order_release);
  last_id_.store(id, std::memory_order_release);
  if (!is_point_to_point(op.kind)) {
    issued_.store(op.seq, relaxed);
    last_collective_.store(id, std::memory_order_release);
  } else {
    p2p_issued_.store(p2p_issued_.load(relaxed) + 1, std::memory_order_release);
  }
  return id;
}

void FlightRecorder::started(uint64_t id, RecorderClock::time_point t) {
  Slot& s = slot(id);
  if (!claim(s, id)) return;
  if (s.state.load(std::memory_order_relaxed) == static_cast<uint8_t>(CallState::Queued)) {
    s.started.store(to_ns(t), std::memory_order_relaxed);
    s.state.store(static_cast<uint8_t>(CallState::Started), std::memory_order_relaxed);
  }
  s.id.store(id, std::memory_order_release);
}

void FlightRecorder::ended(uint64_t id, bool ok, RecorderClock::time_point t) {
  Slot& s = slot(id);
  // Already ended (the usual case: issue() settling a call its Work has marked): no
  // claim. The id is read first, so an outcome seen here is this call's.
  if (s.id.load(std::memory_order_acquire) == id &&
      s.state.load(std::memory_order_acquire) >= static_cast<uint8_t>(CallState::Completed)) {
    return;
  }
  if (!claim(s, id)) return;
  if (s.state.load(std::memory_order_relaxed) >= static_cast<uint8_t>(CallState::Completed)) {
    s.id.store(id, std::memory_order_release);
    return;
  }
  s.ended.store(to_ns(t == RecorderClock::time_point{} ? RecorderClock::now() : t), std::memory_order_relaxed);
  s.state.store(static_cast<uint8_t>(ok ? CallState::Completed : CallState::Failed), std::memory_order_relaxed);
  const bool collective = !is_point_to_point(static_cast<OpKind>(s.what.load(std::memory_order_relaxed) & 0xff));
  const uint64_t seq = s.seq.load(std::memory_order_relaxed);
  s.id.store(id, std::memory_order_release);
  if (!collective) {  // failed before ended: progress() reads ended first
    if (!ok) p2p_failed_.fetch_add(1, std::memory_order_relaxed);
    if (ok) last_p2p_completed_.store(id, std::memory_order_release);
    p2p_ended_.fetch_add(1, std::memory_order_release);
  }
  if (!ok) return notify_failure();
  if (!collective) return;
  completed_.store(seq, std::memory_order_relaxed);
  last_completed_.store(id, std::memory_order_release);
}

std::optional<CallRecord> FlightRecorder::read(uint64_t id) const {
  const Slot& s = slot(id);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint64_t version = s.id.load(std::memory_order_acquire);
    if (version == kWriting) continue;  // being rewritten: look again
    if (version != id) return std::nullopt;  // overwritten by a later call
    CallRecord r;
    r.id = id;
    r.state = static_cast<CallState>(s.state.load(std::memory_order_acquire));
    r.seq = s.seq.load(std::memory_order_relaxed);
    r.count = s.count.load(std::memory_order_relaxed);
    const uint32_t what = s.what.load(std::memory_order_relaxed);
    r.kind = static_cast<OpKind>(what & 0xff);
    r.dtype = static_cast<DType>((what >> 8) & 0xff);
    r.reduce = static_cast<ReduceOp>((what >> 16) & 0xff);
    r.peer = s.peer.load(std::memory_order_relaxed);
    r.queued = from_ns(s.queued.load(std::memory_order_relaxed));
    r.started = from_ns(s.started.load(std::memory_order_relaxed));
    r.ended = from_ns(s.ended.load(std::memory_order_relaxed));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.id.load(std::memory_order_relaxed) == id) return r;
  }
  return std::nullopt;
}

std::vector<CallRecord> FlightRecorder::calls() const {
  const uint64_t last = last_id_.load(std::memory_order_acquire);
  const uint64_t first = last > entries_ ? last - entries_ + 1 : 1;
  std::vector<CallRecord> out;
  out.reserve(static_cast<size_t>(last - first + 1));
  for (uint64_t id = first; id <= last; ++id) {
    if (auto r = read(id)) out.push_back(*r);
  }
  return out;
}

contract::GroupProgress FlightRecorder::progress() const {
  auto summary = [&](uint64_t id) -> std::optional<contract::OpSummary> {
    if (id == 0) return std::nullopt;
    const auto r = read(id);
    if (!r) return std::nullopt;
    return contract::OpSummary{r->seq, r->describe(), call_state_name(r->state), unix_millis(r->since())};
  };
  contract::GroupProgress g;
  g.group = name();
  g.rank = rank_;
  g.size = size_;
  g.current = summary(last_collective_.load(std::memory_order_acquire));
  g.last_completed = summary(last_completed_.load(std::memory_order_acquire));
  g.issued = issued_.load(std::memory_order_relaxed);
  g.completed = completed_.load(std::memory_order_relaxed);
  // Ended first: every call it counts was issued before, so issued >= ended.
  const uint64_t ended = p2p_ended_.load(std::memory_order_acquire);
  const uint64_t open = p2p_issued_.load(std::memory_order_acquire) - ended;  // as p2p_open()
  g.p2p_completed = ended - std::min(p2p_failed_.load(std::memory_order_relaxed), ended);
  if (const auto last = last_p2p_completed_.load(std::memory_order_acquire); last != 0) {
    if (const auto r = read(last)) g.p2p_done_ms = unix_millis(r->ended);
  }
  // The pending sends and recvs, newest first while looking back through the ring.
  const uint64_t last = last_id_.load(std::memory_order_acquire);
  const uint64_t first = last > entries_ ? last - entries_ + 1 : 1;
  for (uint64_t id = last; open > 0 && id >= first && id > 0; --id) {
    const auto r = read(id);
    if (!r || !is_point_to_point(r->kind) || r->state >= CallState::Completed) continue;
    g.p2p_pending.push_back({contract::OpSummary{r->seq, r->describe(), call_state_name(r->state), unix_millis(r->since())},
                             r->peer});
    if (g.p2p_pending.size() == static_cast<size_t>(open) || g.p2p_pending.size() == kMaxPendingShown) break;
  }
  std::reverse(g.p2p_pending.begin(), g.p2p_pending.end());
  return g;
}

std::vector<std::shared_ptr<FlightRecorder>> all_recorders() {
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  std::vector<std::shared_ptr<FlightRecorder>> out;
  for (const auto& w : reg.recorders) {
    if (auto r = w.lock()) out.push_back(std::move(r));
  }
  return out;
}

std::vector<contract::GroupProgress> all_group_progress() {
  std::vector<contract::GroupProgress> out;
  for (const auto& r : all_recorders()) out.push_back(r->progress());
  return out;
}

int add_failure_listener(std::function<void()> listener) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  reg.listeners.emplace_back(reg.next_listener, std::move(listener));
  return reg.next_listener++;
}

void remove_failure_listener(int handle) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mu);
  std::erase_if(reg.listeners, [&](const auto& l) { return l.first == handle; });
}

size_t configured_recorder_entries() { return contract::CommSettings::from_environment().flight_recorder_entries; }

}  // namespace ddp::detail
