// DeviceMesh: the shape check, the row-major layout and the groups per axis.
#include "ddp/device_mesh.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <set>
#include <string>
#include <utility>

#include "ddp/contract/worker_env.hpp"
#include "ddp/types.hpp"

namespace ddp {
namespace {

// Per axis: how far apart (in ranks) two neighbours along it are; the last axis is 1.
std::vector<int> strides_of(const std::vector<MeshAxis>& axes) {
  std::vector<int> strides(axes.size(), 1);
  for (size_t i = axes.size(); i-- > 1;) strides[i - 1] = strides[i] * axes[i].size;
  return strides;
}

// The world ranks of the group whose coordinate-0 member is `base`, `stride` apart.
std::vector<int> group_ranks(int base, int stride, int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int k = 0; k < size; ++k) ranks[static_cast<size_t>(k)] = base + k * stride;
  return ranks;
}

// Every group's coordinate-0 member along an axis of `size` ranks `stride` apart, in
// increasing order: the ranks whose coordinate along that axis is 0.
std::vector<int> group_bases(int world, int stride, int size) {
  std::vector<int> bases;
  for (int r = 0; r < world; ++r) {
    if ((r / stride) % size == 0) bases.push_back(r);
  }
  return bases;
}

// LOCAL_WORLD_SIZE as the worker contract reads it; the world where no launcher set one.
int environment_local_world_size(int world) {
  try {
    return contract::WorkerEnv::from_environment().local_world_size;
  } catch (const contract::ContractError&) {
    return world;
  }
}

}  // namespace

std::string mesh_shape_name(const std::vector<MeshAxis>& axes) {
  std::string s;
  for (const MeshAxis& a : axes) s += (s.empty() ? "" : " x ") + a.name + " " + std::to_string(a.size);
  return s.empty() ? "(no axes)" : s;
}

void check_mesh_shape(const std::vector<MeshAxis>& axes, int world, int local_world_size,
                      const std::vector<std::string>& within_host) {
  const std::string where = "DeviceMesh: shape " + mesh_shape_name(axes) + " over a world of " + std::to_string(world);
  if (axes.empty()) throw InvalidArgument(where + ": no axes");
  if (world < 1) throw InvalidArgument(where + ": the world must have at least one rank");
  std::set<std::string> names;
  long long product = 1;
  for (const MeshAxis& a : axes) {
    if (a.name.empty()) throw InvalidArgument(where + ": an axis has no name");
    if (!names.insert(a.name).second) throw InvalidArgument(where + ": axis '" + a.name + "' appears twice");
    if (a.size < 1) throw InvalidArgument(where + ": axis '" + a.name + "' has size " + std::to_string(a.size));
    product *= a.size;
    if (product > world) break;  // no overflow; the check below names it
  }
  if (product != world) {
    throw InvalidArgument(where + ": the sizes' product is not the world size");
  }
  if (local_world_size < 1) {
    throw InvalidArgument(where + ": local world size " + std::to_string(local_world_size) + " (must be >= 1)");
  }
  const std::vector<int> strides = strides_of(axes);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (std::find(within_host.begin(), within_host.end(), axes[i].name) == within_host.end()) continue;
    for (int base : group_bases(world, strides[i], axes[i].size)) {
      const int last = base + (axes[i].size - 1) * strides[i];
      if (base / local_world_size == last / local_world_size) continue;
      throw InvalidArgument(where + ": axis '" + axes[i].name + "' (size " + std::to_string(axes[i].size) +
                            ") must stay within a host of LOCAL_WORLD_SIZE " + std::to_string(local_world_size) +
                            " ranks, but its group of ranks " + std::to_string(base) + ".." + std::to_string(last) +
                            " spans hosts (put " + axes[i].name + " last / make " + axes[i].name +
                            " divide LOCAL_WORLD_SIZE)");
    }
  }
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshAxis> axes, const MeshOptions& options)
    : world_(std::move(world)), axes_(std::move(axes)) {
  if (!world_) throw InvalidArgument("DeviceMesh: no world group");
  const int n = world_->size();
  if (options.local_world_size < 0) {
    throw InvalidArgument("DeviceMesh: local_world_size " + std::to_string(options.local_world_size) +
                          " (0: the environment's)");
  }
  int32_t local = options.local_world_size;
  if (local == 0) {  // the smallest over the world: nodes of different sizes still judge the shape alike
    local = environment_local_world_size(n);
    world_->all_reduce(view(std::span<int32_t>(&local, 1)), ReduceOp::Min);
  }
  check_mesh_shape(axes_, n, local, options.within_host);
  strides_ = strides_of(axes_);
  const int me = world_->rank();
  for (size_t i = 0; i < axes_.size(); ++i) coords_.push_back((me / strides_[i]) % axes_[i].size);
  // Every rank makes every group, in one order: axes in order, groups by base rank.
  groups_.resize(axes_.size());
  ranks_.resize(axes_.size());
  for (size_t i = 0; i < axes_.size(); ++i) {
    for (int base : group_bases(n, strides_[i], axes_[i].size)) {
      std::vector<int> members = group_ranks(base, strides_[i], axes_[i].size);
      std::shared_ptr<ProcessGroup> g = world_->new_group(members);
      if (!g) continue;
      groups_[i] = std::move(g);
      ranks_[i] = std::move(members);
    }
  }
}

size_t DeviceMesh::index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == axis) return i;
  }
  throw InvalidArgument("DeviceMesh " + mesh_shape_name(axes_) + ": no axis '" + axis + "'");
}

int DeviceMesh::size(const std::string& axis) const { return axes_[index(axis)].size; }
int DeviceMesh::coordinate(const std::string& axis) const { return coords_[index(axis)]; }
const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& axis) const { return groups_[index(axis)]; }
const std::vector<int>& DeviceMesh::ranks(const std::string& axis) const { return ranks_[index(axis)]; }

int DeviceMesh::neighbour(const std::string& axis, int offset) const {
  const size_t i = index(axis);
  const long long c = static_cast<long long>(coords_[i]) + offset;
  if (c < 0 || c >= axes_[i].size) return -1;
  return world_->rank() + (static_cast<int>(c) - coords_[i]) * strides_[i];
}

int DeviceMesh::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size()) {
    throw InvalidArgument("DeviceMesh " + mesh_shape_name(axes_) + ": rank_of needs " + std::to_string(axes_.size()) +
                          " coordinates, got " + std::to_string(coords.size()));
  }
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size) {
      throw InvalidArgument("DeviceMesh " + mesh_shape_name(axes_) + ": coordinate " + std::to_string(coords[i]) +
                            " outside axis '" + axes_[i].name + "'");
    }
    rank += coords[i] * strides_[i];
  }
  return rank;
}

std::string DeviceMesh::describe() const {
  std::string s = mesh_shape_name(axes_) + ": rank " + std::to_string(world_->rank()) + " at ";
  for (size_t i = 0; i < axes_.size(); ++i) {
    s += (i == 0 ? "" : ", ") + axes_[i].name + " " + std::to_string(coords_[i]);
  }
  return s;
}

DeviceMesh make_model_parallel_mesh(std::shared_ptr<ProcessGroup> world, int tp, int pp, const MeshOptions& options) {
  if (!world) throw InvalidArgument("make_model_parallel_mesh: no world group");
  const int n = world->size();
  if (tp < 1 || pp < 1 || n % (tp * pp) != 0) {
    throw InvalidArgument("make_model_parallel_mesh: tp " + std::to_string(tp) + " x pp " + std::to_string(pp) +
                          " does not divide the world of " + std::to_string(n) + " ranks");
  }
  return DeviceMesh(std::move(world), {{"pp", pp}, {"dp", n / (tp * pp)}, {"tp", tp}}, options);
}

}  // namespace ddp
