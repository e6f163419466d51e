// save_model_parallel_checkpoint / load_model_parallel_checkpoint: the unsplit model's
// checkpoint file, assembled from the blocks of a model split by pipeline stages and
// tensor-parallel Linears, and cut back into any other split.
//
// Terms:
//   block         what a rank holds of a parameter (or of an optimizer buffer shaped like
//                 it): by Parameter::split, the whole of it, or part `index` of `parts`
//                 equal row blocks (dim 0) or column blocks (dim 1) of the full tensor;
//   contributor   a rank at dp coordinate 0: one per pipeline stage and tp rank;
//   plan          what a contributor tells world rank 0 first: its stage and tp
//                 coordinates, its optimizer's kind and steps, and per parameter its name,
//                 split, block shape and which optimizer buffers exist (or the error that
//                 kept it from saying more).
//
// Saving, over the world group:
//   1. the plans' sizes go to rank 0 (gather), then the plans (send/recv);
//   2. rank 0 checks that they fit together (every stage and tp rank once, the same
//      parameters and optimizer state across a stage's tp ranks, blocks that cover each
//      parameter) and allocates the full tensors; the verdict goes to every rank
//      (broadcast), so all continue or all throw;
//   3. each contributor sends its blocks in plan order, replicated parameters from tp
//      rank 0 only; rank 0 receives row blocks straight into their place in the full
//      tensor, column blocks through a scratch block, and places its own;
//   4. rank 0 writes the file with save_checkpoint's writer; the outcome goes to every
//      rank (broadcast).
// Loading is local: every rank reads the whole file and cuts its blocks.
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
  // Whether the block is one run of the full tensor's memory (whole, or rows).
  bool contiguous() const { return cols == full_cols; }
  size_t offset() const { return row0 * full_cols + col0; }
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

// The block at `at` of a full host tensor.
Tensor cut(const Placement& at, const Tensor& full) {
  Tensor block(at.rows, at.cols);
  copy_rows(full.data() + at.offset(), at.full_cols, block.data(), at.cols, at.rows, at.cols);
  return block;
}

// Writes a host block into its place `at` in a full host tensor.
void put_block(const Placement& at, const Tensor& block, Tensor& full) {
  copy_rows(block.data(), at.cols, full.data() + at.offset(), at.full_cols, at.rows, at.cols);
}

// A tensor's values in host memory: itself, or a host copy of a device tensor (kept in `copy`).
const Tensor& on_host(const Tensor& t, Tensor& copy) {
  if (!t.is_cuda()) return t;
  copy = t.to(Device::Cpu);
  return copy;
}

Buffer floats(const float* data, size_t count) { return Buffer{const_cast<float*>(data), count, DType::F32, Device::Cpu}; }
Buffer bytes_of(std::string& s) { return Buffer{s.data(), s.size(), DType::U8, Device::Cpu}; }

// One parameter of a plan.
struct Entry {
  std::string name;
  ParameterSplit split;
  size_t rows = 0, cols = 0;  // the block's shape (its optimizer buffers' too)
  std::vector<uint8_t> has;   // per optimizer buffer: whether it exists
};

struct Plan {
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

// Whether a contributor sends parameter i's blocks: a replicated one comes from tp rank 0.
bool sends(const ParameterSplit& split, int tp_index) { return split.dim != -1 || tp_index == 0; }

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

// This contributor's plan, or an error blob.
std::string encode_plan(const std::vector<Parameter*>& params, const OptimizerState* state, const DeviceMesh& mesh) {
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
      const Parameter& p = *params[i];
      binary_io::put_string(out, p.name);
      put<uint64_t>(out, p.split.full_rows);
      put<uint64_t>(out, p.split.full_cols);
      put<int32_t>(out, p.split.dim);
      put<int32_t>(out, p.split.parts);
      put<int32_t>(out, p.split.index);
      put<uint64_t>(out, p.rows());
      put<uint64_t>(out, p.cols());
      if (state == nullptr) continue;
      for (const auto& buffer : state->buffers) put<uint8_t>(out, buffer[i].empty() ? 0 : 1);
    }
    return out.str();
  } catch (const std::exception& e) {
    std::ostringstream err(std::ios::binary);
    put<uint8_t>(err, kError);
    binary_io::put_string(err, "rank " + std::to_string(mesh.world()->rank()) + ": " + e.what());
    return err.str();
  }
}

Plan decode_plan(const std::string& blob, int rank) {
  std::istringstream in(blob, std::ios::binary);
  if (get<uint8_t>(in, "status") != kOk) throw Error(binary_io::get_string(in, "error", kMaxMessage));
  Plan c;
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
  if (count > blob.size() || c.buffers > blob.size()) throw Error("rank " + std::to_string(rank) + ": implausible plan");
  c.entries.resize(count);
  for (Entry& e : c.entries) {
    e.name = binary_io::get_string(in, "parameter name");
    e.split.full_rows = get<uint64_t>(in, "split");
    e.split.full_cols = get<uint64_t>(in, "split");
    e.split.dim = get<int32_t>(in, "split");
    e.split.parts = get<int32_t>(in, "split");
    e.split.index = get<int32_t>(in, "split");
    e.rows = get<uint64_t>(in, "shape");
    e.cols = get<uint64_t>(in, "shape");
    for (size_t k = 0; k < c.buffers; ++k) e.has.push_back(get<uint8_t>(in, "buffer flag"));
  }
  return c;
}

// Rank 0's unsplit model under construction: the plans checked against each other, the
// full tensors allocated, and where each plan's parameters go.
struct Assembly {
  std::vector<Plan> plans;          // by world rank order, contributors only
  std::vector<size_t> first_index;  // per plan: the unsplit model's index of its first parameter
  std::vector<std::string> names;
  std::vector<Tensor> values;
  OptimizerState state;  // full buffers; empty where a buffer does not exist
  bool has_state = false;
};

Assembly plan_assembly(std::vector<Plan> plans) {
  if (plans.empty()) throw Error("no rank at dp coordinate 0");
  const Plan& ref = plans[0];
  std::vector<std::vector<const Plan*>> grid(static_cast<size_t>(std::max(ref.stages, 0)),
                                             std::vector<const Plan*>(static_cast<size_t>(std::max(ref.tp_size, 0))));
  for (const Plan& c : plans) {
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
  Assembly a;
  a.has_state = ref.has_state;
  a.state = OptimizerState{ref.kind, ref.steps, std::vector<std::vector<Tensor>>(ref.buffers)};
  std::vector<size_t> stage_first(grid.size());
  for (size_t s = 0; s < grid.size(); ++s) {
    for (size_t t = 0; t < grid[s].size(); ++t) {
      if (grid[s][t] == nullptr) throw Error("nothing from pp stage " + std::to_string(s) + ", tp rank " + std::to_string(t));
    }
    const auto& row = grid[s];
    const std::vector<Entry>& base = row[0]->entries;
    stage_first[s] = a.names.size();
    for (size_t j = 0; j < base.size(); ++j) {
      const bool whole = base[j].split.dim == -1;
      std::vector<bool> covered(whole ? 1 : static_cast<size_t>(std::max(base[j].split.parts, 1)), false);
      const Placement full = place(base[j].name, base[j].split, base[j].rows, base[j].cols);
      for (const Plan* c : row) {
        const Entry* e = j < c->entries.size() ? &c->entries[j] : nullptr;
        const Placement at = e != nullptr ? place(e->name, e->split, e->rows, e->cols) : full;
        if (c->entries.size() != base.size() || e->name != base[j].name || e->split.dim != base[j].split.dim ||
            e->split.parts != base[j].split.parts || e->has != base[j].has || at.full_rows != full.full_rows ||
            at.full_cols != full.full_cols) {
          throw Error("rank " + std::to_string(c->rank) + "'s parameters do not match rank " +
                      std::to_string(row[0]->rank) + "'s of the same pp stage (at '" + base[j].name + "')");
        }
        covered[whole ? 0 : static_cast<size_t>(e->split.index)] = true;
      }
      for (bool c : covered) {
        if (!c) throw Error("parameter '" + base[j].name + "': a tp block is missing");
      }
      a.names.push_back(base[j].name);
      a.values.emplace_back(full.full_rows, full.full_cols);
      for (size_t k = 0; k < ref.buffers; ++k) {
        a.state.buffers[k].push_back(base[j].has[k] != 0 ? Tensor(full.full_rows, full.full_cols) : Tensor());
      }
    }
  }
  for (const Plan& c : plans) a.first_index.push_back(stage_first[static_cast<size_t>(c.stage)]);
  a.plans = std::move(plans);
  return a;
}

// Every tensor a contributor sends (or rank 0 places), in order: per parameter it sends,
// its value block, then its existing optimizer buffers' blocks. `each(value, buffer, i)`
// gets buffer -1 for the value.
template <typename Each>
void for_each_block(const Plan& c, Each&& each) {
  for (size_t i = 0; i < c.entries.size(); ++i) {
    if (!sends(c.entries[i].split, c.tp_index)) continue;
    each(i, -1);
    for (size_t k = 0; k < c.buffers; ++k) {
      if (c.entries[i].has[k] != 0) each(i, static_cast<int>(k));
    }
  }
}

// Rank 0: receives (from `src`) or copies (its own, from `mine`) every block of plan p
// into the assembly's full tensors.
void gather_blocks(ProcessGroup& pg, Assembly& a, size_t p, const std::vector<Parameter*>* mine,
                   const OptimizerState* my_state) {
  const Plan& c = a.plans[p];
  Tensor scratch, host;
  for_each_block(c, [&](size_t i, int k) {
    const Entry& e = c.entries[i];
    const size_t g = a.first_index[p] + i;
    Tensor& full = k < 0 ? a.values[g] : a.state.buffers[static_cast<size_t>(k)][g];
    const Placement at = place(e.name, e.split, e.rows, e.cols);
    if (mine != nullptr) {
      const Tensor& t = k < 0 ? (*mine)[i]->value : my_state->buffers[static_cast<size_t>(k)][i];
      put_block(at, on_host(t, host), full);
    } else if (at.contiguous()) {
      pg.recv(floats(full.data() + at.offset(), at.rows * at.cols), c.rank);
    } else {
      scratch.resize(at.rows, at.cols);
      pg.recv(floats(scratch.data(), scratch.size()), c.rank);
      put_block(at, scratch, full);
    }
  });
}

// A contributor other than rank 0: sends its blocks in plan order.
void send_blocks(ProcessGroup& pg, const Plan& c, const std::vector<Parameter*>& params, const OptimizerState* state) {
  Tensor host;
  for_each_block(c, [&](size_t i, int k) {
    const Tensor& t = on_host(k < 0 ? params[i]->value : state->buffers[static_cast<size_t>(k)][i], host);
    pg.send(floats(t.data(), t.size()), 0);
  });
}

void write_assembly(const std::string& path, const Assembly& a, const CheckpointInfo& info) {
  std::vector<checkpoint_format::NamedTensor> named;
  for (size_t i = 0; i < a.names.size(); ++i) named.push_back({&a.names[i], &a.values[i]});
  std::string state_bytes;
  if (a.has_state) {
    std::ostringstream out(std::ios::binary);
    write_optimizer_state(out, a.state);
    state_bytes = std::move(out).str();  // moves the buffer out (C++20)
  }
  checkpoint_format::write(path, info, named, a.has_state ? &state_bytes : nullptr);
}

// Rank 0's outcome of a step, to every rank: returns normally on all of them, or throws
// the same error (InvalidArgument or Error, the message naming the file) on all.
void share_outcome(ProcessGroup& pg, uint8_t status, std::string message, const std::string& path) {
  if (pg.rank() == 0 && status != kOk && message.rfind(path, 0) != 0) message = path + ": " + message;
  if (pg.size() > 1) {
    int64_t header[2] = {status, static_cast<int64_t>(message.size())};
    pg.broadcast(view(std::span<int64_t>(header, 2)), 0);
    status = static_cast<uint8_t>(header[0]);
    message.resize(static_cast<size_t>(header[1]));
    if (!message.empty()) pg.broadcast(bytes_of(message), 0);
  }
  if (status == kInvalidArgument) throw InvalidArgument(message);
  if (status != kOk) throw Error(message);
}

// Runs `step` on rank 0, catching what it throws as the status and message to share.
template <typename Step>
void on_rank0(ProcessGroup& pg, const std::string& path, Step&& step) {
  uint8_t status = kOk;
  std::string message;
  if (pg.rank() == 0) {
    try {
      step();
    } catch (const InvalidArgument& e) {
      status = kInvalidArgument;
      message = e.what();
    } catch (const std::exception& e) {
      status = kError;
      message = e.what();
    }
  }
  share_outcome(pg, status, message, path);
}

}  // namespace

void save_model_parallel_checkpoint(const std::string& path, const std::vector<Parameter*>& params,
                                    const OptimizerState* state, const DeviceMesh& mesh, const CheckpointInfo& info) {
  auto world = mesh.world();
  ProcessGroup& pg = *world;
  const bool contributes = model_parallel::axis_coordinate(mesh, "dp") == 0;
  std::string mine = contributes ? encode_plan(params, state, mesh) : std::string();
  // 1. Plans to rank 0: their sizes (0: not a contributor), then each plan.
  std::vector<std::string> blobs;
  if (pg.size() == 1) {
    blobs.push_back(std::move(mine));
  } else {
    int64_t size = static_cast<int64_t>(mine.size());
    std::vector<int64_t> sizes(pg.rank() == 0 ? static_cast<size_t>(pg.size()) : 0);
    pg.gather(view(std::span<int64_t>(&size, 1)), view(sizes), 0);
    if (pg.rank() != 0) {
      if (size > 0) pg.send(bytes_of(mine), 0);
    } else {
      blobs.resize(static_cast<size_t>(pg.size()));
      blobs[0] = std::move(mine);
      for (int r = 1; r < pg.size(); ++r) {
        auto& b = blobs[static_cast<size_t>(r)];
        b.resize(static_cast<size_t>(sizes[static_cast<size_t>(r)]));
        if (!b.empty()) pg.recv(bytes_of(b), r);
      }
    }
  }
  // 2. Rank 0 checks them and allocates the unsplit model; all go on, or all throw.
  Assembly assembly;
  on_rank0(pg, path, [&] {
    std::vector<Plan> plans;
    for (size_t r = 0; r < blobs.size(); ++r) {
      if (!blobs[r].empty()) plans.push_back(decode_plan(blobs[r], static_cast<int>(r)));
    }
    assembly = plan_assembly(std::move(plans));
  });
  // 3. The blocks.
  if (pg.rank() == 0) {
    for (size_t p = 0; p < assembly.plans.size(); ++p) {
      const bool own = assembly.plans[p].rank == 0;
      gather_blocks(pg, assembly, p, own ? &params : nullptr, own ? state : nullptr);
    }
  } else if (contributes) {
    send_blocks(pg, decode_plan(mine, pg.rank()), params, state);
  }
  // 4. The file.
  on_rank0(pg, path, [&] { write_assembly(path, assembly, info); });
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
      binary_io::MemoryStream in(file.state);
      std::string kind = state->kind;
      if (kind.empty()) {  // the file's: its state opens with the kind
        binary_io::MemoryStream peek(file.state);
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
