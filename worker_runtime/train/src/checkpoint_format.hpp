// The checkpoint file's pieces below save_checkpoint / load_checkpoint_bytes (written in
// checkpoint.cpp), for writers and readers that hold the parameters as plain named
// tensors rather than as one Module: checkpoints of a model split across ranks
// (model_parallel_checkpoint.cpp) assemble the unsplit model's parameters on one rank
// and cut a rank's blocks out of them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ddp/checkpoint.hpp"
#include "ddp/tensor.hpp"

namespace ddp::checkpoint_format {

// A parameter as the file stores it: its name and value (host or device).
struct NamedTensor {
  const std::string* name = nullptr;
  const Tensor* value = nullptr;
};

// Writes a checkpoint of `params` (in this order), the optimizer state bytes
// (write_optimizer_state's format; nullptr: none) and info to path, atomically, exactly
// as save_checkpoint writes a model with these parameters and an optimizer whose
// save_state writes these bytes. Throws InvalidArgument for a run id that does not fit,
// Error naming the file on any I/O failure.
void write(const std::string& path, const CheckpointInfo& info, const std::vector<NamedTensor>& params,
           const std::string* optimizer_state);

// What a parameter of the expected model is called and its shape.
struct ParamSpec {
  std::string name;
  size_t rows = 0, cols = 0;
};

// A checkpoint's payload, validated: the parameters and the optimizer's state bytes,
// not yet applied to anything.
struct Contents {
  CheckpointInfo info;
  std::vector<std::string> names;  // every parameter's name, in file order
  std::vector<Tensor> values;      // host tensors; empty when not read (see read)
  bool has_optimizer = false;
  std::string_view state;  // write_optimizer_state bytes when has_optimizer: a view of the bytes read
};

// Validates a checkpoint's bytes (header, CRC-32, structure) and reads its payload.
// With `expect`, the parameter count, names and shapes must match it (in order) and
// the values are read; without, the values are read in their stored shapes when
// `read_values`, else only walked over. Throws Error naming path. The result's state
// is a view into `bytes`, which must outlive it.
Contents read(const std::string& bytes, const std::string& path, const std::vector<ParamSpec>* expect,
              bool read_values);

}  // namespace ddp::checkpoint_format
