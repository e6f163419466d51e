// Model parallelism in fashion_mnist: --tp N --pp M beside --strategy.
//
// The world is laid out as a mesh pp x dp x tp (dp = world / (tp * pp); tp within a
// host). Each rank builds only its pipeline stage of the MLP, its Linears split over
// the tp group (column-, then row-parallel), wraps that stage in the --strategy over
// its dp group (DDP, ZeRO-1 or FSDP), and, with pp > 1, runs each optimizer step's
// batch through a Pipeline of --microbatches micro-batches (GPipe or 1F1B). Every rank
// of one pipeline and tp group sees the same batches: the sampler splits the data over
// dp only. The loss, accuracy and labels live on the last stage; the metrics come from
// its tp rank 0 of each dp replica.
//
// ModelParallel is a Strategy, so the training loop, checkpoints, hashes and the
// parameter dump go through the same calls as for the plain strategies: checkpoints
// are the unsplit model's file (save_model_parallel_checkpoint), so a job resumes in
// any layout, and --save-params / params_hash give the unsplit model's bytes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dataset.hpp"             // ByteImageDataset
#include "ddp/device_mesh.hpp"     // DeviceMesh
#include "ddp/model_parallel.hpp"  // make_parallel_mlp, model-parallel checkpoints
#include "ddp/pipeline.hpp"        // Pipeline
#include "resume.hpp"              // Resumed
#include "strategy.hpp"            // Strategy

namespace fashion_mnist {

// --tp, --pp, --microbatches, --schedule as given.
struct ParallelOptions {
  int tp = 1;
  int pp = 1;
  int microbatches = 0;          // 0: not given (4 when pp > 1)
  std::string schedule;          // empty: not given (gpipe)
  bool enabled() const { return tp * pp > 1; }
  int micro() const { return pp > 1 ? (microbatches > 0 ? microbatches : 4) : 1; }
  std::string schedule_name() const { return pp > 1 ? (schedule.empty() ? "gpipe" : schedule) : "none"; }
};

// What the other flags say that model parallelism must agree with.
struct ParallelContext {
  std::vector<size_t> sizes;     // the MLP's widths (make_mlp's)
  int accumulate = 1;            // --accumulate
  std::string device = "cpu";    // --device
  std::string hidden;            // --hidden as given (for messages)
  int world = 1;                 // the job's workers (WORLD_SIZE)
};

// Checks the flags against each other, the world and the model, before anything is
// started (tp x pp against the world before the widths). Throws InvalidArgument naming
// the flags.
void check_parallel_flags(const ParallelOptions& p, const ParallelContext& c);

// dp = world / (tp * pp); throws InvalidArgument naming --tp and --pp when tp * pp does
// not divide the world.
int data_parallel_size(const ParallelOptions& p, int world);

// Which ranks train and report what: the data split over `replicas` (the sampler's
// num_replicas), this rank's share `replica`; only ranks that `report` count metrics.
struct DataShare {
  size_t replicas = 1;
  size_t replica = 0;
  bool reports = true;
};

// A step's loss sum (loss x rows) and rows, as this rank counts them (zero where it
// does not report).
struct StepLoss {
  double loss_sum = 0;
  double rows = 0;
};

class ModelParallel : public Strategy {
 public:
  // Collective over the world: the mesh, this rank's stage of make_mlp(mlp) (loaded from
  // `resumed`, a full checkpoint of any layout, when given), the strategy over the dp
  // group (its optimizer's state resumed too) and, with pp > 1, the pipeline. A mesh or
  // stage the library refuses throws its InvalidArgument prefixed "--tp N --pp M: ".
  ModelParallel(const ParallelOptions& options, const ddp::MlpOptions& mlp, std::shared_ptr<ddp::ProcessGroup> world,
                const StrategyOptions& strategy, const ddp::OptimizerFactory& make, const Resumed* resumed,
                const std::string& checkpoint_path);
  ~ModelParallel() override;

  DataShare share() const;
  bool pipelined() const { return pipeline_ != nullptr; }
  // "pp 2 x dp 1 x tp 2: rank 0 at pp 0, dp 0, tp 0"
  std::string describe() const { return mesh_.describe(); }
  int dp() const { return mesh_.size("dp"); }

  // One optimizer step's forward and backward through the pipeline (pp > 1): the rows
  // `idx` of `data` (this dp replica's), pixel values from `table`. Gradients end
  // reduced over dp; clip and step follow as for any strategy.
  StepLoss pipeline_step(const ByteImageDataset& data, std::span<const size_t> idx,
                         const std::array<float, 256>& table);
  // Evaluation forward: the logits on ranks that have them (the last stage), nullptr
  // elsewhere. Collective over the pipeline (and over dp under FSDP).
  const ddp::Tensor* eval_forward(const ddp::Tensor& x);
  // Collective over the world: the mean over ranks of the pipeline's idle share (idle /
  // step time) since the last call (whole_run false) or since the start; 0 without one.
  double pipe_idle(bool whole_run);

  // Strategy: the stage through the dp strategy (forward/backward for pp = 1 only).
  const ddp::Tensor& forward(const ddp::Tensor& x) override;
  const ddp::Tensor& backward(const ddp::Tensor& dy, bool sync, bool need_dx) override;
  CommStats last_comm() const override { return inner_->last_comm(); }
  ddp::Optimizer& optimizer() override { return inner_->optimizer(); }
  void step() override { inner_->step(); }
  // The whole model's norm: split parameters' squares summed over tp, replicated ones
  // counted once, summed over pp and dp (as the strategy splits them).
  float clip_grad_norm(float max_norm) override;
  double grad_squares(const std::function<bool(const ddp::Parameter&)>& counted) override {
    return inner_->grad_squares(counted);
  }
  void scale_grads(float factor) override { inner_->scale_grads(factor); }
  void with_full_state(const FullStateUse& use) override { inner_->with_full_state(use); }
  void with_full_params(const FullParamsUse& use) override { inner_->with_full_params(use); }
  // The unsplit model's checkpoint, written by world rank 0.
  void save_checkpoint(const std::string& path, const ddp::CheckpointInfo& info) override;
  // The unsplit model's hash and raw values (world rank 0 writes).
  uint64_t params_hash() override;
  void write_params(const std::string& path) override;
  ddp::MemoryStats memory() const override { return inner_->memory(); }

 private:
  // Collective over the world: the unsplit model with the trained values, on world
  // rank 0 (nullptr elsewhere).
  std::unique_ptr<ddp::Sequential> assemble();

  ParallelOptions options_;
  ddp::MlpOptions mlp_;
  std::shared_ptr<ddp::ProcessGroup> world_;
  ddp::DeviceMesh mesh_;
  ddp::MlpStage stage_;
  std::unique_ptr<Strategy> inner_;
  std::unique_ptr<ddp::Pipeline> pipeline_;
  ddp::StageCompute compute_;
  ddp::Tensor x_;
  std::vector<int32_t> y_;
  double idle_ = 0, steps_ = 0;          // this epoch's pipeline idle and step seconds
  double run_idle_ = 0, run_steps_ = 0;  // the whole run's
};

}  // namespace fashion_mnist
