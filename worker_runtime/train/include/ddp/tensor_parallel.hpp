// Tensor-parallel linear layers (Megatron-LM's): one Linear's matrices split over the
// ranks of a `tp` group, each rank holding one block.
//
//   ColumnParallelLinear: W (out × in) split by rows (output features): rank r holds
//     rows [r·out/tp, (r+1)·out/tp) of W and of b. It takes the whole input and gives
//     its slice of the output columns.
//   RowParallelLinear: W split by columns (input features): rank r holds columns
//     [r·in/tp, (r+1)·in/tp); b is whole (replicated). It takes the input slice a
//     column layer gave and gives the whole output.
//
// Megatron's MLP block, column → activation → row, needs one collective each way,
// through two conjugate operators:
//   f, at the column layer's input: identity in forward, all-reduce (sum over tp) of
//     the input gradient in backward (each rank's dx covers only its output columns);
//   g, at the row layer's output: all-reduce of the partial products in forward (each
//     rank multiplied only its input columns), identity in backward (dy is the same on
//     every tp rank, and each rank's dx is its own input slice).
// The row layer adds its bias once, after the reduction.
//
// Variants:
//   ColumnParallelOptions::gather_output: the column layer all-gathers the output
//     columns (every rank gets the whole output), and its backward takes the whole dy
//     and keeps its own columns.
//   RowParallelOptions::scatter_output (Megatron's sequence-parallel form): a
//     reduce-scatter instead of the all-reduce, so rank r's output is row block r of the
//     batch (batch / tp rows, then + b); backward takes that row block of dy and
//     all-gathers the whole dy first. The batch must divide by tp.
//
// Initialisation: each layer draws the WHOLE layer's values from rng exactly as Linear
// does (same draws, same order; the full matrix exists briefly) and keeps its block, so
// a tp-way model equals the unsplit model's initialisation and consumes the same draws.
// Parameter names are the unsplit Linear's; Parameter::split says where each block sits.
//
// Like Linear: parameter gradients accumulate, the grad-ready hook is called for the
// bias then the weight once their gradients are final, forward and backward keep their
// buffers (and the collectives work in them) so a step at a batch seen before allocates
// nothing, and activations are kept per slot (Module::select_slot). Every rank of the tp
// group must run the same forwards and backwards in the same order (they are
// collectives over tp). Tensors may live on the GPU when the tp group reaches GPU memory
// (backend cpu+nccl or nccl), except for gather_output, which rearranges columns on the
// host only (InvalidArgument "host only for now" otherwise).
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn.hpp"
#include "ddp/process_group.hpp"

namespace ddp {

struct ColumnParallelOptions {
  bool gather_output = false;  // all-gather the output columns (see above)
};

struct RowParallelOptions {
  bool scatter_output = false;  // reduce-scatter the output's rows (see above)
};

// What both layers share: the unsplit layer's options, the tp group, and this rank's
// block of the weight and bias (drawn as the unsplit Linear draws them).
class TensorParallelLinear : public Module {
 public:
  std::vector<Parameter*> parameters() override;
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }  // 0 × 0 without bias
  const std::shared_ptr<ProcessGroup>& group() const { return tp_; }

 protected:
  // split_dim 0: out_features split (column); 1: in_features split (row, bias whole).
  // Throws InvalidArgument without a group or when the split features do not divide
  // by its size.
  TensorParallelLinear(const char* layer, const LinearOptions& full, Rng& rng, std::shared_ptr<ProcessGroup> tp,
                       const std::string& name_prefix, int split_dim);

  LinearOptions full_;
  std::shared_ptr<ProcessGroup> tp_;
  size_t local_ = 0;  // this rank's share of the split features
  Parameter weight_;
  Parameter bias_;
};

class ColumnParallelLinear : public TensorParallelLinear {
 public:
  // `full` is the unsplit layer; full.out_features must divide by tp->size()
  // (InvalidArgument otherwise). Draws as Linear(full, rng, name_prefix) does.
  // weight(): out/tp × in; bias(): 1 × out/tp.
  ColumnParallelLinear(const LinearOptions& full, Rng& rng, std::shared_ptr<ProcessGroup> tp,
                       const std::string& name_prefix = "", const ColumnParallelOptions& options = {});

  // x: batch × in (the same on every tp rank). Returns batch × out/tp (batch × out
  // with gather_output).
  const Tensor& forward(const Tensor& x) override;
  // dy: batch × out/tp (batch × out with gather_output). dx (batch × in) is summed
  // over tp when need_dx; no collective otherwise.
  const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) override;

 private:
  struct Slot {
    const Tensor* input = nullptr;  // the x of this slot's last forward()
    Tensor local;                   // x W_localᵀ + b_local: batch × out/tp
    Tensor blocks;                  // gather_output: every rank's `local`, in rank order
    Tensor gathered;                // gather_output: the whole output, batch × out
    Tensor dy_local;                // gather_output: this rank's columns of dy
  };

  ColumnParallelOptions options_;
  Tensor dx_;  // backward's, all-reduced in place (valid until the next backward, as Linear's)
  std::deque<Slot> slots_;  // a deque: a new slot never moves the earlier slots' outputs
};

class RowParallelLinear : public TensorParallelLinear {
 public:
  // `full` is the unsplit layer; full.in_features must divide by tp->size()
  // (InvalidArgument otherwise). Draws as Linear(full, rng, name_prefix) does.
  // weight(): out × in/tp; bias(): 1 × out, whole.
  RowParallelLinear(const LinearOptions& full, Rng& rng, std::shared_ptr<ProcessGroup> tp,
                    const std::string& name_prefix = "", const RowParallelOptions& options = {});

  // x: batch × in/tp, this rank's input columns. Returns batch × out (batch/tp × out,
  // this rank's row block, with scatter_output).
  const Tensor& forward(const Tensor& x) override;
  // dy: batch × out, the same on every tp rank (with scatter_output: this rank's row
  // block, batch/tp × out). dx is batch × in/tp, this rank's input columns.
  const Tensor& backward(const Tensor& dy, const GradReadyHook& hook, bool need_dx) override;

 private:
  struct Slot {
    const Tensor* input = nullptr;
    Tensor partial;  // x W_localᵀ, batch × out, all-reduced in place (the output)
    Tensor output;   // scatter_output: this rank's rows of the reduced sum
    Tensor dy_full;  // scatter_output: the all-gathered dy
  };

  RowParallelOptions options_;
  Tensor dx_;
  Tensor ones_;  // batch × 1 of ones: adds the bias to every row with one GEMM on either device
  std::deque<Slot> slots_;  // a deque: a new slot never moves the earlier slots' outputs
};

}  // namespace ddp
