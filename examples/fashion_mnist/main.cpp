// fashion_mnist: data-parallel training of an MLP (784-256-128-10) on Fashion-MNIST,
// the headline ddprun example.
//
//   ddprun --nproc_per_node=2 build/examples/fashion_mnist/fashion_mnist --epochs 10
//
// Reads the IDX files of Debian's dataset-fashion-mnist, shards the training set
// with DistributedSampler, trains with DistributedDataParallel (bucketed gradient
// all-reduce overlapped with backward) and AdamW (or SGD) under a warmup + cosine
// schedule, evaluates on the 10,000 test images (accuracy all-reduced) and prints
// one line per epoch from rank 0.
//
// --checkpoint F: rank 0 saves after every epoch; a job the launcher restarts or
// re-forms with another world size continues from F by itself (resume.hpp).
//
// --strategy zero1 shards the optimizer state over the ranks (ZeRO-1), --strategy fsdp
// also the parameters and gradients (FSDP); --grad_dtype bf16 sends gradients in bf16
// (reduced in f32). --wide trains the 784-2048-2048-2048-10 MLP (about 10M parameters),
// the benchmarked setting. Checkpoints are full and the same for every strategy: a job
// resumes under another strategy or world size.
//
// --device cuda trains on the GPU (a build with CUDA): each worker on the GPU its
// NCCL communicator uses (local rank, or the only visible one), the gradient buckets
// reduced over NCCL. The data stays on the host and each batch is copied over.
//
// --tp N --pp M add model parallelism (parallel.hpp): the world as a mesh pp x dp x tp,
// each rank one pipeline stage of the MLP with its Linears split over tp, --strategy over
// dp, --microbatches K through a --schedule gpipe|1f1b pipeline. Host only for now.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/checkpoint.hpp"       // load_optimizer_state
#include "ddp/init.hpp"             // ddp::init: the process group from the launcher's environment
#include "ddp/lr_schedule.hpp"      // WarmupCosine, scaled_lr
#include "ddp/nn.hpp"               // make_mlp, softmax_cross_entropy
#include "ddp/optim.hpp"            // AdamW, SGD
#include "ddp/sampler.hpp"          // DistributedSampler
#include "ddp/trace.hpp"            // --trace timeline
#include "dataset.hpp"              // fashion_mnist::load_bytes: the IDX files
#include "parallel.hpp"             // ModelParallel: --tp, --pp
#include "resume.hpp"               // resume_from_checkpoint: this run's own checkpoint, or --resume
#include "strategy.hpp"             // Strategy: ddp, zero1, fsdp

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Args {
  int epochs = 10;
  int stop_after = 0;        // leave after this many epochs, as if interrupted (tests resume)
  int batch = 64;            // per worker
  double lr = 1e-3;          // base rate for one worker; scaled by the world size
  std::string optimizer = "adamw";
  double momentum = 0.9;     // sgd
  double weight_decay = 0.01;
  double warmup_epochs = 0.5;
  std::string hidden = "256,128";
  bool wide = false;         // --hidden 2048,2048,2048
  uint64_t seed = 0;
  std::string data = fashion_mnist::kDataDir;
  std::string checkpoint;    // written by rank 0 after every epoch
  bool resume = false;       // continue from --checkpoint even when another run wrote it
  std::string trace;         // Chrome trace-event JSON of the whole run
  bool no_allreduce = false; // measurement only: skip gradient averaging
  int accumulate = 1;        // micro-batches per optimizer step (no_sync for all but the last)
  size_t limit_train = 0;    // use only the first N training images (tests)
  bool shuffle = true;
  bool eval = true;
  std::string save_params;   // rank 0 writes the final parameters (raw f32) here
  std::string final_checkpoint;  // rank 0 writes a checkpoint of the final state here
  double max_grad_norm = 0;  // clip the global gradient norm (0: off)
  std::string strategy = "ddp";
  std::string grad_dtype = "f32";
  double first_bucket_kib = 1024;
  double bucket_cap_kib = 25 * 1024;
  std::string device = "cpu";
  fashion_mnist::ParallelOptions parallel;  // --tp, --pp, --microbatches, --schedule
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

std::vector<size_t> parse_hidden(const std::string& s) {
  std::vector<size_t> out{784};
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    const std::string part = s.substr(p, q - p);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v <= 0) throw ddp::InvalidArgument("--hidden: '" + s + "' is not a list of widths");
    out.push_back(static_cast<size_t>(v));
    p = q + 1;
  }
  out.push_back(10);
  return out;
}

// What each pixel byte becomes: scaled to [0, 1] as torchvision's ToTensor, then
// normalised by Fashion-MNIST's pixel mean and standard deviation (over the training
// set). The images stay bytes and each batch is converted through this table: the
// same floats as a converted dataset, at a quarter of its memory.
std::array<float, 256> pixel_values() {
  std::array<float, 256> table{};
  for (int p = 0; p < 256; ++p) table[static_cast<size_t>(p)] = (static_cast<float>(p) / 255.0f - 0.2860f) / 0.3530f;
  return table;
}
const std::array<float, 256> kPixelValues = pixel_values();

// This process's peak resident memory (MiB).
double rss_peak_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

double mib(size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What the epoch and RESULT lines report after the timings: the share of communication
// compute hid, the peak RSS (the largest rank's), the bytes this rank's strategy holds,
// then the layout (tp pp dp microbatches schedule), the pipeline's idle share, the
// largest rank's parameter bytes and the largest rank's parameter + gradient + optimizer
// bytes (each the largest over ranks on its own: they may be two ranks').
struct Footprint {
  double comm_hidden = 1;
  double largest[3] = {0, 0, 0};  // rss_peak_mib, param_bytes, held_bytes: the largest rank's
  ddp::MemoryStats memory;
  double pipe_idle = 0;
  std::string fields(const Args& a, int dp) const {
    char line[768];
    const fashion_mnist::ParallelOptions& p = a.parallel;
    std::snprintf(line, sizeof line,
                  "comm_hidden %.2f rss_peak_mib %.1f param_mib %.2f grad_mib %.2f optim_mib %.2f transient_mib %.2f "
                  "strategy %s grad_dtype %s tp %d pp %d dp %d microbatches %d schedule %s pipe_idle %.3f "
                  "param_bytes %.0f held_bytes %.0f",
                  comm_hidden, largest[0], mib(memory.params), mib(memory.grads), mib(memory.optimizer),
                  mib(memory.transient_peak), a.strategy.c_str(), a.grad_dtype.c_str(), p.tp, p.pp, dp, p.micro(),
                  p.schedule_name().c_str(), pipe_idle, largest[1], largest[2]);
    return line;
  }
};

// Collective (one all-reduce: the RSS, parameter and held bytes are the largest rank's).
Footprint footprint(fashion_mnist::Strategy& strategy, ddp::ProcessGroup& pg, double comm_hidden, double pipe_idle) {
  Footprint f{.comm_hidden = comm_hidden, .memory = strategy.memory(), .pipe_idle = pipe_idle};
  f.largest[0] = rss_peak_mib();
  f.largest[1] = static_cast<double>(f.memory.params);
  f.largest[2] = static_cast<double>(f.memory.held());
  pg.all_reduce(ddp::view(std::span<double>(f.largest, 3)), ddp::ReduceOp::Max);
  return f;
}

// The logits of a test batch where this rank has them (nullptr elsewhere).
using EvalForward = std::function<const ddp::Tensor*(const ddp::Tensor& x)>;

// Test-set accuracy and loss, each data replica on its share, summed over the ranks that
// report. Every rank runs the same number of forwards (FSDP's forward is collective): a
// rank whose share ran out repeats its last chunk and does not count it.
std::pair<double, double> evaluate(const EvalForward& forward, const fashion_mnist::DataShare& share,
                                   const fashion_mnist::ByteImageDataset& test, ddp::ProcessGroup& pg,
                                   ddp::Device device) {
  const size_t world = share.replicas;
  std::vector<size_t> mine;
  for (size_t i = share.replica; i < test.size(); i += world) mine.push_back(i);
  ddp::Tensor x(0, 0, device), dlogits(0, 0, device);
  std::vector<int32_t> y;
  double sums[3] = {0, 0, 0};  // correct, loss * n, n
  constexpr size_t kChunk = 1000;
  if (test.size() < world) throw ddp::InvalidArgument("evaluation: fewer test images than ranks");  // alike everywhere
  const size_t largest_share = (test.size() + world - 1) / world;
  for (size_t off = 0; off < largest_share; off += kChunk) {
    const bool counted = off < mine.size();
    const size_t from = counted ? off : (mine.size() - 1) / kChunk * kChunk;
    const size_t n = std::min(kChunk, mine.size() - from);
    std::span<const size_t> idx(mine.data() + from, n);
    fashion_mnist::gather_rows(test, idx, kPixelValues, x);
    y.resize(n);
    for (size_t i = 0; i < n; ++i) y[i] = test.labels[idx[i]];
    const ddp::Tensor* logits = forward(x);
    if (!counted || !share.reports) continue;
    sums[0] += static_cast<double>(ddp::count_correct(*logits, y));
    sums[1] += static_cast<double>(ddp::softmax_cross_entropy(*logits, y, dlogits)) * static_cast<double>(n);
    sums[2] += static_cast<double>(n);
  }
  pg.all_reduce(ddp::view(std::span<double>(sums, 3)), ddp::ReduceOp::Sum);
  return {sums[0] / sums[2], sums[1] / sums[2]};
}

// ---------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------

int train(const Args& a) {
  const ddp::Device device = a.device == "cuda" ? ddp::Device::Cuda : ddp::Device::Cpu;
  const ddp::MlpOptions mlp{.sizes = parse_hidden(a.hidden), .seed = a.seed};
  const ddp::contract::WorkerEnv env = ddp::contract::WorkerEnv::from_environment();  // as ddp::init reads it
  fashion_mnist::check_parallel_flags(a.parallel, {.sizes = mlp.sizes,
                                                   .accumulate = a.accumulate,
                                                   .device = a.device,
                                                   .hidden = a.hidden,
                                                   .world = env.world_size});
  if (std::string why; device == ddp::Device::Cuda && !ddp::cuda_device_available(&why)) {
    throw ddp::InvalidArgument("--device cuda: " + why);
  }
  // With a GPU for every local rank, DDP_BACKEND=auto (the default) gives a cpu+nccl
  // group and makes this rank's GPU the current device.
  auto pg = ddp::init();
  const int rank = pg->rank(), world = pg->size();
  const bool lead = rank == 0;
  const int dp = fashion_mnist::data_parallel_size(a.parallel, world);  // the world without --tp/--pp
  if (device == ddp::Device::Cuda) {
    // Gradients go through NCCL; the metrics (loss sums, accuracy) are host numbers.
    const std::string backend = pg->backend();
    if (backend == "nccl") {
      throw ddp::InvalidArgument("--device cuda: DDP_BACKEND=nccl reduces GPU buffers only, and this example also "
                                 "reduces host metrics: use DDP_BACKEND=auto (cpu+nccl)");
    }
    if (world > 1 && backend != "cpu+nccl") {
      throw ddp::InvalidArgument("--device cuda with " + std::to_string(world) + " workers needs NCCL, but the group's backend is '" +
                                 backend + "' (DDP_BACKEND=auto gives cpu+nccl when every local rank has a GPU of its own)");
    }
  }

  // Data: every rank loads both splits (the sampler picks its share) as bytes, converted
  // a batch at a time (kPixelValues); --limit-train keeps only the images it uses.
  const fashion_mnist::ByteImageDataset train_set = fashion_mnist::load_bytes(a.data, "train", a.limit_train);
  const fashion_mnist::ByteImageDataset test_set = fashion_mnist::load_bytes(a.data, "t10k");

  // Model (the strategy copies rank 0's values everywhere), resumed values, strategy,
  // then the optimizer's resumed state (the strategy built the optimizer); schedule.
  // (With --tp/--pp each rank builds only its stage, in ModelParallel.)
  std::unique_ptr<ddp::Sequential> model;
  if (!a.parallel.enabled()) {
    model = ddp::make_mlp(mlp);
    model->to(device);  // before the optimizer and DDP, as with torch
  }
  std::unique_ptr<ddp::Trace> trace = a.trace.empty() ? nullptr : std::make_unique<ddp::Trace>(rank);
  const double peak_lr = ddp::scaled_lr(a.lr, dp);  // linear scaling rule, over the data replicas
  ddp::OptimizerFactory make_optimizer;
  if (a.optimizer == "adamw") {
    make_optimizer = [&](std::vector<ddp::Parameter*> params) -> std::unique_ptr<ddp::Optimizer> {
      return std::make_unique<ddp::AdamW>(std::move(params),
                                          ddp::AdamWOptions{.lr = static_cast<float>(peak_lr),
                                                            .weight_decay = static_cast<float>(a.weight_decay)});
    };
  } else if (a.optimizer == "sgd") {
    make_optimizer = [&](std::vector<ddp::Parameter*> params) -> std::unique_ptr<ddp::Optimizer> {
      return std::make_unique<ddp::SGD>(std::move(params),
                                        ddp::SgdOptions{.lr = static_cast<float>(peak_lr),
                                                        .momentum = static_cast<float>(a.momentum),
                                                        .weight_decay = static_cast<float>(a.weight_decay)});
    };
  } else {
    throw ddp::InvalidArgument("--optimizer must be adamw or sgd, not '" + a.optimizer + "'");
  }
  const fashion_mnist::StrategyOptions sopts{
      .kind = a.strategy,
      .grad_dtype = a.grad_dtype == "bf16" ? ddp::DType::BF16 : ddp::DType::F32,
      .all_reduce = !a.no_allreduce,
      .first_bucket_bytes = static_cast<size_t>(a.first_bucket_kib * 1024),
      .bucket_cap_bytes = static_cast<size_t>(a.bucket_cap_kib * 1024),
      .trace = trace.get()};
  // A restarted or re-formed job resumes by itself from its own run's checkpoint
  // (resume.hpp), with this attempt's world and strategy: the sampler reshards below,
  // the peak rate is scaled_lr of the new world, and the schedule's place is kept by
  // epoch.
  const fashion_mnist::ResumeOptions resume_options{
      .checkpoint = a.checkpoint, .resume = a.resume, .run_id = env.run_id, .restart_count = env.restart_count};
  std::optional<fashion_mnist::Resumed> resumed;
  std::unique_ptr<fashion_mnist::Strategy> strategy;
  fashion_mnist::ModelParallel* mp = nullptr;  // with --tp/--pp: the strategy, seen as model parallel
  if (a.parallel.enabled()) {
    resumed = fashion_mnist::resume_from_checkpoint(resume_options, *pg);
    auto m = std::make_unique<fashion_mnist::ModelParallel>(a.parallel, mlp, pg, sopts, make_optimizer,
                                                            resumed ? &*resumed : nullptr, a.checkpoint);
    mp = m.get();
    strategy = std::move(m);
  } else {
    resumed = fashion_mnist::resume_from_checkpoint(resume_options, *pg, *model);
    strategy = fashion_mnist::make_strategy(sopts, *model, pg, make_optimizer);
  }
  ddp::Optimizer& opt = strategy->optimizer();
  if (resumed) {
    if (!mp) ddp::load_optimizer_state(resumed->bytes, a.checkpoint, opt);
    std::string().swap(resumed->bytes);  // the whole checkpoint (~120 MB for --wide): not needed past here
  }
  // Every rank of one pipeline and tp group sees the same batches: the data is split
  // over the dp replicas only, and each one's metrics are counted once.
  const fashion_mnist::DataShare share =
      mp ? mp->share() : fashion_mnist::DataShare{static_cast<size_t>(world), static_cast<size_t>(rank), true};
  const bool pipelined = mp != nullptr && mp->pipelined();
  const EvalForward eval_forward = [&](const ddp::Tensor& x) -> const ddp::Tensor* {
    return mp ? mp->eval_forward(x) : &strategy->forward(x);
  };
  const int first_epoch = resumed ? static_cast<int>(resumed->info.epoch) : 0;

  ddp::DistributedSampler sampler(train_set.size(), {.num_replicas = share.replicas,
                                                     .rank = share.replica,
                                                     .shuffle = a.shuffle,
                                                     .seed = a.seed});
  const size_t micro = static_cast<size_t>(a.batch);
  const size_t per_step = micro * static_cast<size_t>(a.accumulate);
  const int64_t steps_per_epoch = static_cast<int64_t>((sampler.size() + per_step - 1) / per_step);
  // Steps per epoch change with the world, so the step the schedule resumes at is
  // the resumed epoch's first (equal to the saved step when the world is the same).
  int64_t step = steps_per_epoch * first_epoch;
  ddp::WarmupCosine schedule({.base_lr = peak_lr,
                              .warmup_steps = static_cast<int64_t>(a.warmup_epochs * static_cast<double>(steps_per_epoch)),
                              .total_steps = std::max<int64_t>(1, steps_per_epoch * a.epochs),
                              .min_lr = 0.0});
  if (lead) {
    // The restart count says which attempt of the job this is (elastic tests check it).
    std::printf("fashion_mnist: %d worker(s) (%s) on %s, %zu train / %zu test images, batch %d per worker, %s, peak lr %.4g, "
                "restart_count %d\n",
                world, pg->backend().c_str(), ddp::device_name(device), train_set.size(), test_set.size(), a.batch,
                a.optimizer.c_str(), peak_lr, env.restart_count);
    std::printf("strategy %s, grad_dtype %s, hidden %s\n", a.strategy.c_str(), a.grad_dtype.c_str(), a.hidden.c_str());
    if (mp) {
      std::printf("model parallel: %s; microbatches %d, schedule %s\n", mp->describe().c_str(), a.parallel.micro(),
                  a.parallel.schedule_name().c_str());
    }
    if (resumed) {
      std::printf("resumed from %s at epoch %d, step %lld of %lld (world %d)\n", a.checkpoint.c_str(), first_epoch + 1,
                  static_cast<long long>(step), static_cast<long long>(steps_per_epoch * a.epochs), world);
    }
    std::fflush(stdout);
  }

  ddp::Tensor x(0, 0, device), dlogits(0, 0, device);
  std::vector<int32_t> y;
  std::vector<double> step_times;
  double total_samples = 0, total_time = 0;
  double acc = 0;
  double hidden_sum = 0, hidden_steps = 0;  // the whole run's comm_hidden, for RESULT
  int epochs_done = first_epoch;
  for (int epoch = first_epoch; epoch < a.epochs; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    const std::vector<size_t> order = sampler.indices();
    pg->barrier();
    const auto t_epoch = Clock::now();
    double loss_sum = 0, seen = 0, comm = 0;  // comm: communication not hidden behind compute
    double epoch_hidden = 0, epoch_steps = 0;
    for (size_t begin = 0; begin < order.size(); begin += per_step) {
      const auto t_step = Clock::now();
      const size_t end = std::min(order.size(), begin + per_step);
      // Accumulated micro-batches (none here for a pipeline, which splits the step itself).
      const size_t k_micro = pipelined ? 0 : (end - begin + micro - 1) / micro;
      opt.set_lr(static_cast<float>(schedule.lr_at(step)));
      if (pipelined) {
        const fashion_mnist::StepLoss l = mp->pipeline_step(train_set, {order.data() + begin, end - begin}, kPixelValues);
        loss_sum += l.loss_sum;
        seen += l.rows;
        comm += strategy->last_comm().wait;
      }
      for (size_t m = 0; m < k_micro; ++m) {
        const size_t mb = begin + m * micro, me = std::min(end, mb + micro);
        std::span<const size_t> idx(order.data() + mb, me - mb);
        fashion_mnist::gather_rows(train_set, idx, kPixelValues, x);
        y.resize(idx.size());
        for (size_t i = 0; i < idx.size(); ++i) y[i] = train_set.labels[idx[i]];
        float loss;
        {
          auto s = ddp::Trace::scope(trace.get(), "forward");
          const auto& logits = strategy->forward(x);
          loss = ddp::softmax_cross_entropy(logits, y, dlogits);
        }
        // Accumulated micro-batches: average over the step's micro-batches.
        if (k_micro > 1) dlogits.scale(1.0f / static_cast<float>(k_micro));
        {
          auto s = ddp::Trace::scope(trace.get(), "backward");
          strategy->backward(dlogits, /*sync=*/m + 1 == k_micro);
        }
        comm += strategy->last_comm().wait;
        if (!share.reports) continue;
        loss_sum += static_cast<double>(loss) * static_cast<double>(idx.size());
        seen += static_cast<double>(idx.size());
      }
      epoch_hidden += strategy->last_comm().hidden;  // the step's reducing backward
      epoch_steps += 1;
      if (a.max_grad_norm > 0) strategy->clip_grad_norm(static_cast<float>(a.max_grad_norm));
      {
        auto s = ddp::Trace::scope(trace.get(), "optimizer step");
        strategy->step();
      }
      ++step;
      step_times.push_back(since(t_step));
    }
    if (device == ddp::Device::Cuda) ddp::cuda_synchronize();  // the epoch's last kernels count too
    pg->barrier();
    const double dt = since(t_epoch);
    double sums[2] = {loss_sum, seen};
    pg->all_reduce(ddp::view(std::span<double>(sums, 2)), ddp::ReduceOp::Sum);
    total_samples += sums[1];
    total_time += dt;
    hidden_sum += epoch_hidden;
    hidden_steps += epoch_steps;
    double test_loss = 0;
    if (a.eval) std::tie(acc, test_loss) = evaluate(eval_forward, share, test_set, *pg, device);
    // Saved before the epoch is reported: a job that re-forms after the line was
    // printed resumes after that epoch.
    if (!a.checkpoint.empty()) strategy->save_checkpoint(a.checkpoint, {.epoch = epoch + 1, .step = step, .run_id = env.run_id});
    const Footprint f =
        footprint(*strategy, *pg, epoch_steps > 0 ? epoch_hidden / epoch_steps : 1.0, mp ? mp->pipe_idle(false) : 0.0);
    if (lead) {
      // The epoch's training time split: waiting for communication that backward did
      // not hide, and everything else (forward, backward, optimizer, batching); then
      // what the strategy holds.
      std::printf("epoch %d loss %.4f test_acc %.4f samples_per_s %.0f time_s %.2f comm_s %.3f compute_s %.3f step_ms_median %.3f %s\n",
                  epoch + 1, sums[0] / sums[1], acc, sums[1] / dt, dt, comm, dt - comm, median(step_times) * 1e3,
                  f.fields(a, dp).c_str());
      std::fflush(stdout);
    }
    if (!a.checkpoint.empty()) pg->barrier();  // nobody reads a half-written file next
    epochs_done = epoch + 1;
    if (a.stop_after > 0 && epoch + 1 >= a.stop_after && epoch + 1 < a.epochs) {
      if (lead) std::printf("stopping after epoch %d (--stop-after)\n", epoch + 1);
      break;
    }
  }
  // A run resumed with no epoch left (a job that re-formed after its last checkpoint)
  // reports the accuracy of the model it resumed, not the zero of an epoch never run.
  if (a.eval && first_epoch >= a.epochs) acc = evaluate(eval_forward, share, test_set, *pg, device).first;
  // The job's pace is its slowest rank's: with the all-reduce every rank waits for
  // it each step, without it the others only run ahead. So the step time reported
  // is the largest of the ranks' median step times.
  double step_median = median(step_times);
  pg->all_reduce(ddp::view(std::span<double>(&step_median, 1)), ddp::ReduceOp::Max);
  const Footprint f =
      footprint(*strategy, *pg, hidden_steps > 0 ? hidden_sum / hidden_steps : 1.0, mp ? mp->pipe_idle(true) : 0.0);
  if (lead) {
    std::printf("RESULT world %d test_acc %.4f samples_per_s %.0f step_ms_median %.3f %s\n", world, acc,
                total_time > 0 ? total_samples / total_time : 0.0, step_median * 1e3,
                f.fields(a, dp).c_str());
  }
  std::printf("rank %d params_hash %016llx\n", rank, static_cast<unsigned long long>(strategy->params_hash()));
  if (!a.save_params.empty()) strategy->write_params(a.save_params);
  if (!a.final_checkpoint.empty()) {
    // The state as it stands (also when a resumed run had no epoch left: a checkpoint
    // written again by this strategy and world).
    strategy->save_checkpoint(a.final_checkpoint, {.epoch = epochs_done, .step = step, .run_id = env.run_id});
    pg->barrier();
  }
  if (trace) {
    trace->write(*pg, a.trace);
    if (lead) std::printf("trace written to %s (open it in https://ui.perfetto.dev)\n", a.trace.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"Data-parallel MLP training on Fashion-MNIST (launch with ddprun)"};
  Args a;
  app.add_option("--epochs", a.epochs)->check(CLI::Range(1, 100000));
  app.add_option("--stop-after", a.stop_after, "leave after this many epochs (the schedule still spans --epochs)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--batch", a.batch, "batch per worker")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", a.lr, "base learning rate for one worker (scaled by the world size)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", a.optimizer, "adamw or sgd")->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--momentum", a.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", a.weight_decay)->check(CLI::Range(0.0, 10.0));
  app.add_option("--warmup-epochs", a.warmup_epochs)->check(CLI::Range(0.0, 1000.0));
  auto* hidden = app.add_option("--hidden", a.hidden, "hidden layer widths");
  app.add_flag("--wide", a.wide, "the wide MLP 784-2048-2048-2048-10 (--hidden 2048,2048,2048; the benchmarked setting)")
      ->excludes(hidden);
  app.add_option("--strategy", a.strategy, "ddp, zero1 (optimizer state sharded) or fsdp (everything sharded)")
      ->check(CLI::IsMember({"ddp", "zero1", "fsdp"}));
  app.add_option("--grad_dtype,--grad-dtype", a.grad_dtype, "gradients on the wire: f32 or bf16 (reduced in f32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--max-grad-norm", a.max_grad_norm, "clip the global gradient norm to this (0: no clipping)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", a.seed);
  app.add_option("--data", a.data, "directory of the IDX files");
  app.add_option("--checkpoint", a.checkpoint, "file rank 0 writes after every epoch");
  app.add_flag("--resume", a.resume,
               "continue from --checkpoint even when another run wrote it (this run's own is resumed without it)");
  app.add_option("--trace", a.trace, "write a Chrome trace-event JSON timeline here");
  app.add_flag("--no-allreduce", a.no_allreduce, "skip gradient averaging (for measuring overlap only)");
  app.add_option("--accumulate", a.accumulate, "micro-batches per optimizer step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--limit-train", a.limit_train, "use only the first N training images");
  app.add_flag("!--no-shuffle", a.shuffle, "visit the training set in order");
  app.add_flag("!--no-eval", a.eval, "skip the test-set evaluation");
  app.add_option("--save-params", a.save_params, "rank 0 writes the final parameters (raw float32) here");
  app.add_option("--final-checkpoint", a.final_checkpoint,
                 "rank 0 writes a checkpoint of the final state here (also when a resumed run had nothing left to run)");
  app.add_option("--first-bucket-kib", a.first_bucket_kib)->check(CLI::PositiveNumber);
  app.add_option("--bucket-cap-kib", a.bucket_cap_kib)->check(CLI::PositiveNumber);
  app.add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tp", a.parallel.tp, "tensor-parallel ranks: each Linear split over them (within a host)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--pp", a.parallel.pp, "pipeline stages: consecutive layers on different ranks")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--microbatches", a.parallel.microbatches, "micro-batches per step through the pipeline (default 4)")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--schedule", a.parallel.schedule, "pipeline schedule: gpipe (default) or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  try {
    app.parse(argc, argv);
    if (a.wide) a.hidden = "2048,2048,2048";
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fashion_mnist: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    return train(a);
  } catch (const ddp::contract::ContractError& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  } catch (const ddp::InvalidArgument& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
