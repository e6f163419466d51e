// Pipeline parallelism: consecutive layers of a model on consecutive ranks (stages),
// a batch cut into micro-batches that flow through them.
//
//   ddp::Pipeline pipe(*stage_model, pp, {.schedule = ddp::PipelineSchedule::OneFOneB, .microbatches = 8});
//   ddp::StageCompute run{[&](const ddp::Tensor& x) -> const ddp::Tensor& { return stage_model->forward(x); },
//                         [&](const ddp::Tensor& dy, bool) -> const ddp::Tensor& {
//                           return stage_model->backward(dy, {}, !pipe.first()); }};
//   ddp::StageLoss loss = [&](size_t, size_t row, const ddp::Tensor& out, ddp::Tensor& dout) {
//     const float l = ddp::softmax_cross_entropy(out, std::span(labels).subspan(row, out.rows()), dout);
//     dout.scale(static_cast<float>(out.rows()) / batch);  // a mean over the whole batch
//     return l;
//   };
//   auto stats = pipe.train_step(batch, pipe.first() ? &x : nullptr, run, loss);  // grads accumulated
//   optimizer.step();
//
// Terms:
//   stage        this rank's part of the model: its rank in the pp group (0 .. stages-1).
//   micro-batch  rows [i*c, min(batch, (i+1)*c)) of the batch with c = ceil(batch/m), as
//                torch's chunking: the last may be smaller, and a small batch gives fewer
//                than m (9 rows, m = 4: three of 3 rows).
//   F(i), B(i)   the forward and the backward of micro-batch i on this stage.
//   slot         the stage module's activation slot (Module::select_slot) that F(i) and
//                B(i) run in, so a forward stays alive until its backward: i under GPipe
//                (n slots), i mod w under 1F1B (w slots), 0 for forward().
//
// Schedules (n micro-batches in the step, p stages, s this stage), as torch 2.x's
// ScheduleGPipe and Schedule1F1B order them:
//   GPipe  F(0) .. F(n-1), then B(0) .. B(n-1).
//   1F1B   w = min(n, p - s) forwards, then B, F, B, F ... while forwards remain, then the
//          remaining backwards: at most w micro-batches alive at once, so the stage keeps
//          w slots, w gradient buffers and w + 1 input buffers (one received ahead).
// Both run the backwards in micro-batch order 0 .. n-1, so gradients accumulate in the
// same order as one process accumulating the micro-batches: a pipeline over the bare
// stage modules gives bit-identical gradients to the unsplit model trained that way.
// The last backward of the step (B(n-1)) calls compute.backward(dy, last = true); every
// earlier one last = false: where a data-parallel wrapper reduces (inside no_sync before).
//
// Channels: per pair of neighbouring stages (s, s+1), two groups of those two ranks,
// made by the constructor (pp->new_group, on every pp rank in the same order): one that
// carries activations s -> s+1, one that carries their gradients s+1 -> s. A group runs
// its operations in issue order, so each group carries one direction of one link, and
// receives posted ahead never hold up a send. Receives are posted as early as their
// buffer is free (activations: as soon as the step's header gave their width, under
// 1F1B one ahead of the forward that needs it; each gradient right after the forward
// it belongs to). Sends are asynchronous, from copies in the pipeline's own buffers (a
// buffer's previous send is waited for before it is reused); they complete before
// train_step returns. Buffers are reused by later steps: no allocation at a batch size
// seen before.
// With the first activation of each step goes a header (kind, call number, batch rows,
// micro-batches, schedule, activation width), and with the first gradient the same
// without the width: a neighbour that disagrees on any of them fails with Mismatch
// naming both sides' values on both ranks of the link, before any activation is used.
//
// Time (PipelineStepStats, seconds): busy is the time inside the compute callbacks and
// the loss; idle the time blocked waiting for a receive or a send to complete (the
// bubble, and communication not hidden behind compute); step the wall time of
// train_step. idle_share() = idle / step: a stage's own share. A training program
// reports the mean over stages (an all-reduce of idle_share() over pp, divided by p),
// to compare with the schedule's bubble (p-1)/(n+p-1).
//
// Errors: any exception inside a schedule is rethrown as the same ddp error type
// (PeerError, Timeout, Mismatch, InvalidArgument, Error; any other exception becomes
// Error) with what() prefixed "pipeline stage S of P, micro-batch I (forward|backward): ".
// The pipeline then aborts its channel groups (nothing it posted runs on) and every
// later call throws that error at once. A neighbour that exits fails this stage's
// pending receives and sends at once (the groups' peer detection), so a rank that dies
// fails its neighbours, and their exits fail theirs; a rank that catches a pipeline
// error and lives on leaves its neighbours waiting until the groups' timeout.
#pragma once

#include <functional>
#include <memory>

#include "ddp/nn.hpp"
#include "ddp/process_group.hpp"
#include "ddp/tensor.hpp"

namespace ddp {

class Trace;

enum class PipelineSchedule { GPipe, OneFOneB };
const char* pipeline_schedule_name(PipelineSchedule s);  // "gpipe", "1f1b"

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::GPipe;
  int microbatches = 4;    // m: the most micro-batches a batch is cut into (>= 1)
  Millis timeout{0};       // each send and receive, from when it starts running (after
                           // those before it on its link); 0: the pp group's timeout
  Trace* trace = nullptr;  // records each F/B (compute) and each wait (communication) when set
};

// What a stage runs per micro-batch, after the pipeline selected the micro-batch's slot:
// the bare module, or DDP/ZeRO/FSDP over dp around it.
struct StageCompute {
  // The stage's output for input x (micro-batch rows x input width).
  std::function<const Tensor&(const Tensor& x)> forward;
  // Given dLoss/dOutput, accumulates the stage's gradients and returns dLoss/dInput (stage 0:
  // ignored, may be empty). `last`: this is the step's last backward on this stage.
  std::function<const Tensor&(const Tensor& dy, bool last)> backward;
};

// Last stage: the loss of micro-batch `micro`, rows [row_begin, row_begin + output.rows())
// of the batch; writes dLoss/doutput into doutput (already scaled for accumulation by the
// caller, e.g. by rows / batch for a mean over the batch).
using StageLoss = std::function<float(size_t micro, size_t row_begin, const Tensor& output, Tensor& doutput)>;

struct PipelineStepStats {
  double step = 0;  // wall time of train_step
  double busy = 0;  // in the compute callbacks and the loss
  double idle = 0;  // blocked on a receive or a send
  float loss = 0;   // last stage: mean over micro-batches of the loss's values (0 elsewhere)
  size_t microbatches = 0;  // how many the batch was cut into
  double idle_share() const { return step > 0 ? idle / step : 0; }
};

class Pipeline {
 public:
  // A collective over pp: every rank of pp constructs it, in order with its other
  // new_group calls; this rank is stage pp->rank() of pp->size(). `stage` must outlive
  // the pipeline. Throws InvalidArgument for microbatches < 1.
  Pipeline(Module& stage, std::shared_ptr<ProcessGroup> pp, const PipelineOptions& options = {});
  ~Pipeline();  // waits for (or, after an error, has aborted) everything it posted
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // One training step over a batch of batch_rows rows: every micro-batch's forward and
  // backward by the schedule, gradients accumulated into the stage's (zero them before,
  // as usual); no optimizer step. `input` (batch_rows x input width) on stage 0 only
  // (others: nullptr); `loss` is called on the last stage only. Every stage passes the
  // same batch_rows. Throws InvalidArgument for batch_rows 0 or a missing/misshaped
  // input (before anything is sent).
  PipelineStepStats train_step(size_t batch_rows, const Tensor* input, const StageCompute& compute,
                               const StageLoss& loss);

  // Evaluation: the forwards only (in slot 0; nothing kept for a backward). Returns the
  // model's output for the whole batch on the last stage (valid until the next call),
  // nullptr elsewhere.
  const Tensor* forward(size_t batch_rows, const Tensor* input, const StageCompute& compute);

  int stage() const;
  int stages() const;
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }

 private:
  struct Impl;  // channels, buffers and the schedule's state (pipeline.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp
