// The CUDA runtime double: streams (an in-order queue run by a worker thread),
// events (a point in a stream's queue) and host functions on a stream.
#include <cuda_runtime_api.h>

#include <chrono>
#include <map>
#include <random>

#include "../common/fork_safe.hpp"
#include "../common/knobs.hpp"
#include "../gpu_double.hpp"
#include "state.hpp"

struct CUstream_st {
  std::shared_ptr<gpu_double::Stream> stream;
};

namespace gpu_double {
struct EventState {
  std::mutex mu;
  std::shared_ptr<gpu_double::Stream> stream;  // where it was last recorded; null: never
  uint64_t ticket = 0;                         // the marker task's ticket there
  uint64_t generation = 0;                     // counts records, so a stale marker stamps nothing
  bool timing = true;
  std::chrono::steady_clock::time_point when;  // when the stream reached the marker
};
}  // namespace gpu_double

struct CUevent_st {
  std::shared_ptr<gpu_double::EventState> state;  // shared with markers still queued
};

namespace gpu_double {
namespace {

struct Registry {
  std::mutex mu;
  std::map<int, std::shared_ptr<Stream>> legacy;          // per device, created on first use
  std::vector<std::weak_ptr<Stream>> streams;             // every stream, for device-wide waits
};
// A forked child has none of its parent's worker threads: it starts with no streams
// (CUDA does not support using a context across fork(); the double lets a child
// start afresh, which tests that fork after using it rely on).
void forget_streams(Registry& r) {
  r.legacy.clear();
  r.streams.clear();
}
Registry& registry() { return ForkSafe<Registry, &forget_streams>::get(); }

void remember(const std::shared_ptr<Stream>& s) {
  std::lock_guard lock(registry().mu);
  auto& v = registry().streams;
  std::erase_if(v, [](const std::weak_ptr<Stream>& w) { return w.expired(); });
  v.push_back(s);
}

std::vector<std::shared_ptr<Stream>> streams_of(int device) {
  std::vector<std::shared_ptr<Stream>> out;
  std::lock_guard lock(registry().mu);
  for (auto& w : registry().streams)
    if (auto s = w.lock(); s && s->device() == device) out.push_back(s);
  return out;
}

// DDP_GPU_DOUBLE_DELAY_US: a random pause of up to that long before each task, so
// that work missing a cross-stream dependency (or a host wait) runs late and shows.
void delay() {
  const long most = knobs().delay_us;
  if (most <= 0) return;
  thread_local std::minstd_rand random(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<long>(0, most)(random)));
}

}  // namespace

// ---------------------------------------------------------------------------------
// Stream
// ---------------------------------------------------------------------------------
Stream::Stream(int device, bool blocking, bool legacy) : device_(device), blocking_(blocking), legacy_(legacy) {}

uint64_t Stream::enqueue(std::function<void()> task, std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits,
                         std::function<void()> drop) {
  std::shared_ptr<Stream> self;
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Task{std::move(task), std::move(drop), std::move(waits)});
    ticket = ++issued_;
    if (!started_) started_ = true, self = shared_from_this();
  }
  if (self) std::thread([self] { self->work(self); }).detach();
  queued_.notify_one();
  return ticket;
}

uint64_t Stream::last_ticket() {
  std::lock_guard lock(mu_);
  return issued_;
}

uint64_t Stream::completed() {
  std::lock_guard lock(mu_);
  return completed_;
}

void Stream::wait_until(uint64_t ticket) {
  std::unique_lock lock(mu_);
  finished_.wait(lock, [&] { return completed_ >= ticket; });
}

void Stream::retire() {
  {
    std::lock_guard lock(mu_);
    retired_ = true;
  }
  queued_.notify_one();
}

void Stream::work(std::shared_ptr<Stream> self) {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      queued_.wait(lock, [&] { return !queue_.empty() || retired_; });
      if (queue_.empty()) return;  // retired and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    for (auto& [other, ticket] : task.waits) other->wait_until(ticket);
    delay();
    // After a kernel fault the device runs nothing more (CUDA's sticky error).
    if (sticky_error(device_) == cudaSuccess) {
      if (task.run) task.run();
    } else if (task.drop) {
      task.drop();
    }
    {
      std::lock_guard lock(mu_);
      ++completed_;
    }
    finished_.notify_all();
  }
  (void)self;
}

std::shared_ptr<Stream> legacy_stream(int device) {
  std::lock_guard lock(registry().mu);
  auto& s = registry().legacy[device];
  if (!s) {
    s = std::make_shared<Stream>(device, /*blocking=*/true, /*legacy=*/true);
    registry().streams.push_back(s);
  }
  return s;
}

std::shared_ptr<Stream> resolve_stream(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread)
    return legacy_stream(current_device());
  return handle->stream;
}

uint64_t enqueue_ordered(const std::shared_ptr<Stream>& stream, std::function<void()> task,
                         std::function<void()> drop) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> waits;
  if (stream->legacy()) {
    for (auto& s : streams_of(stream->device()))
      if (s != stream && s->blocking()) waits.emplace_back(s, s->last_ticket());
  } else if (stream->blocking()) {
    auto legacy = legacy_stream(stream->device());
    waits.emplace_back(legacy, legacy->last_ticket());
  }
  return stream->enqueue(std::move(task), std::move(waits), std::move(drop));
}

// Where `event` was last recorded: its stream (null: never) and the marker's ticket.
std::pair<std::shared_ptr<Stream>, uint64_t> recorded_point(cudaEvent_t event) {
  std::lock_guard lock(event->state->mu);
  return {event->state->stream, event->state->ticket};
}

std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> device_tails(int device) {
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> out;
  for (auto& s : streams_of(device)) out.emplace_back(s, s->last_ticket());
  return out;
}

void synchronize_device(int device) {
  for (auto& [s, ticket] : device_tails(device)) s->wait_until(ticket);
}

}  // namespace gpu_double

using namespace gpu_double;

// ---------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (cudaError_t e = sticky_fail(current_device()); e != cudaSuccess) return e;
  if (find_process_fault("stream_error") != nullptr) return fail(cudaErrorMemoryAllocation);
  auto s = std::make_shared<Stream>(current_device(), (flags & cudaStreamNonBlocking) == 0, /*legacy=*/false);
  remember(s);
  *stream = new CUstream_st{s};
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return fail(cudaErrorInvalidResourceHandle);
  // As in CUDA, queued work still runs; the stream goes once it drained.
  stream->stream->retire();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_error(s->device()); e != cudaSuccess) return fail(e);
  return s->completed() >= s->last_ticket() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  auto s = resolve_stream(stream);
  s->wait_until(s->last_ticket());
  return fail(sticky_error(s->device()));
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = resolve_stream(stream)->device();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) return e;
  auto [other, ticket] = recorded_point(event);
  if (!other) return cudaSuccess;  // never recorded: nothing to wait for, as in CUDA
  s->enqueue(nullptr, {{other, ticket}});
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  return static_cast<cudaError_t>(gpu_double_launch_host_func(stream, fn, user_data, nullptr));
}

extern "C" __attribute__((visibility("default"))) int gpu_double_launch_host_func(cudaStream_t stream,
                                                                                   void (*fn)(void*), void* data,
                                                                                   void (*drop)(void*)) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue);
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) {
    if (drop != nullptr) drop(data);
    return e;
  }
  std::function<void()> dropped;
  if (drop != nullptr) dropped = [drop, data] { drop(data); };
  enqueue_ordered(s, [fn, data] { fn(data); }, std::move(dropped));
  return cudaSuccess;
}

// ---------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  if (device_count() == 0) return fail(cudaErrorNoDevice);
  if (cudaError_t e = sticky_fail(current_device()); e != cudaSuccess) return e;
  auto* e = new CUevent_st{std::make_shared<EventState>()};
  e->state->timing = (flags & cudaEventDisableTiming) == 0;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // A marker still queued holds the state, not the handle.
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto& ev = event->state;
  auto s = resolve_stream(stream);
  if (cudaError_t e = sticky_fail(s->device()); e != cudaSuccess) return e;
  std::lock_guard lock(ev->mu);
  const uint64_t generation = ++ev->generation;
  ev->stream = s;
  ev->ticket = enqueue_ordered(s, [ev, generation] {
    std::lock_guard inner(ev->mu);
    if (ev->generation == generation) ev->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto [s, ticket] = recorded_point(event);
  if (!s) return cudaSuccess;  // never recorded
  if (cudaError_t e = sticky_error(s->device()); e != cudaSuccess) return fail(e);
  return s->completed() >= ticket ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  auto [s, ticket] = recorded_point(event);
  if (!s) return cudaSuccess;
  s->wait_until(ticket);
  return fail(sticky_error(s->device()));
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  for (cudaEvent_t e : {start, end}) {
    cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess) return fail(q);
  }
  auto& a = start->state;
  auto& b = end->state;
  std::scoped_lock lock(a->mu, b->mu);
  if (!a->timing || !b->timing || !a->stream || !b->stream) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}
