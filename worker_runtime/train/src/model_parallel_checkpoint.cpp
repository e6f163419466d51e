// save_model_parallel_checkpoint / load_model_parallel_checkpoint: the unsplit model's
// checkpoint file, assembled from the blocks of a model split by pipeline stages and
// tensor-parallel Linears, and cut back into any other split.
//
// Terms:
//   block         what a rank holds of a parameter (or of an optimizer buffer shaped like
//                 it): by Parameter::split, the whole of it, or part `index` of `parts`
//                 equal row blocks (dim 0) or column blocks (dim 1) of the full tensor;
//   contribution  what one rank at dp coordinate 0 sends world rank 0: its stage and tp
//                 coordinates, then per parameter its name, split, value block and
//                 optimizer buffer blocks (or the error that kept it from saying more).
//
// Saving: world rank 0 gathers the contributions' sizes, receives each contribution,
// places the blocks into full tensors stage by stage (make_mlp's order), writes the file
// with the writer save_checkpoint uses, and broadcasts the outcome so every rank returns
// or throws alike.
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "binary_io.hpp"
#include "checkpoint_format.hpp"
#include "ddp/model_parallel.hpp"
#include "ddp/types.hpp"
#include "model_parallel_layout.hpp"

namespace ddp {
namespace {

using binary_io::get;
using binary_io::put;

std::string shape_text(size_t rows, size_t cols) { return std::to_string(rows) + "x" + std::to_string(cols); }

// Where a block of rows × cols sits in its full tensor, from the parameter's split.
struct Placement {
  size_t full_rows = 0, full_cols = 0;
  size_t row0 = 0, col0 = 0;  // the block's first row and column in the full tensor
  size_t rows = 0, cols = 0;  // the block's shape
};

// The placement of parameter `name`'s block of shape rows × cols; throws Error when the
// split does not describe such a block.
Placement place(const std::string& name, const ParameterSplit& split, size_t rows, size_t cols) {
  Placement at{split.full_rows != 0 ? split.full_rows : rows, split.full_cols != 0 ? split.full_cols : cols, 0, 0,
               rows, cols};
  const auto parts = static_cast<size_t>(split.parts);
  const bool index_ok = split.parts >= 1 && split.index >= 0 && split.index < split.parts;
  bool ok = false;
  if (split.dim == -1) {
    ok = at.full_rows == rows && at.full_cols == cols;
  } else if (split.dim == 0 && index_ok) {
    ok = rows * parts == at.full_rows && cols == at.full_cols;
    at.row0 = static_cast<size_t>(split.index) * rows;
  } else if (split.dim == 1 && index_ok) {
    ok = cols * parts == at.full_cols && rows == at.full_rows;
    at.col0 = static_cast<size_t>(split.index) * cols;
  }
  if (!ok) {
    throw Error("parameter '" + name + "': a " + shape_text(rows, cols) + " block does not fit its split (full " +
                shape_text(at.full_rows, at.full_cols) + ", dim " + std::to_string(split.dim) + ", part " +
                std::to_string(split.index) + " of " + std::to_string(split.parts) + ")");
  }
  return at;
}

// Copies rows × cols floats between row-major matrices of the given row strides.
void copy_rows(const float* src, size_t src_stride, float* dst, size_t dst_stride, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, cols * sizeof(float));
}

size_t offset_of(const Placement& at) { return at.row0 * at.full_cols + at.col0; }

// The block at `at` of a full host tensor.
Tensor cut(const Placement& at, const Tensor& full) {
  Tensor block(at.rows, at.cols);
  copy_rows(full.data() + offset_of(at), at.full_cols, block.data(), at.cols, at.rows, at.cols);
  return block;
}

// Writes a host block into its place `at` in a full host tensor.
void put_block(const Placement& at, const Tensor& block, Tensor& full) {
  copy_rows(block.data(), at.cols, full.data() + offset_of(at), at.full_cols, at.rows, at.cols);
}

// One parameter of a contribution.
struct Entry {
  std::string name;
  ParameterSplit split;
  Tensor value;
  std::vector<Tensor> state;  // per optimizer buffer; empty tensor: the buffer is absent
  std::vector<uint8_t> has;   // per optimizer buffer: present
};

struct Contribution {
  int rank = 0;  // world rank
  int stage = 0, stages = 1, tp_index = 0, tp_size = 1;
  bool has_state = false;
  std::string kind;
  int64_t steps = 0;
  size_t buffers = 0;
  std::vector<Entry> entries;
};

constexpr uint8_t kOk = 0, kError = 1, kInvalidArgument = 2;
constexpr uint32_t kMaxMessage = 1 << 20;

void put_split(std::ostream& out, const ParameterSplit& s) {
  put<uint64_t>(out, s.full_rows);
  put<uint64_t>(out, s.full_cols);
  put<int32_t>(out, s.dim);
  put<int32_t>(out, s.parts);
  put<int32_t>(out, s.index);
}

ParameterSplit get_split(std::istream& in) {
  ParameterSplit s;
  s.full_rows = get<uint64_t>(in, "split");
  s.full_cols = get<uint64_t>(in, "split");
  s.dim = get<int32_t>(in, "split");
  s.parts = get<int32_t>(in, "split");
  s.index = get<int32_t>(in, "split");
  return s;
}

// Checks this rank's parameters and state locally (their blocks fit their splits, the
// tp split matches the mesh, the state is shaped like the parameters); throws Error.
void check_local(const std::vector<Parameter*>& params, const OptimizerState* state, int tp) {
  for (const Parameter* p : params) {
    if (!p->materialized()) throw Error("parameter '" + p->name + "' is not gathered (its value is sharded)");
    place(p->name, p->split, p->rows(), p->cols());
    if (p->split.dim >= 0 && p->split.parts != tp) {
      throw Error("parameter '" + p->name + "' is split in " + std::to_string(p->split.parts) +
                  " parts, the mesh's tp axis has " + std::to_string(tp) + " ranks");
    }
  }
  if (state == nullptr) return;
  for (const auto& buffer : state->buffers) {
    if (buffer.size() != params.size()) {
      throw Error("optimizer state has " + std::to_string(buffer.size()) + " parameters, this stage has " +
                  std::to_string(params.size()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& b = buffer[i];
      if (!b.empty() && (b.rows() != params[i]->rows() || b.cols() != params[i]->cols())) {
        throw Error("optimizer state of '" + params[i]->name + "' is " + shape_text(b.rows(), b.cols()) +
                    ", the parameter " + shape_text(params[i]->rows(), params[i]->cols()));
      }
    }
  }
}

// This rank's contribution (ranks at dp coordinate 0), or an error blob.
std::string encode(const std::vector<Parameter*>& params, const OptimizerState* state, const DeviceMesh& mesh) {
  std::ostringstream out(std::ios::binary);
  try {
    const int tp = model_parallel::axis_size(mesh, "tp");
    check_local(params, state, tp);
    put<uint8_t>(out, kOk);
    put<int32_t>(out, model_parallel::axis_coordinate(mesh, "pp"));
    put<int32_t>(out, model_parallel::axis_size(mesh, "pp"));
    put<int32_t>(out, model_parallel::axis_coordinate(mesh, "tp"));
    put<int32_t>(out, tp);
    put<uint8_t>(out, state != nullptr ? 1 : 0);
    if (state != nullptr) {
      binary_io::put_string(out, state->kind);
      put<int64_t>(out, state->steps);
      put<uint64_t>(out, state->buffers.size());
    }
    put<uint64_t>(out, params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      binary_io::put_string(out, params[i]->name);
      put_split(out, params[i]->split);
      binary_io::put_tensor(out, params[i]->value);
      if (state == nullptr) continue;
      for (const auto& buffer : state->buffers) {
        put<uint8_t>(out, buffer[i].empty() ? 0 : 1);
        if (!buffer[i].empty()) binary_io::put_tensor(out, buffer[i]);
      }
    }
    return out.str();
  } catch (const std::exception& e) {
    std::ostringstream err(std::ios::binary);
    put<uint8_t>(err, kError);
    binary_io::put_string(err, "rank " + std::to_string(mesh.world()->rank()) + ": " + e.what());
    return err.str();
  }
}

Contribution decode(const std::string& blob, int rank) {
  std::istringstream in(blob, std::ios::binary);
  const uint64_t limit = blob.size();
  if (get<uint8_t>(in, "status") != kOk) throw Error(binary_io::get_string(in, "error", kMaxMessage));
  Contribution c;
  c.rank = rank;
  c.stage = get<int32_t>(in, "stage");
  c.stages = get<int32_t>(in, "stages");
  c.tp_index = get<int32_t>(in, "tp index");
  c.tp_size = get<int32_t>(in, "tp size");
  c.has_state = get<uint8_t>(in, "state flag") == 1;
  if (c.has_state) {
    c.kind = binary_io::get_string(in, "optimizer kind", 64);
    c.steps = get<int64_t>(in, "steps");
    c.buffers = get<uint64_t>(in, "buffer count");
  }
  const auto count = get<uint64_t>(in, "parameter count");
  if (count > limit) throw Error("rank " + std::to_string(rank) + ": implausible parameter count");
  for (size_t i = 0; i < count; ++i) {
    Entry e;
    e.name = binary_io::get_string(in, "parameter name");
    e.split = get_split(in);
    e.value = binary_io::get_any_tensor(in, limit, e.name);
    for (size_t k = 0; k < c.buffers; ++k) {
      e.has.push_back(get<uint8_t>(in, "buffer flag"));
      e.state.push_back(e.has.back() != 0 ? binary_io::get_any_tensor(in, limit, e.name) : Tensor());
    }
    c.entries.push_back(std::move(e));
  }
  return c;
}

// The blocks of one parameter (or buffer) from every tp rank of its stage, as a full tensor.
Tensor assemble(const std::vector<const Contribution*>& tp_ranks, size_t j, int buffer) {
  const Entry& first = tp_ranks[0]->entries[j];
  const Tensor& probe = buffer < 0 ? first.value : first.state[static_cast<size_t>(buffer)];
  const Placement shape = place(first.name, first.split, probe.rows(), probe.cols());
  Tensor full(shape.full_rows, shape.full_cols);
  std::vector<bool> covered(static_cast<size_t>(first.split.parts), false);
  for (const Contribution* c : tp_ranks) {
    const Entry& e = c->entries[j];
    const Tensor& block = buffer < 0 ? e.value : e.state[static_cast<size_t>(buffer)];
    const Placement at = place(e.name, e.split, block.rows(), block.cols());
    put_block(at, block, full);
    covered[static_cast<size_t>(e.split.index)] = true;
    if (e.split.dim == -1) break;  // replicated: tp rank 0's copy
  }
  for (bool c : covered) {
    if (!c) throw Error("parameter '" + first.name + "': a tp block is missing");
  }
  return full;
}

// Rank 0: the checkpoint of the unsplit model from every contribution.
void write_assembled(const std::string& path, const std::vector<Contribution>& all, const CheckpointInfo& info) {
  const Contribution& ref = all.at(0);
  std::vector<std::vector<const Contribution*>> grid(static_cast<size_t>(ref.stages),
                                                     std::vector<const Contribution*>(static_cast<size_t>(ref.tp_size)));
  for (const Contribution& c : all) {
    const std::string who = "rank " + std::to_string(c.rank);
    if (c.stages != ref.stages || c.tp_size != ref.tp_size || c.stage < 0 || c.stage >= ref.stages ||
        c.tp_index < 0 || c.tp_index >= ref.tp_size) {
      throw Error(who + " reports another mesh (pp " + std::to_string(c.stages) + ", tp " + std::to_string(c.tp_size) + ")");
    }
    if (c.has_state != ref.has_state || c.kind != ref.kind || c.steps != ref.steps || c.buffers != ref.buffers) {
      throw Error(who + "'s optimizer state ('" + c.kind + "', " + std::to_string(c.steps) + " steps) differs from rank " +
                  std::to_string(ref.rank) + "'s ('" + ref.kind + "', " + std::to_string(ref.steps) + " steps)");
    }
    auto& cell = grid[static_cast<size_t>(c.stage)][static_cast<size_t>(c.tp_index)];
    if (cell != nullptr) throw Error(who + " and rank " + std::to_string(cell->rank) + " both hold pp stage " +
                                     std::to_string(c.stage) + ", tp rank " + std::to_string(c.tp_index) + " at dp 0");
    cell = &c;
  }
  std::vector<std::string> names;
  std::vector<Tensor> values;
  OptimizerState state{ref.kind, ref.steps, std::vector<std::vector<Tensor>>(ref.buffers)};
  for (size_t s = 0; s < grid.size(); ++s) {
    for (size_t t = 0; t < grid[s].size(); ++t) {
      if (grid[s][t] == nullptr) throw Error("nothing from pp stage " + std::to_string(s) + ", tp rank " + std::to_string(t));
    }
    const auto& row = grid[s];
    for (const Contribution* c : row) {
      for (size_t j = 0; j < c->entries.size(); ++j) {
        const Entry& e = c->entries[j];
        const Entry* r = j < row[0]->entries.size() ? &row[0]->entries[j] : nullptr;
        if (c->entries.size() != row[0]->entries.size() || e.name != r->name || e.split.dim != r->split.dim ||
            e.split.parts != r->split.parts || e.has != r->has) {
          throw Error("rank " + std::to_string(c->rank) + "'s parameter '" + e.name + "' does not match rank " +
                      std::to_string(row[0]->rank) + "'s of the same pp stage");
        }
      }
    }
    for (size_t j = 0; j < row[0]->entries.size(); ++j) {
      names.push_back(row[0]->entries[j].name);
      values.push_back(assemble(row, j, -1));
      for (size_t k = 0; k < ref.buffers; ++k) {
        state.buffers[k].push_back(row[0]->entries[j].has[k] != 0 ? assemble(row, j, static_cast<int>(k)) : Tensor());
      }
    }
  }
  std::vector<checkpoint_format::NamedTensor> named;
  for (size_t i = 0; i < names.size(); ++i) named.push_back({&names[i], &values[i]});
  std::string state_bytes;
  if (ref.has_state) {
    std::ostringstream out(std::ios::binary);
    write_optimizer_state(out, state);
    state_bytes = out.str();
  }
  checkpoint_format::write(path, info, named, ref.has_state ? &state_bytes : nullptr);
}

}  // namespace

void save_model_parallel_checkpoint(const std::string& path, const std::vector<Parameter*>& params,
                                    const OptimizerState* state, const DeviceMesh& mesh, const CheckpointInfo& info) {
  auto world = mesh.world();
  ProcessGroup& pg = *world;
  const bool contributes = model_parallel::axis_coordinate(mesh, "dp") == 0;
  std::string mine = contributes ? encode(params, state, mesh) : std::string();
  std::vector<std::string> blobs;
  if (pg.size() == 1) {
    blobs.push_back(std::move(mine));
  } else {
    // Sizes to rank 0, then each contribution by send/recv (0: that rank sends nothing).
    int64_t size = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(pg.rank() == 0 ? static_cast<size_t>(pg.size()) : 0);
    pg.gather(view(std::span<int64_t>(&size, 1)), view(sizes), 0);
    if (pg.rank() != 0) {
      if (size > 0) pg.send(Buffer{mine.data(), mine.size(), DType::U8, Device::Cpu}, 0);
    } else {
      blobs.resize(static_cast<size_t>(pg.size()));
      blobs[0] = std::move(mine);
      for (int r = 1; r < pg.size(); ++r) {
        auto& b = blobs[static_cast<size_t>(r)];
        b.resize(static_cast<size_t>(sizes[static_cast<size_t>(r)]));
        if (!b.empty()) pg.recv(Buffer{b.data(), b.size(), DType::U8, Device::Cpu}, r);
      }
    }
  }
  // Rank 0 writes; the outcome (status, message) goes to every rank.
  uint8_t status = kOk;
  std::string message;
  if (pg.rank() == 0) {
    try {
      std::vector<Contribution> all;
      for (size_t r = 0; r < blobs.size(); ++r) {
        if (!blobs[r].empty()) all.push_back(decode(blobs[r], static_cast<int>(r)));
      }
      if (all.empty()) throw Error("no rank at dp coordinate 0");
      write_assembled(path, all, info);
    } catch (const InvalidArgument& e) {
      status = kInvalidArgument;
      message = e.what();
    } catch (const std::exception& e) {
      status = kError;
      message = e.what();
    }
    if (status != kOk && message.rfind(path, 0) != 0) message = path + ": " + message;
  }
  if (pg.size() > 1) {
    int64_t header[2] = {status, static_cast<int64_t>(message.size())};
    pg.broadcast(view(std::span<int64_t>(header, 2)), 0);
    status = static_cast<uint8_t>(header[0]);
    message.resize(static_cast<size_t>(header[1]));
    if (!message.empty()) pg.broadcast(Buffer{message.data(), message.size(), DType::U8, Device::Cpu}, 0);
  }
  if (status == kInvalidArgument) throw InvalidArgument(message);
  if (status != kOk) throw Error(message);
}

CheckpointInfo load_model_parallel_checkpoint(const std::string& bytes, const std::string& path,
                                              const std::vector<Parameter*>& params, OptimizerState* state,
                                              const DeviceMesh& mesh) {
  const checkpoint_format::Contents file = checkpoint_format::read(bytes, path, nullptr, true);
  std::vector<Tensor> blocks;
  OptimizerState cut_state;
  try {
    check_local(params, nullptr, model_parallel::axis_size(mesh, "tp"));
    std::map<std::string, size_t> where;
    for (size_t i = 0; i < file.names.size(); ++i) where.emplace(file.names[i], i);
    std::vector<size_t> index;  // params[j] is the file's parameter index[j]
    std::vector<Placement> at;
    for (size_t j = 0; j < params.size(); ++j) {
      const Parameter& p = *params[j];
      const auto it = where.find(p.name);
      if (it == where.end()) throw Error("checkpoint has no parameter '" + p.name + "'");
      if (j > 0 && it->second != index.back() + 1) {
        throw Error("checkpoint parameter '" + file.names[index.back() + 1] + "' where the model has '" + p.name + "'");
      }
      index.push_back(it->second);
      at.push_back(place(p.name, p.split, p.rows(), p.cols()));
      const Tensor& stored = file.values[it->second];
      if (stored.rows() != at.back().full_rows || stored.cols() != at.back().full_cols) {
        throw Error("parameter " + p.name + ": stored shape " + shape_text(stored.rows(), stored.cols()) +
                    ", expected " + shape_text(at.back().full_rows, at.back().full_cols) + " (the unsplit model's)");
      }
      blocks.push_back(cut(at.back(), stored));
    }
    if (state != nullptr) {
      if (!file.has_optimizer) throw Error(std::string("checkpoint holds no optimizer state"));
      std::istringstream in(file.state, std::ios::binary);
      std::string kind = state->kind;
      if (kind.empty()) {  // the file's: its state opens with the kind
        std::istringstream peek(file.state, std::ios::binary);
        kind = binary_io::get_string(peek, "optimizer kind", 64);
      }
      std::vector<std::pair<size_t, size_t>> shapes;
      for (const Tensor& v : file.values) shapes.emplace_back(v.rows(), v.cols());
      const OptimizerState full = read_optimizer_state(in, kind, shapes);
      if (in.peek() != std::char_traits<char>::eof()) throw Error(std::string("trailing data after the optimizer state"));
      cut_state.kind = full.kind;
      cut_state.steps = full.steps;
      for (const auto& buffer : full.buffers) {
        cut_state.buffers.emplace_back();
        for (size_t j = 0; j < params.size(); ++j) {
          const Tensor& b = buffer[index[j]];
          cut_state.buffers.back().push_back(b.empty() ? Tensor() : cut(at[j], b));
        }
      }
    }
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  for (size_t j = 0; j < params.size(); ++j) params[j]->value.copy_from(blocks[j]);
  if (state != nullptr) *state = std::move(cut_state);
  return file.info;
}

}  // namespace ddp
