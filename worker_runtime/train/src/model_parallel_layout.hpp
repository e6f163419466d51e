// What model_parallel.cpp and model_parallel_checkpoint.cpp share: a mesh's axes read
// with a missing axis counted as size 1, coordinate 0.
#pragma once

#include <string>

#include "ddp/device_mesh.hpp"

namespace ddp::model_parallel {

bool has_axis(const DeviceMesh& mesh, const std::string& axis);
int axis_size(const DeviceMesh& mesh, const std::string& axis);
int axis_coordinate(const DeviceMesh& mesh, const std::string& axis);

}  // namespace ddp::model_parallel
