// fashion_mnist's model parallelism (see parallel.hpp): the flags' checks, the mesh,
// the stage wrapped in the dp strategy, the pipeline, and the whole-model views
// (norm, checkpoint, hash) that cut across the mesh.
#include "parallel.hpp"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>

#include "ddp/checkpoint.hpp"
#include "ddp/types.hpp"

namespace fashion_mnist {
namespace {

// The optimizer's whole per-parameter state as values (what save_state writes; a
// sharded optimizer must have gathered it first).
ddp::OptimizerState per_parameter_state(const ddp::Optimizer& opt, const std::vector<ddp::Parameter*>& params) {
  std::stringstream bytes;
  opt.save_state(bytes);
  std::vector<std::pair<size_t, size_t>> shapes;
  for (const ddp::Parameter* p : params) shapes.emplace_back(p->rows(), p->cols());
  return ddp::read_optimizer_state(bytes, opt.kind(), shapes);
}

// "--tp N --pp M", as the user gave them.
std::string layout_flags(const ParallelOptions& p) {
  return "--tp " + std::to_string(p.tp) + " --pp " + std::to_string(p.pp);
}

// build(), where the library's InvalidArgument (a mesh it refuses, a width it cannot
// split) reaches the user prefixed with the flags that asked for it.
template <class Build>
auto naming_flags(const ParallelOptions& p, const Build& build) {
  try {
    return build();
  } catch (const ddp::InvalidArgument& e) {
    throw ddp::InvalidArgument(layout_flags(p) + ": " + e.what());
  }
}

}  // namespace

void check_parallel_flags(const ParallelOptions& p, const ParallelContext& c) {
  const std::string layout = layout_flags(p);
  if (p.microbatches > 0 && p.pp < 2) {
    throw ddp::InvalidArgument("--microbatches splits a pipeline's batch: it needs --pp 2 or more (--accumulate "
                               "splits a step without one)");
  }
  if (!p.schedule.empty() && p.pp < 2) {
    throw ddp::InvalidArgument("--schedule orders a pipeline: it needs --pp 2 or more");
  }
  if (!p.enabled()) return;
  data_parallel_size(p, c.world);  // the layout against the world first: no width fits a wrong one
  if (c.accumulate > 1 && p.pp > 1) {
    throw ddp::InvalidArgument("--accumulate " + std::to_string(c.accumulate) + " with --pp " + std::to_string(p.pp) +
                               ": the pipeline's micro-batches are the accumulation (use --microbatches)");
  }
  if (c.device != "cpu") {
    throw ddp::InvalidArgument("--device " + c.device + " with " + layout +
                               ": tensor and pipeline parallelism run on the host only for now (--device cpu)");
  }
  const size_t linears = c.sizes.size() - 1;
  if (static_cast<size_t>(p.pp) > linears) {
    throw ddp::InvalidArgument("--pp " + std::to_string(p.pp) + " is more stages than the " + std::to_string(linears) +
                               " Linear layers of --hidden " + c.hidden);
  }
  // Linears pair up as column- then row-parallel: each pair's inner width is split.
  for (size_t i = 0; i + 1 < linears; i += 2) {
    if (c.sizes[i + 1] % static_cast<size_t>(p.tp) != 0) {
      throw ddp::InvalidArgument("--tp " + std::to_string(p.tp) + " does not divide the hidden width " +
                                 std::to_string(c.sizes[i + 1]) + " of --hidden " + c.hidden +
                                 " (a column-parallel layer splits its outputs over tp)");
    }
  }
}

int data_parallel_size(const ParallelOptions& p, int world) {
  const int mp = p.tp * p.pp;
  if (world % mp != 0) {
    throw ddp::InvalidArgument(layout_flags(p) + ": tp x pp = " + std::to_string(mp) + " does not divide the world of " +
                               std::to_string(world) + " workers");
  }
  return world / mp;
}

ModelParallel::ModelParallel(const ParallelOptions& options, const ddp::MlpOptions& mlp,
                             std::shared_ptr<ddp::ProcessGroup> world, const StrategyOptions& strategy,
                             const ddp::OptimizerFactory& make, const Resumed* resumed,
                             const std::string& checkpoint_path)
    : options_(options),
      mlp_(mlp),
      world_(world),
      mesh_(naming_flags(options, [&] { return ddp::make_model_parallel_mesh(world, options.tp, options.pp); })),
      stage_(naming_flags(options, [&] { return ddp::make_parallel_mlp(mlp, mesh_); })) {
  // Resumed values go in before the strategy wraps the stage (FSDP shards them), the
  // optimizer's state after it built the optimizer, as in the plain path.
  std::optional<ddp::OptimizerState> state;
  if (resumed) {
    state.emplace();
    ddp::load_model_parallel_checkpoint(resumed->bytes, checkpoint_path, stage_.model->parameters(), &*state, mesh_);
  }
  inner_ = make_strategy(strategy, *stage_.model, mesh_.group("dp"), make);
  if (state && !state->kind.empty()) {
    std::stringstream bytes;
    ddp::write_optimizer_state(bytes, *state);
    inner_->optimizer().load_state(bytes);
  }
  if (options.pp > 1) {
    pipeline_ = std::make_unique<ddp::Pipeline>(*stage_.model, mesh_.group("pp"),
                                                ddp::PipelineOptions{.schedule = ddp::pipeline_schedule_from_name(options.schedule_name()),
                                                                     .microbatches = options.micro(),
                                                                     .trace = strategy.trace});
  }
  compute_.forward = [this](const ddp::Tensor& x) -> const ddp::Tensor& { return inner_->forward(x); };
  compute_.backward = [this](const ddp::Tensor& dy, bool last) -> const ddp::Tensor& {
    return inner_->backward(dy, last, !pipeline_->first());
  };
}

ModelParallel::~ModelParallel() = default;

DataShare ModelParallel::share() const {
  const bool last = pipeline_ == nullptr || pipeline_->last();
  return {.replicas = static_cast<size_t>(mesh_.size("dp")),
          .replica = static_cast<size_t>(mesh_.coordinate("dp")),
          .reports = last && mesh_.coordinate("tp") == 0};
}

StepLoss ModelParallel::pipeline_step(const ByteImageDataset& data, std::span<const size_t> idx,
                                      const std::array<float, 256>& table) {
  const size_t rows = idx.size();
  if (pipeline_->first()) gather_rows(data, idx, table, x_);
  if (pipeline_->last()) {
    y_.resize(rows);
    for (size_t i = 0; i < rows; ++i) y_[i] = data.labels[idx[i]];
  }
  double loss_sum = 0;
  // The batch's mean loss: each micro-batch's mean weighted by its share of the rows.
  const ddp::StageLoss loss = [&](size_t, size_t row_begin, const ddp::Tensor& out, ddp::Tensor& dout) {
    const float l = ddp::softmax_cross_entropy(out, std::span<const int32_t>(y_.data() + row_begin, out.rows()), dout);
    if (out.rows() != rows) dout.scale(static_cast<float>(out.rows()) / static_cast<float>(rows));
    loss_sum += static_cast<double>(l) * static_cast<double>(out.rows());
    return l;
  };
  const ddp::PipelineStepStats s = pipeline_->train_step(rows, pipeline_->first() ? &x_ : nullptr, compute_, loss);
  idle_ += s.idle;
  steps_ += s.step;
  if (!share().reports) return {};
  return {loss_sum, static_cast<double>(rows)};
}

const ddp::Tensor* ModelParallel::eval_forward(const ddp::Tensor& x) {
  if (!pipeline_) return &inner_->forward(x);
  return pipeline_->forward(x.rows(), pipeline_->first() ? &x : nullptr, compute_);
}

double ModelParallel::pipe_idle(bool whole_run) {
  if (!whole_run) {
    run_idle_ += idle_;
    run_steps_ += steps_;
  }
  const double idle = whole_run ? run_idle_ : idle_, steps = whole_run ? run_steps_ : steps_;
  double v[2] = {steps > 0 ? idle / steps : 0.0, 1.0};
  world_->all_reduce(ddp::view(std::span<double>(v, 2)), ddp::ReduceOp::Sum);
  if (!whole_run) idle_ = steps_ = 0;
  return v[0] / v[1];
}

const ddp::Tensor& ModelParallel::forward(const ddp::Tensor& x) {
  if (pipeline_) throw ddp::InvalidArgument("fashion_mnist: a pipeline stage runs whole steps (pipeline_step)");
  return inner_->forward(x);
}

const ddp::Tensor& ModelParallel::backward(const ddp::Tensor& dy, bool sync, bool need_dx) {
  if (pipeline_) throw ddp::InvalidArgument("fashion_mnist: a pipeline stage runs whole steps (pipeline_step)");
  return inner_->backward(dy, sync, need_dx);
}

float ModelParallel::clip_grad_norm(float max_norm) {
  const bool tp_first = mesh_.coordinate("tp") == 0;
  double sq = inner_->grad_squares([tp_first](const ddp::Parameter& p) { return p.split.dim != -1 || tp_first; });
  world_->all_reduce(ddp::view(std::span<double>(&sq, 1)), ddp::ReduceOp::Sum);
  const float norm = static_cast<float>(std::sqrt(sq));
  if (norm > max_norm && norm > 0) inner_->scale_grads(max_norm / (norm + 1e-6f));  // as DDP's clip
  return norm;
}

void ModelParallel::save_checkpoint(const std::string& path, const ddp::CheckpointInfo& info) {
  inner_->with_full_state([&](ddp::Module& m, const ddp::Optimizer& opt, bool root) {
    const std::vector<ddp::Parameter*> params = m.parameters();
    std::optional<ddp::OptimizerState> state;
    if (root) state = per_parameter_state(opt, params);
    ddp::save_model_parallel_checkpoint(path, params, state ? &*state : nullptr, mesh_, info);
  });
}

std::unique_ptr<ddp::Sequential> ModelParallel::assemble() {
  // Through the checkpoint file, which holds the unsplit model: world rank 0 writes it to
  // a temporary file of its own and reads it back into make_mlp's model. Parameters
  // only: no optimizer state is gathered or written.
  int64_t pid = static_cast<int64_t>(::getpid());
  world_->broadcast(ddp::view(std::span<int64_t>(&pid, 1)), 0);
  const std::string tmp =
      (std::filesystem::temp_directory_path() / ("fashion_mnist." + std::to_string(pid) + ".params")).string();
  inner_->with_full_params(
      [&](ddp::Module& m, bool) { ddp::save_model_parallel_checkpoint(tmp, m.parameters(), nullptr, mesh_, {}); });
  if (world_->rank() != 0) return nullptr;
  auto model = ddp::make_mlp(mlp_);
  std::error_code ec;
  try {
    ddp::load_checkpoint(tmp, *model, nullptr);
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::filesystem::remove(tmp, ec);
  return model;
}

uint64_t ModelParallel::params_hash() {
  const std::unique_ptr<ddp::Sequential> model = assemble();
  int64_t h = model ? static_cast<int64_t>(hash_parameters(*model)) : 0;
  world_->broadcast(ddp::view(std::span<int64_t>(&h, 1)), 0);
  return static_cast<uint64_t>(h);
}

void ModelParallel::write_params(const std::string& path) {
  const std::unique_ptr<ddp::Sequential> model = assemble();
  if (model) write_parameters(*model, path);
}

}  // namespace fashion_mnist
