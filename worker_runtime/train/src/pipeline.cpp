// Pipeline: the GPipe and 1F1B schedules over per-link channel groups (see pipeline.hpp).
//
// A call (train_step or forward) runs in three parts:
//   1. headers: the gradient header goes to the previous stage at once, its receive from
//      the next stage is posted (training only); the activation header's receive from the
//      previous stage is posted;
//   2. the schedule's actions, each F(i) or B(i) in turn (run_forward, run_backward);
//   3. every send of the call is waited for, so the next call may reuse its buffers.
#include "ddp/pipeline.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "ddp/trace.hpp"

namespace ddp {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The header's fields, one int64 each.
enum HeaderField : size_t { kKind, kCall, kRows, kMicro, kSchedule, kWidth, kHeaderSize };
using Header = std::array<int64_t, kHeaderSize>;
constexpr int64_t kTrainCall = 1, kEvalCall = 2;
constexpr Millis kSendGrace{1000};  // after an error, for the sends already posted

std::string describe(const Header& h) {
  return std::string(h[kKind] == kTrainCall ? "train_step" : h[kKind] == kEvalCall ? "forward" : "?") + " #" +
         std::to_string(h[kCall]) + ": " + std::to_string(h[kRows]) + " rows in up to " + std::to_string(h[kMicro]) +
         " micro-batches, " + pipeline_schedule_name(static_cast<PipelineSchedule>(h[kSchedule]));
}

// One direction of one link: the two-rank group and the neighbour's rank in it.
struct Channel {
  std::shared_ptr<ProcessGroup> group;
  int peer = -1;
};

// F(micro) or B(micro).
struct Action {
  bool forward;
  size_t micro;
};

// The order of a stage's actions for n micro-batches (see pipeline.hpp).
std::vector<Action> actions_of(PipelineSchedule schedule, size_t n, int stages, int stage, bool train) {
  std::vector<Action> out;
  if (!train || schedule == PipelineSchedule::GPipe) {
    for (size_t i = 0; i < n; ++i) out.push_back({true, i});
    if (train)
      for (size_t i = 0; i < n; ++i) out.push_back({false, i});
    return out;
  }
  const size_t warmup = std::min(n, static_cast<size_t>(stages - stage));
  size_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({true, f});
  while (b < n) {
    out.push_back({false, b++});
    if (f < n) out.push_back({true, f++});
  }
  return out;
}

Buffer buffer_of(Tensor& t) { return Buffer{t.data(), t.size(), DType::F32, t.device()}; }
Buffer buffer_of(Header& h) { return view(std::span<int64_t>(h)); }

// The exception in flight as the same ddp error type with `prefix` before what().
std::exception_ptr with_prefix(const std::string& prefix) {
  try {
    throw;
  } catch (const PeerError& e) {
    return std::make_exception_ptr(PeerError(e.rank(), prefix + e.what()));
  } catch (const Timeout& e) {
    return std::make_exception_ptr(Timeout(prefix + e.what()));
  } catch (const Mismatch& e) {
    return std::make_exception_ptr(Mismatch(prefix + e.what()));
  } catch (const InvalidArgument& e) {
    return std::make_exception_ptr(InvalidArgument(prefix + e.what()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(prefix + e.what()));
  } catch (...) {
    return std::make_exception_ptr(Error(prefix + "unknown exception"));
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

}  // namespace

const char* pipeline_schedule_name(PipelineSchedule s) {
  return s == PipelineSchedule::GPipe ? "gpipe" : s == PipelineSchedule::OneFOneB ? "1f1b" : "?";
}

struct Pipeline::Impl {
  Module& module;
  std::shared_ptr<ProcessGroup> pp;
  PipelineOptions options;
  int stage = 0, stages = 1;
  Channel act_in, act_out, grad_in, grad_out;  // from s-1, to s+1, from s+1, to s-1

  // Buffers of the micro-batches in flight, reused by every call (grown as needed):
  // micro-batch i uses input in_of(i) and the others at slot_of(i) (sent_of(i) for the
  // activation sent), each with the Work of the operation on it.
  std::vector<Tensor> inputs;     // stage 0: views of the input's rows; else received activations
  std::vector<Work> input_recvs;
  std::vector<Tensor> grads;      // dLoss/dOutput: received from s+1, or the loss's on the last stage
  std::vector<Work> grad_recvs;
  std::vector<Tensor> act_sent;   // copies of the outputs sent to s+1
  std::vector<Work> act_sends;
  std::vector<Tensor> grad_sent;  // copies of dLoss/dInput sent to s-1
  std::vector<Work> grad_sends;
  Header act_header_out{}, act_header_in{}, grad_header_out{}, grad_header_in{};
  Work act_header_recv, grad_header_recv, act_header_send, grad_header_send;
  Tensor eval_output;  // forward(): the whole batch's output on the last stage
  int64_t calls = 0;
  std::exception_ptr broken;  // the error that ended the pipeline

  // The current call.
  struct Call {
    bool train = true;
    size_t rows = 0, chunk = 0, n = 0;
    size_t slots = 1;     // micro-batches alive at once: n (GPipe), min(n, p - s) (1F1B), 1 (eval)
    size_t in_bufs = 1;   // input buffers: n, or slots + 1 (1F1B: one received ahead)
    size_t width = 0;     // of the activations received
    Device device = Device::Cpu;  // where they are received: the stage's parameters'
    const Tensor* input = nullptr;
    const StageCompute* compute = nullptr;
    const StageLoss* loss = nullptr;
    Header header{};
    size_t backwards = 0;
    double loss_sum = 0;
    // Where the schedule is, for the error prefix.
    size_t micro = 0;
    bool forward = true;
  } call;
  PipelineStepStats stats;

  Impl(Module& m, std::shared_ptr<ProcessGroup> group, const PipelineOptions& o)
      : module(m), pp(std::move(group)), options(o) {}

  CollectiveOptions async() const { return {.async_op = true, .timeout = options.timeout}; }
  size_t begin_of(size_t i) const { return i * call.chunk; }
  size_t rows_of(size_t i) const { return std::min(call.rows, begin_of(i) + call.chunk) - begin_of(i); }
  size_t slot_of(size_t i) const { return i % call.slots; }
  size_t in_of(size_t i) const { return i % call.in_bufs; }
  size_t sent_of(size_t i) const { return call.train ? slot_of(i) : i; }

  std::string prefix() const {
    return "pipeline stage " + std::to_string(stage) + " of " + std::to_string(stages) + ", micro-batch " +
           std::to_string(call.micro) + (call.forward ? " (forward)" : " (backward)") + ": ";
  }

  void trace(const std::string& name, Clock::time_point a, Clock::time_point b, Trace::Track track) {
    if (options.trace) options.trace->add(name, a, b, track);
  }

  // Blocks on `w` (unless it completed), counting the time as idle.
  void wait_idle(Work& w, const char* what) {
    if (w.is_completed()) {
      w.wait();  // its error, if any
      return;
    }
    const auto t0 = Clock::now();
    w.wait();
    const auto t1 = Clock::now();
    stats.idle += seconds_between(t0, t1);
    trace(std::string("wait ") + what + " " + std::to_string(call.micro), t0, t1, Trace::kCommunication);
  }

  // Runs `f` as compute, counting the time as busy.
  template <typename F>
  decltype(auto) busy(const char* what, F&& f) {
    struct Done {
      Impl* self;
      const char* what;
      Clock::time_point t0;
      ~Done() {
        const auto t1 = Clock::now();
        self->stats.busy += seconds_between(t0, t1);
        self->trace(std::string(what) + std::to_string(self->call.micro), t0, t1, Trace::kCompute);
      }
    } done{this, what, Clock::now()};
    return f();
  }

  // The neighbour's header against this stage's: equal but for the width.
  void check_header(const Header& theirs, int from) const {
    for (size_t f : {kKind, kCall, kRows, kMicro, kSchedule}) {
      if (theirs[f] != call.header[f]) {
        throw Mismatch("stage " + std::to_string(from) + " runs " + describe(theirs) + "; this stage runs " +
                       describe(call.header));
      }
    }
  }

  // Sends a copy of `src` from `buf` once the buffer's previous send completed.
  void send_copy(const Channel& c, const Tensor& src, Tensor& buf, Work& work) {
    wait_idle(work, "send");
    buf.resize_on(src.device(), src.rows(), src.cols());
    buf.copy_from(src);
    work = c.group->send(buffer_of(buf), c.peer, async());
  }

  void post_headers() {
    if (call.train && stage > 0) {
      grad_header_out = call.header;
      grad_header_send = grad_out.group->send(buffer_of(grad_header_out), grad_out.peer, async());
    }
    if (call.train && stage + 1 < stages) grad_header_recv = grad_in.group->recv(buffer_of(grad_header_in), grad_in.peer, async());
    if (stage > 0) act_header_recv = act_in.group->recv(buffer_of(act_header_in), act_in.peer, async());
  }

  void post_input_recv(size_t j) {
    Tensor& in = inputs[in_of(j)];
    in.resize_on(call.device, rows_of(j), call.width);
    input_recvs[in_of(j)] = act_in.group->recv(buffer_of(in), act_in.peer, async());
  }

  // The first forward on a stage past the first: the header gives the activations' width,
  // then the receives of the first in_bufs micro-batches are posted (the rest as buffers free).
  void post_activation_recvs() {
    wait_idle(act_header_recv, "header");
    check_header(act_header_in, stage - 1);
    call.width = static_cast<size_t>(act_header_in[kWidth]);
    for (size_t j = 0; j < std::min(call.n, call.in_bufs); ++j) post_input_recv(j);
  }

  void run_forward(size_t i) {
    call.micro = i;
    call.forward = true;
    const size_t rows = rows_of(i);
    Tensor& x = inputs[in_of(i)];
    if (stage == 0) {
      const Tensor& in = *call.input;
      x = Tensor::view(const_cast<float*>(in.row(begin_of(i))), rows, in.cols(), in.device());
    } else {
      if (i == 0) post_activation_recvs();
      wait_idle(input_recvs[in_of(i)], "activation");
    }
    module.select_slot(call.train ? slot_of(i) : 0);
    const Tensor& out = busy("F", [&]() -> const Tensor& { return call.compute->forward(x); });
    if (out.rows() != rows) {
      throw InvalidArgument("the stage's forward returned " + std::to_string(out.rows()) + " rows for " +
                            std::to_string(rows));
    }
    if (stage + 1 == stages) {
      if (call.train) {
        call.loss_sum += busy("loss", [&] { return (*call.loss)(i, begin_of(i), out, grads[slot_of(i)]); });
      } else {
        if (i == 0) eval_output.resize_on(out.device(), call.rows, out.cols());
        Tensor::view(eval_output.row(begin_of(i)), rows, out.cols(), out.device()).copy_from(out);
      }
      return;
    }
    if (i == 0) {
      act_header_out = call.header;
      act_header_out[kWidth] = static_cast<int64_t>(out.cols());
      act_header_send = act_out.group->send(buffer_of(act_header_out), act_out.peer, async());
    }
    send_copy(act_out, out, act_sent[sent_of(i)], act_sends[sent_of(i)]);
    if (call.train) {
      Tensor& g = grads[slot_of(i)];
      g.resize_on(out.device(), out.rows(), out.cols());
      grad_recvs[slot_of(i)] = grad_in.group->recv(buffer_of(g), grad_in.peer, async());
    }
  }

  void run_backward(size_t i) {
    call.micro = i;
    call.forward = false;
    if (stage + 1 < stages) {
      if (call.backwards == 0) {
        wait_idle(grad_header_recv, "header");
        check_header(grad_header_in, stage + 1);
      }
      wait_idle(grad_recvs[slot_of(i)], "gradient");
    }
    const bool last = ++call.backwards == call.n;
    module.select_slot(slot_of(i));
    const Tensor& dx = busy("B", [&]() -> const Tensor& { return call.compute->backward(grads[slot_of(i)], last); });
    if (stage == 0) return;
    const Tensor& x = inputs[in_of(i)];
    if (dx.rows() != x.rows() || dx.cols() != x.cols()) {
      throw InvalidArgument("the stage's backward returned a " + std::to_string(dx.rows()) + "x" +
                            std::to_string(dx.cols()) + " input gradient for a " + std::to_string(x.rows()) + "x" +
                            std::to_string(x.cols()) + " input");
    }
    send_copy(grad_out, dx, grad_sent[slot_of(i)], grad_sends[slot_of(i)]);
    // Micro-batch i's input is done with: its buffer receives a later one.
    if (i + call.in_bufs < call.n) post_input_recv(i + call.in_bufs);
  }

  std::vector<Work*> sends() {
    std::vector<Work*> all{&act_header_send, &grad_header_send};
    for (auto* v : {&act_sends, &grad_sends})
      for (Work& w : *v) all.push_back(&w);
    return all;
  }

  std::vector<Work*> pending() {
    std::vector<Work*> all = sends();
    all.insert(all.end(), {&act_header_recv, &grad_header_recv});
    for (auto* v : {&input_recvs, &grad_recvs})
      for (Work& w : *v) all.push_back(&w);
    return all;
  }

  // After an error: the sends already posted get a moment to land (a neighbour that
  // gets this stage's header finds a mismatch itself, rather than this stage's exit);
  // then nothing posted may run on into these buffers.
  void abort_all(const std::string& reason) noexcept {
    const auto deadline = Clock::now() + kSendGrace;
    for (Work* w : sends()) {
      try {
        w->wait(std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now())));
      } catch (...) {  // a broken group or the grace spent: the abort below ends it
      }
    }
    for (Channel* c : {&act_in, &act_out, &grad_in, &grad_out})
      if (c->group) c->group->abort(reason);
    for (Work* w : pending()) {
      wait_all_noexcept({w});
      *w = Work();
    }
  }

  void validate(size_t batch_rows, const Tensor* input, const StageCompute& compute, const StageLoss* loss) const {
    const std::string where = "pipeline stage " + std::to_string(stage) + " of " + std::to_string(stages) + ": ";
    if (batch_rows == 0) throw InvalidArgument(where + "a batch of 0 rows");
    if (stage == 0 && (input == nullptr || input->rows() != batch_rows)) {
      throw InvalidArgument(where + "the first stage needs the input of " + std::to_string(batch_rows) + " rows" +
                            (input ? " (got " + std::to_string(input->rows()) + ")" : std::string(" (got none)")));
    }
    if (!compute.forward || (loss && !compute.backward)) throw InvalidArgument(where + "a StageCompute without callbacks");
    if (loss && stage + 1 == stages && !*loss) throw InvalidArgument(where + "the last stage needs a loss");
  }

  // The call's shape: micro-batches, slots and buffers.
  void plan(size_t batch_rows, const Tensor* input, const StageCompute& compute, const StageLoss* loss) {
    const auto m = static_cast<size_t>(options.microbatches);
    call = Call{};
    call.train = loss != nullptr;
    call.rows = batch_rows;
    call.chunk = (batch_rows + m - 1) / m;
    call.n = (batch_rows + call.chunk - 1) / call.chunk;
    const bool one_f_one_b = call.train && options.schedule == PipelineSchedule::OneFOneB;
    call.slots = !call.train ? 1 : one_f_one_b ? std::min(call.n, static_cast<size_t>(stages - stage)) : call.n;
    call.in_bufs = one_f_one_b ? std::min(call.n, call.slots + 1) : call.n;
    const auto params = module.parameters();
    call.device = params.empty() ? Device::Cpu : params.front()->device();
    call.input = input;
    call.compute = &compute;
    call.loss = loss;
    call.header = {call.train ? kTrainCall : kEvalCall, calls++, static_cast<int64_t>(batch_rows),
                   options.microbatches, static_cast<int64_t>(options.schedule), 0};
    const auto grow = [](auto& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(inputs, call.in_bufs);
    grow(input_recvs, call.in_bufs);
    grow(grads, call.slots);
    grow(grad_recvs, call.slots);
    grow(grad_sent, call.slots);
    grow(grad_sends, call.slots);
    grow(act_sent, call.train ? call.slots : call.n);
    grow(act_sends, call.train ? call.slots : call.n);
  }

  // One call: headers, the schedule's actions, every send waited for.
  void run(size_t batch_rows, const Tensor* input, const StageCompute& compute, const StageLoss* loss) {
    if (broken) std::rethrow_exception(broken);
    validate(batch_rows, input, compute, loss);
    plan(batch_rows, input, compute, loss);
    try {
      post_headers();
      for (const Action& a : actions_of(options.schedule, call.n, stages, stage, call.train)) {
        if (a.forward) {
          run_forward(a.micro);
        } else {
          run_backward(a.micro);
        }
      }
      for (Work* w : sends()) wait_idle(*w, "send");
    } catch (...) {
      broken = with_prefix(prefix());
      abort_all(what_of(broken));
      std::rethrow_exception(broken);
    }
  }
};

Pipeline::Pipeline(Module& stage, std::shared_ptr<ProcessGroup> pp, const PipelineOptions& options) {
  if (!pp) throw InvalidArgument("Pipeline: no process group");
  if (options.microbatches < 1) {
    throw InvalidArgument("Pipeline: microbatches must be at least 1 (got " + std::to_string(options.microbatches) + ")");
  }
  impl_ = std::make_unique<Impl>(stage, pp, options);
  impl_->stage = pp->rank();
  impl_->stages = pp->size();
  // Two groups per link (s, s+1), made by every pp rank in the same order.
  const int s = impl_->stage;
  for (int k = 0; k + 1 < impl_->stages; ++k) {
    auto forward = pp->new_group({k, k + 1});
    auto backward = pp->new_group({k, k + 1});
    if (s == k) {
      impl_->act_out = {forward, 1};
      impl_->grad_in = {backward, 1};
    } else if (s == k + 1) {
      impl_->act_in = {forward, 0};
      impl_->grad_out = {backward, 0};
    }
  }
}

Pipeline::~Pipeline() {
  for (Work* w : impl_->pending()) wait_all_noexcept({w});
}

PipelineStepStats Pipeline::train_step(size_t batch_rows, const Tensor* input, const StageCompute& compute,
                                       const StageLoss& loss) {
  const auto t0 = Clock::now();
  impl_->stats = {};
  impl_->run(batch_rows, input, compute, &loss);
  auto& st = impl_->stats;
  st.step = seconds_between(t0, Clock::now());
  st.microbatches = impl_->call.n;
  if (last()) st.loss = static_cast<float>(impl_->call.loss_sum / static_cast<double>(impl_->call.n));
  return st;
}

const Tensor* Pipeline::forward(size_t batch_rows, const Tensor* input, const StageCompute& compute) {
  impl_->stats = {};
  impl_->run(batch_rows, input, compute, nullptr);
  return last() ? &impl_->eval_output : nullptr;
}

int Pipeline::stage() const { return impl_->stage; }
int Pipeline::stages() const { return impl_->stages; }

}  // namespace ddp
