// pipeline_checks: a program the pipeline tests launch under the real ddprun, every
// rank one stage (pp = world) of a small MLP (32-64-48-40-10), synthetic data; at world 1
// the whole model is the one stage.
//
//   pipeline_checks                 the checks below; prints "rank R: N checks, F failed" last
//   pipeline_checks exit <sched>    stage 1 exits (status 0) in micro-batch 2's forward of
//                                   step 1; every other rank must fail
//   pipeline_checks mismatch <sched> stage 1 cuts batches into 3 micro-batches, the others
//                                   into 4; every rank must fail
//   pipeline_checks stall <sched>   sends and receives time out after 500 ms; stage 1 sleeps
//                                   2 s in micro-batch 2's forward of step 1; every rank must fail
// In the failure modes the victim prints "EXIT <unix seconds>" before it exits, every other
// rank "ERROR <unix seconds> <type> <what()>" when its step failed, then "AGAIN same" when the
// next step threw the same error (exit 0), or "OK" (exit 1).
//
// Checks, for GPipe and 1F1B, SGD and AdamW, 20 steps of 4 micro-batches:
//   - every stage's parameters are bit-identical to the unsplit model's trained with the
//     same micro-batches accumulated in one process; within 1e-6 (relative, per parameter)
//     of the unsplit model trained on the whole batch (printed: max_rel_diff);
//   - busy + idle <= step on every step, idle > 0 over the steps; the last stage's loss is the
//     accumulated model's (bit for bit); `last` is passed to the step's last backward only;
//   - forward() (evaluation) gives the unsplit model's output on the last stage, nullptr
//     elsewhere;
//   - a batch smaller than m (3 rows) and an uneven one (30 rows): fewer or smaller
//     micro-batches, still bit-identical to the accumulated model;
//   - at world 4, dp2 x pp2 with DDP over each stage's replicas (GPipe SGD, 1F1B AdamW):
//     bit-identical to each replica's micro-batches accumulated and averaged in one
//     process, replicas bit-identical, DDP reduces once per step (earlier backwards in
//     no_sync); the difference from the unsplit model on both batches is printed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ddp/distributed_data_parallel.hpp"
#include "ddp/init.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"
#include "ddp/pipeline.hpp"
#include "ddp/trace.hpp"
#include "launched_checks.hpp"

namespace {

using launched::check;
using launched::g_rank;

const std::vector<size_t> kSizes = {32, 64, 48, 40, 10};
constexpr uint64_t kSeed = 21;
constexpr int kMicro = 4;

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Linears [first, end) of make_mlp(kSizes, kSeed), with its names and values (every
// Linear's draws consumed in order) and its ReLUs.
std::unique_ptr<ddp::Sequential> make_stage(size_t first, size_t end) {
  ddp::Rng rng(kSeed);
  auto stage = std::make_unique<ddp::Sequential>();
  const size_t linears = kSizes.size() - 1;
  for (size_t i = 0; i < linears; ++i) {
    auto linear = std::make_unique<ddp::Linear>(ddp::LinearOptions{kSizes[i], kSizes[i + 1], true}, rng,
                                                std::to_string(2 * i) + ".");
    if (i < first || i >= end) continue;
    stage->append(std::move(linear));
    if (i + 1 < linears) stage->add<ddp::ReLU>();
  }
  return stage;
}

std::unique_ptr<ddp::Optimizer> make_optimizer(const std::string& kind, std::vector<ddp::Parameter*> params) {
  if (kind == "sgd") return std::make_unique<ddp::SGD>(params, ddp::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  return std::make_unique<ddp::AdamW>(params, ddp::AdamWOptions{.lr = 1e-3f});
}

ddp::PipelineSchedule schedule_of(const std::string& name) {
  return name == "1f1b" ? ddp::PipelineSchedule::OneFOneB : ddp::PipelineSchedule::GPipe;
}

// One stage of the model in a pipeline over pp, and the batch every rank draws alike.
struct StageRun {
  std::unique_ptr<ddp::Sequential> model;
  ddp::Pipeline pipe;
  ddp::Tensor x;
  std::vector<int32_t> y;
  size_t batch = 0;
  int lasts = 0, backwards = 0;  // how the `last` flag was passed in the current step
  int step_index = 0;
  ddp::StageCompute compute;
  ddp::StageLoss loss;

  StageRun(const std::shared_ptr<ddp::ProcessGroup>& pp, const ddp::PipelineOptions& o)
      : model(make_stage(linears_begin(*pp, pp->rank()), linears_begin(*pp, pp->rank() + 1))), pipe(*model, pp, o) {
    compute.forward = [this](const ddp::Tensor& in) -> const ddp::Tensor& { return model->forward(in); };
    compute.backward = [this](const ddp::Tensor& dy, bool last) -> const ddp::Tensor& {
      ++backwards;
      if (last) lasts = backwards;
      return model->backward(dy, {}, !pipe.first());
    };
    loss = [this](size_t, size_t begin, const ddp::Tensor& out, ddp::Tensor& dout) {
      const float l = ddp::softmax_cross_entropy(out, std::span(y).subspan(begin, out.rows()), dout);
      dout.scale(static_cast<float>(out.rows()) / static_cast<float>(batch));
      return l;
    };
  }
  static size_t linears_begin(const ddp::ProcessGroup& pp, int stage) {
    return static_cast<size_t>(stage) * (kSizes.size() - 1) / static_cast<size_t>(pp.size());
  }
  void draw(size_t rows, int step) {
    batch = rows;
    launched::fill_batch(x, y, rows, kSizes.front(), kSizes.back(), 0, step);
  }
  ddp::PipelineStepStats step() {
    lasts = backwards = 0;
    return pipe.train_step(batch, pipe.first() ? &x : nullptr, compute, loss);
  }
};

// The unsplit model trained on the same batch: micro-batch accumulation as the pipeline
// cuts it (same order of sums), returning the mean of the micro-batch losses.
float accumulated_step(ddp::Sequential& ref, const ddp::Tensor& x, std::span<const int32_t> y, ddp::Tensor& d) {
  const size_t rows = x.rows(), chunk = (rows + kMicro - 1) / kMicro;
  double sum = 0;
  size_t n = 0;
  for (size_t begin = 0; begin < rows; begin += chunk, ++n) {
    const size_t r = std::min(chunk, rows - begin);
    const ddp::Tensor xi = ddp::Tensor::view(const_cast<float*>(x.row(begin)), r, x.cols());
    sum += ddp::softmax_cross_entropy(ref.forward(xi), y.subspan(begin, r), d);
    d.scale(static_cast<float>(r) / static_cast<float>(rows));
    ref.backward(d, {}, false);
  }
  return static_cast<float>(sum / static_cast<double>(n));
}

float whole_step(ddp::Sequential& ref, const ddp::Tensor& x, std::span<const int32_t> y, ddp::Tensor& d) {
  const float l = ddp::softmax_cross_entropy(ref.forward(x), y, d);
  ref.backward(d, {}, false);
  return l;
}

ddp::Parameter* by_name(ddp::Module& m, const std::string& name) {
  for (auto* p : m.parameters())
    if (p->name == name) return p;
  return nullptr;
}

// The stage's parameters against the same-named ones of `ref`: whether all are bit-identical,
// and the largest relative difference of any parameter.
std::pair<bool, double> compare(ddp::Module& stage, ddp::Module& ref) {
  bool same = true;
  double worst = 0;
  for (auto* p : stage.parameters()) {
    auto* q = by_name(ref, p->name);
    if (q == nullptr || q->numel() != p->numel()) return {false, INFINITY};
    same &= std::memcmp(p->value.data(), q->value.data(), p->numel() * sizeof(float)) == 0;
    const std::vector<float> a(p->value.data(), p->value.data() + p->numel());
    const std::vector<float> b(q->value.data(), q->value.data() + q->numel());
    worst = std::max(worst, launched::rel_diff(a, b));
  }
  return {same, worst};
}

// `steps` steps of `rows` rows through the pipeline and both references.
void train_case(const std::shared_ptr<ddp::ProcessGroup>& pp, const std::string& schedule, const std::string& opt,
                size_t rows, int steps) {
  const std::string name = schedule + " " + opt + " batch " + std::to_string(rows);
  ddp::Trace trace(pp->rank());
  StageRun run(pp, {.schedule = schedule_of(schedule), .microbatches = kMicro, .trace = &trace});
  auto acc = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  auto whole = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  auto o_stage = make_optimizer(opt, run.model->parameters());
  auto o_acc = make_optimizer(opt, acc->parameters());
  auto o_whole = make_optimizer(opt, whole->parameters());
  const size_t expected_n = (rows + (rows + kMicro - 1) / kMicro - 1) / ((rows + kMicro - 1) / kMicro);
  bool times_ok = true, loss_exact = true, last_ok = true, n_ok = true;
  double loss_diff = 0, share = 0, idle = 0;
  ddp::Tensor d;
  for (int step = 0; step < steps; ++step) {
    run.draw(rows, step);
    run.model->zero_grad();
    acc->zero_grad();
    whole->zero_grad();
    const auto st = run.step();
    const float l_acc = accumulated_step(*acc, run.x, run.y, d);
    const float l_whole = whole_step(*whole, run.x, run.y, d);
    o_stage->step();
    o_acc->step();
    o_whole->step();
    times_ok &= st.busy + st.idle <= st.step + 1e-4;
    idle += st.idle;
    n_ok &= st.microbatches == expected_n;
    last_ok &= run.backwards == static_cast<int>(expected_n) && run.lasts == run.backwards;
    if (run.pipe.last()) {
      loss_exact &= st.loss == l_acc;
      loss_diff = std::max(loss_diff, std::fabs(static_cast<double>(st.loss) - l_whole) / std::fabs(l_whole));
    }
    share += st.idle_share() / steps;
  }
  const auto [same, rel_acc] = compare(*run.model, *acc);
  const auto [same_whole, rel] = compare(*run.model, *whole);
  (void)same_whole;
  std::vector<double> mean{share};
  pp->all_reduce(ddp::view(mean));
  std::printf("rank %d: %s stage %d of %d max_rel_diff %.3g (accumulated: %s), loss rel diff %.3g, idle share %.3f "
              "(mean over stages %.3f)\n",
              g_rank, name.c_str(), pp->rank(), pp->size(), rel, same ? "bit-identical" : "DIFFERENT", loss_diff,
              share, mean[0] / pp->size());
  check(same, name + ": parameters bit-identical to the unsplit model with accumulated micro-batches (rel " +
                  std::to_string(rel_acc) + ")");
  check(rel <= 1e-6, name + ": within 1e-6 of the unsplit model on the whole batch (" + std::to_string(rel) + ")");
  check(times_ok, name + ": busy + idle <= step");
  // (A step may find every message already there: the sum over the steps, on every stage;
  // a single stage has nothing to wait for.)
  check(pp->size() == 1 || idle > 0, name + ": idle > 0");
  check(n_ok, name + ": " + std::to_string(expected_n) + " micro-batches per step");
  check(last_ok, name + ": `last` only on the step's last backward");
  check(loss_exact, name + ": the last stage's loss is the accumulated model's");
  // The trace holds at least every F and B of every step (and the waits, the losses).
  check(trace.size() >= 2 * expected_n * static_cast<size_t>(steps), name + ": the trace records each F and B");
  // The mean of the micro-batches' means is the batch's mean when they are equal.
  const bool even = rows % expected_n == 0;
  check(!even || loss_diff <= 1e-6, name + ": the loss within 1e-6 of the whole batch's");
  if (rows != 32 || opt != "sgd") return;
  // Evaluation: the trained pipeline's output against the trained reference's.
  const ddp::Tensor* out = run.pipe.forward(rows, run.pipe.first() ? &run.x : nullptr, run.compute);
  check(run.pipe.last() == (out != nullptr), name + ": forward() returns the output on the last stage only");
  if (out != nullptr) {
    const ddp::Tensor& want = acc->forward(run.x);
    const std::vector<float> a(out->data(), out->data() + out->size()), b(want.data(), want.data() + want.size());
    check(launched::rel_diff(a, b) <= 1e-6, name + ": forward() equals the unsplit model's output");
  } else {
    check(true, name + ": forward() (not the last stage)");
  }
}

// dp2 x pp2 (world 4): rank r is stage r / 2 of data-parallel replica r % 2, DDP over the
// two ranks of a stage. Inside the step only the last backward reduces (the others run
// in no_sync). The reference accumulates each replica's micro-batches in one process and
// averages the two sums as DDP does ((a + b) / 2: the same bits), so the stages must be
// bit-identical to it; against the unsplit model on both batches at once the difference
// is printed (AdamW amplifies the rounding of gradients that nearly cancel).
void data_parallel_case(const std::shared_ptr<ddp::ProcessGroup>& world, const std::string& schedule,
                        const std::string& opt) {
  const std::string name = "dp2 x pp2 " + schedule + " " + opt;
  const int r = world->rank(), stage = r / 2, replica = r % 2;
  std::shared_ptr<ddp::ProcessGroup> pp, dp;
  for (int d : {0, 1})
    if (auto g = world->new_group({d, d + 2})) pp = g;
  for (int st : {0, 1})
    if (auto g = world->new_group({2 * st, 2 * st + 1})) dp = g;
  StageRun run(pp, {.schedule = schedule_of(schedule), .microbatches = kMicro});
  ddp::DistributedDataParallel ddp(*run.model, dp);
  bool quiet_inside = true, reduced_last = true;
  run.compute.forward = [&](const ddp::Tensor& in) -> const ddp::Tensor& { return ddp.forward(in); };
  run.compute.backward = [&](const ddp::Tensor& dy, bool last) -> const ddp::Tensor& {
    if (last) {
      const ddp::Tensor& dx = ddp.backward(dy, stage > 0);
      reduced_last &= ddp.last_backward().buckets_reduced > 0;
      return dx;
    }
    auto guard = ddp.no_sync();
    const ddp::Tensor& dx = ddp.backward(dy, stage > 0);
    quiet_inside &= ddp.last_backward().buckets_reduced == 0;
    return dx;
  };
  auto acc = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  auto whole = ddp::make_mlp({.sizes = kSizes, .seed = kSeed});
  auto o_stage = make_optimizer(opt, run.model->parameters());
  auto o_acc = make_optimizer(opt, acc->parameters());
  auto o_whole = make_optimizer(opt, whole->parameters());
  const auto acc_params = acc->parameters();
  ddp::Tensor both(64, kSizes.front()), d, part;
  std::vector<int32_t> both_y, part_y;
  std::vector<std::vector<float>> first_sum(acc_params.size());
  bool replicas_same = true;
  for (int step = 0; step < 20; ++step) {
    both_y.clear();
    whole->zero_grad();
    for (int rep : {0, 1}) {
      launched::fill_batch(part, part_y, 32, kSizes.front(), kSizes.back(), rep, step);
      std::memcpy(both.row(32 * static_cast<size_t>(rep)), part.data(), part.size() * sizeof(float));
      both_y.insert(both_y.end(), part_y.begin(), part_y.end());
      acc->zero_grad();
      accumulated_step(*acc, part, part_y, d);
      for (size_t i = 0; i < acc_params.size(); ++i) {
        float* g = acc_params[i]->grad.data();
        if (rep == 0) first_sum[i].assign(g, g + acc_params[i]->numel());
        for (size_t j = 0; rep == 1 && j < first_sum[i].size(); ++j) g[j] = (first_sum[i][j] + g[j]) / 2;
      }
    }
    launched::fill_batch(run.x, run.y, 32, kSizes.front(), kSizes.back(), replica, step);
    run.batch = 32;
    ddp.zero_grad();
    run.step();
    whole_step(*whole, both, both_y, d);
    o_stage->step();
    o_acc->step();
    o_whole->step();
    replicas_same &= launched::same_everywhere(*dp, launched::hash_params(*run.model));
  }
  const auto [same, rel_acc] = compare(*run.model, *acc);
  const double rel = compare(*run.model, *whole).second;
  std::printf("rank %d: %s stage %d replica %d max_rel_diff %.3g (accumulated: %s), unsplit on both batches %.3g\n",
              g_rank, name.c_str(), stage, replica, rel_acc, same ? "bit-identical" : "DIFFERENT", rel);
  check(same, name + ": bit-identical to the replicas' accumulated micro-batches, averaged (rel " +
                  std::to_string(rel_acc) + ")");
  check(replicas_same, name + ": the replicas of a stage stay bit-identical");
  check(quiet_inside, name + ": no bucket reduced in the backwards before the last");
  check(reduced_last, name + ": the last backward of each step reduces");
}

// The failure modes: the victim (stage 1) exits or mismatches; every rank reports.
int failure_mode(const std::shared_ptr<ddp::ProcessGroup>& pp, const std::string& mode, const std::string& schedule) {
  const bool victim = pp->rank() == 1;
  ddp::PipelineOptions o{.schedule = schedule_of(schedule), .microbatches = kMicro};
  if (mode == "mismatch" && victim) o.microbatches = 3;
  if (mode == "stall") o.timeout = ddp::Millis(500);
  StageRun run(pp, o);
  if ((mode == "exit" || mode == "stall") && victim) {
    auto inner = run.compute.forward;
    run.compute.forward = [&, inner, mode](const ddp::Tensor& in) -> const ddp::Tensor& {
      if (run.step_index == 1 && run.model->slot() == 2) {
        if (mode == "stall") {
          std::this_thread::sleep_for(std::chrono::seconds(2));
        } else {
          std::printf("EXIT %.6f\n", now_s());
          std::fflush(stdout);
          std::_Exit(0);
        }
      }
      return inner(in);
    };
  }
  try {
    for (int step = 0; step < 3; ++step) {
      run.step_index = step;
      run.draw(32, step);
      run.model->zero_grad();
      run.step();
    }
  } catch (const std::exception& e) {
    // The same error type as the step failed with (the pipeline keeps it).
    const char* type = dynamic_cast<const ddp::PeerError*>(&e)  ? "PeerError"
                       : dynamic_cast<const ddp::Timeout*>(&e)  ? "Timeout"
                       : dynamic_cast<const ddp::Mismatch*>(&e) ? "Mismatch"
                                                                : "Error";
    std::printf("ERROR %.6f %s %s\n", now_s(), type, e.what());
    // The pipeline is broken from then on: the next step throws the same error at once.
    try {
      run.step();
    } catch (const std::exception& again) {
      std::printf("AGAIN %s\n", std::string(again.what()) == e.what() ? "same" : again.what());
    }
    return 0;
  }
  std::printf("OK\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    auto pp = ddp::init({.backend = "cpu"});
    g_rank = pp->rank();
    if (argc > 2) return failure_mode(pp, argv[1], argv[2]);
    for (const char* schedule : {"gpipe", "1f1b"})
      for (const char* opt : {"sgd", "adamw"}) train_case(pp, schedule, opt, 32, 20);
    train_case(pp, "1f1b", "adamw", 3, 5);
    train_case(pp, "gpipe", "sgd", 30, 5);
    if (pp->size() == 4) {
      data_parallel_case(pp, "gpipe", "sgd");
      data_parallel_case(pp, "1f1b", "adamw");
    }
    pp->barrier();
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return launched::finish();
}
