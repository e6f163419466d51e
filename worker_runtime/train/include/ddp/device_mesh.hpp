// A device mesh: the world laid out along named axes (say pp × dp × tp), with this
// rank's coordinates and one process group per axis.
//
// Layout: ranks are numbered row-major over the axes, the LAST axis fastest, so the
// ranks of one group of the last axis are consecutive. With axes pp 2 × dp 2 × tp 2,
// rank 5 = 1·4 + 0·2 + 1 sits at pp 1, dp 0, tp 1; its tp group is {4, 5}, its dp group
// {5, 7}, its pp group {1, 5}. Every group's rank i is the member at coordinate i.
//
// Hosts: launchers number ranks contiguously per node, so host h holds the global
// ranks [h·L, (h+1)·L) with L the local world size (torchrun's LOCAL_WORLD_SIZE, read
// through the worker contract). When the world is not a multiple of L (nodes of
// different sizes) the same rule is applied anyway: it is then only an approximation
// of where the ranks run. Axes named in MeshOptions::within_host (by default "tp",
// whose collectives are the most frequent) must keep each of their groups on one host.
//
// The host rule reads `world`'s ranks as the launcher's: pass init()'s group, or say
// MeshOptions::local_world_size for another one.
//
// Building a mesh is a collective over `world`: every rank makes the subgroup of every
// group of every axis (axes in order, groups by their smallest rank), as
// ProcessGroup::new_group asks, and keeps its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp/process_group.hpp"

namespace ddp {

struct MeshAxis {
  std::string name;  // unique in the mesh: "pp", "dp", "tp", ...
  int size = 1;      // ranks along this axis (>= 1)
};

struct MeshOptions {
  // Ranks per host. 0: LOCAL_WORLD_SIZE of the environment (the worker contract's
  // local_world_size; the world's size where the environment has none), the smallest
  // over the world (one all-reduce), so that every rank judges the shape alike.
  int local_world_size = 0;
  // Axes whose groups must not span hosts; a name that is not an axis is ignored.
  std::vector<std::string> within_host = {"tp"};
};

// Checks a mesh shape without any process group: every size >= 1, names non-empty and
// distinct, the sizes' product equal to `world`, and each `within_host` axis's groups
// inside one host of `local_world_size` ranks (>= 1). Throws one InvalidArgument naming
// the shape and the world (and, for a host split, the axis, its size, the local world
// size and a fix).
void check_mesh_shape(const std::vector<MeshAxis>& axes, int world, int local_world_size,
                      const std::vector<std::string>& within_host);

// "pp 2 x dp 2 x tp 2" (what errors and describe() call the shape).
std::string mesh_shape_name(const std::vector<MeshAxis>& axes);

class DeviceMesh {
 public:
  // Collective over `world` (see above). Axes outermost first. Throws InvalidArgument
  // for a bad shape (check_mesh_shape) before any group is made.
  DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshAxis> axes, const MeshOptions& options = {});

  // Every method taking an axis name throws InvalidArgument for a name not in the mesh.
  int size(const std::string& axis) const;
  int coordinate(const std::string& axis) const;  // this rank's, 0 .. size-1
  // This rank's group along the axis (a group of one for an axis of size 1).
  const std::shared_ptr<ProcessGroup>& group(const std::string& axis) const;
  // The world ranks of that group, in group-rank order.
  const std::vector<int>& ranks(const std::string& axis) const;
  // The world rank at this rank's coordinates with `axis` moved by `offset`; -1 when
  // that falls outside the axis.
  int neighbour(const std::string& axis, int offset) const;
  // The world rank at `coords` (one per axis, in axes order); InvalidArgument for a
  // wrong count or a coordinate out of range.
  int rank_of(const std::vector<int>& coords) const;

  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  const std::vector<MeshAxis>& axes() const { return axes_; }
  // "pp 2 x dp 2 x tp 2: rank 5 at pp 1, dp 0, tp 1".
  std::string describe() const;

 private:
  size_t index(const std::string& axis) const;

  std::shared_ptr<ProcessGroup> world_;
  std::vector<MeshAxis> axes_;
  std::vector<int> strides_;                          // per axis: rank distance of one step
  std::vector<int> coords_;                           // this rank's, per axis
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // this rank's, per axis
  std::vector<std::vector<int>> ranks_;               // their world ranks, per axis
};

// The mesh model parallelism uses: axes {"pp", pp}, {"dp", world / (tp·pp)}, {"tp", tp}.
// Throws InvalidArgument when tp or pp is below 1 or tp·pp does not divide the world.
DeviceMesh make_model_parallel_mesh(std::shared_ptr<ProcessGroup> world, int tp, int pp,
                                    const MeshOptions& options = {});

}  // namespace ddp
