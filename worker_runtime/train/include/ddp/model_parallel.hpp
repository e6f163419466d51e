// A rank's part of a model split by tensor and pipeline parallelism, and checkpoints
// that do not depend on the split.
//
// The model is make_mlp's: Linear → ReLU → ... → Linear. Over a DeviceMesh with axes
// "pp", "dp" and "tp" (make_model_parallel_mesh), pipeline stage s (the pp coordinate)
// holds a contiguous range of the Linears, each with the ReLU that follows it; within a
// stage the Linears alternate ColumnParallelLinear and RowParallelLinear over the tp
// group (counted over the whole model: Linear 0 column, 1 row, 2 column, ...; an odd
// last Linear, a column with no row after it, stays a plain Linear replicated on every
// tp rank). Parameter names and initial values are make_mlp's, so every layout starts
// from the unsplit model's values, and checkpoints are the unsplit model's file
// (save_checkpoint's), whatever layout saved them and whatever layout loads them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/device_mesh.hpp"
#include "ddp/nn.hpp"
#include "ddp/optim.hpp"

namespace ddp {

// Splits make_mlp's Linears (widths `sizes`: Linear i is sizes[i] → sizes[i+1], with
// sizes[i]*sizes[i+1] + sizes[i+1] parameters) into `stages` contiguous ranges
// [first, end) of Linear indices, one per stage, each non-empty, minimising the largest
// stage's parameter count (ties: from the last stage back, each boundary as early as the
// optimum allows, so later stages take the spare Linears). Throws InvalidArgument for
// fewer than two sizes, a zero width, stages < 1 or more stages than Linears.
std::vector<std::pair<size_t, size_t>> partition_layers(const std::vector<size_t>& sizes, int stages);

// This rank's pipeline stage of make_mlp's model.
struct MlpStage {
  std::unique_ptr<Sequential> model;
  size_t first_linear = 0, end_linear = 0;  // the stage's Linears: [first_linear, end_linear)
  // This rank's input and output widths: the full widths, except a tp shard (width / tp)
  // where a stage boundary falls between a column- and a row-parallel Linear.
  size_t in_features = 0, out_features = 0;
};

// This rank's stage (its pp coordinate) of make_mlp(options), split over the mesh's tp
// group as the header comment says, with make_mlp's parameter names and initial values
// (the draws of other stages' Linears are skipped in order). With tp = pp = 1 it is
// exactly make_mlp(options). A mesh without a "pp" or "tp" axis counts it as size 1.
// Throws InvalidArgument for make_mlp's bad sizes, more stages than Linears, or a width
// a tensor-parallel Linear splits that does not divide by the tp size (naming the width
// and --tp). Not a collective (the tp layers only keep the mesh's group).
MlpStage make_parallel_mlp(const MlpOptions& options, const DeviceMesh& mesh);

// Collective over the mesh's world: writes at world rank 0 exactly the file that
// save_checkpoint writes for the unsplit make_mlp model and an optimizer in the same
// state. `params` are this rank's stage's parameters (its MlpStage model's parameters(),
// with their full values: not dp-sharded), `state` their optimizer state in the same
// order (Optimizer::state(); nullptr: none, on every rank alike). The ranks at dp
// coordinate 0 contribute; each parameter's block is placed by its Parameter::split;
// a stage's parameters follow the previous stage's. Every rank returns once the file is
// in place, or throws the same error on every rank, naming the file and what is wrong:
// Error for a rank's parameters or state that do not fit together (naming the rank) or
// an I/O failure, InvalidArgument for a run id too long for the file.
void save_model_parallel_checkpoint(const std::string& path, const std::vector<Parameter*>& params,
                                    const OptimizerState* state, const DeviceMesh& mesh, const CheckpointInfo& info);

// Local: cuts this rank's blocks out of a full checkpoint's bytes (save_checkpoint's
// file, or save_model_parallel_checkpoint's from any layout) into params' values and,
// when `state` is not null, into *state (kind, steps and per-parameter buffers, shaped
// like params: hand it to Optimizer::set_state). `params` must appear in the file in
// this order, one after the other, with their full shapes (Parameter::split). A non-empty
// state->kind must match the file's optimizer. Everything is validated first (as
// load_checkpoint_bytes does): on error nothing is changed and Error names `path`.
CheckpointInfo load_model_parallel_checkpoint(const std::string& bytes, const std::string& path,
                                              const std::vector<Parameter*>& params, OptimizerState* state,
                                              const DeviceMesh& mesh);

}  // namespace ddp
